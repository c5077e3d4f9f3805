//! The `Valkey` custom resource (database.kuberly.io/v1alpha1).
//!
//! Every rule a user can break is enforced by the API server itself, as OpenAPI schema or CEL
//! (`x-kubernetes-validations`) generated from these types, so `kubectl apply`, the plugin and the
//! operator all see the same verdict. Each message names the field and says how to fix it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::defaults;

/// Desired state of a Valkey instance.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "database.kuberly.io",
    version = "v1alpha1",
    kind = "Valkey",
    plural = "valkeys",
    shortname = "vk",
    namespaced,
    status = "ValkeyStatus",
    doc = "A Valkey instance: a primary and up to four replicas, with auth, persistence and failover",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.readyReplicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".spec.resource.cpu","priority":1}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".spec.resource.memory","priority":1}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready replicas","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Primary","type":"string","jsonPath":".status.primary"}"#,
    printcolumn = r#"{"name":"Has volume","type":"boolean","jsonPath":".spec.volume.enabled","priority":1}"#,
    printcolumn = r#"{"name":"Volume size","type":"string","jsonPath":".spec.volume.storage","priority":1}"#,
    printcolumn = r#"{"name":"Error","type":"string","jsonPath":".status.error","priority":1}"#,
    printcolumn = r#"{"name":"Last reconcile","type":"date","jsonPath":".status.lastReconcileAt","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new(name_rule()).message(Message::Message(name_message())),
    validation = Rule::new(VOLUME_NEVER_SHRINKS_RULE)
        .message(Message::Message(VOLUME_NEVER_SHRINKS_MESSAGE.into()))
        .field_path(".spec.volume.storage"),
)]
#[serde(rename_all = "camelCase")]
pub struct ValkeySpec {
    /// Container image of valkey-server. Defaults to the Valkey release the operator is tested with.
    #[serde(default = "defaults::image")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.matches('[[:space:]]')")
        .message(Message::Message("spec.image must be an image reference without spaces, e.g. valkey/valkey:9.1.2".into())))]
    pub image: String,

    /// Number of Valkey pods: 0 stops the instance (data kept), 1 runs a standalone primary,
    /// 2 to 5 run one primary and replicas; the operator promotes a replica when the primary fails.
    #[serde(default = "defaults::replicas")]
    #[x_kube(validation = Rule::new(format!("self >= 0 && self <= {}", defaults::MAX_REPLICAS))
        .message(Message::Message(format!("spec.replicas must be between 0 and {} (0 stops the instance and keeps its data)", defaults::MAX_REPLICAS))))]
    pub replicas: i32,

    /// The ACL user that gets full rights with the instance's password. `default` (the default)
    /// lets clients that only send a password (AUTH <password>) in; any other name also turns the
    /// password-less `default` user off, so only this user can log in.
    #[serde(default = "defaults::user")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$')")
            .message(Message::Message("spec.user must be letters, digits, '.', '_' or '-' and start with a letter or digit, e.g. admin".into())),
        validation = Rule::new("self != 'valkey-operator'")
            .message(Message::Message("spec.user must not be valkey-operator: the operator logs in as that user; pick another name".into())),
        validation = Rule::new("self != 'valkey-metrics'")
            .message(Message::Message("spec.user must not be valkey-metrics: the metrics exporter logs in as that user; pick another name".into())),
    )]
    pub user: String,

    /// An existing Secret that holds the password. When absent, the operator generates a random
    /// password into the Secret `<name>-auth` (key `password`) and never overwrites it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<PasswordSecretRef>,

    /// Persistent storage of each pod.
    #[serde(default)]
    pub volume: VolumeSpec,

    /// Requests (and the memory limit) of the valkey container.
    #[serde(default)]
    pub resource: ResourceSpec,

    /// Extra valkey.conf directives, e.g. `maxmemory-policy: allkeys-lru`. Directives the operator
    /// manages (port, bind, dir, replicaof, requirepass, ...) are refused. With the default image
    /// (or a tag of its Valkey release) the operator also refuses, before changing any pod,
    /// directives that release does not know and values it would refuse (booleans, integers,
    /// memory sizes, enums); with other images the server itself judges them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "config_schema")]
    pub config: BTreeMap<String, String>,

    /// How long the primary may be NotReady or not answer the operator before the operator
    /// promotes a replica, e.g. `3s`, `500ms`, `1m` (at most 10m); `0s` acts at the first missed
    /// answer. A deleted or terminating primary pod, or one on a NotReady or unreachable node,
    /// is replaced at once. A replica is only promoted while it answers the operator.
    #[serde(default = "defaults::failover_delay")]
    #[schemars(length(min = 2, max = 16))]
    #[x_kube(
        validation = Rule::new(FAILOVER_DELAY_FORM_RULE)
            .message(Message::Message("spec.failoverDelay must be a duration such as 3s, 500ms or 1m (units ms, s, m)".into())),
        validation = Rule::new(FAILOVER_DELAY_BOUND_RULE)
            .message(Message::Message("spec.failoverDelay must be at most 10m".into())),
    )]
    pub failover_delay: String,

    /// How a primary stops taking writes when it is cut off from its replicas, so that an old
    /// primary on the wrong side of a partition cannot keep acknowledging writes that a failover
    /// would lose.
    #[serde(default)]
    pub fencing: FencingSpec,

    /// Prometheus metrics of the instance: an exporter sidecar (redis_exporter) in every pod, a
    /// metrics Service and, optionally, a ServiceMonitor. Turning metrics on or off changes the
    /// pod template, so the pods roll once, one at a time.
    #[serde(default)]
    pub metrics: MetricsSpec,

    /// A NetworkPolicy `<name>` for the instance's pods (off by default). When on, port 6379
    /// takes connections only from the instance's own pods (replication), from the operator's
    /// pods (label `app.kubernetes.io/name: valkey-operator` in the operator's namespace) and
    /// from the pods `clientSelector` picks; the exporter port (9121) only from the namespaces
    /// `metricsNamespaceSelector` picks, while metrics are on. Nothing else may connect, egress
    /// stays open. A NetworkPolicy is only enforced by a network plugin that implements it
    /// (Calico, Cilium, ...): the local test cluster of this project enforces none, so there the
    /// policy is only checked as an object. An operator run outside the cluster (as in the
    /// project's tests) is not one of the operator's pods: with enforcement, it could not reach
    /// the pods.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,

    /// Node labels the pods must run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Tolerations of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Affinity of the pods. When absent, pods prefer to run on different nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
}

