//! The status of a Valkey, computed from what the operator observed: its StatefulSet, its pods,
//! the primary it recorded, and the error of the last reconcile. Pure: no client, no clock.

pub mod pods;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ContainerStatus, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::names::{self, ObjectNames};
use crate::api::{LastFailover, Phase, Valkey, ValkeyStatus};

/// Condition types.
pub mod conditions {
    pub const READY: &str = "Ready";
    pub const PROGRESSING: &str = "Progressing";
    pub const DEGRADED: &str = "Degraded";
    /// Whether the last reconcile finished: False with the error's reason while it does not,
    /// including errors that pass with time (the API server busy or away), which leave the
    /// phase alone.
    pub const RECONCILED: &str = "Reconciled";
    /// Only with spec.metrics.serviceMonitor.enabled: whether the ServiceMonitor exists, or why
    /// not (the Prometheus operator's CRD is not installed).
    pub const SERVICE_MONITOR: &str = "ServiceMonitor";
}

/// What became of the ServiceMonitor a Valkey asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Monitoring {
    pub created: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Monitoring {
    pub fn created(name: &str) -> Self {
        Self {
            created: true,
            reason: "Created",
            message: format!("ServiceMonitor {name} selects the metrics Service {name}"),
        }
    }

    pub fn api_missing(name: &str) -> Self {
        Self {
            created: false,
            reason: "ServiceMonitorAPIMissing",
            message: format!(
                "no ServiceMonitor created: the cluster does not serve monitoring.coreos.com/v1 servicemonitors; install the Prometheus operator's CRDs (the operator creates {name} at its next reconcile), or scrape the metrics Service {name} (port metrics) another way"
            ),
        }
    }
}

/// Whether the last status says a ServiceMonitor was created (so one may need deleting).
pub fn had_service_monitor(valkey: &Valkey) -> bool {
    valkey.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::SERVICE_MONITOR && c.status == "True")
    })
}

/// What a reconcile saw of the instance.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    pub statefulset: Option<&'a StatefulSet>,
    /// The instance's pods (any order).
    pub pods: &'a [Pod],
    /// The pod that takes writes: the recorded primary, seen answering as one.
    pub primary: Option<String>,
    /// A move of the primary role just made (kept from the previous status otherwise).
    pub last_failover: Option<LastFailover>,
    /// A fact about failover to tell in the conditions, e.g. that no replica can take over.
    pub fact: Option<String>,
    /// Why the last reconcile could not finish, in words.
    pub error: Option<String>,
    /// The CamelCase reason of `error` (e.g. UnknownDirective), for the conditions.
    pub error_reason: Option<&'static str>,
    /// Whether `error` passes with time (an API server hiccup): the phase then stays what the
    /// pods say, and only the `Reconciled` condition and `status.error` tell it. Any other error
    /// makes the instance `Failed`: it cannot make progress until something is fixed.
    pub error_transient: bool,
    /// The instance's volume claims (any order), to tell an unbound volume from other
    /// scheduling failures.
    pub claims: &'a [PersistentVolumeClaim],
    /// Whether the last reconcile changed anything in the cluster.
    pub changed: bool,
    /// What became of the ServiceMonitor, when one is wanted and the reconcile got that far.
    pub monitoring: Option<Monitoring>,
}

