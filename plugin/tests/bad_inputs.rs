//! Bad input, table-driven: the built plugin runs as a subprocess for each case, which must end
//! with the documented exit code, a clear message on stderr, nothing on stdout and no panic.
//!
//! Usage mistakes run with a kubeconfig pointing at a closed port: a case that wrongly reached
//! for the cluster would exit 1 ("cannot reach"), not 2. Cluster cases use the local control
//! plane: an unknown instance, a user without rights (impersonated with --as). A missing CRD
//! cannot be arranged on the shared cluster (the CRD is cluster-wide and other tests need it), so
//! that case talks to a stand-in server answering every request as kube-apiserver answers
//! requests for an API it does not serve: `404 page not found`, as text.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::PostParams;
use serde_json::json;
use support::cluster::{self, TestNamespace};
use support::plugin::{self, Outcome};
use valkey_core::api::{Valkey, ValkeySpec};

/// Which cluster a case sees.
#[derive(Clone, Copy, Debug)]
enum Env {
    /// A kubeconfig whose server is 127.0.0.1:1 (nothing listens there).
    Unreachable,
    /// A kubeconfig that is not valid YAML.
    Broken,
    /// No KUBECONFIG, no ~/.kube/config, not in a cluster.
    Nothing,
    /// A server that serves no Valkey API (404 page not found for everything).
    NoCrd,
    /// A server that accepts connections and never answers.
    Silent,
    /// The local control plane, in the case's namespace.
    Cluster,
}

struct Case {
    name: &'static str,
    env: Env,
    args: &'static [&'static str],
    stdin: Option<&'static str>,
    code: i32,
    /// Fragments stderr must contain.
    says: &'static [&'static str],
    /// Fragments stderr must not contain.
    hides: &'static [&'static str],
}

const fn case(
    name: &'static str,
    env: Env,
    args: &'static [&'static str],
    code: i32,
    says: &'static [&'static str],
) -> Case {
    Case {
        name,
        env,
        args,
        stdin: None,
        code,
        says,
        hides: &[],
    }
}

const LONG_NAME: &str = "a23456789012345678901234567890123456789012";

