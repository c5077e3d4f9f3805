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
            Error::Failover(_) => "FailoverFailed",
            Error::Build(e) => e.reason(),
            Error::Kube(_) => "KubernetesApiError",
        }
    }
}
