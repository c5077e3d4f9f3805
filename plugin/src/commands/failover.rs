//! `failover NAME [--to POD]`: a planned switchover. The plugin asks the operator (the
//! annotation `database.kuberly.io/switchover` on the Valkey), which runs Valkey's `FAILOVER
//! TO`, moves the role labels and the ConfigMap key, records `status.lastFailover` and removes
//! the annotation; the plugin waits for that and prints the outcome.

use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::ListParams;
use valkey_core::api::Valkey;
use valkey_core::api::names::SWITCHOVER_ANNOTATION;

use crate::cli::{FailoverArgs, GlobalArgs};
use crate::error::Problem;
use crate::output;
use crate::session::Session;

const POLL: Duration = Duration::from_millis(250);

pub async fn run(args: FailoverArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let valkey = session.get_valkey(&args.name).await?;
    if valkey.spec.replicas < 2 {
        return Err(Problem::new(format!(
            "{} has spec.replicas {}: a switchover needs a replica to hand over to",
            args.name, valkey.spec.replicas
        ))
        .hint(format!("kubectl valkey scale {} --replicas 3", args.name))
        .into());
    }
    if let Some(to) = &args.to
        && valkey_core::api::names::pod_ordinal(&args.name, to)
            .is_none_or(|o| o < 0 || o >= valkey.spec.replicas)
    {
        return Err(Problem::new(format!(
            "{to} is not a pod of {} (its pods are {}-0 to {}-{})",
            args.name,
            args.name,
            args.name,
            valkey.spec.replicas - 1
        ))
        .into());
    }
    let before = last_failover_time(&valkey);
    let asked = k8s_openapi::jiff::Timestamp::now();
    let to = args.to.as_deref().unwrap_or_default();
    session
        .annotate_valkey(&args.name, SWITCHOVER_ANNOTATION, to)
        .await?;
    eprintln!(
        "asked the operator to hand {}'s primary role over{}",
        args.name,
        args.to
            .as_deref()
            .map(|t| format!(" to {t}"))
            .unwrap_or_default()
    );
    let deadline = Instant::now() + args.timeout;
    loop {
        tokio::time::sleep(POLL).await;
        let valkey = session.get_valkey(&args.name).await?;
        let pending = valkey.annotations().contains_key(SWITCHOVER_ANNOTATION);
        let record = valkey
            .status
            .as_ref()
            .and_then(|s| s.last_failover.as_ref());
        if let Some(r) = record.filter(|_| last_failover_time(&valkey) != before) {
            return output::print(&format!(
                "{}: {} is the primary (was {}, {}, took {})",
                args.name,
                r.to,
                r.from.as_deref().unwrap_or("unknown"),
                r.reason,
                r.duration
            ));
        }
        if !pending {
            // Acted on without a move: the operator said why in an event.
            let why = refusal(&session, &valkey, asked).await.unwrap_or_else(|| {
                "the operator removed the request without a switchover".to_owned()
            });
            return Err(Problem::new(format!("{}: {why}", args.name))
                .hint(format!("kubectl valkey status {}", args.name))
                .into());
        }
        if Instant::now() > deadline {
            return Err(Problem::new(format!(
                "the operator did not act on the switchover of {} within {:?}",
                args.name, args.timeout
            ))
            .hint("is the operator running? `kubectl valkey version` shows it; the request stays until it acts")
            .into());
        }
    }
}

fn last_failover_time(valkey: &Valkey) -> Option<String> {
    valkey
        .status
        .as_ref()
        .and_then(|s| s.last_failover.as_ref())
        .map(|f| f.time.0.to_string())
}

/// The newest SwitchoverRefused / SwitchoverFailed event about the instance since `asked`.
async fn refusal(
    session: &Session,
    valkey: &Valkey,
    asked: k8s_openapi::jiff::Timestamp,
) -> Option<String> {
    let selector = format!("regarding.kind=Valkey,regarding.name={}", valkey.name_any());
    let events = session
        .api::<Event>()
        .list(&ListParams::default().fields(&selector))
        .await
        .ok()?;
    events
        .items
        .into_iter()
        .filter(|e| {
            matches!(
                e.reason.as_deref(),
                Some("SwitchoverRefused" | "SwitchoverFailed")
            )
        })
        .filter(|e| {
            let at = e
                .series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or(e.event_time.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
            at.is_some_and(|t| t.as_second() + 1 >= asked.as_second())
        })
        .max_by_key(|e| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .and_then(|e| e.note)
}
