//! `<name>-config`: valkey.conf, the start script, and which pod starts as primary. No secrets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::conf::{
    self, CLI_SH_KEY, INITIALIZED_KEY, MIN_REPLICAS_KEY, PRIMARY_KEY, START_SH_KEY, VALKEY_CONF_KEY,
};
use super::instance::Instance;
use super::{BuildError, Facts, primary_pod};
use crate::api::Valkey;

/// The ConfigMap; `primary` is the pod that takes writes (pod 0 when none is known yet),
/// `initialized` arms the boot guard, `min-replicas-to-write` is the fencing pods start with.
/// None of the three rolls the pods when it changes: start.sh reads them at every start.
pub fn config_map(valkey: &Valkey, facts: &Facts) -> Result<ConfigMap, BuildError> {
    let instance = Instance::new(valkey)?;
    let primary = primary_pod(&instance, facts.primary.as_deref())?;
    // The guard only matters where a replica can hold the data; a standalone pod that lost its
    // data has nothing better to start from.
    let initialized = facts.initialized && valkey.spec.replicas > 1;
    Ok(ConfigMap {
        metadata: instance.meta(instance.names.config_map()),
        data: Some(BTreeMap::from([
            (VALKEY_CONF_KEY.to_owned(), conf::valkey_conf(&instance)?),
            (START_SH_KEY.to_owned(), conf::start_sh(&instance)),
            (CLI_SH_KEY.to_owned(), conf::cli_sh(&instance)),
            (PRIMARY_KEY.to_owned(), primary),
            (INITIALIZED_KEY.to_owned(), initialized.to_string()),
            (
                MIN_REPLICAS_KEY.to_owned(),
                valkey.spec.min_replicas_to_write().to_string(),
            ),
        ])),
        ..ConfigMap::default()
    })
}
