//! One reconcile of one Valkey: read the password, build the desired objects, apply them, label
//! the pods with their roles, then compute and write the status and tell the story in events.
//! The operator binary wires [`reconcile`] to a kube-runtime Controller.

mod error;
mod events;
mod password;
mod volumes;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::Recorder;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tracing::{debug, info};

use crate::api::names::{self, FIELD_MANAGER, ObjectNames, labels, roles};
use crate::api::{Phase, Valkey, ValkeyStatus};
use crate::apply::{self, Outcome};
use crate::desired::{self, Facts};
use crate::status::{self, Observed};

pub use error::Error;
pub use events::Change;

/// What the operator needs for every reconcile.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
}

/// What a reconcile did, for metrics and logs.
#[derive(Clone, Debug)]
pub struct Report {
    pub phase: Phase,
    pub changes: Vec<Change>,
}

/// Brings the cluster in line with `valkey` and records what it sees in its status. An error is
/// written to the status in words and returned, so the controller retries with backoff.
pub async fn reconcile(valkey: &Valkey, ctx: &Context) -> Result<Report, Error> {
    let namespace = valkey.namespace().ok_or(Error::NotNamespaced)?;
    if valkey.metadata.deletion_timestamp.is_some() {
        // Children go with their owner (garbage collection); the StatefulSet's PVC retention
        // policy keeps or deletes the volumes. Nothing to do, and no finalizer to hold it up.
        return Ok(Report {
            phase: Phase::Stopped,
            changes: Vec::new(),
        });
    }
    let primary = status::choose_primary(valkey);
    let result = converge(valkey, &namespace, primary.clone(), ctx).await;
    let (changes, error) = match &result {
        Ok(changes) => (changes.clone(), None),
        Err(e) => (Vec::new(), Some((e.to_string(), e.reason()))),
    };
    let (phase, status) = write_status(valkey, &namespace, primary, &changes, error, ctx).await?;
    events::publish(ctx, valkey, &changes, result.as_ref().err()).await;
    if result.is_ok() {
        events::pod_problems(ctx, valkey, &status).await;
    }
    result.map(|changes| Report { phase, changes })
}

/// Applies every object of the instance; returns what changed.
async fn converge(
    valkey: &Valkey,
    namespace: &str,
    primary: Option<String>,
    ctx: &Context,
) -> Result<Vec<Change>, Error> {
    let client = &ctx.client;
    let credentials = password::resolve(client, valkey, namespace).await?;
    let facts = Facts {
        primary: primary.clone(),
        password: credentials.password,
        new_password: credentials.generate,
    };
    let desired = desired::objects(valkey, &facts)?;
    let mut changes = Vec::new();
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    if let Some(secret) = &desired.generated_secret {
        changes.push(Change::of(
            "Secret",
            secret,
            apply::create_if_absent(&secrets, secret).await?,
        ));
    }
    changes.push(Change::applied(
        "Secret",
        apply::apply(&secrets, &desired.acl_secret).await?,
    ));
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    changes.push(Change::applied(
        "ConfigMap",
        apply::apply(&config_maps, &desired.config_map).await?,
    ));
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
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), namespace);
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let resize = volumes::grow(&statefulsets, &claims, valkey, &desired.statefulset).await?;
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
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    changes.extend(label_roles(&pods, valkey, primary.as_deref()).await?);
    changes.retain(|c| c.outcome.changed());
    Ok(changes)
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
fn pod_gone_or_replaced(error: &kube::Error) -> bool {
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
        |p: &Pod| status::ordinal(&valkey.name_any(), &p.name_any()).is_some();
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
    primary: Option<String>,
    changes: &[Change],
    error: Option<(String, &'static str)>,
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
    let (error, error_reason) = error.unzip();
    let observed = Observed {
        statefulset: sts.as_ref(),
        pods: &pods,
        primary,
        error,
        error_reason,
        claims: &claims,
        changed: !changes.is_empty(),
    };
    let new = status::compute(valkey, &observed, &Time(jiff_now()));
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
        "apiVersion": "database.kuberly.io/v1alpha1",
        "kind": "Valkey",
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
