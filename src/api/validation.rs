//! Client-side evaluation of the CRD's own rules (its CEL `x-kubernetes-validations`), so the
//! plugin can refuse bad input before it calls the API server, with the API server's words.

use kube::CustomResourceExt;
use kube::core::cel::{ValidationError, Validator};

use super::Valkey;

/// One rule a Valkey breaks: the field and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() || self.message.starts_with(&self.field) {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl From<&ValidationError> for Violation {
    fn from(e: &ValidationError) -> Self {
        Self {
            field: e.field_path.clone(),
            message: e.message.clone(),
        }
    }
}

/// Checks a Valkey (as JSON, so that defaults are applied as the API server applies them) against
/// the CRD's rules; `old` is the stored object for an update, whose transition rules then apply.
pub fn violations(valkey: &serde_json::Value, old: Option<&serde_json::Value>) -> Vec<Violation> {
    let crd = Valkey::crd();
    let Some(schema) = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
    else {
        return vec![Violation {
            field: String::new(),
            message: "the Valkey CRD has no schema (a bug in valkey-operator)".into(),
        }];
    };
    match Validator::new().validate(&schema, valkey, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(Violation::from).collect(),
    }
}

/// Checks a typed Valkey; see [`violations`].
pub fn validate(valkey: &Valkey, old: Option<&Valkey>) -> Vec<Violation> {
    let to_json = |v: &Valkey| serde_json::to_value(v).unwrap_or_default();
    let old = old.map(to_json);
    violations(&to_json(valkey), old.as_ref())
}
