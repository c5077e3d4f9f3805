//! `logs NAME`: the logs of every pod of the instance, merged and prefixed with the pod. With
//! `-f`, a watch on the instance's pods attaches to each pod once its container runs, including
//! pods that appear later, and re-attaches after a container restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use valkey_core::api::names;
use valkey_core::api::names::pod_ordinal as ordinal;
use valkey_core::desired::CONTAINER;

use crate::cli::{GlobalArgs, LogsArgs};
use crate::diagnose::Call;
use crate::error::Problem;
use crate::output;
use crate::session::Session;

pub async fn run(args: LogsArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    session.get_valkey(&args.name).await?;
    let pods = session.instance_pods(&args.name).await?;
    let printer = Printer {
        instance: args.name.clone(),
        color: output::style(global.color).color,
        timestamps: args.timestamps,
    };
    if let Some(pod) = &args.pod
        && !args.follow
        && !pods.iter().any(|p| p.metadata.name.as_deref() == Some(pod))
    {
        return Err(not_a_pod(&args.name, pod, &pods).into());
    }
    if args.follow {
        follow(&session, &args, &printer).await
    } else {
        dump(&session, &args, &printer, &pods).await
    }
}

fn not_a_pod(instance: &str, pod: &str, pods: &[Pod]) -> Problem {
    let names: Vec<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    Problem::new(format!("{pod} is not a pod of Valkey {instance}")).hint(if names.is_empty() {
        format!("Valkey {instance} has no pods yet")
    } else {
        format!("its pods: {}", names.join(", "))
    })
}

fn log_params(args: &LogsArgs) -> LogParams {
    LogParams {
        container: Some(CONTAINER.to_owned()),
        tail_lines: (args.tail >= 0).then_some(args.tail),
        since_seconds: args
            .since
            .map(|d| i64::try_from(d.as_secs().max(1)).unwrap_or(i64::MAX)),
        // Always asked for: they order the merged output; printed only with --timestamps.
        timestamps: true,
        ..LogParams::default()
    }
}

/// Every pod's log so far, merged in time order.
async fn dump(
    session: &Session,
    args: &LogsArgs,
    printer: &Printer,
    pods: &[Pod],
) -> anyhow::Result<()> {
    let mut names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .filter(|n| args.pod.as_ref().is_none_or(|p| p == n))
        .collect();
    names.sort_by_key(|n| (ordinal(&args.name, n).unwrap_or(i32::MAX), n.clone()));
    if names.is_empty() {
        eprintln!("Valkey {} has no pods yet.", args.name);
        return Ok(());
    }
    let api = session.api::<Pod>();
    let params = log_params(args);
    let fetched = futures::future::join_all(names.iter().map(|pod| {
        let (api, params) = (&api, &params);
        async move { api.logs(pod, params).await }
    }))
    .await;
    let mut lines = Vec::new();
    let mut failed = 0;
    for (index, (pod, result)) in names.iter().zip(fetched).enumerate() {
        match result {
            Ok(text) => lines.extend(parse_lines(index, &text)),
            Err(err) => {
                failed += 1;
                let call = Call::new::<Pod>("get")
                    .subresource("log")
                    .namespace(Some(&session.namespace))
                    .name(pod);
                eprintln!(
                    "warning: no logs from {pod}: {:#}",
                    session.explain(err, call).await
                );
            }
        }
    }
    lines.sort_by_key(|l| (l.time, l.pod, l.seq));
    for line in &lines {
        if !printer.print(&names[line.pod], &line.raw)? {
            break;
        }
    }
    if failed == names.len() {
        return Err(Problem::new(format!(
            "no logs could be read from the pods of Valkey {}",
            args.name
        ))
        .into());
    }
    Ok(())
}

struct Line {
    time: Option<Timestamp>,
    pod: usize,
    seq: usize,
    raw: String,
}

