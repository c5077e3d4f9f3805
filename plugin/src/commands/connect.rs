//! `cli NAME` / `connect NAME`: valkey-cli in a pod of the instance, over the exec API.
//!
//! The command is the pod's `sh /etc/valkey/cli.sh [ARGS]` ([`cli_command`]), which runs
//! `valkey-cli --user <spec.user> [ARGS]` with the password of the files the ACL Secret mounts
//! (they follow a password rotation; the container's environment keeps the password it started
//! with), through the environment, so it is on no command line, local or remote. Pods of an
//! older operator, without cli.sh, get `valkey-cli --user <spec.user> [ARGS]` and the password
//! of their environment (VALKEYCLI_AUTH).

use std::io::IsTerminal;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess};
use tokio::io::AsyncWriteExt;
use valkey_core::api::Valkey;
use valkey_core::api::names::pod_ordinal as ordinal;
use valkey_core::api::names::{self, roles};
use valkey_core::desired::CONTAINER;
use valkey_core::status::is_ready;

use crate::cli::{CliArgs, GlobalArgs};
use crate::diagnose::Call;
use crate::error::{ExitWith, Problem};
use crate::session::Session;
use crate::terminal::{self, RawMode};

/// The exec command running valkey-cli as `user` with `args` in a pod of the instance: the pod's
/// cli.sh when it has one, else valkey-cli with the password of the environment.
pub fn cli_command(user: &str, args: &[String]) -> Vec<String> {
    use valkey_core::desired::{CLI_SH_KEY, CONFIG_DIR};
    let script = format!(
        r#"if [ -r {CONFIG_DIR}/{CLI_SH_KEY} ]; then shift; exec sh {CONFIG_DIR}/{CLI_SH_KEY} "$@"; fi; exec valkey-cli --user "$@""#
    );
    let mut command = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        script,
        "valkey-cli".to_owned(),
        user.to_owned(),
    ];
    command.extend(args.iter().cloned());
    command
}

/// How valkey-cli's input and output are wired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A terminal on both ends: a TTY in the pod, raw mode here, window size forwarded.
    Interactive,
    /// `-- ARGS`: one command, no input.
    Command,
    /// Commands piped in on stdin, answers on stdout.
    Pipe,
}

impl Mode {
    fn pick(has_args: bool) -> Self {
        if has_args {
            Self::Command
        } else if terminal::stdin_is_terminal() && std::io::stdout().is_terminal() {
            Self::Interactive
        } else {
            Self::Pipe
        }
    }

    fn params(self) -> AttachParams {
        AttachParams {
            container: Some(CONTAINER.to_owned()),
            stdin: self != Self::Command,
            stdout: true,
            // With a TTY the server merges stderr into stdout.
            stderr: self != Self::Interactive,
            tty: self == Self::Interactive,
            ..AttachParams::default()
        }
    }
}

pub async fn run(args: CliArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let session = Session::connect(global).await?;
    let valkey = session.get_valkey(&args.name).await?;
    let pods = session.instance_pods(&args.name).await?;
    let pod = choose_pod(&valkey, &pods, args.replica, args.pod.as_deref())?;
    let pod = pod.metadata.name.clone().unwrap_or_default();

    let mode = Mode::pick(!args.args.is_empty());
    let command = cli_command(&valkey.spec.user, &args.args);
    let api: Api<Pod> = Api::namespaced(session.streaming_client()?, &session.namespace);
    let call = Call::new::<Pod>("create")
        .subresource("exec")
        .namespace(Some(&session.namespace))
        .name(&pod);
    let process = session
        .check(api.exec(&pod, command, &mode.params()).await, call)
        .await?;
    let status = match mode {
        Mode::Interactive => interactive(process).await?,
        Mode::Command => streams(process, false).await?,
        Mode::Pipe => streams(process, true).await?,
    };
    match exit_code(status.as_ref(), &pod)? {
        0 => Ok(()),
        code => Err(ExitWith(code).into()),
    }
}

/// The pod to connect to: `--pod`, else a ready replica with `--replica`, else the primary
/// (the one the status records, else the one labelled primary).
pub fn choose_pod<'a>(
    valkey: &Valkey,
    pods: &'a [Pod],
    replica: bool,
    wanted: Option<&str>,
) -> Result<&'a Pod, Problem> {
    let instance = valkey.metadata.name.as_deref().unwrap_or_default();
    let by_name = |name: &str| {
        pods.iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    };
    let role_of = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(names::labels::ROLE))
            .cloned()
    };
    if let Some(name) = wanted {
        return by_name(name).ok_or_else(|| {
            let names: Vec<&str> = pods
                .iter()
                .filter_map(|p| p.metadata.name.as_deref())
                .collect();
            Problem::new(format!("{name} is not a pod of Valkey {instance}")).hint(
                if names.is_empty() {
                    format!("Valkey {instance} has no pods yet")
                } else {
                    format!("its pods: {}", names.join(", "))
                },
            )
        });
    }
    if replica {
        let mut replicas: Vec<&Pod> = pods
            .iter()
            .filter(|p| role_of(p).as_deref() == Some(roles::REPLICA) && is_ready(p))
            .collect();
        replicas.sort_by_key(|p| ordinal(instance, p.metadata.name.as_deref().unwrap_or_default()));
        return replicas.first().copied().ok_or_else(|| {
            Problem::new(format!(
                "Valkey {instance} has no ready replica (spec.replicas is {})",
                valkey.spec.replicas
            ))
            .hint(format!(
                "replicas run with 2 or more pods: kubectl valkey scale {instance} --replicas 3"
            ))
        });
    }
    let recorded = valkey
        .status
        .as_ref()
        .and_then(|s| s.primary.as_deref())
        .and_then(by_name);
    let labelled = || {
        pods.iter()
            .filter(|p| role_of(p).as_deref() == Some(roles::PRIMARY))
            .max_by_key(|p| is_ready(p))
    };
    recorded.or_else(labelled).ok_or_else(|| {
        let phase = valkey
            .status
            .as_ref()
            .and_then(|s| s.status)
            .map_or_else(|| "no status yet".to_owned(), |p| p.to_string());
        Problem::new(format!(
            "Valkey {instance} has no primary pod yet ({phase})"
        ))
        .hint(format!(
            "`kubectl valkey status {instance}` shows its pods and events"
        ))
    })
}

