//! Growing the volumes of a running instance. A StatefulSet's claim template cannot change, so
//! a larger spec.volume.storage is carried out in two moves: each existing claim is resized in
//! place (the storage driver grows the volume), then the StatefulSet is deleted with its pods
//! orphaned, and the next apply re-creates it with the new template and adopts the same pods.

use k8s_openapi::api::apps::v1::StatefulSet;
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::info;

use super::{Change, Error};
use crate::api::Valkey;
use crate::api::names;
use crate::apply::Outcome;
use crate::desired::quantity::quantity_millis;
use crate::status::claim_template_size;

/// What resizing did: the changes, and whether the StatefulSet is gone for now (so it must not
/// be applied until its deletion is finished and the next reconcile re-creates it).
pub struct Resize {
    pub changes: Vec<Change>,
    pub statefulset_replaced: bool,
}

/// Grows every claim of the instance to spec.volume.storage when the live claim template is
/// smaller. Shrinking never reaches here: the API server refuses it.
pub async fn grow(
    statefulsets: &Api<StatefulSet>,
    claims: &Api<PersistentVolumeClaim>,
    storage_classes: &Api<StorageClass>,
    valkey: &Valkey,
    desired: &StatefulSet,
) -> Result<Resize, Error> {
    let mut resize = Resize {
        changes: Vec::new(),
        statefulset_replaced: false,
    };
    let Some(want) = claim_template_size(desired) else {
        return Ok(resize);
    };
    let Some(live) = statefulsets.get_opt(&desired.name_any()).await? else {
        return Ok(resize);
    };
    if live.metadata.deletion_timestamp.is_some() {
        resize.statefulset_replaced = true;
        return Ok(resize);
    }
    let Some(have) = claim_template_size(&live) else {
        return Ok(resize);
    };
    if !is_larger(&want, &have) {
        return Ok(resize);
    }
    let selector = names::instance_selector(&valkey.name_any());
    let instance_claims = claims
        .list(&ListParams::default().labels(&selector))
        .await?;
    check_expansion_allowed(storage_classes, &instance_claims.items, &have, &want).await?;
    for claim in instance_claims {
        let current = claim_request(&claim).unwrap_or_default();
        if !is_larger(&want, &current) {
            continue;
        }
        let name = claim.name_any();
        let patch = json!({"spec": {"resources": {"requests": {"storage": want}}}});
        claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::VolumeResize {
                claim: name.clone(),
                size: want.clone(),
                source,
            })?;
        info!(claim = %name, from = %current, to = %want, "resized volume");
        resize.changes.push(Change::named(
            "PersistentVolumeClaim",
            &name,
            Outcome::Updated,
        ));
    }
    statefulsets
        .delete(
            &live.name_any(),
            &DeleteParams {
                propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await?;
    info!(statefulset = %live.name_any(), "replacing the StatefulSet (pods kept) to change its claim template");
    resize.changes.push(Change::named(
        "StatefulSet",
        &live.name_any(),
        Outcome::Deleted,
    ));
    resize.statefulset_replaced = true;
    Ok(resize)
}

/// Refuses a growth the StorageClass of the claims would refuse, before any claim is touched, so
/// the instance is not left with some claims grown and a StatefulSet that cannot follow. A class
/// that cannot be read is not judged here: the API server refuses the resize itself then.
async fn check_expansion_allowed(
    storage_classes: &Api<StorageClass>,
    claims: &[PersistentVolumeClaim],
    from: &str,
    to: &str,
) -> Result<(), Error> {
    let classes: BTreeSet<String> = claims
        .iter()
        .filter_map(|c| c.spec.as_ref()?.storage_class_name.clone())
        .filter(|c| !c.is_empty())
        .collect();
    for class in classes {
        let Some(storage_class) = storage_classes.get_opt(&class).await? else {
            continue;
        };
        if storage_class.allow_volume_expansion != Some(true) {
            return Err(Error::VolumeExpansionNotAllowed {
                class,
                from: from.to_owned(),
                to: to.to_owned(),
            });
        }
    }
    Ok(())
}

fn claim_request(claim: &PersistentVolumeClaim) -> Option<String> {
    let requests = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    requests.get("storage").map(|q| q.0.clone())
}

fn is_larger(a: &str, b: &str) -> bool {
    match (quantity_millis(a), quantity_millis(b)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}
