//! Prometheus metrics of an instance (spec.metrics): the exporter sidecar of every pod, the
//! metrics Service in front of them, and the Prometheus operator's ServiceMonitor selecting it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Probe, ResourceRequirements,
    SeccompProfile, SecretKeySelector, SecurityContext, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::BuildError;
use super::conf::PORT;
use super::instance::Instance;
use super::secret::METRICS_PASSWORD_KEY;
use crate::api::Valkey;
use crate::api::defaults::METRICS_PORT;
use crate::api::names::{METRICS_USER, labels};

/// Name of the exporter sidecar container.
pub const METRICS_CONTAINER: &str = "metrics";
/// Name of the metrics port on the container, the metrics Service and the ServiceMonitor.
pub const METRICS_PORT_NAME: &str = "metrics";
/// Where the exporter serves the metrics.
pub const METRICS_PATH: &str = "/metrics";
/// `app.kubernetes.io/component` of the metrics Service (what the ServiceMonitor selects).
pub const METRICS_COMPONENT: &str = "metrics";
/// uid and gid the upstream redis_exporter image runs as.
pub const METRICS_UID: i64 = 59000;

/// The exporter sidecar: redis_exporter scraping the pod's own valkey-server on localhost, as
/// the ACL user [`METRICS_USER`], whose password comes from its Secret through the environment
/// (never argv). Ready once its HTTP server answers `/health`.
pub(crate) fn container(instance: &Instance) -> Container {
    let spec = &instance.valkey.spec.metrics;
    let value = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        ..EnvVar::default()
    };
    let password = EnvVar {
        name: "REDIS_PASSWORD".to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: instance.names.metrics_secret(),
                key: METRICS_PASSWORD_KEY.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let quantity = |q: &str| Quantity(q.to_owned());
    Container {
        name: METRICS_CONTAINER.to_owned(),
        image: Some(spec.image().to_owned()),
        env: Some(vec![
            value("REDIS_ADDR", format!("redis://localhost:{PORT}")),
            value("REDIS_USER", METRICS_USER.to_owned()),
            password,
            value(
                "REDIS_EXPORTER_WEB_LISTEN_ADDRESS",
                format!(":{METRICS_PORT}"),
            ),
            value("REDIS_EXPORTER_WEB_TELEMETRY_PATH", METRICS_PATH.to_owned()),
            // The user may not run CONFIG GET (it would reveal masterauth): skip it rather than
            // fail it at every scrape (see METRICS_COMMANDS).
            value("REDIS_EXPORTER_CONFIG_COMMAND", "-".to_owned()),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.to_owned()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), quantity(&spec.resources.cpu)),
                ("memory".to_owned(), quantity(&spec.resources.memory)),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                quantity(&spec.resources.memory),
            )])),
            ..ResourceRequirements::default()
        }),
        // /health answers while the exporter's HTTP server runs, whatever valkey-server does:
        // a Valkey that is down shows as redis_up 0, and never takes the pod out of its
        // Services through the sidecar.
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/health".to_owned()),
                port: IntOrString::String(METRICS_PORT_NAME.to_owned()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(10),
            timeout_seconds: Some(3),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        // The valkey container's restrictions, as the image's own user, with seccomp set here too.
        security_context: Some(SecurityContext {
            run_as_user: Some(METRICS_UID),
            run_as_group: Some(METRICS_UID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..super::pod::container_security_context()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    }
}

/// Labels of the metrics Service, and what the ServiceMonitor selects.
fn service_labels(instance: &Instance) -> BTreeMap<String, String> {
    let mut service_labels = instance.labels();
    service_labels.insert(labels::COMPONENT.to_owned(), METRICS_COMPONENT.to_owned());
    service_labels
}

/// `<name>-metrics`: port `metrics` of every pod of the instance (primary and replicas), or
/// `None` when metrics are off.
pub fn metrics_service(valkey: &Valkey) -> Result<Option<Service>, BuildError> {
    let instance = Instance::new(valkey)?;
    if !valkey.spec.metrics.enabled {
        return Ok(None);
    }
    let mut metadata = instance.meta(instance.names.metrics_service());
    metadata.labels = Some(service_labels(&instance));
    Ok(Some(Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: Some(instance.selector_labels()),
            ports: Some(vec![ServicePort {
                name: Some(METRICS_PORT_NAME.to_owned()),
                port: METRICS_PORT,
                target_port: Some(IntOrString::String(METRICS_PORT_NAME.to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            // A pod that is not ready (a replica syncing, a primary starting) still has
            // metrics worth scraping: that is when they matter most.
            publish_not_ready_addresses: Some(true),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }))
}

/// The part of the Prometheus operator's ServiceMonitor (monitoring.coreos.com/v1) the operator
/// writes. Fields it does not set are left out, so server-side apply leaves them to others.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "monitoring.coreos.com",
    version = "v1",
    kind = "ServiceMonitor",
    plural = "servicemonitors",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// The Services to scrape.
    pub selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    /// Pod labels copied onto every scraped series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_target_labels: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelector {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_names: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// `<name>-metrics`, selecting the metrics Service, or `None` unless
/// spec.metrics.serviceMonitor.enabled (and spec.metrics.enabled). Each series gets the pod's
/// instance and role labels, so a dashboard or an alert can tell the primary from the replicas.
pub fn service_monitor(valkey: &Valkey) -> Result<Option<ServiceMonitor>, BuildError> {
    let instance = Instance::new(valkey)?;
    let metrics = &valkey.spec.metrics;
    if !metrics.service_monitor_wanted() {
        return Ok(None);
    }
    let mut monitor = ServiceMonitor::new(
        &instance.names.service_monitor(),
        ServiceMonitorSpec {
            selector: LabelSelector {
                match_labels: Some(service_labels(&instance)),
                ..LabelSelector::default()
            },
            namespace_selector: Some(NamespaceSelector {
                match_names: vec![instance.namespace.to_owned()],
            }),
            endpoints: vec![Endpoint {
                port: Some(METRICS_PORT_NAME.to_owned()),
                path: Some(METRICS_PATH.to_owned()),
                interval: Some(metrics.service_monitor.interval.clone()),
            }],
            pod_target_labels: Some(vec![labels::INSTANCE.to_owned(), labels::ROLE.to_owned()]),
        },
    );
    monitor.metadata = instance.meta(instance.names.service_monitor());
    monitor.metadata.labels = Some(service_labels(&instance));
    Ok(Some(monitor))
}
