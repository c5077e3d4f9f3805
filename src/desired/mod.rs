//! Pure builders: a `Valkey` and the facts the operator observed in, the Kubernetes objects it
//! wants out. No client and no I/O, so each object is unit-tested from YAML fixtures; the apply
//! layer writes them with server-side apply.

mod conf;
mod config_map;
mod error;
mod instance;
mod metrics;
mod network_policy;
mod password;
mod pdb;
mod pod;
pub mod quantity;
mod secret;
mod service;
mod statefulset;

use std::fmt;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

pub use conf::{
    AUTH_CONF_KEY, CLI_SH_KEY, CONFIG_DIR, DATA_DIR, DATA_FILES, INITIALIZED_KEY,
    MAXMEMORY_PERCENT, METRICS_COMMANDS, MIN_REPLICAS_KEY, OLD_PASSWORD_KEY, OLD_PASSWORD_PATH,
    OPERATOR_COMMANDS, PASSWORD_KEY, PASSWORD_PATH, PORT, PRIMARY_KEY, START_SH_KEY,
    VALKEY_CONF_KEY, pod_host,
};
pub use config_map::config_map;
pub use error::BuildError;
pub use metrics::{
    Endpoint, METRICS_COMPONENT, METRICS_CONTAINER, METRICS_PATH, METRICS_PORT_NAME, METRICS_UID,
    NamespaceSelector, ServiceMonitor, ServiceMonitorSpec, metrics_service, service_monitor,
};
pub use network_policy::network_policy;
pub use password::{PASSWORD_BYTES, generate_password, password_from_bytes};
pub use pdb::pod_disruption_budget;
pub use pod::VALKEY_UID;
pub use quantity::quantity_millis;
pub use secret::{
    METRICS_PASSWORD_KEY, OPERATOR_PASSWORD_KEY, acl_secret, generated_secret, metrics_secret,
    operator_secret,
};
pub use service::{headless_service, read_only_service, read_write_service};
pub use statefulset::{CONTAINER, PORT_NAME, statefulset};

use crate::api::Valkey;
use instance::Instance;

/// Pod-template annotation: sha256 of valkey.conf, start.sh and auth.conf (without the instance
/// user's password, which rotates live), so a change of the config rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "database.kuberly.io/config-hash";

/// What the operator observed and the builders cannot know from the spec.
#[derive(Clone, Default)]
pub struct Facts {
    /// The pod that takes writes; pod 0 when none is known yet (a new instance).
    pub primary: Option<String>,
    /// The password: read from the password Secret, or just generated.
    pub password: String,
    /// While a password rotation runs: the password the pods ran with before it, which they
    /// all still accept (auth.conf and `passwords` then carry both).
    pub old_password: Option<String>,
    /// While a password rotation runs: when it started (RFC 3339), recorded on the ACL Secret.
    pub rotation_started: Option<String>,
    /// The password was just generated because `<name>-auth` does not exist yet, so that Secret
    /// must be created. Ignored when `spec.passwordSecret` is set.
    pub new_password: bool,
    /// The password of the operator's own ACL user: read from `<name>-operator`, or just
    /// generated.
    pub operator_password: String,
    /// The operator's password was just generated, so `<name>-operator` must be created.
    pub new_operator_password: bool,
    /// The instance has run with a primary and replicas before (see [`INITIALIZED_KEY`]).
    pub initialized: bool,
    /// The password of the metrics exporter's ACL user: read from `<name>-metrics-auth`, or
    /// just generated. Only used (and then required) while spec.metrics.enabled.
    pub metrics_password: String,
    /// The metrics password was just generated, so `<name>-metrics-auth` must be created.
    pub new_metrics_password: bool,
}

