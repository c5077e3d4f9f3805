//! The end-to-end harness: the `valkey-operator` binary as its own process, with a kubeconfig
//! that holds only a token of the ServiceAccount the manifests ship (so it runs under the shipped
//! RBAC, never as admin), one namespace per test, and bounded polling.

use std::fs::{self, File};
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{DeleteParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Api, Client};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::OnceCell;

use crate::support::cluster::{self, TestNamespace};

/// Where the operator's ServiceAccount, RBAC and leader Leases live (manifests/).
pub const OPERATOR_NAMESPACE: &str = "valkey-operator-system";
pub const OPERATOR_SERVICE_ACCOUNT: &str = "valkey-operator";
/// The default bound of every wait.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Polls `check` every 200 ms until it returns `Ok`, for at most `timeout`; then fails the test
/// with `what` and the last reason `check` gave.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(reason) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {reason}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// One test's world: its namespace (labelled to enforce the restricted Pod Security Standard,
/// as production namespaces are), the operator's kubeconfig, and a directory under target/ for
/// logs.
pub struct Env {
    pub ns: TestNamespace,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    /// The leader Lease name of this test's operators (unique per test).
    pub lease: String,
    started: usize,
}

impl Env {
    pub async fn new(prefix: &str) -> Self {
        install_manifests_once().await;
        let ns = TestNamespace::new(
            prefix,
            &[
                ("pod-security.kubernetes.io/enforce", "restricted"),
                ("pod-security.kubernetes.io/enforce-version", "latest"),
            ],
        )
        .await;
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("e2e")
            .join(&ns.name);
        fs::create_dir_all(&dir).expect("creating the test's directory under target/");
        let kubeconfig = dir.join("operator.kubeconfig");
        write_operator_kubeconfig(&ns.client, &kubeconfig).await;
        let lease = format!("e2e-{}", ns.name);
        Self {
            ns,
            dir,
            kubeconfig,
            lease,
            started: 0,
        }
    }

    pub fn client(&self) -> Client {
        self.ns.client.clone()
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        self.ns.api()
    }

    /// Starts an operator that watches this test's namespace and competes for its Lease.
    pub async fn start_operator(&mut self) -> Operator {
        let kubeconfig = self.kubeconfig.clone();
        self.start_operator_with(&kubeconfig).await
    }

    /// Starts an operator with another kubeconfig of the same ServiceAccount (e.g. one whose
    /// server is a proxy the test can cut).
    pub async fn start_operator_with(&mut self, kubeconfig: &Path) -> Operator {
        self.started += 1;
        let identity = format!("{}-{}", self.ns.name, self.started);
        Operator::start(self, identity, kubeconfig).await
    }

    /// Starts an operator and waits until it leads.
    pub async fn start_leader(&mut self) -> Operator {
        let operator = self.start_operator().await;
        operator.wait_leader(TIMEOUT).await;
        operator
    }

    pub async fn lease_holder(&self) -> Option<String> {
        Api::<Lease>::namespaced(self.client(), OPERATOR_NAMESPACE)
            .get_opt(&self.lease)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // A killed operator leaves its Lease behind; the namespace goes with TestNamespace.
        let lease = self.lease.clone();
        cluster::clean_up_with_admin(move |client| async move {
            let _ = Api::<Lease>::namespaced(client, OPERATOR_NAMESPACE)
                .delete(&lease, &DeleteParams::default())
                .await;
        });
    }
}

/// `kubectl apply -k manifests/` once per test binary.
async fn install_manifests_once() {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async { cluster::install_manifests().await })
        .await;
}

/// A kubeconfig with the cluster's server and CA and a fresh token of the operator's
/// ServiceAccount (TokenRequest API): the operator can do exactly what the shipped RBAC allows.
async fn write_operator_kubeconfig(admin: &Client, path: &Path) {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(2 * 3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), OPERATOR_NAMESPACE)
        .create_token_request(OPERATOR_SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .expect("requesting a token for the operator's ServiceAccount")
        .status
        .expect("the TokenRequest has a status")
        .token;
    let admin_config = Kubeconfig::read_from(cluster::kubeconfig_path())
        .expect("reading the cluster's kubeconfig");
    let cluster = admin_config
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .expect("the cluster's kubeconfig names a cluster");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": "valkey-operator", "user": {"token": token}}],
        "contexts": [{"name": "valkey-operator", "context": {
            "cluster": "local",
            "user": "valkey-operator",
            "namespace": OPERATOR_NAMESPACE,
        }}],
        "current-context": "valkey-operator",
    });
    let yaml = yaml_serde::to_string(&config).expect("serializing the kubeconfig");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .expect("creating the operator's kubeconfig");
    file.write_all(yaml.as_bytes())
        .expect("writing the operator's kubeconfig");
}

