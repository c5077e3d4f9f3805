//! The ServiceMonitor of spec.metrics.serviceMonitor: applied where the Prometheus operator's
//! API is installed, deleted when no longer wanted; where the API is absent, nothing is retried
//! in a loop: the `ServiceMonitor` condition says why there is none.

use kube::{Api, Client};
use tracing::debug;

use super::{Change, Error};
use crate::api::Valkey;
use crate::api::names::ObjectNames;
use crate::apply;
use crate::desired::ServiceMonitor;
use crate::status::Monitoring;

/// API group/version and plural of the ServiceMonitor kind.
const MONITORING_API: &str = "monitoring.coreos.com/v1";
const SERVICE_MONITORS: &str = "servicemonitors";

/// Whether the API server serves monitoring.coreos.com/v1 servicemonitors (its CRD installed).
/// Asked at each reconcile that needs to know, so installing the CRD later is picked up by the
/// next reconcile (any change of the Valkey or its children, or the periodic resync).
pub async fn service_monitors_served(client: &Client) -> Result<bool, Error> {
    match client.list_api_group_resources(MONITORING_API).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == SERVICE_MONITORS)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Applies `desired` (or deletes the instance's ServiceMonitor when there is none to have), and
/// says what became of it when one is wanted.
pub async fn service_monitor(
    client: &Client,
    valkey: &Valkey,
    namespace: &str,
    desired: Option<&ServiceMonitor>,
    may_have_one: bool,
) -> Result<(Vec<Change>, Option<Monitoring>), Error> {
    let name =
        ObjectNames::new(valkey.metadata.name.as_deref().unwrap_or_default()).service_monitor();
    // Most instances never had a ServiceMonitor (no metrics): no discovery request for them.
    if desired.is_none() && !may_have_one {
        return Ok((Vec::new(), None));
    }
    let served = service_monitors_served(client).await?;
    let api = Api::<ServiceMonitor>::namespaced(client.clone(), namespace);
    let Some(desired) = desired else {
        if !served {
            return Ok((Vec::new(), None));
        }
        let outcome = apply::delete_managed(&api, &name).await?;
        return Ok((vec![Change::named("ServiceMonitor", &name, outcome)], None));
    };
    if !served {
        debug!(%name, "no ServiceMonitor API: not creating one");
        return Ok((Vec::new(), Some(Monitoring::api_missing(&name))));
    }
    let applied = apply::apply(&api, desired).await?;
    Ok((
        vec![Change::applied("ServiceMonitor", applied)],
        Some(Monitoring::created(&name)),
    ))
}