/// How long the output of a program that has exited may take to arrive.
const OUTPUT_DRAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// A TTY session: raw mode here, keys to the pod, its screen to stdout, window size kept in sync.
async fn interactive(mut process: AttachedProcess) -> anyhow::Result<Option<Status>> {
    let mut remote_in = process.stdin().context("the exec session has no stdin")?;
    let mut remote_out = process.stdout().context("the exec session has no stdout")?;
    let status = process
        .take_status()
        .context("the exec session has no status")?;
    let resize = process
        .terminal_size()
        .map(|sender| tokio::spawn(forward_window_size(sender)));
    let raw = RawMode::enable()?;
    // A blocking read of the terminal; it ends with the process, not with this task.
    let input = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut remote_in).await;
        let _ = remote_in.shutdown().await;
    });
    let mut stdout = tokio::io::stdout();
    let (copied, status) = {
        let copy = tokio::io::copy(&mut remote_out, &mut stdout);
        tokio::pin!(copy, status);
        tokio::select! {
            copied = &mut copy => (copied, status.await),
            // The program exited: the session ends now, whenever the stream closes. What it
            // printed last may still be on its way.
            status = &mut status => {
                let rest = tokio::time::timeout(OUTPUT_DRAIN, &mut copy).await;
                (rest.unwrap_or(Ok(0)), status)
            }
        }
    };
    let _ = stdout.flush().await;
    drop(raw);
    input.abort();
    if let Some(task) = resize {
        task.abort();
    }
    copied.context("copying the session's output")?;
    Ok(status)
}

async fn forward_window_size(mut sender: futures::channel::mpsc::Sender<kube::api::TerminalSize>) {
    use futures::SinkExt;
    let size = || {
        crossterm::terminal::size()
            .ok()
            .filter(|(width, height)| *width > 0 && *height > 0)
            .map(|(width, height)| kube::api::TerminalSize { width, height })
    };
    // A pseudo-terminal of unknown size (0x0) makes line editors in the pod probe the cursor
    // with escape sequences nobody answers; a classic 80x24 is a safer start.
    let initial = size().unwrap_or(kube::api::TerminalSize {
        width: 80,
        height: 24,
    });
    if sender.send(initial).await.is_err() {
        return;
    }
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut changes) = signal(SignalKind::window_change()) else {
            return;
        };
        while changes.recv().await.is_some() {
            if let Some(s) = size()
                && sender.send(s).await.is_err()
            {
                return;
            }
        }
    }
}

/// Plain streams: the pod's stdout and stderr to ours, and (for piped commands) our stdin to it.
async fn streams(mut process: AttachedProcess, with_stdin: bool) -> anyhow::Result<Option<Status>> {
    let remote_out = process.stdout();
    let remote_err = process.stderr();
    let status = process
        .take_status()
        .context("the exec session has no status")?;
    let input = match (with_stdin, process.stdin()) {
        (true, Some(mut remote_in)) => Some(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut remote_in).await;
            // End of input: valkey-cli sees EOF and exits.
            let _ = remote_in.shutdown().await;
        })),
        _ => None,
    };
    let out = async {
        if let Some(mut reader) = remote_out {
            let mut stdout = tokio::io::stdout();
            let _ = tokio::io::copy(&mut reader, &mut stdout).await;
            let _ = stdout.flush().await;
        }
    };
    let err = async {
        if let Some(mut reader) = remote_err {
            let mut stderr = tokio::io::stderr();
            let _ = tokio::io::copy(&mut reader, &mut stderr).await;
            let _ = stderr.flush().await;
        }
    };
    let ((), (), status) = tokio::join!(out, err, status);
    if let Some(task) = input {
        task.abort();
    }
    Ok(status)
}

/// valkey-cli's exit code from the exec status; an error when the command could not run at all.
fn exit_code(status: Option<&Status>, pod: &str) -> Result<i32, Problem> {
    let Some(status) = status else {
        return Ok(0);
    };
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    let code = status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.trim().parse::<i32>().ok());
    match code {
        Some(code) => Ok(code),
        None => Err(Problem::new(format!(
            "valkey-cli could not run in pod {pod}: {}",
            status.message.as_deref().unwrap_or("no reason given")
        ))
        .hint("the pod's image must provide valkey-cli in its container named \"valkey\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[test]
    fn exit_codes_come_from_the_status_causes() {
        let failed = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    ..StatusCause::default()
                }]),
                ..StatusDetails::default()
            }),
            ..Status::default()
        };
        assert_eq!(exit_code(Some(&failed), "p").ok(), Some(3));
        let ok = Status {
            status: Some("Success".into()),
            ..Status::default()
        };
        assert_eq!(exit_code(Some(&ok), "p").ok(), Some(0));
        let broken = Status {
            status: Some("Failure".into()),
            message: Some("executable file not found".into()),
            ..Status::default()
        };
        assert!(exit_code(Some(&broken), "p").is_err());
    }
}
