//! `<name>-config`: valkey.conf, the start script, and which pod starts as primary. No secrets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::conf::{self, PRIMARY_KEY, START_SH_KEY, VALKEY_CONF_KEY};
use super::instance::Instance;
use super::{BuildError, primary_pod};
use crate::api::Valkey;

/// The ConfigMap; `primary` is the pod that takes writes (pod 0 when none is known yet).
pub fn config_map(valkey: &Valkey, primary: Option<&str>) -> Result<ConfigMap, BuildError> {
    let instance = Instance::new(valkey)?;
    let primary = primary_pod(&instance, primary)?;
    Ok(ConfigMap {
        metadata: instance.meta(instance.names.config_map()),
        data: Some(BTreeMap::from([
            (VALKEY_CONF_KEY.to_owned(), conf::valkey_conf(&instance)?),
            (START_SH_KEY.to_owned(), conf::start_sh(&instance)),
            (PRIMARY_KEY.to_owned(), primary),
        ])),
        ..ConfigMap::default()
    })
}
