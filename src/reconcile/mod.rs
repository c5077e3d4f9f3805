//! One reconcile of one Valkey: read the password, build the desired objects, apply them, label
//! the pods with their roles, then compute and write the status and tell the story in events.
//! The operator binary wires [`reconcile`] to a kube-runtime Controller.

mod error;
mod events;
pub mod failover;
mod metrics;
mod password;
mod rollout;
mod rotation;
mod volumes;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::Recorder;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info};

use crate::api::names::{self, FIELD_MANAGER, ObjectNames, labels, roles};
use crate::api::{LastFailover, Phase, Valkey, ValkeyStatus};
use crate::apply::{self, Outcome};
use crate::desired::{self, Facts, INITIALIZED_KEY, PRIMARY_KEY};
use crate::status::{self, Observed};

pub use error::Error;
pub use events::Change;

/// What the operator needs for every reconcile.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// What the operator remembers of the pods between reconciles, shared with its health loop.
    pub memory: Arc<failover::Memory>,
    /// The namespace the operator's pods run in: spec.networkPolicy lets them in.
    pub operator_namespace: String,
}

/// What a reconcile did, for metrics and logs.
#[derive(Clone, Debug)]
pub struct Report {
    pub phase: Phase,
    pub changes: Vec<Change>,
    /// A move of the primary role this reconcile made: its reason and how long it took.
    pub failover: Option<(String, Duration)>,
    /// Look again after this long (a primary failing within failoverDelay, no candidate yet).
    pub requeue_after: Option<Duration>,
}

/// Brings the cluster in line with `valkey` and records what it sees in its status. An error is
/// written to the status in words and returned, so the controller retries with backoff.
pub async fn reconcile(valkey: &Valkey, ctx: &Context) -> Result<Report, Error> {
    let namespace = valkey.namespace().ok_or(Error::NotNamespaced)?;
    if valkey.metadata.deletion_timestamp.is_some() {
        // Children go with their owner (garbage collection); the StatefulSet's PVC retention
        // policy keeps or deletes the volumes. Nothing to do, and no finalizer to hold it up.
        ctx.memory.forget(&namespace, &valkey.name_any());
        return Ok(Report {
            phase: Phase::Stopped,
            changes: Vec::new(),
            failover: None,
            requeue_after: None,
        });
    }
    // Changes are collected as they are made, so those made before a step fails are still
    // told in events and counted.
    let mut changes = Vec::new();
    let result = converge(valkey, &namespace, ctx, &mut changes).await;
    changes.retain(|c| c.outcome.changed());
    let seen = result.as_ref().map(Clone::clone).unwrap_or_default();
    let error = result
        .as_ref()
        .err()
        .map(|e| (e.to_string(), e.reason(), e.is_transient()));
    let written = write_status(valkey, &namespace, &seen, &changes, error, ctx).await;
    // The story is told even when the status could not be written.
    events::publish(ctx, valkey, &changes, result.as_ref().err()).await;
    events::failover(ctx, valkey, &seen.events).await;
    let phase = match written {
        Ok((phase, status)) => {
            if result.is_ok() {
                events::pod_problems(ctx, valkey, &status).await;
            }
            phase
        }
        Err(e) => return Err(result.err().unwrap_or(e)),
    };
    if seen.switchover_done {
        // After the status and the events: whoever waits for the request to go sees the
        // outcome (status.lastFailover, or a SwitchoverRefused event) with it.
        clear_switchover(&ctx.client, &namespace, &valkey.name_any()).await?;
    }
    result.map(|seen| Report {
        phase,
        changes,
        failover: seen
            .failover
            .as_ref()
            .map(|f| (f.reason.clone(), seen.took)),
        requeue_after: seen.requeue_after,
    })
}

/// What the failover step saw and did, for the status and the events.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// The recorded primary, when it answers as one (or, unreachable, is Ready).
    primary: Option<String>,
    failover: Option<LastFailover>,
    took: Duration,
    fact: Option<String>,
    events: Vec<(bool, &'static str, String)>,
    requeue_after: Option<Duration>,
    /// The switchover request was acted on: remove it, once the status says the outcome.
    switchover_done: bool,
    /// What became of the ServiceMonitor (only when one is wanted).
    monitoring: Option<status::Monitoring>,
    /// The password rotation's state, when the reconcile got that far.
    password_rotation: Option<crate::api::PasswordRotation>,
    /// Look again after this long for the password rotation's next step.
    rotation_requeue: Option<Duration>,
}