#[rustfmt::skip]
const USAGE_CASES: &[Case] = &[
    case("no subcommand", Env::Unreachable, &[], 2, &["Usage: kubectl valkey"]),
    case("unknown subcommand", Env::Unreachable, &["frobnicate"], 2, &["unrecognized subcommand 'frobnicate'"]),
    case("unknown flag", Env::Unreachable, &["list", "--bogus"], 2, &["unexpected argument '--bogus'"]),
    case("create without a name", Env::Unreachable, &["create"], 2, &["<NAME>"]),
    case("replicas 9", Env::Unreachable, &["create", "cache", "--replicas", "9"], 2, &["spec.replicas must be between 0 and 5", "--replicas"]),
    case("negative replicas", Env::Unreachable, &["create", "cache", "--replicas", "-1"], 2, &["spec.replicas must be between 0 and 5"]),
    case("bad storage quantity", Env::Unreachable, &["create", "cache", "--storage", "1Gx"], 2, &["spec.volume.storage must be a positive quantity", "--storage"]),
    case("bad memory quantity", Env::Unreachable, &["create", "cache", "--memory", "lots"], 2, &["spec.resource.memory must be a positive quantity"]),
    case("zero cpu", Env::Unreachable, &["create", "cache", "--cpu", "0"], 2, &["spec.resource.cpu must be a positive quantity"]),
    Case { hides: &["hunter2"], ..case("password on the command line", Env::Unreachable, &["create", "cache", "--password", "hunter2"], 2, &["there is no --password flag", "--password-stdin", "--password-secret"]) },
    Case { hides: &["hunter2"], ..case("password= on the command line", Env::Unreachable, &["create", "cache", "--password=hunter2"], 2, &["there is no --password flag"]) },
    case("uppercase name", Env::Unreachable, &["create", "Cache"], 2, &["metadata.name must be at most 40 characters"]),
    case("name too long", Env::Unreachable, &["create", LONG_NAME], 2, &["metadata.name must be at most 40 characters"]),
    case("operator-owned config", Env::Unreachable, &["create", "cache", "--config", "port=7000"], 2, &["spec.config must not set port", "--config"]),
    case("unknown directive", Env::Unreachable, &["create", "cache", "--config", "nonexistent-directive=yes"], 2, &["valkey-server 9.1.2 has no directive \"nonexistent-directive\"", "fix --config"]),
    case("misspelt directive", Env::Unreachable, &["create", "cache", "--config", "maxmemory-polcy=allkeys-lru"], 2, &["did you mean maxmemory-policy?"]),
    case("directive value the server refuses", Env::Unreachable, &["create", "cache", "--config", "appendonly=true"], 2, &["spec.config.appendonly: \"true\" is not yes or no"]),
    case("config without a value", Env::Unreachable, &["create", "cache", "--config", "novalue"], 2, &["expected KEY=VALUE"]),
    case("config twice", Env::Unreachable, &["create", "cache", "--config", "a=1", "--config", "a=2"], 2, &["--config a is given more than once"]),
    case("no volume with a size", Env::Unreachable, &["create", "cache", "--no-volume", "--storage", "2Gi"], 2, &["cannot be used with"]),
    case("a ServiceMonitor without metrics", Env::Unreachable, &["create", "cache", "--service-monitor"], 2, &["--metrics"]),
    case("two password sources", Env::Unreachable, &["create", "cache", "--password-stdin", "--password-secret", "s"], 2, &["cannot be used with"]),
    case("password key without secret", Env::Unreachable, &["create", "cache", "--password-key", "k"], 2, &["--password-secret <SECRET>"]),
    Case { stdin: Some(""), ..case("empty password on stdin", Env::Unreachable, &["create", "cache", "--password-stdin"], 2, &["--password-stdin read an empty password"]) },
    case("bad admin user", Env::Unreachable, &["create", "cache", "--admin-user", "bad user"], 2, &["spec.user must be letters"]),
    case("bad dry-run mode", Env::Unreachable, &["create", "cache", "--dry-run=banana"], 2, &["invalid value 'banana'"]),
    case("scale without replicas", Env::Unreachable, &["scale", "cache"], 2, &["--replicas <N>"]),
    case("scale to 9", Env::Unreachable, &["scale", "cache", "--replicas", "9"], 2, &["spec.replicas must be between 0 and 5"]),
    case("restart without a name", Env::Unreachable, &["restart"], 2, &["<NAME>"]),
    case("restart with a bad timeout", Env::Unreachable, &["restart", "cache", "--timeout", "later"], 2, &["invalid duration \"later\""]),
    case("bad since", Env::Unreachable, &["logs", "cache", "--since", "5x"], 2, &["invalid duration \"5x\""]),
    case("bad tail", Env::Unreachable, &["logs", "cache", "--tail", "abc"], 2, &["invalid value 'abc'"]),
    case("bad output format", Env::Unreachable, &["status", "-o", "xml"], 2, &["invalid value 'xml'"]),
    case("bad color", Env::Unreachable, &["list", "--color", "sometimes"], 2, &["invalid value 'sometimes'"]),
    case("unknown shell", Env::Unreachable, &["completion", "tcsh"], 2, &["invalid value 'tcsh'"]),
    case("replica and pod", Env::Unreachable, &["cli", "cache", "--replica", "--pod", "cache-1"], 2, &["cannot be used with"]),
    case("bad request timeout", Env::Unreachable, &["list", "--request-timeout", "soon"], 2, &["invalid duration \"soon\""]),
    case("delete without a terminal or --yes", Env::Unreachable, &["delete", "cache"], 2, &["refusing to delete Valkey cache without confirmation", "--yes"]),
    case("unreachable server", Env::Unreachable, &["list"], 1, &["cannot reach the Kubernetes API server at https://127.0.0.1:1", "Connection refused"]),
    case("server that never answers", Env::Silent, &["list", "--request-timeout", "1s"], 1, &["no answer from the Kubernetes API server at https://127.0.0.1:", "within 1s"]),
    case("broken kubeconfig", Env::Broken, &["list"], 1, &["is not valid", "unclosed"]),
    case("missing kubeconfig file", Env::Unreachable, &["--kubeconfig", "/nonexistent/kubeconfig", "list"], 1, &["the kubeconfig /nonexistent/kubeconfig does not exist"]),
    case("no kubeconfig at all", Env::Nothing, &["status", "cache"], 1, &["no kubeconfig found", "KUBECONFIG"]),
    case("unknown context", Env::Unreachable, &["--context", "nope", "list"], 1, &["the context \"nope\" is not in the kubeconfig", "contexts: unreachable"]),
    case("CRD not installed", Env::NoCrd, &["list"], 1, &["the Valkey API (valkeys.database.kuberly.io) is not installed", "kubectl valkey install"]),
    case("CRD not installed, status", Env::NoCrd, &["status", "cache"], 1, &["is not installed", "kubectl valkey install"]),
];

