//! The NetworkPolicy of spec.networkPolicy: who may connect to the instance's pods.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::BuildError;
use super::conf::PORT;
use super::instance::Instance;
use crate::api::names::{OPERATOR_APP_NAME, labels};
use crate::api::{Valkey, defaults};

/// The label every namespace carries with its own name (set by the API server).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// `Some` with spec.networkPolicy.enabled: ingress to the instance's pods only on port 6379 from
/// the instance's own pods, the operator's pods (in `operator_namespace`) and the client pods
/// the spec picks; and on the exporter port from the namespaces the spec picks, while metrics
/// are on. `None` otherwise (the reconcile then deletes a policy left from before).
pub fn network_policy(
    valkey: &Valkey,
    operator_namespace: &str,
) -> Result<Option<NetworkPolicy>, BuildError> {
    let instance = Instance::new(valkey)?;
    let spec = &valkey.spec.network_policy;
    if !spec.enabled {
        return Ok(None);
    }
    let match_labels = |pairs: &[(&str, &str)]| LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..LabelSelector::default()
    };
    let mut valkey_from = vec![
        // Replication, and the replicas' own connections to the primary.
        NetworkPolicyPeer {
            pod_selector: Some(instance.selector()),
            ..NetworkPolicyPeer::default()
        },
        NetworkPolicyPeer {
            namespace_selector: Some(match_labels(&[(NAMESPACE_NAME_LABEL, operator_namespace)])),
            pod_selector: Some(match_labels(&[(labels::NAME, OPERATOR_APP_NAME)])),
            ..NetworkPolicyPeer::default()
        },
    ];
    if let Some(clients) = &spec.client_selector {
        valkey_from.push(NetworkPolicyPeer {
            pod_selector: Some(clients.clone()),
            namespace_selector: spec.client_namespace_selector.clone(),
            ..NetworkPolicyPeer::default()
        });
    }
    let port = |number: i32| {
        Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(number)),
            protocol: Some("TCP".to_owned()),
            ..NetworkPolicyPort::default()
        }])
    };
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(valkey_from),
        ports: port(PORT),
    }];
    if valkey.spec.metrics.enabled
        && let Some(monitoring) = &spec.metrics_namespace_selector
    {
        ingress.push(NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(monitoring.clone()),
                ..NetworkPolicyPeer::default()
            }]),
            ports: port(defaults::METRICS_PORT),
        });
    }
    Ok(Some(NetworkPolicy {
        metadata: instance.meta(instance.names.network_policy()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(instance.selector()),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(ingress),
            egress: None,
        }),
    }))
}