/// Observes the pods and fails over when the primary failed, labels the pods with their roles,
/// then applies every object of the instance, pushing each change to `changes` as it is made.
async fn converge(
    valkey: &Valkey,
    namespace: &str,
    ctx: &Context,
    changes: &mut Vec<Change>,
) -> Result<Seen, Error> {
    let client = &ctx.client;
    let credentials = password::resolve(client, valkey, namespace).await?;
    let operator = password::resolve_operator(client, valkey, namespace).await?;
    let metrics_credentials = password::resolve_metrics(client, valkey, namespace).await?;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let live_config = config_maps
        .get_opt(&ObjectNames::new(&valkey.name_any()).config_map())
        .await?;
    let live_key = |key: &str| {
        live_config
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(key))
            .cloned()
    };
    let recorded = status::recorded_primary(valkey, live_key(PRIMARY_KEY).as_deref());
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), namespace);
    let mut seen = Seen::default();
    let mut outcome = None;
    let mut listed = Vec::new();
    if let Some(recorded) = recorded.as_deref() {
        // A new instance (no ConfigMap, no operator password yet) has no pod to ask.
        if live_config.is_some() && !operator.generate {
            listed = instance_pods(&pods, valkey).await?;
            let live_statefulset = statefulsets
                .get_opt(&ObjectNames::new(&valkey.name_any()).statefulset())
                .await?;
            let o = failover::run(
                ctx,
                valkey,
                namespace,
                &listed,
                &rollout::Revisions::of(live_statefulset.as_ref()),
                recorded,
                &operator.password,
            )
            .await?;
            seen.primary = match o.primary_answers {
                Some(true) => Some(o.primary.clone()),
                Some(false) => None,
                // Not reachable by the operator: the kubelet's word.
                None => listed
                    .iter()
                    .find(|p| p.name_any() == o.primary && p.metadata.deletion_timestamp.is_none())
                    .filter(|p| status::is_ready(p))
                    .map(|_| o.primary.clone()),
            };
            outcome = Some(o);
        } else {
            seen.primary = Some(recorded.to_owned());
        }
    }
    let primary = outcome.as_ref().map(|o| o.primary.clone()).or(recorded);
    // Routing first: a recreated primary gets its role label (and the read-write Service its
    // endpoint) whatever fails further down. Except when this reconcile moved the primary: then
    // the ConfigMap must record the new one before its label routes writes to it, or a restart
    // of the old primary after a crash of the operator would bring back two primaries.
    let moved = outcome.as_ref().is_some_and(|o| o.failover.is_some());
    if !moved {
        changes.extend(label_roles(&pods, valkey, primary.as_deref()).await?);
    }
    let initialized = live_key(INITIALIZED_KEY).as_deref() == Some("true")
        || outcome.as_ref().is_some_and(failover::Outcome::initialized);
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let record = rotation::record(&secrets, valkey).await?;
    let rotating = crate::rotation::plan(
        record.as_ref(),
        &credentials.password,
        k8s_openapi::jiff::Timestamp::now(),
    )
    .rotating();
    let rotation_pods = if rotating {
        instance_pods(&pods, valkey).await?
    } else {
        Vec::new()
    };
    let step = rotation::run(
        valkey,
        record.as_ref(),
        &credentials.password,
        credentials.resource_version.clone(),
        &rotation_pods,
        primary.as_deref(),
    )
    .await;
    seen.password_rotation = Some(step.status);
    if let Some(after) = step.requeue_after {
        seen.rotation_requeue = Some(after);
    }
    let facts = Facts {
        primary: primary.clone(),
        old_password: step.old_password,
        rotation_started: step.started,
        password: credentials.password,
        new_password: credentials.generate,
        operator_password: operator.password,
        new_operator_password: operator.generate,
        initialized,
        metrics_password: metrics_credentials.password,
        new_metrics_password: metrics_credentials.generate,
    };
    let desired = desired::objects(valkey, &facts)?;
    for secret in [
        &desired.generated_secret,
        &desired.operator_secret,
        &desired.metrics_secret,
    ]
    .into_iter()
    .flatten()
    {
        // The password was generated because the Secret was absent or unusable when read: one
        // there now must be read again, never disagreed with (auth.conf would carry a password
        // the Secret does not).
        let outcome = apply::create_if_absent(&secrets, secret).await?;
        if outcome == Outcome::Unchanged {
            return Err(Error::GeneratedSecretExists {
                namespace: namespace.to_owned(),
                name: secret.name_any(),
            });
        }
        changes.push(Change::of("Secret", secret, outcome));
    }
    changes.push(Change::applied(
        "Secret",
        apply::apply(&secrets, &desired.acl_secret).await?,
    ));
    changes.push(Change::applied(
        "ConfigMap",
        apply::apply(&config_maps, &desired.config_map).await?,
    ));
    if moved {
        changes.extend(label_roles(&pods, valkey, primary.as_deref()).await?);
    }
    // The replicas follow the primary (and a primary just replaced loses its clients) as soon
    // as it is recorded and labelled, not after every other object is applied.
    if let Some(o) = outcome.as_mut() {
        failover::finish(valkey, namespace, o).await;
    }
    let services = Api::<Service>::namespaced(client.clone(), namespace);
    for service in [
        &desired.headless_service,
        &desired.read_write_service,
        &desired.read_only_service,
    ] {
        changes.push(Change::applied(
            "Service",
            apply::apply(&services, service).await?,
        ));
    }
    let metrics_service = ObjectNames::new(&valkey.name_any()).metrics_service();
    let stale_metrics_service = match &desired.metrics_service {
        Some(_) => None,
        None => services.get_opt(&metrics_service).await?,
    };
    // A ServiceMonitor can exist while metrics are on, or are still being turned off (their
    // Service not gone yet), or when the status says one was made. The ServiceMonitor goes first:
    // if its deletion fails, the Service is still there to say so at the next attempt.
    let may_have_monitor = desired.metrics_service.is_some()
        || stale_metrics_service.is_some()
        || status::had_service_monitor(valkey);
    let (monitor_changes, monitoring) = metrics::service_monitor(
        client,
        valkey,
        namespace,
        desired.service_monitor.as_ref(),
        may_have_monitor,
    )
    .await?;
    changes.extend(monitor_changes);
    match &desired.metrics_service {
        Some(service) => changes.push(Change::applied(
            "Service",
            apply::apply(&services, service).await?,
        )),
        None if stale_metrics_service.is_some() => changes.push(Change::named(
            "Service",
            &metrics_service,
            apply::delete_managed(&services, &metrics_service).await?,
        )),
        None => {}
    }
    seen.monitoring = monitoring;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let storage_classes = Api::<StorageClass>::all(client.clone());
    let resize = volumes::grow(
        &statefulsets,
        &claims,
        &storage_classes,
        valkey,
        &desired.statefulset,
    )
    .await?;
    changes.extend(resize.changes);
    if !resize.statefulset_replaced {
        let sts = apply::apply(&statefulsets, &desired.statefulset).await?;
        let replicas = |s: &StatefulSet| s.spec.replicas;
        if let Some(from) = sts.previous.as_ref().and_then(replicas)
            && Some(from) != replicas(&sts.object)
        {
            changes.push(Change::scaled(&sts.object, from, valkey.spec.replicas));
        }
        changes.push(Change::applied("StatefulSet", sts));
    }
    let restart = outcome.as_mut().and_then(|o| o.restart.take());
    if let Some(pod) = restart.filter(|_| !resize.statefulset_replaced)
        && rollout::restart(&pods, &listed, &pod).await?
    {
        changes.push(Change::named("Pod", &pod, Outcome::Deleted));
        if let Some(o) = outcome.as_mut() {
            let note = format!(
                "restarted {pod} to run the StatefulSet's newest pod template (rolling update, the primary last)"
            );
            o.events.push((false, "RollingUpdate", note));
        }
    }

    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace);
    let pdb_name = ObjectNames::new(&valkey.name_any()).pod_disruption_budget();
    match &desired.pod_disruption_budget {
        Some(pdb) => changes.push(Change::applied(
            "PodDisruptionBudget",
            apply::apply(&pdbs, pdb).await?,
        )),
        None => changes.push(Change::named(
            "PodDisruptionBudget",
            &pdb_name,
            apply::delete_managed(&pdbs, &pdb_name).await?,
        )),
    }
    let policies = Api::<NetworkPolicy>::namespaced(client.clone(), namespace);
    match desired::network_policy(valkey, &ctx.operator_namespace)? {
        Some(policy) => changes.push(Change::applied(
            "NetworkPolicy",
            apply::apply(&policies, &policy).await?,
        )),
        None => {
            let name = ObjectNames::new(&valkey.name_any()).network_policy();
            changes.push(Change::named(
                "NetworkPolicy",
                &name,
                apply::delete_managed(&policies, &name).await?,
            ));
        }
    }
    if let Some(o) = outcome {
        failover::fence(valkey, &o).await;
        seen.switchover_done = o.switchover_done;
        seen.took = failover::took(&o).unwrap_or_default();
        seen.failover = o.failover;
        seen.fact = o.fact;
        seen.events = o.events;
        seen.requeue_after = o.requeue_after;
        // A primary that answers while no replica has synced yet (a new instance): look again
        // shortly, so the boot guard is armed once one has, without waiting for an event.
        if !initialized && valkey.spec.replicas > 1 && o.primary_answers == Some(true) {
            let soon = Duration::from_secs(2);
            seen.requeue_after = Some(seen.requeue_after.map_or(soon, |r| r.min(soon)));
        }
    }
    if let Some(after) = seen.rotation_requeue {
        seen.requeue_after = Some(seen.requeue_after.map_or(after, |r| r.min(after)));
    }
    Ok(seen)
}

