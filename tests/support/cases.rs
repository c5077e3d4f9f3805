//! The table of invalid Valkey objects in tests/fixtures/validation-cases.yaml.

use serde::Deserialize;
use serde_json::{Value, json};

use super::cluster::repo_root;

#[derive(Debug, Deserialize)]
pub struct Case {
    pub case: String,
    /// The field the error must name.
    pub field: String,
    #[serde(default)]
    pub local: bool,
    #[serde(default = "default_name")]
    pub name: String,
    pub spec: Value,
    #[serde(default, rename = "oldSpec")]
    pub old_spec: Option<Value>,
}

fn default_name() -> String {
    "cache".into()
}

impl Case {
    pub fn object(&self) -> Value {
        valkey_object(&self.name, self.spec.clone())
    }

    pub fn old_object(&self) -> Option<Value> {
        self.old_spec
            .clone()
            .map(|spec| valkey_object(&self.name, spec))
    }
}

pub fn valkey_object(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "database.kuberly.io/v1alpha1",
        "kind": "Valkey",
        "metadata": {"name": name},
        "spec": spec,
    })
}

pub fn load() -> Vec<Case> {
    let path = repo_root().join("tests/fixtures/validation-cases.yaml");
    let text = std::fs::read_to_string(path).expect("reading validation-cases.yaml");
    yaml_serde::from_str(&text).expect("parsing validation-cases.yaml")
}

/// The documented examples, as (file name, object).
pub fn examples() -> Vec<(String, Value)> {
    let dir = repo_root().join("docs/examples");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("reading docs/examples")
        .map(|e| e.expect("listing docs/examples").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("reading an example");
            let value: Value = yaml_serde::from_str(&text).expect("parsing an example");
            (
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                value,
            )
        })
        .collect()
}