impl fmt::Debug for Facts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Facts")
            .field("primary", &self.primary)
            .field("password", &"<redacted>")
            .field(
                "old_password",
                &self.old_password.as_ref().map(|_| "<redacted>"),
            )
            .field("rotation_started", &self.rotation_started)
            .field("new_password", &self.new_password)
            .field("operator_password", &"<redacted>")
            .field("new_operator_password", &self.new_operator_password)
            .field("initialized", &self.initialized)
            .field("metrics_password", &"<redacted>")
            .field("new_metrics_password", &self.new_metrics_password)
            .finish()
    }
}

/// Every object of one Valkey. No `Debug`: two of them hold the password.
#[derive(Clone)]
pub struct Desired {
    /// `<name>-auth`: create if absent, never update (see [`generated_secret`]).
    pub generated_secret: Option<Secret>,
    /// `<name>-operator`: create if absent, never update (see [`operator_secret`]).
    pub operator_secret: Option<Secret>,
    pub acl_secret: Secret,
    pub config_map: ConfigMap,
    pub statefulset: StatefulSet,
    pub read_write_service: Service,
    pub read_only_service: Service,
    pub headless_service: Service,
    /// Only with more than one pod.
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    /// `<name>-metrics-auth`, only with spec.metrics.enabled and a password just generated:
    /// create if absent, never update (see [`metrics_secret`]).
    pub metrics_secret: Option<Secret>,
    /// `<name>-metrics`, only with spec.metrics.enabled; deleted otherwise.
    pub metrics_service: Option<Service>,
    /// `<name>-metrics`, only with spec.metrics.serviceMonitor.enabled; applied only where the
    /// ServiceMonitor API is installed, deleted otherwise.
    pub service_monitor: Option<ServiceMonitor>,
}

/// All objects of `valkey`.
pub fn objects(valkey: &Valkey, facts: &Facts) -> Result<Desired, BuildError> {
    let generated_secret = if facts.new_password {
        generated_secret(valkey, &facts.password)?
    } else {
        None
    };
    let operator_secret = if facts.new_operator_password {
        Some(operator_secret(valkey, &facts.operator_password)?)
    } else {
        None
    };
    let metrics_secret = if facts.new_metrics_password {
        metrics_secret(valkey, &facts.metrics_password)?
    } else {
        None
    };
    Ok(Desired {
        generated_secret,
        operator_secret,
        metrics_secret,
        metrics_service: metrics_service(valkey)?,
        service_monitor: service_monitor(valkey)?,
        acl_secret: acl_secret(valkey, facts)?,
        config_map: config_map(valkey, facts)?,
        statefulset: statefulset(valkey, facts)?,
        read_write_service: read_write_service(valkey)?,
        read_only_service: read_only_service(valkey)?,
        headless_service: headless_service(valkey)?,
        pod_disruption_budget: pod_disruption_budget(valkey)?,
    })
}

/// An empty password would leave the instance open to anyone who can reach it.
fn check_password(instance: &Instance, password: &str) -> Result<(), BuildError> {
    if password.is_empty() {
        return Err(BuildError::EmptyPassword(instance.name.to_owned()));
    }
    Ok(())
}

/// With metrics on, the exporter's user needs a password too (an empty one would let anyone in
/// as that user).
fn check_metrics_password(instance: &Instance, facts: &Facts) -> Result<(), BuildError> {
    if instance.valkey.spec.metrics.enabled {
        check_password(instance, &facts.metrics_password)?;
    }
    Ok(())
}

/// The primary's pod name, checked: it is written into a file the start script compares with
/// the pod's own name, and a name that is no pod of the instance would leave no pod primary.
fn primary_pod(instance: &Instance, primary: Option<&str>) -> Result<String, BuildError> {
    let Some(primary) = primary else {
        return Ok(instance.names.pod(0));
    };
    match crate::api::names::pod_ordinal(instance.name, primary) {
        Some(_) => Ok(primary.to_owned()),
        None => Err(BuildError::InvalidPrimary {
            primary: primary.to_owned(),
            instance: instance.name.to_owned(),
        }),
    }
}