/// Lines of one pod's log. A line without a readable timestamp takes the one before it, so a
/// multi-line message stays in one piece when merged.
fn parse_lines(pod: usize, text: &str) -> Vec<Line> {
    let mut time = None;
    text.lines()
        .enumerate()
        .map(|(seq, raw)| {
            if let (Some(t), _) = split_timestamp(raw) {
                time = Some(t);
            }
            Line {
                time,
                pod,
                seq,
                raw: raw.to_owned(),
            }
        })
        .collect()
}

/// `2026-11-30T10:00:00.123456789Z message` into its time and its message.
pub fn split_timestamp(line: &str) -> (Option<Timestamp>, &str) {
    match line.split_once(' ') {
        Some((time, rest)) => match time.parse::<Timestamp>() {
            Ok(t) => (Some(t), rest),
            Err(_) => (None, line),
        },
        None => match line.parse::<Timestamp>() {
            Ok(t) => (Some(t), ""),
            Err(_) => (None, line),
        },
    }
}

/// Prints lines as `[pod] message`, the pod in its own colour on a terminal.
struct Printer {
    instance: String,
    color: bool,
    timestamps: bool,
}

impl Printer {
    /// Returns false once stdout is gone (e.g. `| head`), so following can stop.
    fn print(&self, pod: &str, raw: &str) -> anyhow::Result<bool> {
        let text = if self.timestamps {
            raw
        } else {
            split_timestamp(raw).1
        };
        let prefix = if self.color {
            const COLORS: [u8; 6] = [36, 35, 33, 32, 34, 31];
            let index = ordinal(&self.instance, pod).unwrap_or(0).unsigned_abs() as usize;
            format!("\x1b[{}m[{pod}]\x1b[0m", COLORS[index % COLORS.len()])
        } else {
            format!("[{pod}]")
        };
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{prefix} {text}") {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

enum Output {
    Line {
        pod: String,
        raw: String,
    },
    /// The watch listed the pods and none has started yet.
    NoPodsYet,
    Notice(String),
}

/// What is known of a followed pod.
#[derive(Default)]
struct Followed {
    /// A task streams its log now.
    active: bool,
    /// The time of the last line printed, to skip lines already shown on re-attach.
    last: Option<Timestamp>,
}

type FollowState = Arc<Mutex<HashMap<String, Followed>>>;

async fn follow(session: &Session, args: &LogsArgs, printer: &Printer) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(session.streaming_client()?, &session.namespace);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let state: FollowState = Arc::default();
    let selector = names::instance_selector(&args.name);
    let watch = tokio::spawn(watch_pods(
        api,
        selector,
        args.pod.clone(),
        log_params(args),
        state,
        tx,
    ));
    let mut waiting_noted = false;
    while let Some(output) = rx.recv().await {
        match output {
            Output::Line { pod, raw } => {
                if !printer.print(&pod, &raw)? {
                    break;
                }
            }
            Output::NoPodsYet => {
                if !waiting_noted {
                    eprintln!("waiting for pods of Valkey {} to start ...", args.name);
                    waiting_noted = true;
                }
            }
            Output::Notice(text) => eprintln!("{text}"),
        }
    }
    watch.abort();
    Ok(())
}

/// Attaches to every pod of the instance whose container has started, as the watch reports them.
async fn watch_pods(
    api: Api<Pod>,
    selector: String,
    only: Option<String>,
    params: LogParams,
    state: FollowState,
    tx: mpsc::UnboundedSender<Output>,
) {
    let config = watcher::Config::default().labels(&selector);
    let mut events = watcher(api.clone(), config).default_backoff().boxed();
    let mut seen_any = false;
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(watcher::Event::InitDone) => {
                if !seen_any {
                    let _ = tx.send(Output::NoPodsYet);
                }
                continue;
            }
            Ok(_) => continue,
            Err(err) => {
                let _ = tx.send(Output::Notice(format!(
                    "warning: watching pods: {err} (retrying)"
                )));
                continue;
            }
        };
        let Some(name) = pod.metadata.name.clone() else {
            continue;
        };
        if only.as_ref().is_some_and(|o| *o != name) || !container_started(&pod) {
            continue;
        }
        seen_any = true;
        let first = {
            let Ok(mut state) = state.lock() else { return };
            let entry = state.entry(name.clone()).or_default();
            if entry.active {
                continue;
            }
            entry.active = true;
            entry.last.is_none()
        };
        let mut pod_params = params.clone();
        if !first {
            pod_params.tail_lines = None;
        }
        tokio::spawn(follow_pod(
            api.clone(),
            name,
            pod_params,
            state.clone(),
            tx.clone(),
        ));
    }
}