/// The form of `spec.failoverDelay`: numbers with the units ms, s or m, e.g. `1m30s`.
pub const FAILOVER_DELAY_FORM_RULE: &str = "self.matches('^([0-9]{1,6}(ms|s|m))+$')";
/// The bound of `spec.failoverDelay` (checked only once its form is right).
pub const FAILOVER_DELAY_BOUND_RULE: &str =
    "!self.matches('^([0-9]{1,6}(ms|s|m))+$') || duration(self) <= duration('10m')";
/// Longest `spec.failoverDelay`.
pub const MAX_FAILOVER_DELAY: std::time::Duration = std::time::Duration::from_secs(600);

impl ValkeySpec {
    /// `spec.failoverDelay` as a duration. A value the CRD would refuse (an old CRD, a client
    /// that bypassed it) reads as the default, never as "no delay".
    pub fn failover_delay(&self) -> std::time::Duration {
        parse_duration(&self.failover_delay)
            .filter(|d| *d <= MAX_FAILOVER_DELAY)
            .unwrap_or(defaults::FAILOVER_DELAY)
    }
}

/// `3s`, `500ms`, `1m30s`: numbers with the units ms, s or m, as `spec.failoverDelay` takes them.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || digits > 6 {
            return None;
        }
        let (number, tail) = rest.split_at(digits);
        let number: u64 = number.parse().ok()?;
        let (unit, tail) = if let Some(tail) = tail.strip_prefix("ms") {
            (Duration::from_millis(number), tail)
        } else if let Some(tail) = tail.strip_prefix('s') {
            (Duration::from_secs(number), tail)
        } else if let Some(tail) = tail.strip_prefix('m') {
            (Duration::from_secs(number.checked_mul(60)?), tail)
        } else {
            return None;
        };
        total = total.checked_add(unit)?;
        rest = tail;
    }
    Some(total)
}

