//! `kubectl valkey`: the kubectl plugin of valkey-operator.
//!
//! Process start-up is in [`run`]: it parses the command line before anything else (so `--help`,
//! `version --client` and `completion` never need a cluster), then runs one command on a tokio
//! runtime and turns its result into an exit code and messages on stderr.

pub mod cli;
pub mod commands;
pub mod complete;
pub mod diagnose;
pub mod duration;
pub mod error;
pub mod kubeconfig;
pub mod manifests;
pub mod output;
pub mod render;
pub mod session;
pub mod terminal;
pub mod view;

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;

use crate::cli::Cli;
use crate::error::{UsageError, exit};

/// Runs the plugin with `args` (argv, program name first) and returns the exit code.
pub fn run(args: Vec<OsString>) -> i32 {
    if complete::invoked_for_completion(&args) {
        return complete::main(&args);
    }
    if let Some(err) = password_on_command_line(&args) {
        return print_error(&anyhow::Error::new(err));
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version go to stdout with exit 0; mistakes to stderr with exit 2.
            let _ = err.print();
            return err.exit_code();
        }
    };
    init_logging(cli.global.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return exit::FAILURE;
        }
    };
    let result = runtime.block_on(commands::run(cli));
    // A read of the terminal may still be blocked in a worker thread (interactive `cli`); it
    // must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => exit::OK,
        Err(err) => print_error(&err),
    }
}

fn print_error(err: &anyhow::Error) -> i32 {
    let (code, lines) = error::report(err);
    for line in lines {
        eprintln!("{line}");
    }
    code
}

/// There is no `--password` flag; clap alone would only call it unknown. Say why and what to
/// do instead, without echoing the value. Arguments after `--` belong to valkey-cli.
fn password_on_command_line(args: &[OsString]) -> Option<UsageError> {
    let given = args
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .filter_map(|a| a.to_str())
        .any(|a| a == "--password" || a.starts_with("--password="));
    given.then(|| {
        UsageError::new(
            "there is no --password flag: a password on the command line ends up in shell history and in the process list",
        )
        .hint(
            "pipe it in instead:  printf '%s' \"$PASSWORD\" | kubectl valkey create NAME --password-stdin\n\
             or name a Secret that holds it:  kubectl valkey create NAME --password-secret SECRET [--password-key KEY]\n\
             or give neither and the operator generates one (in the Secret NAME-auth, key \"password\")",
        )
    })
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => return,
        1 => "kubectl_valkey=debug,kube_client=debug",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_password_flag_is_refused_without_echoing_it() {
        for line in [
            &["kubectl-valkey", "create", "c", "--password", "hunter2"][..],
            &["kubectl-valkey", "create", "c", "--password=hunter2"],
        ] {
            let err = password_on_command_line(&args(line));
            let text = err.map(|e| format!("{e} {:?}", e.hint)).unwrap_or_default();
            assert!(text.contains("--password-stdin"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn password_stdin_and_valkey_cli_arguments_are_fine() {
        for line in [
            &["kubectl-valkey", "create", "c", "--password-stdin"][..],
            &["kubectl-valkey", "create", "c", "--password-secret", "s"],
            &["kubectl-valkey", "cli", "c", "--", "--password", "x"],
        ] {
            assert!(password_on_command_line(&args(line)).is_none(), "{line:?}");
        }
    }
}
