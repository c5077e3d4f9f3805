//! Running `kubectl-valkey`: as a plain subprocess, or as `kubectl valkey` found by kubectl's own
//! plugin discovery on PATH.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use super::cluster;

/// The plugin binary Cargo built for these tests.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kubectl-valkey"))
}

/// A directory holding only `kubectl-valkey` and `kubectl_complete-valkey` (symlinks to the
/// built binary), so kubectl discovers exactly this plugin. Shared by the test binaries (the
/// links are the same for all), so made idempotently.
pub fn plugin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-path");
        std::fs::create_dir_all(&dir).expect("creating the plugin dir");
        for name in ["kubectl-valkey", "kubectl_complete-valkey"] {
            let link = dir.join(name);
            if std::fs::read_link(&link).ok().as_deref() != Some(bin().as_path()) {
                let _ = std::fs::remove_file(&link);
                if let Err(e) = std::os::unix::fs::symlink(bin(), &link)
                    && e.kind() != std::io::ErrorKind::AlreadyExists
                {
                    panic!("linking {}: {e}", link.display());
                }
            }
        }
        dir
    })
    .clone()
}

/// PATH for kubectl: the plugin first, then the cluster's tools, then the caller's PATH.
pub fn path_env() -> String {
    format!(
        "{}:{}:{}",
        plugin_dir().display(),
        cluster::tools_path(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The cluster's kubectl binary.
pub fn kubectl_bin() -> PathBuf {
    Path::new(&cluster::tools_path()).join("kubectl")
}

/// `kubectl valkey ARGS...` through plugin discovery, with the cluster's admin kubeconfig.
pub fn kubectl_valkey(args: &[&str]) -> Command {
    let mut command = Command::new(kubectl_bin());
    command
        .env("PATH", path_env())
        .env("KUBECONFIG", cluster::kubeconfig_path())
        .env_remove("NO_COLOR")
        .arg("valkey")
        .args(args);
    command
}

/// `kubectl ARGS...` (the cluster's kubectl, plugin on PATH).
pub fn kubectl(args: &[&str]) -> Command {
    let mut command = Command::new(kubectl_bin());
    command
        .env("PATH", path_env())
        .env("KUBECONFIG", cluster::kubeconfig_path())
        .args(args);
    command
}

/// What a finished command left.
#[derive(Debug)]
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` to completion, feeding it `stdin` (empty when `None`).
pub fn run(mut command: Command, stdin: Option<&str>) -> Outcome {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("starting the command");
    // Dropping the pipe (after writing) is the end of input.
    if let (Some(mut pipe), Some(text)) = (child.stdin.take(), stdin) {
        let _ = pipe.write_all(text.as_bytes());
    }
    let output: Output = child.wait_with_output().expect("waiting for the command");
    Outcome {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `kubectl valkey ARGS...` and insists on success.
pub fn ok(args: &[&str], stdin: Option<&str>) -> Outcome {
    let outcome = run(kubectl_valkey(args), stdin);
    assert_eq!(
        outcome.code, 0,
        "kubectl valkey {args:?} failed:\nstdout: {}\nstderr: {}",
        outcome.stdout, outcome.stderr
    );
    outcome
}

/// `kubectl valkey install` once per test binary (server-side apply: safe alongside other tests
/// applying the same manifests).
pub fn install() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        cluster::ensure_up();
        ok(&["install"], None);
    });
}
