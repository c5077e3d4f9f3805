//! Writing the built objects to the cluster: server-side apply with the operator's field manager,
//! skipped entirely when the live object already says everything the desired one says, so an
//! idle operator makes no API writes.

mod subset;

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::names::{self, FIELD_MANAGER};

pub use subset::is_subset;

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
    let live = api.get_opt(&name).await?;
    if let Some(live) = live {
        if is_subset(&to_json(desired)?, &to_json(&live)?) {
            return Ok(Applied {
                outcome: Outcome::Unchanged,
                object: live.clone(),
                previous: Some(live),
            });
        }
        let object = api
            .patch(&name, &apply_params(), &Patch::Apply(desired))
            .await?;
        return Ok(Applied {
            outcome: Outcome::Updated,
            object,
            previous: Some(live),
        });
    }
    let object = api
        .patch(&name, &apply_params(), &Patch::Apply(desired))
        .await?;
    Ok(Applied {
        outcome: Outcome::Created,
        object,
        previous: None,
    })
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
