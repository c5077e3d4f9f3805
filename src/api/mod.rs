//! The Valkey API: the custom resource, its defaults, and the names and labels derived from it.

pub mod defaults;
pub mod directives;
pub mod names;
#[cfg(feature = "cel")]
pub mod validation;
mod valkey;

pub use valkey::*;

use kube::CustomResourceExt;

/// The CustomResourceDefinition of `Valkey`, as YAML (what `valkey-operator crd` prints and
/// `manifests/crd.yaml` holds).
pub fn crd_yaml() -> Result<String, yaml_serde::Error> {
    yaml_serde::to_string(&Valkey::crd())
}