/// The status the instance should have now. `now` stamps transitions and `lastReconcileAt`.
pub fn compute(valkey: &Valkey, observed: &Observed<'_>, now: &Time) -> ValkeyStatus {
    let previous = valkey.status.clone().unwrap_or_default();
    let desired = valkey.spec.replicas;
    let ready = ready_pods(observed.pods);
    let rolling = rollout_in_progress(valkey, observed.statefulset);
    let primary = observed.primary.clone().filter(|p| {
        observed
            .pods
            .iter()
            .any(|pod| pod.metadata.name.as_deref() == Some(p.as_str()))
    });
    let phase = phase(desired, ready, primary.is_some(), observed, previous.status);
    let problems = if desired == 0 {
        Vec::new()
    } else {
        pods::diagnose_all(observed.pods, observed.claims)
    };
    let mut message = message(phase, desired, ready, rolling, observed);
    // A reconcile error comes first (nothing new was applied); otherwise what the pods say.
    let (error, reason) = match (&observed.error, problems.first()) {
        (Some(error), _) if !observed.error_transient => (
            error.clone(),
            observed.error_reason.unwrap_or(phase_reason(phase)),
        ),
        (_, Some(problem)) => {
            let mut error = problem.message.clone();
            match problems.len() - 1 {
                0 => {}
                1 => error.push_str(" (and 1 more pod not running)"),
                more => error.push_str(&format!(" (and {more} more pods not running)")),
            }
            message = format!("{message}: {error}");
            (error, problem.cause.reason())
        }
        (_, None) => (String::new(), phase_reason(phase)),
    };
    let troubled = !error.is_empty();
    // An error that passes with time is told in status.error and the Reconciled condition only.
    let error = match &observed.error {
        Some(transient) if observed.error_transient => transient.clone(),
        _ => error,
    };

    let mut status = ValkeyStatus {
        status: Some(phase),
        error,
        ready_replicas: ready,
        primary: if desired == 0 { None } else { primary },
        volume_storage: observed
            .statefulset
            .and_then(claim_template_size)
            .or(previous.volume_storage.clone())
            .filter(|_| valkey.spec.volume.enabled),
        last_failover: observed
            .last_failover
            .clone()
            .or(previous.last_failover.clone()),
        selector: Some(names::instance_selector(valkey_name(valkey))),
        observed_generation: valkey.metadata.generation,
        last_reconcile_at: previous.last_reconcile_at.clone(),
        // The reconcile sets it (reconcile::rotation); kept from the previous status here.
        password_rotation: previous.password_rotation.clone(),
        conditions: Vec::new(),
    };
    let generation = valkey.metadata.generation;
    status.conditions = vec![
        condition(
            &previous,
            conditions::READY,
            matches!(phase, Phase::Running | Phase::Stopped),
            if troubled {
                reason
            } else {
                phase_reason(phase)
            },
            &message,
            generation,
            now,
        ),
        condition(
            &previous,
            conditions::PROGRESSING,
            rolling || phase == Phase::Creating || phase == Phase::Pending,
            if rolling {
                "RollingUpdate"
            } else {
                phase_reason(phase)
            },
            &message,
            generation,
            now,
        ),
        condition(
            &previous,
            conditions::DEGRADED,
            matches!(phase, Phase::Degraded | Phase::Failed),
            if troubled {
                reason
            } else {
                phase_reason(phase)
            },
            &message,
            generation,
            now,
        ),
        reconciled_condition(&previous, observed, generation, now),
    ];
    if valkey.spec.metrics.service_monitor_wanted() {
        // A reconcile that stopped before the ServiceMonitor step keeps what the last one said.
        let monitoring = observed.monitoring.as_ref().map(|m| {
            condition(
                &previous,
                conditions::SERVICE_MONITOR,
                m.created,
                m.reason,
                &m.message,
                generation,
                now,
            )
        });
        let kept = || {
            previous
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::SERVICE_MONITOR)
                .cloned()
        };
        status.conditions.extend(monitoring.or_else(kept));
    }
    if observed.changed || previous.status != status.status || previous.last_reconcile_at.is_none()
    {
        status.last_reconcile_at = Some(now.clone());
    }
    status
}

/// Whether two statuses differ in anything but their timestamps, i.e. whether writing the new
/// one tells a reader something new.
pub fn differs(old: Option<&ValkeyStatus>, new: &ValkeyStatus) -> bool {
    let Some(old) = old else { return true };
    let strip = |s: &ValkeyStatus| {
        let mut s = s.clone();
        s.last_reconcile_at = None;
        for c in &mut s.conditions {
            c.last_transition_time = Time(Default::default());
        }
        s
    };
    strip(old) != strip(new)
}

fn valkey_name(valkey: &Valkey) -> &str {
    valkey.metadata.name.as_deref().unwrap_or_default()
}

fn phase(
    desired: i32,
    ready: i32,
    has_primary: bool,
    observed: &Observed<'_>,
    previous: Option<Phase>,
) -> Phase {
    if observed.error.is_some() && !observed.error_transient {
        return Phase::Failed;
    }
    if desired == 0 {
        return Phase::Stopped;
    }
    // No StatefulSet but pods: it is being replaced (a volume resize orphans the pods and
    // creates it again), and the pods still say how the instance is.
    if observed.statefulset.is_none() && observed.pods.is_empty() {
        return Phase::Pending;
    }
    if ready >= desired && has_primary {
        return Phase::Running;
    }
    // Until an instance first runs it is being created; afterwards missing pods are a degradation.
    match previous {
        Some(Phase::Running | Phase::Degraded) => Phase::Degraded,
        _ => Phase::Creating,
    }
}