/// Fencing of a cut-off primary (valkey's `min-replicas-to-write` and `min-replicas-max-lag`).
///
/// The primary refuses writes while fewer than `minReplicasToWrite` replicas have acknowledged
/// its replication stream within the last `maxLagSeconds` seconds. So a primary cut off from
/// all its replicas stops accepting writes at most `maxLagSeconds` (plus up to one second of
/// valkey's own bookkeeping) after it lost them. The operator applies it to the primary only
/// while the instance has more than one pod (a standalone primary has nobody to wait for), and
/// never asks for more replicas than the instance has.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FencingSpec {
    /// Replicas that must be connected and in sync for the primary to take writes; 0 turns
    /// fencing off (a cut-off primary then takes writes that a failover loses).
    #[serde(default = "defaults::min_replicas_to_write")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 4")
        .message(Message::Message("spec.fencing.minReplicasToWrite must be between 0 and 4 (0 turns fencing off)".into())))]
    pub min_replicas_to_write: i32,
    /// How recent (in seconds) a replica's acknowledgement must be to count: the bound on how
    /// long a cut-off primary keeps taking writes.
    #[serde(default = "defaults::max_lag_seconds")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 60")
        .message(Message::Message("spec.fencing.maxLagSeconds must be between 1 and 60".into())))]
    pub max_lag_seconds: i32,
}

impl Default for FencingSpec {
    fn default() -> Self {
        Self {
            min_replicas_to_write: defaults::min_replicas_to_write(),
            max_lag_seconds: defaults::max_lag_seconds(),
        }
    }
}

impl ValkeySpec {
    /// The `min-replicas-to-write` the primary gets with `replicas` pods: at most the number of
    /// replicas the instance has, 0 for a standalone instance.
    pub fn min_replicas_to_write(&self) -> i32 {
        self.fencing
            .min_replicas_to_write
            .clamp(0, (self.replicas - 1).max(0))
    }
}

/// Prometheus metrics of the instance (`spec.metrics`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.serviceMonitor) || !self.serviceMonitor.enabled || self.enabled")
    .message(Message::Message("spec.metrics.serviceMonitor.enabled needs spec.metrics.enabled: true (the ServiceMonitor scrapes the exporter sidecar); set both, or neither".into())))]
pub struct MetricsSpec {
    /// Run the exporter sidecar (container `metrics`, port 9121, named `metrics`) in every pod,
    /// and the Service `<name>-metrics` in front of them. The exporter logs in as the ACL user
    /// `valkey-metrics`, which may only read server statistics (INFO, PING, LATENCY, SLOWLOG
    /// LEN), with a password the operator generates into the Secret `<name>-metrics-auth`.
    #[serde(default)]
    pub enabled: bool,

    /// Container image of the exporter. Defaults to the redis_exporter release the operator is
    /// tested with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.matches('[[:space:]]')")
        .message(Message::Message("spec.metrics.image must be an image reference without spaces, e.g. oliver006/redis_exporter:v1.88.0".into())))]
    pub image: Option<String>,

    /// Requests (and the memory limit) of the metrics container.
    #[serde(default)]
    pub resources: MetricsResources,

    /// A ServiceMonitor (monitoring.coreos.com/v1, the Prometheus operator's) for the metrics
    /// Service. Created only where that API is installed; otherwise the `ServiceMonitor`
    /// condition says why there is none.
    #[serde(default)]
    pub service_monitor: ServiceMonitorSpec,
}

impl MetricsSpec {
    /// The exporter's image: `spec.metrics.image`, or the default.
    pub fn image(&self) -> &str {
        self.image.as_deref().unwrap_or(defaults::METRICS_IMAGE)
    }

    /// Whether a ServiceMonitor is wanted (it needs the exporter too).
    pub fn service_monitor_wanted(&self) -> bool {
        self.enabled && self.service_monitor.enabled
    }
}

/// `spec.networkPolicy`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Create the NetworkPolicy `<name>`; turning it off deletes it.
    #[serde(default)]
    pub enabled: bool,

    /// The client pods that may connect to port 6379: a label selector of pods in the
    /// instance's namespace (or, with `clientNamespaceSelector`, in the namespaces it picks).
    /// Absent: no client pod at all, only the instance's pods and the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_selector: Option<LabelSelector>,

    /// The namespaces whose `clientSelector` pods may connect. Absent: the instance's
    /// namespace only. `{}` means every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_namespace_selector: Option<LabelSelector>,

    /// The namespaces whose pods may scrape the exporter port (9121) while spec.metrics is on,
    /// e.g. `{matchLabels: {kubernetes.io/metadata.name: monitoring}}`. Absent: no one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_namespace_selector: Option<LabelSelector>,
}

