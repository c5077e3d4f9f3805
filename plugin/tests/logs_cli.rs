//! `logs` and `cli` against pods that exist: no operator runs here, so each test creates the
//! pods of a Valkey itself, with the operator's labels, on KWOK's fake nodes (tolerating their
//! taint), and tells KWOK what
//! "the container" does (hack/README.md):
//! - a Logs object per pod names a CRI-format file the test writes, which `kubectl logs` (and so
//!   the plugin) reads;
//! - an Exec object per pod runs `kubectl exec` commands on the host, with the environment a
//!   Valkey pod has (VALKEYCLI_AUTH holds the password) plus the test cluster's valkey-cli hook
//!   that sends commands to a REAL valkey-server started by the test: pod 0 (the primary) to one
//!   server, the other pods to a second server that replicates the first. Both have the ACL user
//!   `admin` with the password and the default user off, so every answer proves valkey-cli ran as
//!   `--user admin` with the password from the environment.
//!
//! The pods are owned by a ConfigMap (as their controller), so that no StatefulSet controller,
//! should an operator run against the cluster, adopts them.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Resource};
use serde_json::json;
use support::cluster::{self, TestNamespace};
use support::plugin::{self, Outcome, ok, run};
use valkey_core::api::Valkey;
use valkey_core::api::names::{self, ObjectNames, roles};
use valkey_core::desired::CONTAINER;
use valkey_core::status::is_ready;

const INSTANCE: &str = "cache";
const USER: &str = "admin";

/// A namespace with a Valkey, its pods, their KWOK Exec/Logs objects and a host valkey-server.
struct Setup {
    ns: TestNamespace,
    dir: tempfile::TempDir,
    password: String,
    owner: ConfigMap,
    /// Ports of the primary's and the replicas' valkey-server.
    ports: (u16, u16),
    _servers: (Server, Server),
}

impl Setup {
    async fn new(prefix: &str, pods: i32) -> Self {
        plugin::install();
        let ns = TestNamespace::new(prefix, &[]).await;
        let dir = tempfile::tempdir().expect("a temp dir");
        let password = format!("pw{}x{}", std::process::id(), nanos());
        let primary = Server::start(&dir.path().join("primary"), None, &password);
        let replica = Server::start(&dir.path().join("replica"), Some(primary.port), &password);
        ok(
            &[
                "create",
                INSTANCE,
                "-n",
                &ns.name,
                "--admin-user",
                USER,
                "--replicas",
                &pods.to_string(),
                "--no-volume",
            ],
            None,
        );
        let owner = ns
            .api::<ConfigMap>()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "test-owner"}}))
                    .expect("a ConfigMap"),
            )
            .await
            .expect("creating the pods' owner");
        let setup = Self {
            ns,
            dir,
            password,
            owner,
            ports: (primary.port, replica.port),
            _servers: (primary, replica),
        };
        for ordinal in 0..pods {
            setup.add_pod(ordinal, &[]).await;
        }
        for ordinal in 0..pods {
            setup.wait_ready(ordinal).await;
        }
        setup
    }

    fn pod_name(&self, ordinal: i32) -> String {
        ObjectNames::new(INSTANCE).pod(ordinal)
    }

    fn log_file(&self, ordinal: i32) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.pod_name(ordinal)))
    }

    /// Writes the pod's log file and KWOK objects, then the pod (so it never runs without them).
    async fn add_pod(&self, ordinal: i32, lines: &[(i64, &str)]) {
        let name = self.pod_name(ordinal);
        let port = if ordinal == 0 {
            self.ports.0
        } else {
            self.ports.1
        };
        append_log(&self.log_file(ordinal), lines);
        let kwok = |kind: &str, plural: &str| {
            let gvk = GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", kind);
            Api::<DynamicObject>::namespaced_with(
                self.ns.client.clone(),
                &self.ns.name,
                &ApiResource::from_gvk_with_plural(&gvk, plural),
            )
        };
        let logs = json!({
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
            "metadata": {"name": name},
            "spec": {"logs": [{"containers": [CONTAINER], "logsFile": self.log_file(ordinal), "follow": true}]},
        });
        let exec = json!({
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Exec",
            "metadata": {"name": name},
            "spec": {"execs": [{"containers": [CONTAINER], "local": {
                "workDir": self.dir.path(),
                "envs": [
                    {"name": "VALKEYCLI_AUTH", "value": self.password},
                    {"name": "VALKEYCLI_FORCE_HOST", "value": "127.0.0.1"},
                    {"name": "VALKEYCLI_FORCE_PORT", "value": port.to_string()},
                ],
            }}]},
        });
        for (api, object) in [(kwok("Logs", "logs"), logs), (kwok("Exec", "execs"), exec)] {
            let object: DynamicObject = serde_json::from_value(object).expect("a KWOK object");
            api.create(&PostParams::default(), &object)
                .await
                .expect("creating a KWOK object");
        }
        let role = if ordinal == 0 {
            roles::PRIMARY
        } else {
            roles::REPLICA
        };
        let owner = self
            .owner
            .controller_owner_ref(&())
            .expect("the owner's reference");
        let pod = json!({
            "metadata": {
                "name": name,
                "labels": {
                    names::labels::NAME: names::APP_NAME,
                    names::labels::INSTANCE: INSTANCE,
                    names::labels::ROLE: role,
                },
                "ownerReferences": [owner],
            },
            // On a KWOK node: its Exec and Logs objects play the container (hack/README.md).
            "spec": {
                "containers": [{"name": CONTAINER, "image": "valkey/valkey:9.1.2"}],
                "nodeSelector": {"type": "kwok"},
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            },
        });
        let pod: Pod = serde_json::from_value(pod).expect("a pod");
        self.ns
            .api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .expect("creating a pod");
    }

    async fn wait_ready(&self, ordinal: i32) {
        let name = self.pod_name(ordinal);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(pod) = self.ns.api::<Pod>().get(&name).await
                && is_ready(&pod)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("pod {name} is not ready after 60s");
    }

    fn plugin(&self, args: &[&str]) -> Command {
        let mut all = vec!["-n", self.ns.name.as_str()];
        all.extend_from_slice(args);
        plugin::kubectl_valkey(&all)
    }
}