fn reconciled_condition(
    previous: &ValkeyStatus,
    observed: &Observed<'_>,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    match &observed.error {
        Some(error) => condition(
            previous,
            conditions::RECONCILED,
            false,
            observed.error_reason.unwrap_or("ReconcileFailed"),
            error,
            generation,
            now,
        ),
        None => condition(
            previous,
            conditions::RECONCILED,
            true,
            "Reconciled",
            "the last reconcile applied every object",
            generation,
            now,
        ),
    }
}

fn phase_reason(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "Pending",
        Phase::Creating => "Creating",
        Phase::Running => "AllReplicasReady",
        Phase::Degraded => "ReplicasNotReady",
        Phase::Stopped => "Stopped",
        Phase::Failed => "ReconcileFailed",
    }
}

fn message(
    phase: Phase,
    desired: i32,
    ready: i32,
    rolling: bool,
    observed: &Observed<'_>,
) -> String {
    match phase {
        Phase::Failed => observed.error.clone().unwrap_or_default(),
        Phase::Stopped => "spec.replicas is 0: no pod runs; the data is kept".into(),
        Phase::Pending => "waiting for the StatefulSet to be created".into(),
        _ if rolling => format!("{ready}/{desired} pods ready; rolling out a new pod template"),
        _ => match &observed.fact {
            Some(fact) => format!("{ready}/{desired} pods ready; {fact}"),
            None => format!("{ready}/{desired} pods ready"),
        },
    }
}

fn condition(
    previous: &ValkeyStatus,
    kind: &str,
    on: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if on { "True" } else { "False" };
    // A condition's transition time moves only when its status flips.
    let last_transition_time = previous
        .conditions
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: kind.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// Pods that are Ready (the kubelet's verdict, which includes the authenticated probe).
pub fn ready_pods(pods: &[Pod]) -> i32 {
    let ready = pods
        .iter()
        .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
        .count();
    i32::try_from(ready).unwrap_or(i32::MAX)
}

/// Whether the pod's valkey container is ready (its authenticated PING answers), whatever the
/// other containers (the metrics sidecar) say: the pod's Ready condition, or a ready valkey
/// container in a pod that is NotReady only because another container is not ready.
pub fn valkey_ready(pod: &Pod) -> bool {
    if is_ready(pod) {
        return true;
    }
    let containers = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let valkey = |c: &&ContainerStatus| c.name == crate::desired::CONTAINER;
    containers.iter().find(valkey).is_some_and(|c| c.ready)
        && containers.iter().any(|c| !valkey(&c) && !c.ready)
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the StatefulSet is still moving its pods to a new pod template (or has not yet seen
/// its latest spec).
fn rollout_in_progress(valkey: &Valkey, statefulset: Option<&StatefulSet>) -> bool {
    let Some(sts) = statefulset else { return false };
    let Some(status) = sts.status.as_ref() else {
        return true;
    };
    if status.observed_generation < sts.metadata.generation {
        return true;
    }
    let revisions_differ =
        status.update_revision.is_some() && status.current_revision != status.update_revision;
    valkey.spec.replicas > 0 && revisions_differ
}

/// The recorded primary: the ConfigMap key `primary` (where pods read it at start), else
/// `status.primary`, else pod 0 (a new instance); pod 0 too when the recorded pod is outside
/// `spec.replicas` (scaled away). `None` when the instance is stopped.
pub fn recorded_primary(valkey: &Valkey, config_map_primary: Option<&str>) -> Option<String> {
    let name = valkey_name(valkey);
    if valkey.spec.replicas == 0 {
        return None;
    }
    let in_range = |p: &str| names::pod_ordinal(name, p).is_some_and(|o| o < valkey.spec.replicas);
    let from_status = valkey.status.as_ref().and_then(|s| s.primary.clone());
    // The ConfigMap's primary stands even beyond spec.replicas: a scale-down keeps its pod until
    // the role has been handed over (desired::statefulset::pod_count, failover::decide).
    config_map_primary
        .map(str::to_owned)
        .filter(|p| names::pod_ordinal(name, p).is_some())
        .or(from_status.filter(|p| in_range(p)))
        .or_else(|| Some(ObjectNames::new(name).pod(0)))
}

/// The size each pod's volume is created with and was last grown to: the storage request of
/// the StatefulSet's data claim template.
pub fn claim_template_size(sts: &StatefulSet) -> Option<String> {
    let template = sts
        .spec
        .volume_claim_templates
        .as_ref()?
        .iter()
        .find(|t| t.metadata.name.as_deref() == Some(names::DATA_VOLUME))?;
    let requests = template
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?;
    requests.get("storage").map(|q| q.0.clone())
}