#[rustfmt::skip]
const CLUSTER_CASES: &[Case] = &[
    case("unknown instance", Env::Cluster, &["status", "nosuch"], 1, &["Valkey \"nosuch\" not found in namespace", "instances in namespace", "existing"]),
    case("scale an unknown instance", Env::Cluster, &["scale", "nosuch", "--replicas", "2"], 1, &["Valkey \"nosuch\" not found"]),
    case("restart an unknown instance", Env::Cluster, &["restart", "nosuch"], 1, &["Valkey \"nosuch\" not found"]),
    case("forbidden restart", Env::Cluster, &["restart", "existing", "--as", "nobody"], 1, &["is not allowed to get valkeys.database.kuberly.io \"existing\""]),
    case("delete an unknown instance", Env::Cluster, &["delete", "nosuch", "--yes"], 1, &["Valkey \"nosuch\" not found"]),
    case("cli to an unknown instance", Env::Cluster, &["cli", "nosuch", "--", "PING"], 1, &["Valkey \"nosuch\" not found"]),
    case("create an existing instance", Env::Cluster, &["create", "existing"], 1, &["Valkey \"existing\" already exists"]),
    case("logs of a pod of another instance", Env::Cluster, &["logs", "existing", "--pod", "other-0"], 1, &["other-0 is not a pod of Valkey existing"]),
    case("cli without a primary", Env::Cluster, &["cli", "existing", "--", "PING"], 1, &["Valkey existing has no primary pod yet"]),
    case("forbidden list", Env::Cluster, &["--as", "nobody", "list"], 1, &["forbidden: user \"nobody\" is not allowed to list valkeys.database.kuberly.io", "kubectl create role"]),
    case("forbidden get", Env::Cluster, &["status", "existing", "--as", "nobody"], 1, &["forbidden: user \"nobody\" is not allowed to get valkeys.database.kuberly.io \"existing\"", "--verb=get"]),
    case("forbidden list in all namespaces", Env::Cluster, &["list", "-A", "--as", "nobody"], 1, &["is not allowed to list valkeys.database.kuberly.io in all namespaces", "clusterrole"]),
    case("forbidden install", Env::Cluster, &["install", "--as", "nobody"], 1, &["forbidden: user \"nobody\" is not allowed to patch namespaces"]),
    case("forbidden scale", Env::Cluster, &["scale", "existing", "--replicas", "2", "--as", "nobody"], 1, &["is not allowed to patch valkeys.database.kuberly.io/scale", "resource \"valkeys/scale\""]),
];