#[tokio::test]
async fn logs_merge_every_pod_and_follow_pods_that_start_later() {
    let setup = Setup::new("plugin-logs", 0).await;
    setup
        .add_pod(
            0,
            &[
                (-3600, "Server initialized"),
                (-10, "Ready to accept connections"),
            ],
        )
        .await;
    setup
        .add_pod(
            1,
            &[
                (-1800, "Connecting to PRIMARY cache-0"),
                (-5, "MASTER <-> REPLICA sync: Finished with success"),
            ],
        )
        .await;
    setup.wait_ready(0).await;
    setup.wait_ready(1).await;

    let expected = [
        "[cache-0] Server initialized",
        "[cache-1] Connecting to PRIMARY cache-0",
        "[cache-0] Ready to accept connections",
        "[cache-1] MASTER <-> REPLICA sync: Finished with success",
    ];
    // KWOK picks new Logs objects up through a watch of its own: allow it a moment.
    let merged = eventually(
        || run(setup.plugin(&["logs", INSTANCE]), None),
        |o| o.stdout.lines().count() == 4,
    );
    assert_eq!(
        merged.stdout.lines().collect::<Vec<_>>(),
        expected,
        "merged in time order"
    );

    let one = ok_in(&setup, &["logs", INSTANCE, "--pod", "cache-1"]);
    assert_eq!(
        one.stdout.lines().collect::<Vec<_>>(),
        [expected[1], expected[3]]
    );
    let tail = ok_in(&setup, &["logs", INSTANCE, "--tail", "1"]);
    assert_eq!(
        tail.stdout.lines().collect::<Vec<_>>(),
        [expected[2], expected[3]]
    );
    let stamped = ok_in(
        &setup,
        &["logs", INSTANCE, "--timestamps", "--pod", "cache-0"],
    );
    let first = stamped.stdout.lines().next().unwrap_or_default();
    let stamp = first
        .strip_prefix("[cache-0] ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_default();
    assert!(
        stamp.parse::<jiff::Timestamp>().is_ok(),
        "a timestamp: {first}"
    );
    let recent = ok_in(&setup, &["logs", INSTANCE, "--since", "5m"]);
    assert_eq!(
        recent.stdout.lines().collect::<Vec<_>>(),
        [expected[2], expected[3]]
    );

    // -f: the lines so far, a line written later, and a pod that starts later.
    let mut follow = Follower::start(setup.plugin(&["logs", INSTANCE, "-f"]));
    follow.expect(expected[3]);
    follow.expect(expected[2]);
    append_log(&setup.log_file(0), &[(0, "written while following")]);
    follow.expect("[cache-0] written while following");
    setup
        .add_pod(2, &[(0, "hello from a pod that started later")])
        .await;
    follow.expect("[cache-2] hello from a pod that started later");
    append_log(&setup.log_file(2), &[(1, "and it keeps talking")]);
    follow.expect("[cache-2] and it keeps talking");
}

#[tokio::test]
async fn cli_runs_valkey_cli_in_the_primary_or_a_replica() {
    let setup = Setup::new("plugin-cli", 2).await;
    setup.grant_cli_rights_without_secrets(CLI_USER).await;
    let as_user = |args: &[&str]| {
        let mut all = vec!["--as", CLI_USER];
        all.extend_from_slice(args);
        run(setup.plugin(&all), None)
    };

    // Writes go to the primary; a user who may not read Secrets can do all of this, so the
    // password cannot have come through the plugin.
    let set = as_user(&["cli", INSTANCE, "--", "SET", "greeting", "hello"]);
    assert_eq!((set.code, set.stdout.trim()), (0, "OK"), "{set:?}");
    let whoami = as_user(&["cli", INSTANCE, "--", "ACL", "WHOAMI"]);
    assert_eq!(whoami.stdout.trim(), USER, "{whoami:?}");
    let role = as_user(&["cli", INSTANCE, "--", "ROLE"]);
    assert!(
        role.stdout.starts_with("master"),
        "the primary pod answers: {role:?}"
    );
    assert_eq!(
        as_user(&["cli", INSTANCE, "--", "GET", "greeting"])
            .stdout
            .trim(),
        "hello"
    );

    // --replica and --pod reach the replica's server, which replicated the write.
    let replica = eventually(
        || as_user(&["connect", INSTANCE, "--replica", "--", "GET", "greeting"]),
        |o| o.stdout.trim() == "hello",
    );
    assert_eq!(replica.stdout.trim(), "hello", "{replica:?}");
    let role = as_user(&["connect", INSTANCE, "--replica", "--", "ROLE"]);
    assert!(
        role.stdout.starts_with("slave"),
        "a replica answers: {role:?}"
    );
    let pod = as_user(&["cli", INSTANCE, "--pod", "cache-1", "--", "PING"]);
    assert_eq!(pod.stdout.trim(), "PONG", "{pod:?}");

    // Commands on stdin (not a terminal): valkey-cli reads them until the end of input.
    let piped = run(
        setup.plugin(&["cli", INSTANCE]),
        Some("SET piped yes\nGET piped\n"),
    );
    assert_eq!(piped.code, 0, "{piped:?}");
    assert_eq!(piped.stdout.lines().collect::<Vec<_>>(), ["OK", "yes"]);

    // valkey-cli's own failure and exit code come through unchanged.
    let refused = run(
        setup.plugin(&["cli", INSTANCE, "--", "--no-such-option"]),
        None,
    );
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains("Unrecognized option"),
        "{refused:?}"
    );
    assert!(
        !refused.stderr.contains("error:"),
        "the plugin adds nothing: {refused:?}"
    );

    // The same user may not read the Secret: the plugin never needed it.
    let secret = run(
        plugin::kubectl(&[
            "get",
            "secret",
            &format!("{INSTANCE}-auth"),
            "-n",
            &setup.ns.name,
            "--as",
            CLI_USER,
        ]),
        None,
    );
    assert_ne!(secret.code, 0, "{secret:?}");
}