fn container_started(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER))
        .and_then(|c| c.state.as_ref());
    match container {
        Some(state) => state.running.is_some() || state.terminated.is_some(),
        None => status.and_then(|s| s.phase.as_deref()) == Some("Running"),
    }
}

/// Streams one pod's log until the pod is gone; re-attaches (from the last line shown) when the
/// stream ends while the pod still runs, e.g. after a container restart.
async fn follow_pod(
    api: Api<Pod>,
    pod: String,
    mut params: LogParams,
    state: FollowState,
    tx: mpsc::UnboundedSender<Output>,
) {
    params.follow = true;
    let mut failures = 0;
    loop {
        match api.log_stream(&pod, &params).await {
            Ok(reader) => {
                failures = 0;
                let mut lines = reader.lines();
                while let Ok(Some(raw)) = lines.try_next().await {
                    let (time, _) = split_timestamp(&raw);
                    if !record(&state, &pod, time) {
                        continue;
                    }
                    if tx
                        .send(Output::Line {
                            pod: pod.clone(),
                            raw,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            }
            Err(err) => {
                failures += 1;
                if failures >= 5 {
                    let _ = tx.send(Output::Notice(format!(
                        "warning: cannot follow {pod}: {err}"
                    )));
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        match api.get_opt(&pod).await {
            Ok(Some(p)) if container_started(&p) => {}
            _ => break,
        }
        params.tail_lines = None;
        params.since_seconds = None;
        params.since_time = last_time(&state, &pod);
    }
    if let Ok(mut state) = state.lock()
        && let Some(entry) = state.get_mut(&pod)
    {
        entry.active = false;
    }
}

/// Notes a line's time; false when the line was already shown before a re-attach.
fn record(state: &FollowState, pod: &str, time: Option<Timestamp>) -> bool {
    let Ok(mut state) = state.lock() else {
        return true;
    };
    let entry = state.entry(pod.to_owned()).or_default();
    match (time, entry.last) {
        (Some(t), Some(last)) if t <= last => false,
        (Some(t), _) => {
            entry.last = Some(t);
            true
        }
        (None, _) => true,
    }
}

fn last_time(state: &FollowState, pod: &str) -> Option<Timestamp> {
    state.lock().ok()?.get(pod)?.last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_split_from_messages() {
        let (time, text) =
            split_timestamp("2026-11-30T10:00:00.123456789Z Ready to accept connections");
        assert!(time.is_some());
        assert_eq!(text, "Ready to accept connections");
        assert_eq!(split_timestamp("no time here"), (None, "no time here"));
    }

    #[test]
    fn merged_lines_keep_multi_line_messages_together() {
        let a = parse_lines(
            0,
            "2026-01-01T00:00:01Z a1\ncontinued\n2026-01-01T00:00:03Z a3",
        );
        let b = parse_lines(1, "2026-01-01T00:00:02Z b2");
        let mut all: Vec<Line> = a.into_iter().chain(b).collect();
        all.sort_by_key(|l| (l.time, l.pod, l.seq));
        let order: Vec<&str> = all.iter().map(|l| split_timestamp(&l.raw).1).collect();
        assert_eq!(order, ["a1", "continued", "b2", "a3"]);
    }
}
