//! `restart NAME`: a rolling restart through the operator. The plugin sets the annotation
//! `database.kuberly.io/restartedAt` on the Valkey; the operator copies it onto the pod template
//! and restarts the pods one at a time, the primary last after a planned switchover. The plugin
//! then watches the pods until every one carries the new value and is Ready, and the instance
//! runs.

use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use valkey_core::api::Valkey;
use valkey_core::api::names::{self, RESTARTED_AT_ANNOTATION};
use valkey_core::status;

use crate::cli::{GlobalArgs, RestartArgs};
use crate::duration;
use crate::error::Problem;
use crate::output;
use crate::session::Session;

use super::wait;

pub async fn run(args: RestartArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let valkey = session.get_valkey(&args.name).await?;
    if valkey.spec.replicas == 0 {
        return Err(Problem::new(format!(
            "{} is stopped (spec.replicas is 0): it has no pod to restart",
            args.name
        ))
        .hint(format!("kubectl valkey scale {} --replicas 1", args.name))
        .into());
    }
    let at = k8s_openapi::jiff::Timestamp::now().to_string();
    session
        .annotate_valkey(&args.name, RESTARTED_AT_ANNOTATION, &at)
        .await?;
    eprintln!(
        "asked the operator to restart the {} pods of {}, the primary last",
        valkey.spec.replicas, args.name
    );
    if !args.wait {
        return Ok(());
    }
    let restarted = until_restarted(&session, &valkey, &at, args.timeout).await?;
    wait::until_running(&session, &args.name, args.timeout).await?;
    let valkey = session.get_valkey(&args.name).await?;
    let primary = valkey
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .unwrap_or_else(|| "none".to_owned());
    output::print(&format!(
        "{}: restarted {restarted} pods; the primary is {primary}",
        args.name
    ))
}

/// Watches the instance's pods until every one of `spec.replicas` was created from the template
/// carrying `at` and is Ready. Returns how many pods that is.
async fn until_restarted(
    session: &Session,
    valkey: &Valkey,
    at: &str,
    timeout: Duration,
) -> anyhow::Result<usize> {
    let name = valkey.name_any();
    let api: Api<Pod> = Api::namespaced(session.streaming_client()?, &session.namespace);
    let config = watcher::Config::default().labels(&names::instance_selector(&name));
    let (pods, writer) = reflector::store();
    let mut stream = reflector(writer, watcher(api, config))
        .applied_objects()
        .boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut printed = String::new();
    loop {
        let restarted = pods
            .state()
            .iter()
            .filter(|p| {
                names::pod_ordinal(&name, &p.name_any()).is_some_and(|o| o < valkey.spec.replicas)
            })
            .filter(|p| p.metadata.deletion_timestamp.is_none() && status::is_ready(p))
            .filter(|p| {
                p.annotations()
                    .get(RESTARTED_AT_ANNOTATION)
                    .map(String::as_str)
                    == Some(at)
            })
            .count();
        let want = usize::try_from(valkey.spec.replicas).unwrap_or(0);
        if restarted >= want {
            return Ok(restarted);
        }
        let line = format!("{restarted}/{want} pods restarted and ready");
        if line != printed {
            eprintln!("{line}");
            printed = line;
        }
        match tokio::time::timeout_at(deadline, stream.try_next()).await {
            Ok(next) => {
                if next
                    .with_context(|| format!("watching the pods of {name}"))?
                    .is_none()
                {
                    return Err(
                        Problem::new(format!("the watch of the pods of {name} ended"))
                            .hint(format!("kubectl valkey status {name}"))
                            .into(),
                    );
                }
            }
            Err(_) => {
                return Err(Problem::new(format!(
                    "the restart of {name} is not done after {}: {printed}",
                    duration::format(timeout)
                ))
                .hint(format!(
                    "the operator goes on; `kubectl valkey status {name}` shows its pods and events, and says why a pod does not become Ready"
                ))
                .into());
            }
        }
    }
}