#[tokio::test]
async fn cli_is_interactive_on_a_terminal() {
    let setup = Setup::new("plugin-tty", 1).await;
    ok_in(
        &setup,
        &["cli", INSTANCE, "--", "SET", "k", "typed-on-a-tty"],
    );
    // `script` gives the plugin a pseudo-terminal on stdin and stdout: raw mode, a TTY in the pod.
    let line = format!(
        "{} valkey -n {} cli {INSTANCE}",
        plugin::kubectl_bin().display(),
        setup.ns.name
    );
    let mut command = Command::new("script");
    command
        .args(["-qefc", &line, "/dev/null"])
        .env("PATH", plugin::path_env())
        .env("KUBECONFIG", cluster::kubeconfig_path())
        .env("TERM", "xterm");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting script");
    let stdin = child.stdin.take().expect("script's stdin");
    let stdout = child.stdout.take().expect("script's stdout");
    let terminal = std::thread::spawn(move || play_terminal(stdout, stdin));
    let (code, rest) = wait_with_timeout(child, Duration::from_secs(30));
    let output = format!("{}{rest}", terminal.join().unwrap_or_default());
    assert!(
        output.contains("typed-on-a-tty"),
        "the interactive session answered: {output}"
    );
    assert_eq!(code, Some(0), "{output}");
}

/// A user with exactly the rights `cli` needs, and none on Secrets.
const CLI_USER: &str = "valkey-cli-user";

