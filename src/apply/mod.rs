//! Writing the built objects to the cluster: server-side apply with the operator's field manager,
//! skipped entirely when the live object already says everything the desired one says and was
//! last applied from the same desired object, so an idle operator makes no API writes.
//!
//! Containment alone cannot see a removal: a field the operator applied once and no longer wants
//! (a nodeSelector taken out of the spec) is still on the live object, so the live object still
//! "contains" the desired one. Each applied object therefore carries the fingerprint of what was
//! applied ([`APPLIED_ANNOTATION`]); a different fingerprint means the desired object changed, and
//! the apply lets server-side apply drop the fields the operator no longer sets.

mod subset;

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use sha2::{Digest, Sha256};

use crate::api::names::{self, FIELD_MANAGER};

pub use subset::is_subset;

/// Annotation on every applied object: a fingerprint (sha256, hex) of the object the operator
/// applied, computed without Secret data so no password material is derived into metadata.
pub const APPLIED_ANNOTATION: &str = "database.kuberly.io/applied";

/// What applying one object did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Updated,
    Unchanged,
    Deleted,
}

impl Outcome {
    pub fn changed(self) -> bool {
        self != Outcome::Unchanged
    }
}

/// The result of an apply: what happened and the object as the API server now has it.
pub struct Applied<K> {
    pub outcome: Outcome,
    pub object: K,
    /// The object before the apply, when it existed.
    pub previous: Option<K>,
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Makes the object named like `desired` match it. The caller's `desired` must carry a name.
pub async fn apply<K>(api: &Api<K>, desired: &K) -> Result<Applied<K>, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = desired.name_any();
    let desired = fingerprinted(to_json(desired)?);
    let live = api.get_opt(&name).await?;
    let outcome = match &live {
        Some(live) if up_to_date(&desired, &to_json(live)?) => {
            return Ok(Applied {
                outcome: Outcome::Unchanged,
                object: live.clone(),
                previous: Some(live.clone()),
            });
        }
        Some(_) => Outcome::Updated,
        None => Outcome::Created,
    };
    let object = api
        .patch(&name, &apply_params(), &Patch::Apply(&desired))
        .await?;
    Ok(Applied {
        outcome,
        object,
        previous: live,
    })
}

/// Whether `live` was applied from this very desired object and still says all of it.
pub fn up_to_date(desired: &serde_json::Value, live: &serde_json::Value) -> bool {
    let fingerprint = |v: &serde_json::Value| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(APPLIED_ANNOTATION))
            .cloned()
    };
    fingerprint(desired).is_some()
        && fingerprint(desired) == fingerprint(live)
        && is_subset(desired, live)
}

/// `desired` with its [`APPLIED_ANNOTATION`] set.
pub fn fingerprinted(mut desired: serde_json::Value) -> serde_json::Value {
    let fingerprint = fingerprint(&desired);
    if let Some(metadata) = desired.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(APPLIED_ANNOTATION.to_owned(), fingerprint.into());
        }
    }
    desired
}

fn fingerprint(desired: &serde_json::Value) -> String {
    let mut hashed = desired.clone();
    if let Some(object) = hashed.as_object_mut() {
        object.remove("data");
        object.remove("stringData");
        if let Some(annotations) = object
            .get_mut("metadata")
            .and_then(|m| m.get_mut("annotations"))
            .and_then(|a| a.as_object_mut())
        {
            annotations.remove(APPLIED_ANNOTATION);
        }
    }
    // serde_json's maps are ordered by key, so equal objects serialize to equal bytes.
    let digest = Sha256::digest(hashed.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates the object unless one of that name exists; an existing one is never changed (a
/// generated password must survive every reconcile).
pub async fn create_if_absent<K>(api: &Api<K>, desired: &K) -> Result<Outcome, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + Serialize + DeserializeOwned,
{
    match api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            desired,
        )
        .await
    {
        Ok(_) => Ok(Outcome::Created),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Outcome::Unchanged),
        Err(e) => Err(e),
    }
}

/// Deletes the named object if it exists and the operator manages it (never a user's object
/// that happens to share the name).
pub async fn delete_managed<K>(api: &Api<K>, name: &str) -> Result<Outcome, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
{
    let Some(live) = api.get_opt(name).await? else {
        return Ok(Outcome::Unchanged);
    };
    let managed = live
        .labels()
        .get(names::labels::MANAGED_BY)
        .is_some_and(|v| v == names::MANAGED_BY);
    if !managed {
        return Ok(Outcome::Unchanged);
    }
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(Outcome::Deleted),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Outcome::Unchanged),
        Err(e) => Err(e),
    }
}

fn to_json<K: Serialize>(object: &K) -> Result<serde_json::Value, kube::Error> {
    serde_json::to_value(object).map_err(kube::Error::SerdeError)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn statefulset(node_selector: Option<serde_json::Value>) -> serde_json::Value {
        let mut spec = json!({"replicas": 3});
        if let Some(selector) = node_selector {
            spec["template"] = json!({"spec": {"nodeSelector": selector}});
        }
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": "cache"}, "spec": spec})
    }

    #[test]
    fn an_object_applied_from_the_same_desired_object_is_up_to_date() {
        let desired = fingerprinted(statefulset(Some(json!({"disk": "ssd"}))));
        let mut live = desired.clone();
        live["spec"]["revisionHistoryLimit"] = json!(10);
        assert!(up_to_date(&desired, &live));
    }

    #[test]
    fn a_field_removed_from_the_desired_object_is_not_up_to_date() {
        let before = fingerprinted(statefulset(Some(json!({"disk": "ssd"}))));
        let after = fingerprinted(statefulset(None));
        // The live object still says everything the new desired object says (but for the
        // fingerprint), so containment alone would skip the apply and keep the nodeSelector.
        let mut unfingerprinted = after.clone();
        unfingerprinted["metadata"]["annotations"] = json!({});
        assert!(is_subset(&unfingerprinted, &before));
        // It was applied from another desired object: applied again, SSA drops the field.
        assert!(!up_to_date(&after, &before));
    }

    #[test]
    fn an_object_without_a_fingerprint_is_applied_once() {
        let desired = fingerprinted(statefulset(None));
        assert!(!up_to_date(&desired, &statefulset(None)));
    }

    #[test]
    fn the_fingerprint_ignores_secret_data() {
        let secret = |password: &str| {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                   "stringData": {"password": password}})
        };
        let a = fingerprinted(secret("one"));
        let b = fingerprinted(secret("two"));
        assert_eq!(
            a["metadata"]["annotations"][APPLIED_ANNOTATION],
            b["metadata"]["annotations"][APPLIED_ANNOTATION]
        );
        // A changed password is still seen, by containment.
        assert!(!up_to_date(&b, &a));
    }
}