/// Requests (and the memory limit) of the metrics container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MetricsResources {
    /// CPU request, e.g. 10m.
    #[serde(default = "defaults::metrics_cpu")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))")
        .message(Message::Message("spec.metrics.resources.cpu must be a positive quantity, e.g. 10m".into())))]
    pub cpu: String,

    /// Memory request and limit, e.g. 64Mi.
    #[serde(default = "defaults::metrics_memory")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))")
        .message(Message::Message("spec.metrics.resources.memory must be a positive quantity, e.g. 64Mi".into())))]
    pub memory: String,
}

impl Default for MetricsResources {
    fn default() -> Self {
        Self {
            cpu: defaults::metrics_cpu(),
            memory: defaults::metrics_memory(),
        }
    }
}

/// The ServiceMonitor of the metrics Service (`spec.metrics.serviceMonitor`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// Create the ServiceMonitor `<name>-metrics`, selecting the metrics Service.
    #[serde(default)]
    pub enabled: bool,

    /// How often Prometheus scrapes each pod, a Prometheus duration such as 30s or 1m.
    #[serde(default = "defaults::scrape_interval")]
    #[schemars(length(min = 2, max = 16))]
    #[x_kube(validation = Rule::new(SCRAPE_INTERVAL_RULE)
        .message(Message::Message("spec.metrics.serviceMonitor.interval must be a Prometheus duration such as 15s, 30s or 1m (units ms, s, m, h), at least 1s".into())))]
    pub interval: String,
}

impl Default for ServiceMonitorSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            interval: defaults::scrape_interval(),
        }
    }
}

/// The form of `spec.metrics.serviceMonitor.interval`: a Prometheus duration of whole hours,
/// minutes, seconds and milliseconds, not zero and not below one second.
pub const SCRAPE_INTERVAL_RULE: &str = "self.matches('^(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$') && self != '' && !self.matches('^([0-9]+ms|0+s|0+m|0+h)$')";

/// Every object the operator derives from a Valkey is named `<name>` or `<name>-<suffix>`, and a
/// StatefulSet adds a revision hash to its name in a label value (63 characters at most), so the
/// name is kept short, and starts with a letter because Service names must.
/// spec.volume.storage never goes below what the volumes are: it may grow, and a growth that
/// never happened (the StorageClass does not allow expansion) may be taken back down to the size
/// the operator last saw on the claims, `status.volumeStorage`. A rule on the whole object,
/// because a field's own rule cannot see the status.
const VOLUME_NEVER_SHRINKS_RULE: &str = "!has(oldSelf.spec) || !has(self.spec.volume) || !has(oldSelf.spec.volume) \
|| !has(self.spec.volume.storage) || !has(oldSelf.spec.volume.storage) \
|| !isQuantity(self.spec.volume.storage) || !isQuantity(oldSelf.spec.volume.storage) \
|| quantity(self.spec.volume.storage).compareTo(quantity(oldSelf.spec.volume.storage)) >= 0 \
|| (has(self.status) && has(self.status.volumeStorage) && isQuantity(self.status.volumeStorage) \
&& quantity(self.spec.volume.storage).compareTo(quantity(self.status.volumeStorage)) >= 0)";
const VOLUME_NEVER_SHRINKS_MESSAGE: &str = "spec.volume.storage can grow but never shrink below the size the volumes have (status.volumeStorage): set it to at least that size";

fn name_rule() -> String {
    format!(
        "size(self.metadata.name) <= {} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        defaults::MAX_NAME_LENGTH
    )
}

fn name_message() -> String {
    format!(
        "metadata.name must be at most {} characters of lowercase letters, digits and '-', starting with a letter (it names the StatefulSet, Services and Secrets)",
        defaults::MAX_NAME_LENGTH
    )
}

/// Reference to the Secret key that holds the password.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSecretRef {
    /// Name of a Secret in the Valkey's namespace.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')")
        .message(Message::Message("spec.passwordSecret.name must be a Secret name: lowercase letters, digits, '-' and '.'".into())))]
    pub name: String,
    /// Key in the Secret's data that holds the password.
    #[serde(default = "defaults::password_key")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$')")
        .message(Message::Message("spec.passwordSecret.key must be a Secret key: letters, digits, '-', '_' and '.'".into())))]
    pub key: String,
}