/// A running `valkey-operator run`, killed (SIGKILL) when dropped. Its log (JSON lines) is a
/// file under target/; a failing test prints its path and its last lines.
pub struct Operator {
    child: Child,
    pub identity: String,
    pub log: PathBuf,
    pub http: SocketAddr,
}

impl Operator {
    async fn start(env: &Env, identity: String, kubeconfig: &Path) -> Self {
        let http = free_port();
        let log = env.dir.join(format!("operator-{identity}.log"));
        let out = File::create(&log).expect("creating the operator's log file");
        let err = out.try_clone().expect("sharing the log file");
        let child = Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
            .args(["run", "--log-format", "json"])
            .args(["--watch-namespace", &env.ns.name])
            .args(["--lease-name", &env.lease])
            .args(["--lease-namespace", OPERATOR_NAMESPACE])
            .args(["--identity", &identity])
            .args(["--http-addr", &http.to_string()])
            .env("KUBECONFIG", kubeconfig)
            // Debug logs of the operator's own code: more chances to catch a leaked secret.
            .env("RUST_LOG", "info,valkey_operator=debug,valkey_core=debug")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("VALKEY_OPERATOR_WATCH_NAMESPACE")
            .env_remove("VALKEY_OPERATOR_HTTP_ADDR")
            .env_remove("VALKEY_OPERATOR_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting valkey-operator");
        let mut operator = Self {
            child,
            identity,
            log,
            http,
        };
        let healthy = eventually("the operator's /healthz", TIMEOUT, || {
            let exited = operator.child.try_wait().ok().flatten();
            let http = operator.http;
            async move {
                if let Some(status) = exited {
                    return Ok(Err(format!("the operator exited with {status}")));
                }
                http_get(http, "/healthz").await.map(Ok)
            }
        })
        .await;
        if let Err(e) = healthy {
            panic!(
                "{e}; log {}:\n{}",
                operator.log.display(),
                operator.log_tail(40)
            );
        }
        operator
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: no chance to release the Lease or finish a reconcile.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `/readyz`: `Ok` when it answers 200, else what it answered.
    #[allow(dead_code)] // used by tests/outage.rs
    pub async fn ready(&self) -> Result<(), String> {
        http_get(self.http, "/readyz").await.map(|_| ())
    }

    pub async fn metrics(&self) -> Result<String, String> {
        http_get(self.http, "/metrics").await
    }

    /// The `valkey_operator_leader` gauge.
    pub async fn leader(&self) -> Result<bool, String> {
        let metrics = self.metrics().await?;
        metric(&metrics, "valkey_operator_leader")
            .map(|v| v == 1.0)
            .ok_or_else(|| "no valkey_operator_leader in /metrics".to_owned())
    }

    pub async fn wait_leader(&self, timeout: Duration) {
        let what = format!("operator {} to lead", self.identity);
        eventually(&what, timeout, || async {
            match self.leader().await? {
                true => Ok(()),
                false => Err("valkey_operator_leader is 0".into()),
            }
        })
        .await;
    }

    pub fn log_text(&self) -> String {
        let mut text = String::new();
        let _ = File::open(&self.log).and_then(|mut f| f.read_to_string(&mut text));
        text
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- operator {} log: {}\n{}\n---",
                self.identity,
                self.log.display(),
                self.log_tail(30)
            );
        }
    }
}

/// The value of an unlabelled sample in a Prometheus/OpenMetrics text exposition.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The sum of every sample of a metric family (all label sets).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free port on 127.0.0.1")
}

/// A plain HTTP/1.0 GET; the body when the status is 200.
#[allow(dead_code)] // pub for the test binaries that scrape pods (operator/tests/metrics.rs)
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| format!("GET {path}: no answer within 5s"))?
        .map_err(|e| format!("GET {path}: {e}"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "GET {path}: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    Ok(body.to_owned())
}

/// The plugin binary beside this test binary (`cargo build -p kubectl-valkey` builds it).
#[allow(dead_code)] // not every test binary that includes the harness runs the plugin
pub fn plugin_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("kubectl-valkey"))
        .expect("the target dir");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p kubectl-valkey` (same profile) first",
        bin.display()
    );
    bin
}
