//! The operator's install manifests, embedded at build time (see build.rs) in the order of
//! manifests/kustomization.yaml.

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

include!(concat!(env!("OUT_DIR"), "/manifests.rs"));

/// Every object of the manifests, in order.
pub fn objects() -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (file, text) in MANIFESTS {
        for document in yaml_serde::Deserializer::from_str(text) {
            let value = Value::deserialize(document)
                .with_context(|| format!("reading the embedded manifest {file}"))?;
            if !value.is_null() {
                objects.push(value);
            }
        }
    }
    Ok(objects)
}

/// The manifests as one multi-document YAML stream, comments kept.
pub fn yaml() -> String {
    MANIFESTS
        .iter()
        .map(|(file, text)| format!("# manifests/{file}\n{}", text.trim_end()))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// Where the manifests install the operator: (namespace, Deployment name).
pub fn operator_deployment() -> Option<(String, String)> {
    let objects = objects().ok()?;
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment")?;
    let metadata = &deployment["metadata"];
    Some((
        metadata["namespace"].as_str()?.to_owned(),
        metadata["name"].as_str()?.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_hold_the_crd_and_the_operator() {
        let objects = objects().unwrap_or_default();
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert!(kinds.contains(&"CustomResourceDefinition"), "{kinds:?}");
        assert_eq!(
            kinds.first(),
            Some(&"Namespace"),
            "the namespace comes first"
        );
        assert!(operator_deployment().is_some());
    }
}
