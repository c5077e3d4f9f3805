//! Why the desired objects of a Valkey cannot be built.

use crate::api::directives::ConfigProblem;

/// Each variant names the field at fault; most mean the object skipped the CRD's own validation
/// (an old CRD, or the status/uid not read from the API server), so they are reported, not retried.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "Valkey {name} has no metadata.{field}: build its objects from the object the API server returned"
    )]
    MissingMetadata { name: String, field: &'static str },

    #[error("the password of Valkey {0} is empty: put a non-empty password in its password Secret")]
    EmptyPassword(String),

    #[error("spec.config.{key}: {reason}")]
    InvalidConfig { key: String, reason: &'static str },

    /// Entries valkey-server would refuse at boot (see [`crate::api::directives`]); never empty.
    #[error("{}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    RefusedConfig { problems: Vec<ConfigProblem> },

    #[error("spec.resource.memory {0:?} is not a positive memory quantity, e.g. 512Mi")]
    InvalidMemory(String),

    #[error(
        "the primary {primary:?} is not a pod of Valkey {instance} (expected {instance}-<ordinal>)"
    )]
    InvalidPrimary { primary: String, instance: String },

    #[error("cannot read random bytes from the operating system for a password: {0}")]
    Random(#[from] getrandom::Error),
}

impl BuildError {
    /// A short CamelCase reason for events and conditions, naming who is at fault.
    pub fn reason(&self) -> &'static str {
        match self {
            // The spec is fine; the user's (or the generated) Secret holds an empty password.
            BuildError::EmptyPassword(_) => "PasswordSecretInvalid",
            BuildError::RefusedConfig { problems } => problems
                .first()
                .map(ConfigProblem::reason)
                .unwrap_or("InvalidSpec"),
            BuildError::Random(_) => "PasswordGenerationFailed",
            // The operator's own record of the primary, not the user's spec.
            BuildError::InvalidPrimary { .. } => "InvalidPrimary",
            BuildError::MissingMetadata { .. }
            | BuildError::InvalidConfig { .. }
            | BuildError::InvalidMemory(_) => "InvalidSpec",
        }
    }
}
