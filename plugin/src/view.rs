//! What `list` and `status` show, as plain data computed from the API objects: the tables of
//! `render` and the `-o json|yaml` documents are two views of the same values. Pure: no client,
//! no clock (ages are computed when rendering).

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use serde::Serialize;
use valkey_core::api::names::{self, ObjectNames};
use valkey_core::api::names::{claim_ordinal, pod_ordinal as ordinal};
use valkey_core::api::{Valkey, defaults};
use valkey_core::desired;
use valkey_core::status::{is_ready, pods};

/// One line of `list`.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRow {
    pub namespace: String,
    pub name: String,
    /// The operator's phase; absent until the operator has seen the instance.
    pub status: Option<String>,
    pub ready_replicas: i32,
    pub replicas: i32,
    pub primary: Option<String>,
    pub image: String,
    /// Size of each pod's volume; absent without a volume.
    pub volume: Option<String>,
    pub created: Option<Timestamp>,
    pub error: Option<String>,
}

/// Everything `status NAME` shows.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceReport {
    #[serde(flatten)]
    pub instance: InstanceRow,
    pub user: String,
    pub password_secret: SecretKeyRef,
    pub endpoints: Endpoints,
    pub storage: Storage,
    pub cpu: String,
    pub memory: String,
    pub generation: Option<i64>,
    pub observed_generation: Option<i64>,
    pub last_reconcile: Option<Timestamp>,
    pub conditions: Vec<ConditionRow>,
    pub pods: Vec<PodRow>,
    pub events: Vec<EventRow>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

