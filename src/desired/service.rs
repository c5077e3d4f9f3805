//! The three Services: read-write (the primary), read-only (the replicas), and headless (stable
//! pod DNS names for replication).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::BuildError;
use super::conf::PORT;
use super::instance::Instance;
use super::statefulset::PORT_NAME;
use crate::api::Valkey;
use crate::api::names::roles;

/// `<name>`: follows the primary through the role label the operator keeps on the pods.
pub fn read_write_service(valkey: &Valkey) -> Result<Service, BuildError> {
    let instance = Instance::new(valkey)?;
    let selector = instance.role_selector(roles::PRIMARY);
    Ok(service(
        &instance,
        instance.names.read_write_service(),
        selector,
    ))
}

/// `<name>-replicas`: the replicas, for reads that may lag.
pub fn read_only_service(valkey: &Valkey) -> Result<Service, BuildError> {
    let instance = Instance::new(valkey)?;
    let selector = instance.role_selector(roles::REPLICA);
    Ok(service(
        &instance,
        instance.names.read_only_service(),
        selector,
    ))
}

/// `<name>-headless`: the StatefulSet's serviceName, giving each pod a DNS name.
pub fn headless_service(valkey: &Valkey) -> Result<Service, BuildError> {
    let instance = Instance::new(valkey)?;
    let mut service = service(
        &instance,
        instance.names.headless_service(),
        instance.selector_labels(),
    );
    if let Some(spec) = service.spec.as_mut() {
        spec.cluster_ip = Some("None".to_owned());
        // Replicas must resolve the primary while it is still starting, before it is ready.
        spec.publish_not_ready_addresses = Some(true);
    }
    Ok(service)
}

fn service(instance: &Instance, name: String, selector: BTreeMap<String, String>) -> Service {
    Service {
        metadata: instance.meta(name),
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_owned()),
                port: PORT,
                target_port: Some(IntOrString::String(PORT_NAME.to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
