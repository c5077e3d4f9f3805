//! What every object of one Valkey shares: its identity, labels and owner reference.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;

use super::BuildError;
use crate::api::Valkey;
use crate::api::names::{APP_NAME, MANAGED_BY, ObjectNames, labels};

/// A Valkey that can own objects: it has a namespace and a uid.
pub(crate) struct Instance<'a> {
    pub valkey: &'a Valkey,
    pub name: &'a str,
    pub namespace: &'a str,
    pub names: ObjectNames<'a>,
    owner: OwnerReference,
}

impl<'a> Instance<'a> {
    pub fn new(valkey: &'a Valkey) -> Result<Self, BuildError> {
        let name = valkey.metadata.name.as_deref().unwrap_or_default();
        let missing = |field| BuildError::MissingMetadata {
            name: name.to_owned(),
            field,
        };
        if name.is_empty() {
            return Err(missing("name"));
        }
        let namespace = valkey
            .metadata
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .ok_or_else(|| missing("namespace"))?;
        let owner = valkey
            .controller_owner_ref(&())
            .filter(|o| !o.uid.is_empty())
            .ok_or_else(|| missing("uid"))?;
        Ok(Self {
            valkey,
            name,
            namespace,
            names: ObjectNames::new(name),
            owner: OwnerReference {
                // Garbage collection then waits for children, so a foreground delete of the
                // Valkey cannot leave pods running without their owner.
                block_owner_deletion: Some(true),
                ..owner
            },
        })
    }

    /// Labels that select the instance's pods (the StatefulSet selector, which is immutable, so
    /// it stays minimal).
    pub fn selector_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::NAME.to_owned(), APP_NAME.to_owned()),
            (labels::INSTANCE.to_owned(), self.name.to_owned()),
        ])
    }

    pub fn selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(self.selector_labels()),
            ..LabelSelector::default()
        }
    }

    /// Selector of the instance's pods that have one role (the role label is on pods only).
    pub fn role_selector(&self, role: &str) -> BTreeMap<String, String> {
        let mut selector = self.selector_labels();
        selector.insert(labels::ROLE.to_owned(), role.to_owned());
        selector
    }

    /// Labels on every object of the instance.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.selector_labels();
        labels.insert(labels::MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
        labels
    }

    pub fn meta(&self, name: String) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.to_owned()),
            labels: Some(self.labels()),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}
