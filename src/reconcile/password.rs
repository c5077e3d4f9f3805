//! Where the instance's password comes from: the user's Secret (spec.passwordSecret), or the
//! Secret the operator generated once and never overwrites.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};

use super::Error;
use crate::api::names::ObjectNames;
use crate::api::{Valkey, defaults};
use crate::desired;

/// The password, and whether it was just generated (so its Secret must be created).
pub struct Credentials {
    pub password: String,
    pub generate: bool,
    /// The resourceVersion of the Secret it was read from (none when just generated).
    pub resource_version: Option<String>,
}

pub async fn resolve(
    client: &Client,
    valkey: &Valkey,
    namespace: &str,
) -> Result<Credentials, Error> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let (name, key, user_supplied) = match &valkey.spec.password_secret {
        Some(r) => (r.name.clone(), r.key.clone(), true),
        None => (
            ObjectNames::new(&valkey.name_any()).generated_secret(),
            defaults::PASSWORD_KEY.to_owned(),
            false,
        ),
    };
    let located =
        |e: fn(String, String, String) -> Error| e(namespace.to_owned(), name.clone(), key.clone());
    let Some(secret) = secrets.get_opt(&name).await? else {
        if user_supplied {
            return Err(located(|namespace, name, key| {
                Error::PasswordSecretMissing {
                    namespace,
                    name,
                    key,
                }
            }));
        }
        return Ok(Credentials {
            password: desired::generate_password()?,
            generate: true,
            resource_version: None,
        });
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(&key))
                .map(|s| s.clone().into_bytes())
        });
    let Some(bytes) = bytes else {
        return Err(located(|namespace, name, key| Error::PasswordKeyMissing {
            namespace,
            name,
            key,
        }));
    };
    let password = String::from_utf8(bytes).map_err(|_| {
        located(|namespace, name, key| Error::PasswordNotText {
            namespace,
            name,
            key,
        })
    })?;
    Ok(Credentials {
        password,
        generate: false,
        resource_version: secret.metadata.resource_version.clone(),
    })
}

/// The password of the operator's own ACL user, from `<name>-operator`, or a new one (the
/// Secret is then created, and never overwritten).
pub async fn resolve_operator(
    client: &Client,
    valkey: &Valkey,
    namespace: &str,
) -> Result<Credentials, Error> {
    let name = ObjectNames::new(&valkey.name_any()).operator_secret();
    resolve_generated(client, namespace, &name, desired::OPERATOR_PASSWORD_KEY).await
}

/// The password of the metrics exporter's ACL user, from `<name>-metrics-auth`, or a new one;
/// none (and no read) while spec.metrics is off.
pub async fn resolve_metrics(
    client: &Client,
    valkey: &Valkey,
    namespace: &str,
) -> Result<Credentials, Error> {
    if !valkey.spec.metrics.enabled {
        return Ok(Credentials {
            password: String::new(),
            generate: false,
            resource_version: None,
        });
    }
    let name = ObjectNames::new(&valkey.name_any()).metrics_secret();
    resolve_generated(client, namespace, &name, desired::METRICS_PASSWORD_KEY).await
}

/// A password the operator generates into Secret `name` (key `key`) once: the one there, or a
/// new one when there is none.
async fn resolve_generated(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Credentials, Error> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let password = secrets
        .get_opt(name)
        .await?
        .and_then(|s| s.data)
        .and_then(|d| d.get(key).cloned())
        .and_then(|b| String::from_utf8(b.0).ok())
        .filter(|p| !p.is_empty());
    Ok(match password {
        Some(password) => Credentials {
            password,
            generate: false,
            resource_version: None,
        },
        // Absent (or emptied by hand): a new one. create_if_absent leaves an existing Secret
        // alone, so an emptied one must be deleted to be replaced.
        None => Credentials {
            password: desired::generate_password()?,
            generate: true,
            resource_version: None,
        },
    })
}