/// Persistent storage of each pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)"
).message(Message::Message("spec.volume.storageClassName cannot be added, changed or removed after creation; create a new Valkey to use another storage class".into())))]
pub struct VolumeSpec {
    /// Keep data on a PersistentVolumeClaim per pod. `false` uses an emptyDir: data is lost
    /// whenever a pod restarts. Fixed at creation.
    #[serde(default = "defaults::volume_enabled")]
    #[x_kube(validation = Rule::new("self == oldSelf")
        .message(Message::Message("spec.volume.enabled cannot change after creation; create a new Valkey instead".into())))]
    pub enabled: bool,

    /// Size of each pod's volume, e.g. 1Gi. May grow, never below the size the volumes have
    /// (status.volumeStorage): a growth the StorageClass refuses can be taken back.
    #[serde(default = "defaults::storage")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(
        validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))")
            .message(Message::Message("spec.volume.storage must be a positive quantity, e.g. 1Gi".into())),
    )]
    pub storage: String,

    /// StorageClass of the volumes; the cluster's default class when absent. Fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,

    /// What happens to the volumes when the Valkey is deleted.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
}

impl Default for VolumeSpec {
    fn default() -> Self {
        Self {
            enabled: defaults::volume_enabled(),
            storage: defaults::storage(),
            storage_class_name: None,
            reclaim_policy: ReclaimPolicy::default(),
        }
    }
}

/// What happens to the PersistentVolumeClaims when the Valkey is deleted.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReclaimPolicy {
    /// Keep the volumes (and the data); a new Valkey of the same name picks them up again.
    #[default]
    Retain,
    /// Delete the volumes with the Valkey.
    Delete,
}

impl ReclaimPolicy {
    /// The value as the API writes it: in the CRD and as the StatefulSet's PVC retention policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retain => "Retain",
            Self::Delete => "Delete",
        }
    }
}

/// Requests (and the memory limit) of the valkey container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSpec {
    /// CPU request, e.g. 250m.
    #[serde(default = "defaults::cpu")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))")
        .message(Message::Message("spec.resource.cpu must be a positive quantity, e.g. 250m or 1".into())))]
    pub cpu: String,

    /// Memory request and limit, e.g. 512Mi.
    #[serde(default = "defaults::memory")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))")
        .message(Message::Message("spec.resource.memory must be a positive quantity, e.g. 512Mi".into())))]
    pub memory: String,

    /// Ephemeral-storage request, e.g. 1Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))")
        .message(Message::Message("spec.resource.storage must be a positive quantity, e.g. 1Gi".into())))]
    pub storage: Option<String>,
}

impl Default for ResourceSpec {
    fn default() -> Self {
        Self {
            cpu: defaults::cpu(),
            memory: defaults::memory(),
            storage: None,
        }
    }
}

/// valkey.conf directives the operator writes itself, or that would break it (files, network,
/// auth, replication, fencing (spec.fencing), process supervision, command names its probes use).
pub const OPERATOR_OWNED_CONFIG_KEYS: &[&str] = &[
    "aclfile",
    "bind",
    "cluster-config-file",
    "cluster-enabled",
    "daemonize",
    "dir",
    "include",
    "logfile",
    "masterauth",
    "masteruser",
    "min-replicas-max-lag",
    "min-replicas-to-write",
    "min-slaves-max-lag",
    "min-slaves-to-write",
    "pidfile",
    "port",
    "primaryauth",
    "primaryuser",
    "protected-mode",
    "rename-command",
    "replica-announce-ip",
    "replica-announce-port",
    "replicaof",
    "requirepass",
    "slave-announce-ip",
    "slave-announce-port",
    "slaveof",
    "supervised",
    "unixsocket",
    "unixsocketperm",
    "user",
];

/// Most directives an instance may carry in `spec.config`.
pub const MAX_CONFIG_ENTRIES: u32 = 64;