/// Service DNS names and port: what clients connect to.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    pub read_write: String,
    pub read_only: String,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    pub enabled: bool,
    pub size: Option<String>,
    pub storage_class: Option<String>,
    pub reclaim_policy: Option<String>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConditionRow {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition: Option<Timestamp>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodRow {
    pub name: String,
    pub role: Option<String>,
    pub ready: bool,
    /// Phase, or why the pod is not running (CrashLoopBackOff, Terminating, ...).
    pub status: String,
    pub restarts: i32,
    pub node: Option<String>,
    pub ip: Option<String>,
    pub created: Option<Timestamp>,
    /// Why the pod does not run, as the operator reports it (see `valkey_core::status::pods`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<PodProblemRow>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodProblemRow {
    /// The condition reason: Unschedulable, VolumeNotReady, ImagePullFailed, OOMKilled,
    /// PodCrashLooping or ContainerCannotStart.
    pub reason: String,
    pub message: String,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventRow {
    pub last_seen: Option<Timestamp>,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    /// `Kind/name` of the object the event is about.
    pub object: String,
    pub message: String,
    pub count: i32,
}

/// How many events `status` keeps (the most recent ones).
pub const MAX_EVENTS: usize = 10;

pub fn instance_row(valkey: &Valkey) -> InstanceRow {
    let status = valkey.status.as_ref();
    let spec = &valkey.spec;
    InstanceRow {
        namespace: valkey.metadata.namespace.clone().unwrap_or_default(),
        name: valkey.metadata.name.clone().unwrap_or_default(),
        status: status.and_then(|s| s.status).map(|p| p.to_string()),
        ready_replicas: status.map(|s| s.ready_replicas).unwrap_or_default(),
        replicas: spec.replicas,
        primary: status.and_then(|s| s.primary.clone()),
        image: spec.image.clone(),
        volume: spec.volume.enabled.then(|| spec.volume.storage.clone()),
        created: valkey.metadata.creation_timestamp.as_ref().map(|t| t.0),
        error: status
            .map(|s| s.error.trim().to_owned())
            .filter(|e| !e.is_empty()),
    }
}

/// The report of one instance; `events` may hold events of anything in the namespace.
pub fn instance_report(
    valkey: &Valkey,
    pods: &[Pod],
    claims: &[PersistentVolumeClaim],
    events: &[Event],
) -> InstanceReport {
    let instance = instance_row(valkey);
    let spec = &valkey.spec;
    let status = valkey.status.as_ref();
    let names = ObjectNames::new(&instance.name);
    let password_secret = match &spec.password_secret {
        Some(s) => SecretKeyRef {
            name: s.name.clone(),
            key: s.key.clone(),
        },
        None => SecretKeyRef {
            name: names.generated_secret(),
            key: defaults::PASSWORD_KEY.to_owned(),
        },
    };
    let mut pods: Vec<&Pod> = pods.iter().collect();
    pods.sort_by_key(|p| pod_sort_key(&instance.name, p));
    InstanceReport {
        user: spec.user.clone(),
        password_secret,
        endpoints: endpoints(&instance.name, &instance.namespace),
        storage: Storage {
            enabled: spec.volume.enabled,
            size: spec.volume.enabled.then(|| spec.volume.storage.clone()),
            storage_class: spec
                .volume
                .storage_class_name
                .clone()
                .filter(|_| spec.volume.enabled),
            reclaim_policy: spec
                .volume
                .enabled
                .then(|| spec.volume.reclaim_policy.as_str().to_owned()),
        },
        cpu: spec.resource.cpu.clone(),
        memory: spec.resource.memory.clone(),
        generation: valkey.metadata.generation,
        observed_generation: status.and_then(|s| s.observed_generation),
        last_reconcile: status
            .and_then(|s| s.last_reconcile_at.as_ref())
            .map(|t| t.0),
        conditions: status
            .map(|s| s.conditions.iter().map(condition_row).collect())
            .unwrap_or_default(),
        pods: pods.into_iter().map(|p| pod_row(p, claims)).collect(),
        events: recent_events(&instance.name, events, MAX_EVENTS),
        instance,
    }
}

/// In-cluster DNS names of the read-write and read-only Services, with the Valkey port.
pub fn endpoints(instance: &str, namespace: &str) -> Endpoints {
    let names = ObjectNames::new(instance);
    let address = |service: String| format!("{service}.{namespace}.svc:{}", desired::PORT);
    Endpoints {
        read_write: address(names.read_write_service()),
        read_only: address(names.read_only_service()),
    }
}

fn pod_sort_key(instance: &str, pod: &Pod) -> (i32, String) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    (ordinal(instance, &name).unwrap_or(i32::MAX), name)
}

fn condition_row(c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> ConditionRow {
    ConditionRow {
        type_: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        last_transition: Some(c.last_transition_time.0),
    }
}

pub fn pod_row(pod: &Pod, claims: &[PersistentVolumeClaim]) -> PodRow {
    let labels = pod.metadata.labels.as_ref();
    let status = pod.status.as_ref();
    let restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or_default();
    PodRow {
        name: pod.metadata.name.clone().unwrap_or_default(),
        role: labels.and_then(|l| l.get(names::labels::ROLE)).cloned(),
        ready: is_ready(pod),
        status: pod_status(pod),
        restarts,
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ip: status.and_then(|s| s.pod_ip.clone()),
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        problem: pods::diagnose(pod, claims).map(|p| PodProblemRow {
            reason: p.cause.reason().to_owned(),
            message: p.message,
        }),
    }
}

/// What kubectl shows in its STATUS column: why a container is not running, else the phase.
fn pod_status(pod: &Pod) -> String {
    if pod.metadata.deletion_timestamp.is_some() {
        return "Terminating".to_owned();
    }
    let status = pod.status.as_ref();
    let waiting_or_failed = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref())
        .find_map(|state| {
            let waiting = state.waiting.as_ref().and_then(|w| w.reason.clone());
            let terminated = state.terminated.as_ref().and_then(|t| t.reason.clone());
            waiting.or(terminated)
        });
    waiting_or_failed
        .or_else(|| status.and_then(|s| s.phase.clone()))
        .unwrap_or_else(|| "Unknown".to_owned())
}

/// The last `max` events about the instance or its objects, oldest first.
pub fn recent_events(instance: &str, events: &[Event], max: usize) -> Vec<EventRow> {
    let mut rows: Vec<EventRow> = events
        .iter()
        .filter(|e| {
            let regarding = e.regarding.as_ref();
            let kind = regarding
                .and_then(|r| r.kind.as_deref())
                .unwrap_or_default();
            let name = regarding
                .and_then(|r| r.name.as_deref())
                .unwrap_or_default();
            involves(instance, kind, name)
        })
        .map(event_row)
        .collect();
    rows.sort_by_key(|r| r.last_seen);
    let skip = rows.len().saturating_sub(max);
    rows.split_off(skip)
}

/// Whether an event about `kind/name` concerns the instance: the Valkey itself, an object the
/// operator derives from it, one of its pods, or one of its volumes.
pub fn involves(instance: &str, kind: &str, name: &str) -> bool {
    let names = ObjectNames::new(instance);
    match kind {
        "Valkey" => name == instance,
        "Pod" => ordinal(instance, name).is_some_and(|o| names.pod(o) == name),
        "PersistentVolumeClaim" => claim_ordinal(instance, name).is_some(),
        "StatefulSet" => name == names.statefulset(),
        "PodDisruptionBudget" => name == names.pod_disruption_budget(),
        "ConfigMap" => name == names.config_map(),
        "Service" => {
            let services = BTreeSet::from([
                names.read_write_service(),
                names.read_only_service(),
                names.headless_service(),
            ]);
            services.contains(name)
        }
        _ => false,
    }
}

pub fn event_row(event: &Event) -> EventRow {
    let regarding = event.regarding.as_ref();
    let last_seen = event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let count = event
        .series
        .as_ref()
        .map(|s| s.count)
        .or(event.deprecated_count)
        .unwrap_or(1);
    EventRow {
        last_seen,
        type_: event.type_.clone().unwrap_or_default(),
        reason: event.reason.clone().unwrap_or_default(),
        object: format!(
            "{}/{}",
            regarding.and_then(|r| r.kind.as_deref()).unwrap_or("?"),
            regarding.and_then(|r| r.name.as_deref()).unwrap_or("?")
        ),
        message: event.note.clone().unwrap_or_default().trim().to_owned(),
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_the_instance_and_its_children_are_kept() {
        for (kind, name) in [
            ("Valkey", "cache"),
            ("Pod", "cache-0"),
            ("Pod", "cache-12"),
            ("PersistentVolumeClaim", "data-cache-1"),
            ("StatefulSet", "cache"),
            ("Service", "cache-replicas"),
            ("ConfigMap", "cache-config"),
        ] {
            assert!(involves("cache", kind, name), "{kind}/{name}");
        }
        for (kind, name) in [
            ("Valkey", "cache-2"),
            ("Pod", "cache-x"),
            ("Pod", "cache-01"),
            ("Pod", "cachet-0"),
            ("PersistentVolumeClaim", "data-cache-x"),
            ("PersistentVolumeClaim", "data-other-0"),
            ("Node", "cache"),
        ] {
            assert!(!involves("cache", kind, name), "{kind}/{name}");
        }
    }
}
