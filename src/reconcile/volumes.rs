//! Growing the volumes of a running instance. A StatefulSet's claim template cannot change, so
//! a larger spec.volume.storage is carried out in two moves: each existing claim is resized in
//! place (the storage driver grows the volume), then the StatefulSet is deleted with its pods
//! orphaned, and the next apply re-creates it with the new template and adopts the same pods.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::info;

use super::{Change, Error};
use crate::api::Valkey;
use crate::api::names::{self, DATA_VOLUME};
use crate::apply::Outcome;
use crate::desired::quantity::quantity_millis;

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
    valkey: &Valkey,
    desired: &StatefulSet,
) -> Result<Resize, Error> {
    let mut resize = Resize {
        changes: Vec::new(),
        statefulset_replaced: false,
    };
    let Some(want) = claim_size(desired) else {
        return Ok(resize);
    };
    let Some(live) = statefulsets.get_opt(&desired.name_any()).await? else {
        return Ok(resize);
    };
    if live.metadata.deletion_timestamp.is_some() {
        resize.statefulset_replaced = true;
        return Ok(resize);
    }
    let Some(have) = claim_size(&live) else {
        return Ok(resize);
    };
    if !is_larger(&want, &have) {
        return Ok(resize);
    }
    let selector = names::instance_selector(&valkey.name_any());
    for claim in claims
        .list(&ListParams::default().labels(&selector))
        .await?
    {
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

fn claim_size(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .volume_claim_templates
        .as_ref()?
        .iter()
        .find(|t| t.metadata.name.as_deref() == Some(DATA_VOLUME))
        .and_then(claim_request)
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