#[test]
fn usage_and_connection_mistakes_are_explained() {
    let files = Files::new();
    let failures: Vec<String> = USAGE_CASES
        .iter()
        .filter_map(|case| check(case, &files, None))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        USAGE_CASES.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn cluster_mistakes_are_explained() {
    plugin::install();
    let ns = TestNamespace::new("plugin-bad", &[]).await;
    let spec: ValkeySpec = serde_json::from_value(json!({})).expect("a default spec");
    let mut existing = Valkey::new("existing", spec);
    existing.metadata.namespace = Some(ns.name.clone());
    ns.api::<Valkey>()
        .create(&PostParams::default(), &existing)
        .await
        .expect("creating a Valkey");
    let files = Files::new();
    let failures: Vec<String> = CLUSTER_CASES
        .iter()
        .filter_map(|case| check(case, &files, Some(&ns.name)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CLUSTER_CASES.len(),
        failures.join("\n")
    );
}

/// Runs one case; `Some(report)` when it does not behave.
fn check(case: &Case, files: &Files, namespace: Option<&str>) -> Option<String> {
    let mut command = Command::new(plugin::bin());
    command.env_remove("KUBERNETES_SERVICE_HOST");
    match case.env {
        Env::Unreachable => command.env("KUBECONFIG", &files.unreachable),
        Env::Broken => command.env("KUBECONFIG", &files.broken),
        Env::NoCrd => command.env("KUBECONFIG", &files.no_crd),
        Env::Silent => command.env("KUBECONFIG", &files.silent),
        Env::Nothing => command
            .env_remove("KUBECONFIG")
            .env("HOME", &files.empty_home),
        Env::Cluster => command
            .env("KUBECONFIG", cluster::kubeconfig_path())
            .args(["-n", namespace.unwrap_or("default")]),
    };
    // After -n: arguments after `--` belong to valkey-cli.
    command.args(case.args);
    let outcome: Outcome = plugin::run(command, case.stdin);
    let mut problems = Vec::new();
    if outcome.code != case.code {
        problems.push(format!(
            "exit code {} instead of {}",
            outcome.code, case.code
        ));
    }
    for fragment in case.says {
        if !outcome.stderr.contains(fragment) {
            problems.push(format!("stderr lacks {fragment:?}"));
        }
    }
    for fragment in case.hides.iter().chain(&["panicked", "RUST_BACKTRACE"]) {
        if outcome.stderr.contains(fragment) || outcome.stdout.contains(fragment) {
            problems.push(format!("output shows {fragment:?}"));
        }
    }
    if !outcome.stdout.is_empty() {
        problems.push("stdout is not empty".to_owned());
    }
    if outcome.stderr.trim().is_empty() {
        problems.push("stderr is empty".to_owned());
    }
    (!problems.is_empty()).then(|| {
        format!(
            "- {} ({:?}): {}\n  stderr: {}\n  stdout: {}",
            case.name,
            case.args,
            problems.join("; "),
            outcome.stderr.trim().replace('\n', "\n          "),
            outcome.stdout.trim()
        )
    })
}

/// The kubeconfigs and directories the cases point at.
struct Files {
    _dir: tempfile::TempDir,
    unreachable: PathBuf,
    broken: PathBuf,
    no_crd: PathBuf,
    silent: PathBuf,
    empty_home: PathBuf,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let unreachable = dir.path().join("unreachable.yaml");
        write(
            &unreachable,
            &kubeconfig("unreachable", "https://127.0.0.1:1"),
        );
        let broken = dir.path().join("broken.yaml");
        write(&broken, "apiVersion: v1\nclusters: [ {\n");
        let no_crd = dir.path().join("no-crd.yaml");
        write(
            &no_crd,
            &kubeconfig("no-crd", &format!("http://{}", not_found_server())),
        );
        let silent = dir.path().join("silent.yaml");
        write(
            &silent,
            &kubeconfig("silent", &format!("https://{}", silent_server())),
        );
        let empty_home = dir.path().join("home");
        std::fs::create_dir_all(&empty_home).expect("creating a home dir");
        Self {
            _dir: dir,
            unreachable,
            broken,
            no_crd,
            silent,
            empty_home,
        }
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("writing a kubeconfig");
}

fn kubeconfig(name: &str, server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {name}\nclusters:\n- name: {name}\n  cluster: {{server: \"{server}\"}}\ncontexts:\n- name: {name}\n  context: {{cluster: {name}, user: {name}}}\nusers:\n- name: {name}\n  user: {{token: not-a-real-token}}\n"
    )
}

/// A server that answers every request the way kube-apiserver answers a request for an API group
/// it does not serve; returns its address.
fn not_found_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a port");
    let address = listener
        .local_addr()
        .expect("the bound address")
        .to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let body = "404 page not found\n";
            let _ = (&stream).write_all(
                format!(
                    "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    address
}

/// A server that accepts connections and never says a word; returns its address.
fn silent_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a port");
    let address = listener
        .local_addr()
        .expect("the bound address")
        .to_string();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().flatten() {
            open.push(stream);
        }
    });
    address
}
