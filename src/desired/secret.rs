//! The password Secret the operator generates, and the ACL Secret it renders from the password.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use super::conf::{self, AUTH_CONF_KEY, OLD_PASSWORD_KEY, PASSWORD_KEY};
use super::instance::Instance;
use super::{BuildError, Facts, check_metrics_password, check_password};
use crate::api::names::ROTATION_STARTED_ANNOTATION;
use crate::api::{Valkey, defaults};

/// `<name>-auth` holding `password`, or `None` when `spec.passwordSecret` names the user's own.
///
/// The apply layer must create it only if absent and never update it: it is the only copy of a
/// generated password, and users may rotate it themselves.
pub fn generated_secret(valkey: &Valkey, password: &str) -> Result<Option<Secret>, BuildError> {
    let instance = Instance::new(valkey)?;
    if valkey.spec.password_secret.is_some() {
        return Ok(None);
    }
    check_password(&instance, password)?;
    Ok(Some(secret(
        &instance,
        instance.names.generated_secret(),
        defaults::PASSWORD_KEY,
        password,
    )))
}

/// Key of `<name>-operator` holding the operator user's password.
pub const OPERATOR_PASSWORD_KEY: &str = "password";

/// `<name>-operator` holding the password of the operator's own ACL user.
///
/// Like the generated password, the apply layer creates it only if absent and never updates it.
pub fn operator_secret(valkey: &Valkey, operator_password: &str) -> Result<Secret, BuildError> {
    let instance = Instance::new(valkey)?;
    check_password(&instance, operator_password)?;
    Ok(secret(
        &instance,
        instance.names.operator_secret(),
        OPERATOR_PASSWORD_KEY,
        operator_password,
    ))
}

/// Key of `<name>-metrics-auth` holding the metrics user's password.
pub const METRICS_PASSWORD_KEY: &str = "password";

/// `<name>-metrics-auth` holding the password of the exporter's ACL user (spec.metrics), or
/// `None` when metrics are off. Like the generated password, the apply layer creates it only if
/// absent and never updates it; it stays when metrics are turned off (and goes with the Valkey).
pub fn metrics_secret(
    valkey: &Valkey,
    metrics_password: &str,
) -> Result<Option<Secret>, BuildError> {
    let instance = Instance::new(valkey)?;
    if !valkey.spec.metrics.enabled {
        return Ok(None);
    }
    check_password(&instance, metrics_password)?;
    Ok(Some(secret(
        &instance,
        instance.names.metrics_secret(),
        METRICS_PASSWORD_KEY,
        metrics_password,
    )))
}

/// `<name>-acl` holding `auth.conf`, which valkey.conf includes: the ACL and the replication
/// credentials, and `password` and `old-password`, the instance user's passwords the pods accept
/// (for the probes and `kubectl valkey cli`). A Secret, not the ConfigMap, because it contains the passwords.
///
/// While a password rotation runs (`facts.old_password`) auth.conf carries both passwords, and
/// the annotation [`ROTATION_STARTED_ANNOTATION`] says since when: the Secret is the operator's
/// record of the rotation, so it survives a restart of the operator.
pub fn acl_secret(valkey: &Valkey, facts: &Facts) -> Result<Secret, BuildError> {
    let instance = Instance::new(valkey)?;
    check_password(&instance, &facts.password)?;
    check_password(&instance, &facts.operator_password)?;
    check_metrics_password(&instance, facts)?;
    let old = facts.old_password.as_deref();
    if let Some(old) = old {
        check_password(&instance, old)?;
    }
    let mut secret = secret(
        &instance,
        instance.names.acl_secret(),
        AUTH_CONF_KEY,
        &conf::auth_conf(
            &instance,
            &facts.password,
            old,
            &facts.operator_password,
            &facts.metrics_password,
        ),
    );
    if let Some(data) = secret.data.as_mut() {
        data.insert(
            PASSWORD_KEY.to_owned(),
            ByteString(facts.password.as_bytes().to_vec()),
        );
        data.insert(
            OLD_PASSWORD_KEY.to_owned(),
            ByteString(old.unwrap_or_default().as_bytes().to_vec()),
        );
    }
    if let Some(started) = &facts.rotation_started {
        secret
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ROTATION_STARTED_ANNOTATION.to_owned(), started.clone());
    }
    Ok(secret)
}

fn secret(instance: &Instance, name: String, key: &str, value: &str) -> Secret {
    Secret {
        metadata: instance.meta(name),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            key.to_owned(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}
