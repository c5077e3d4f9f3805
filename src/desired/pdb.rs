//! The PodDisruptionBudget: voluntary evictions (node drains) take one pod at a time.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::BuildError;
use super::instance::Instance;
use crate::api::Valkey;

/// `Some` only with replicas: a lone pod under `maxUnavailable: 1` gains nothing, and under
/// `maxUnavailable: 0` it would block every node drain.
pub fn pod_disruption_budget(valkey: &Valkey) -> Result<Option<PodDisruptionBudget>, BuildError> {
    let instance = Instance::new(valkey)?;
    if valkey.spec.replicas <= 1 {
        return Ok(None);
    }
    Ok(Some(PodDisruptionBudget {
        metadata: instance.meta(instance.names.pod_disruption_budget()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(instance.selector()),
            // A pod that is not ready serves nothing; letting drains evict it avoids a stuck
            // pod blocking node maintenance forever.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".to_owned()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }))
}
