//! Why a reconcile could not finish. Every message is written to `status.error` and to a Warning
//! event, so it says what is wrong and what to do, and never carries a secret.

use crate::desired::BuildError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the Valkey has no namespace; it is a namespaced resource")]
    NotNamespaced,

    #[error(
        "Secret {namespace}/{name} (spec.passwordSecret) not found: create it with a {key:?} key, or remove spec.passwordSecret to let the operator generate a password"
    )]
    PasswordSecretMissing {
        namespace: String,
        name: String,
        key: String,
    },

    #[error(
        "Secret {namespace}/{name} has no key {key:?}: add it, or point spec.passwordSecret.key at the key that holds the password"
    )]
    PasswordKeyMissing {
        namespace: String,
        name: String,
        key: String,
    },

    #[error(
        "the password in Secret {namespace}/{name} (key {key:?}) is not valid UTF-8 text: store it as text"
    )]
    PasswordNotText {
        namespace: String,
        name: String,
        key: String,
    },

    #[error(
        "cannot grow volume {claim} to {size} (spec.volume.storage): {source}; use a StorageClass with allowVolumeExpansion: true"
    )]
    VolumeResize {
        claim: String,
        size: String,
        source: kube::Error,
    },

    #[error(
        "cannot grow the volumes from {from} to {to} (spec.volume.storage): StorageClass {class} does not allow volume expansion; nothing was changed: set spec.volume.storage back to {from}, or enable allowVolumeExpansion on the class if its driver supports it"
    )]
    VolumeExpansionNotAllowed {
        class: String,
        from: String,
        to: String,
    },

    #[error(
        "Secret {namespace}/{name} exists, but had no password the operator could read when this reconcile began (created meanwhile, or its key emptied); the operator reads it again. If this stays, delete the Secret and the operator generates a new password"
    )]
    GeneratedSecretExists { namespace: String, name: String },

    #[error("failover: {0}")]
    Failover(String),

    #[error("{0}")]
    Build(#[from] BuildError),

    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// A short CamelCase reason for events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NotNamespaced => "NotNamespaced",
            Error::PasswordSecretMissing { .. } => "PasswordSecretMissing",
            Error::PasswordKeyMissing { .. } => "PasswordKeyMissing",
            Error::PasswordNotText { .. } => "PasswordNotText",
            Error::VolumeResize { .. } => "VolumeResizeFailed",
            Error::VolumeExpansionNotAllowed { .. } => "VolumeExpansionNotAllowed",
            Error::GeneratedSecretExists { .. } => "GeneratedSecretExists",
            Error::Failover(_) => "FailoverFailed",
            Error::Build(e) => e.reason(),
            Error::Kube(_) => "KubernetesApiError",
        }
    }

    /// Whether trying again alone may get past this error: the API server busy, unreachable or
    /// in conflict, a Secret created meanwhile, a pod that did not answer. Such an error leaves
    /// the phase to what the pods say (a serving instance stays Running) and shows in the
    /// `Reconciled` condition; any other error needs a change first (the spec, a Secret, RBAC, a
    /// StorageClass) and makes the instance `Failed`.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kube(e) | Error::VolumeResize { source: e, .. } => kube_error_is_transient(e),
            Error::GeneratedSecretExists { .. } | Error::Failover(_) => true,
            _ => false,
        }
    }
}

/// 409 Conflict, 429 Too Many Requests, 5xx, and failures to get an answer at all (connection,
/// timeout, a stream cut) pass with time; other answers (403 Forbidden, 404, 422 Invalid) and
/// local faults (a request or response that does not serialize, credentials) do not.
fn kube_error_is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..=599),
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::HttpError(_) => true,
        _ => false,
    }
}
