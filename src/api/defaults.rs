//! Defaults of the Valkey API. The CRD schema carries them (the API server fills them in) and the
//! plugin uses the same functions, so both agree by construction.

/// The Valkey release the operator is tested with (the valkey-server the tests boot is 9.1.2).
pub const IMAGE: &str = "valkey/valkey:9.1.2";
pub const REPLICAS: i32 = 1;
pub const MAX_REPLICAS: i32 = 5;
pub const USER: &str = "default";
pub const PASSWORD_KEY: &str = "password";
pub const STORAGE: &str = "1Gi";
pub const CPU: &str = "100m";
pub const MEMORY: &str = "256Mi";
/// `spec.failoverDelay`: long enough to ride out a missed probe or a short network blip, short
/// enough that a dead primary is replaced within seconds.
pub const FAILOVER_DELAY_TEXT: &str = "3s";
pub const FAILOVER_DELAY: std::time::Duration = std::time::Duration::from_secs(3);
/// `spec.fencing`: a primary needs one replica in sync to take writes...
pub const MIN_REPLICAS_TO_WRITE: i32 = 1;
/// ... whose acknowledgement is at most this many seconds old.
pub const MAX_LAG_SECONDS: i32 = 10;
/// The exporter image of the metrics sidecar (spec.metrics.image): the redis_exporter release
/// the operator is tested with (hack/cluster builds it under this very reference).
pub const METRICS_IMAGE: &str = "docker.io/oliver006/redis_exporter:v1.88.0";
/// Requests of the metrics container: redis_exporter idles at a few MiB and a few millicores.
pub const METRICS_CPU: &str = "10m";
pub const METRICS_MEMORY: &str = "64Mi";
/// spec.metrics.serviceMonitor.interval.
pub const SCRAPE_INTERVAL: &str = "30s";
/// The port the exporter serves /metrics on (redis_exporter's own default).
pub const METRICS_PORT: i32 = 9121;
/// Longest Valkey name: every derived object name and label value must stay valid.
pub const MAX_NAME_LENGTH: usize = 40;

pub fn image() -> String {
    IMAGE.to_owned()
}

pub fn replicas() -> i32 {
    REPLICAS
}

pub fn user() -> String {
    USER.to_owned()
}

pub fn password_key() -> String {
    PASSWORD_KEY.to_owned()
}

pub fn volume_enabled() -> bool {
    true
}

pub fn storage() -> String {
    STORAGE.to_owned()
}

pub fn cpu() -> String {
    CPU.to_owned()
}

pub fn memory() -> String {
    MEMORY.to_owned()
}

pub fn failover_delay() -> String {
    FAILOVER_DELAY_TEXT.to_owned()
}

pub fn min_replicas_to_write() -> i32 {
    MIN_REPLICAS_TO_WRITE
}

pub fn max_lag_seconds() -> i32 {
    MAX_LAG_SECONDS
}

pub fn metrics_cpu() -> String {
    METRICS_CPU.to_owned()
}

pub fn metrics_memory() -> String {
    METRICS_MEMORY.to_owned()
}

pub fn scrape_interval() -> String {
    SCRAPE_INTERVAL.to_owned()
}