/// The schema of `spec.config`: a bounded map (so the API server can bound the cost of its CEL
/// rules) whose keys are plain directive names and whose values cannot start a new line.
fn config_schema(_: &mut SchemaGenerator) -> Schema {
    let mut rules = vec![
        json!({
            "rule": "self.all(k, k.matches('^[a-z][a-z0-9-]{0,63}$'))",
            "message": "spec.config keys must be valkey.conf directive names in lowercase (letters, digits and '-', at most 64), e.g. maxmemory-policy",
        }),
        json!({
            "rule": r#"self.all(k, !self[k].matches(r'[[:cntrl:]"\\]') && !self[k].contains("'"))"#,
            "message": "spec.config values must be plain words separated by spaces: no quotes, backslashes, newlines or other control characters",
        }),
    ];
    // One cheap rule per directive (a map lookup), so the message names the directive.
    rules.extend(OPERATOR_OWNED_CONFIG_KEYS.iter().map(|key| {
        json!({
            "rule": format!("!('{key}' in self)"),
            "message": format!("spec.config must not set {key}: the operator manages it; remove it (or use the matching spec field)"),
        })
    }));
    json_schema!({
        "type": "object",
        "description": "Extra valkey.conf directives, e.g. `maxmemory-policy: allkeys-lru`. Directives the operator manages (port, bind, dir, replicaof, requirepass, ...) are refused. With the default image (or a tag of its Valkey release) the operator also refuses, before changing any pod, directives that release does not know and values it would refuse (booleans, integers, memory sizes, enums); with other images the server itself judges them.",
        "maxProperties": MAX_CONFIG_ENTRIES,
        "additionalProperties": {"type": "string", "maxLength": 1024},
        "x-kubernetes-validations": rules,
    })
}

/// Observed state of a Valkey instance, written by the operator.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyStatus {
    /// Pending, Creating, Running, Degraded, Stopped or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Phase>,
    /// The last error, in words; empty once the instance is healthy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// Pods that are ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The pod that takes writes now: the one the operator recorded as primary, seen answering
    /// as a primary. Absent while no pod is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// The size of each pod's volume now (the StatefulSet's claim template); spec.volume.storage
    /// may be set back to it when a growth cannot be carried out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_storage: Option<String>,
    /// The last time the operator moved the primary role: an automatic failover or a planned
    /// switchover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<LastFailover>,
    /// Label selector of the instance's pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the operator last changed something for this instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reconcile_at: Option<Time>,
    /// The instance user's password: whether the pods run with the one in the password Secret,
    /// or are being moved to it (a live rotation, no pod restarted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_rotation: Option<PasswordRotation>,
    /// Ready, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// `status.passwordRotation`. Never a password, nor a hash of one.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PasswordRotation {
    /// Rotating while the pods are moved to the password Secret's new password (both the old
    /// and the new one are accepted meanwhile); Complete when every pod accepts only the
    /// Secret's password.
    pub phase: RotationPhase,
    /// The resourceVersion of the password Secret this phase is about (absent for a Secret the
    /// operator just generated): `kubectl valkey rotate-password` waits for Complete with the
    /// resourceVersion it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_resource_version: Option<String>,
    /// When the rotation in progress, or the last one, started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the last rotation completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// What the rotation waits for, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The phase of `status.passwordRotation`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotationPhase {
    Rotating,
    Complete,
}

/// One move of the primary role, as `status.lastFailover` records it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastFailover {
    /// The pod that was primary (absent when it was unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The pod promoted.
    pub to: String,
    /// Why, as one word: PodDeleted, PodTerminating, NodeNotReady, NodeUnreachable, PodNotReady,
    /// Unreachable, NotPrimary, Switchover.
    pub reason: String,
    /// When the operator decided.
    pub time: Time,
    /// How long the move took, from the decision to the new primary labelled, e.g. `850ms`.
    pub duration: String,
}

/// The instance's phase, as one word.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Accepted, nothing created yet.
    Pending,
    /// Objects created, pods not all ready yet.
    Creating,
    /// Every pod ready, primary known.
    Running,
    /// Serving, but with fewer ready pods than asked for.
    Degraded,
    /// spec.replicas is 0: no pod runs, data is kept.
    Stopped,
    /// Cannot make progress until something is fixed; status.error says what.
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Creating => "Creating",
            Phase::Running => "Running",
            Phase::Degraded => "Degraded",
            Phase::Stopped => "Stopped",
            Phase::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
