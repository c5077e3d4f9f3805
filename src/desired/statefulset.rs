//! The StatefulSet: one pod per `spec.replicas`, each with its own volume and DNS name.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::instance::Instance;
use super::{BuildError, Facts, check_metrics_password, check_password, pod};
use crate::api::Valkey;
use crate::api::names::DATA_VOLUME;

/// Name of the valkey container (what `kubectl exec -c` and the plugin use).
pub const CONTAINER: &str = "valkey";
/// Name of the Valkey port on the container and the Services.
pub const PORT_NAME: &str = "valkey";

/// `spec.replicas`, except while a scale-down would remove the primary's pod: the StatefulSet
/// keeps that pod until the operator has handed the role over to a pod that stays (a planned
/// switchover, see `failover::decide`), so a scale-down never deletes the only pod that takes
/// writes, nor leaves the remaining pods following a primary that is gone.
pub fn pod_count(valkey: &Valkey, facts: &Facts) -> i32 {
    let replicas = valkey.spec.replicas;
    let name = valkey.metadata.name.as_deref().unwrap_or_default();
    let primary_ordinal = facts
        .primary
        .as_deref()
        .and_then(|p| crate::api::names::pod_ordinal(name, p));
    match primary_ordinal {
        Some(ordinal) if replicas > 0 && ordinal >= replicas => ordinal + 1,
        _ => replicas,
    }
}

/// The StatefulSet; the passwords only feed the config hash (they appear nowhere in the object).
pub fn statefulset(valkey: &Valkey, facts: &Facts) -> Result<StatefulSet, BuildError> {
    let instance = Instance::new(valkey)?;
    check_password(&instance, &facts.password)?;
    check_password(&instance, &facts.operator_password)?;
    check_metrics_password(&instance, facts)?;
    let volume = &valkey.spec.volume;
    Ok(StatefulSet {
        metadata: instance.meta(instance.names.statefulset()),
        spec: StatefulSetSpec {
            replicas: Some(pod_count(valkey, facts)),
            selector: instance.selector(),
            service_name: Some(instance.names.headless_service()),
            // Which pod is primary comes from the ConfigMap, not from start order, so pods need
            // not wait for each other; OrderedReady would also hold back every higher ordinal
            // behind one pod that cannot become ready.
            pod_management_policy: Some("Parallel".to_owned()),
            // The operator restarts the pods itself on a template change, replicas first and
            // the primary last after a switchover (`rollout`), so the role moves once.
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                rolling_update: None,
            }),
            template: pod::template(&instance, facts)?,
            volume_claim_templates: volume
                .enabled
                .then(|| vec![volume_claim_template(&instance)]),
            persistent_volume_claim_retention_policy: volume.enabled.then(|| {
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(volume.reclaim_policy.as_str().to_owned()),
                    // Scaling down and up again picks the data back up.
                    when_scaled: Some("Retain".to_owned()),
                }
            }),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    })
}

fn volume_claim_template(instance: &Instance) -> PersistentVolumeClaim {
    let volume = &instance.valkey.spec.volume;
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.to_owned()),
            // The StatefulSet controller copies these onto each claim, so claims can be found
            // (and cleaned up) by the instance selector.
            labels: Some(instance.labels()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: volume.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(volume.storage.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}
