//! The rolling update's side of a reconcile: which template revision each pod runs, and the
//! restart of the pod `rollout::next_step` chose (a delete; the StatefulSet, whose update
//! strategy is `OnDelete`, recreates it from the newest template).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, ResourceExt};
use tracing::{debug, info};

use super::Error;

/// The label the StatefulSet controller puts on each pod: the revision of the template it was
/// created from.
const REVISION_LABEL: &str = "controller-revision-hash";

/// What the StatefulSet says about its pod templates.
pub enum Revisions<'a> {
    /// No StatefulSet yet: nothing to roll.
    None,
    /// It has not yet seen its newest spec: which template is newest is not known.
    Pending,
    /// Pods created from another revision than this one run an old template.
    Newest(&'a str),
}

impl<'a> Revisions<'a> {
    pub fn of(statefulset: Option<&'a StatefulSet>) -> Self {
        let Some(sts) = statefulset else {
            return Revisions::None;
        };
        let Some(status) = sts.status.as_ref() else {
            return Revisions::Pending;
        };
        match status.update_revision.as_deref() {
            Some(newest) if status.observed_generation >= sts.metadata.generation => {
                Revisions::Newest(newest)
            }
            _ => Revisions::Pending,
        }
    }

    pub fn pending(&self) -> bool {
        matches!(self, Revisions::Pending)
    }

    /// Whether `pod` runs an older template than the newest.
    pub fn outdated(&self, pod: &Pod) -> bool {
        match self {
            Revisions::Newest(newest) => {
                pod.labels().get(REVISION_LABEL).map(String::as_str) != Some(*newest)
            }
            Revisions::None | Revisions::Pending => false,
        }
    }
}

/// Deletes `name` (the pod observed, by uid: a namesake created meanwhile is left alone).
/// Returns whether this call deleted it.
pub async fn restart(api: &Api<Pod>, pods: &[Pod], name: &str) -> Result<bool, Error> {
    let Some(pod) = pods.iter().find(|p| p.name_any() == name) else {
        return Ok(false);
    };
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            info!(pod = %name, "restarted the pod for the rolling update");
            Ok(true)
        }
        // Gone already, or another pod of that name (409: the uid precondition failed).
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
            debug!(pod = %name, "pod gone before the rolling update restarted it");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