impl Setup {
    async fn grant_cli_rights_without_secrets(&self, user: &str) {
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": "valkey-cli"},
            "rules": [
                {"apiGroups": [Valkey::group(&())], "resources": [Valkey::plural(&())], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
            ],
        }))
        .expect("a Role");
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "valkey-cli"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "valkey-cli"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }))
        .expect("a RoleBinding");
        self.ns
            .api::<Role>()
            .create(&PostParams::default(), &role)
            .await
            .expect("creating the Role");
        self.ns
            .api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await
            .expect("creating the RoleBinding");
    }
}

fn ok_in(setup: &Setup, args: &[&str]) -> Outcome {
    let outcome = run(setup.plugin(args), None);
    assert_eq!(outcome.code, 0, "{args:?}: {outcome:?}");
    outcome
}

/// Runs `attempt` until `done` holds (up to 20 s) and returns the last outcome.
fn eventually(attempt: impl Fn() -> Outcome, done: impl Fn(&Outcome) -> bool) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let outcome = attempt();
        if done(&outcome) || Instant::now() > deadline {
            return outcome;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A running `logs -f`, its stdout read line by line.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Follower {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting logs -f");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn expect(&mut self, line: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.seen.iter().any(|l| l == line) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(next) => self.seen.push(next),
                Err(_) => panic!(
                    "logs -f did not print {line:?} within 30s; it printed {:?}",
                    self.seen
                ),
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A valkey-server on the host (a replica of `primary` when given), stopped when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(dir: &Path, primary: Option<u16>, password: &str) -> Self {
        std::fs::create_dir_all(dir).expect("creating the server's dir");
        let port = free_port();
        let bin = Path::new(&cluster::tools_path()).join("valkey-server");
        let mut command = Command::new(bin);
        command
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--dir", &dir.display().to_string()])
            .args(["--user", "default", "off"])
            .args([
                "--user",
                USER,
                "on",
                &format!(">{password}"),
                "~*",
                "&*",
                "+@all",
            ]);
        if let Some(primary) = primary {
            command
                .args(["--replicaof", "127.0.0.1", &primary.to_string()])
                .args(["--masteruser", USER, "--masterauth", password]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting valkey-server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "valkey-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Appends CRI-format lines (`<RFC 3339 time> stdout F <message>`), each `seconds` from now.
fn append_log(path: &Path, lines: &[(i64, &str)]) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("opening a log file");
    let now = jiff::Timestamp::now();
    for (seconds, text) in lines {
        let at = now
            .checked_add(jiff::SignedDuration::from_secs(*seconds))
            .expect("a time");
        writeln!(
            file,
            "{} stdout F {text}",
            at.strftime("%Y-%m-%dT%H:%M:%S%.9fZ")
        )
        .expect("writing a log line");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default()
}

/// Waits for `child` (killing it after `limit`); its exit code, and its stdout and stderr.
/// Plays the terminal `script` is attached to: answers the line editor's cursor-position queries
/// (ESC[6n) as an 80-column terminal does (valkey-cli asks when the pseudo-terminal's size is
/// not known yet), types `GET k` once the first prompt shows and `quit` once the answer came.
/// Returns everything the session wrote.
fn play_terminal(mut stdout: impl Read, mut stdin: impl Write) -> String {
    const QUERY: &[u8] = b"\x1b[6n";
    let mut output = Vec::new();
    let (mut answered, mut typed_get, mut typed_quit) = (0, false, false);
    let mut chunk = [0u8; 4096];
    while let Ok(n) = stdout.read(&mut chunk) {
        if n == 0 {
            break;
        }
        output.extend_from_slice(&chunk[..n]);
        let queries: Vec<usize> = output
            .windows(QUERY.len())
            .enumerate()
            .filter(|(_, w)| *w == QUERY)
            .map(|(i, _)| i)
            .collect();
        for (k, &at) in queries.iter().enumerate().skip(answered) {
            // After "move 999 right" (ESC[999C) the cursor is in the last column.
            let since = if k == 0 { 0 } else { queries[k - 1] };
            let right = output[since..at].windows(6).any(|w| w == b"\x1b[999C");
            let answer: &[u8] = if right { b"\x1b[1;80R" } else { b"\x1b[1;1R" };
            let _ = stdin.write_all(answer).and_then(|_| stdin.flush());
            answered = k + 1;
        }
        let text = String::from_utf8_lossy(&output);
        if !typed_get && text.contains("> ") {
            let _ = stdin.write_all(b"GET k\r").and_then(|_| stdin.flush());
            typed_get = true;
        } else if typed_get && !typed_quit && text.contains("typed-on-a-tty") {
            let _ = stdin.write_all(b"quit\r").and_then(|_| stdin.flush());
            typed_quit = true;
        }
    }
    String::from_utf8_lossy(&output).into_owned()
}

fn wait_with_timeout(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("collecting output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}