/// Removes the switchover request once it has been acted on (done or refused).
async fn clear_switchover(client: &Client, namespace: &str, name: &str) -> Result<(), Error> {
    let patch = json!({"metadata": {"annotations": {names::SWITCHOVER_ANNOTATION: null}}});
    Api::<Valkey>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Labels each pod with its replication role, so the read-write Service follows the primary.
async fn label_roles(
    pods: &Api<Pod>,
    valkey: &Valkey,
    primary: Option<&str>,
) -> Result<Vec<Change>, Error> {
    let mut changes = Vec::new();
    for pod in instance_pods(pods, valkey).await? {
        // A terminating pod serves nobody whatever its label says.
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.name_any();
        let role = if Some(name.as_str()) == primary {
            roles::PRIMARY
        } else {
            roles::REPLICA
        };
        if pod.labels().get(labels::ROLE).map(String::as_str) == Some(role) {
            continue;
        }
        // A merge patch, not an apply: an apply of a pod deleted meanwhile would try to create
        // it. The uid is a precondition, so a pod gone or replaced by a namesake is left alone;
        // the new pod's own event brings it back here.
        let patch = json!({
            "metadata": {"uid": pod.metadata.uid, "labels": {labels::ROLE: role}},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match pods.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pod_gone_or_replaced(&e) => {
                debug!(pod = %name, "pod gone before its role label was set");
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        debug!(pod = %name, role, "labelled pod");
        changes.push(Change::named("Pod", &name, Outcome::Updated));
    }
    Ok(changes)
}

/// A patch with a uid precondition failed because the pod is gone (404) or is another pod of
/// the same name now (422: metadata.uid is immutable).
pub(crate) fn pod_gone_or_replaced(error: &kube::Error) -> bool {
    let kube::Error::Api(status) = error else {
        return false;
    };
    let uid_refused = || {
        status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
    };
    status.code == 404 || (status.code == 422 && uid_refused())
}

async fn instance_pods(pods: &Api<Pod>, valkey: &Valkey) -> Result<Vec<Pod>, kube::Error> {
    let selector = names::instance_selector(&valkey.name_any());
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let owned_by_statefulset =
        |p: &Pod| names::pod_ordinal(&valkey.name_any(), &p.name_any()).is_some();
    Ok(list
        .items
        .into_iter()
        .filter(owned_by_statefulset)
        .collect())
}

/// Computes the status from what is in the cluster now and writes it when it says something new.
async fn write_status(
    valkey: &Valkey,
    namespace: &str,
    seen: &Seen,
    changes: &[Change],
    error: Option<(String, &'static str, bool)>,
    ctx: &Context,
) -> Result<(Phase, ValkeyStatus), Error> {
    let client = &ctx.client;
    let sts = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get_opt(&ObjectNames::new(&valkey.name_any()).statefulset())
        .await?;
    let pods = instance_pods(&Api::namespaced(client.clone(), namespace), valkey).await?;
    let claims = if valkey.spec.volume.enabled {
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(&names::instance_selector(&valkey.name_any())))
            .await?
            .items
    } else {
        Vec::new()
    };
    let (error, error_reason, error_transient) = match error {
        Some((message, reason, transient)) => (Some(message), Some(reason), transient),
        None => (None, None, false),
    };
    let observed = Observed {
        statefulset: sts.as_ref(),
        pods: &pods,
        primary: seen.primary.clone(),
        last_failover: seen.failover.clone(),
        fact: seen.fact.clone(),
        error,
        error_reason,
        error_transient,
        claims: &claims,
        changed: !changes.is_empty() || seen.failover.is_some(),
        monitoring: seen.monitoring.clone(),
    };
    let mut new = status::compute(valkey, &observed, &Time(jiff_now()));
    new.password_rotation = seen.password_rotation.clone().or_else(|| {
        valkey
            .status
            .as_ref()
            .and_then(|s| s.password_rotation.clone())
    });
    let phase = new.status.unwrap_or(Phase::Pending);
    if status::differs(valkey.status.as_ref(), &new) || observed.changed {
        patch_status(client, namespace, &valkey.name_any(), &new).await?;
        info!(phase = %phase, ready = new.ready_replicas, "status updated");
    }
    Ok((phase, new))
}

async fn patch_status(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &ValkeyStatus,
) -> Result<(), kube::Error> {
    let patch = json!({
        "apiVersion": Valkey::api_version(&()),
        "kind": Valkey::kind(&()),
        "status": status,
    });
    Api::<Valkey>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map(|_| ())
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
