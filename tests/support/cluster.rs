//! The local control plane for tests: started (or reused) once per test binary through
//! `hack/cluster up`, one fresh namespace per test, removed when the test ends.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Config};

/// The workspace root (where `hack/`, `manifests/` and `docs/` live), whether these helpers are
/// compiled into a test of the root package or of a member such as `operator/`.
pub fn repo_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|toml| toml.lines().any(|l| l.trim() == "[workspace]"))
        })
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

fn cache_dir() -> PathBuf {
    std::env::var_os("VALKEY_OPERATOR_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/valkey-operator")
        })
}

static CLUSTER: OnceLock<String> = OnceLock::new();
static APISERVER_PORT: OnceLock<u16> = OnceLock::new();

/// Which cluster of the cache this test binary uses (`VALKEY_OPERATOR_CLUSTER` of hack/cluster):
/// `cluster` unless the environment or `use_own_cluster` says otherwise.
pub fn cluster_name() -> &'static str {
    CLUSTER.get_or_init(|| {
        std::env::var("VALKEY_OPERATOR_CLUSTER")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "cluster".to_owned())
    })
}

/// Makes this test binary run on a cluster of its own, `name`, started from the same cache's
/// binaries (for tests that break the control plane: the other tests keep theirs). Call it first
/// thing, before any other helper.
///
/// Its API server gets a fixed port (VALKEY_OPERATOR_APISERVER_PORT) from the kernel's ephemeral
/// range: kwokctl picks the ports of new clusters counting down from 32765, so while a test has
/// the API server stopped, a cluster created meanwhile (by anyone on the machine) could take a
/// port kwokctl chose, but not this one. It has no real nodes (`VALKEY_OPERATOR_REAL_NODES=0`)
/// and another cluster index than the main cluster (`own_cluster_index`): even without real
/// nodes a cluster routes its ranges, and its `down` removes the routes, rules and bridges of its
/// index, which would cut the main cluster's pods off.
pub fn use_own_cluster(name: &str) {
    let _ = CLUSTER.set(name.to_owned());
    assert_eq!(
        cluster_name(),
        name,
        "use_own_cluster must come before any other cluster helper"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port for the API server");
    let _ = APISERVER_PORT.set(port);
}

/// The cluster index of a cluster of its own: 3, or 2 when the main cluster is at 3.
fn own_cluster_index() -> &'static str {
    match std::env::var("VALKEY_OPERATOR_CLUSTER_INDEX").as_deref() {
        Ok("3") => "2",
        _ => "3",
    }
}

/// `hack/cluster ARGS...` for this binary's cluster.
pub fn hack_cluster(args: &[&str]) -> Command {
    let mut command = Command::new(repo_root().join("hack/cluster"));
    command
        .args(args)
        .env("VALKEY_OPERATOR_CLUSTER", cluster_name());
    if let Some(port) = APISERVER_PORT.get() {
        command
            .env("VALKEY_OPERATOR_APISERVER_PORT", port.to_string())
            .env("VALKEY_OPERATOR_REAL_NODES", "0")
            .env("VALKEY_OPERATOR_CLUSTER_INDEX", own_cluster_index());
    }
    command
}

fn state_dir() -> PathBuf {
    cache_dir().join(cluster_name())
}

/// The API server's audit log: one JSON line per request of the operator's ServiceAccount (the
/// policy is hack/cluster-manifests/audit-policy.yaml), since the cluster was created.
pub fn audit_log_path() -> PathBuf {
    state_dir().join("kwok/clusters/valkey-operator/logs/audit.log")
}

/// The kubeconfig `hack/cluster up` writes.
pub fn kubeconfig_path() -> PathBuf {
    state_dir().join("kubeconfig")
}

/// The pid of a running control-plane component (`etcd`, `kube-apiserver`, ...), from kwokctl's
/// pid file (see hack/README.md, cache layout).
pub fn component_pid(component: &str) -> Option<u32> {
    let file = state_dir()
        .join("kwok/clusters/valkey-operator/pids")
        .join(format!("{component}.pid"));
    let pid: u32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    std::path::Path::new(&format!("/proc/{pid}"))
        .exists()
        .then_some(pid)
}

/// The bin dir of the cluster's tools (kubectl, valkey-server, ...), from `hack/cluster env`.
pub fn tools_path() -> String {
    cluster_env("PATH")
        .map(|p| p.replace(":$PATH", ""))
        .unwrap_or_default()
}

/// A variable `hack/cluster env` exports for this binary's cluster (e.g. `VALKEY_OPERATOR_POD_CIDR`).
pub fn cluster_env(name: &str) -> Option<String> {
    let out = hack_cluster(&["env"])
        .output()
        .expect("running hack/cluster env");
    let prefix = format!("export {name}=");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.replace('"', ""))
}

/// Runs `hack/cluster ARGS...` (e.g. `node stop real-node-1`) and asserts that it succeeded.
pub fn run_hack_cluster(args: &[&str]) {
    let out = hack_cluster(args).output().expect("running hack/cluster");
    assert!(
        out.status.success(),
        "hack/cluster {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Brings the control plane up once for this test binary (a no-op when it already runs).
pub fn ensure_up() -> PathBuf {
    static UP: OnceLock<PathBuf> = OnceLock::new();
    UP.get_or_init(|| {
        let status = hack_cluster(&["up"])
            .status()
            .expect("running hack/cluster up");
        assert!(status.success(), "hack/cluster up failed");
        kubeconfig_path()
    })
    .clone()
}

/// The cluster's own kubectl, with the admin kubeconfig.
pub fn kubectl() -> Command {
    let mut kubectl = Command::new("kubectl");
    kubectl
        .env(
            "PATH",
            format!(
                "{}:{}",
                tools_path(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("KUBECONFIG", kubeconfig_path());
    kubectl
}

/// `kubectl apply -k manifests/` (the CRD, the operator's namespace, ServiceAccount and RBAC, its
/// Deployment), then waits for the CRD to be served. Safe to run from many tests at once.
pub async fn install_manifests() {
    ensure_up();
    let out = kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-k"])
        .arg(repo_root().join("manifests"))
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl apply -k manifests/ failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crds: Api<CustomResourceDefinition> = Api::all(admin_client().await);
    let established = await_condition(
        crds,
        "valkeys.database.kuberly.io",
        conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(30), established)
        .await
        .expect("the CRD is established within 30s")
        .expect("watching the CRD");
}

/// A client with the cluster's admin credentials.
pub async fn admin_client() -> Client {
    let path = ensure_up();
    let kubeconfig = Kubeconfig::read_from(&path).expect("reading the cluster's kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("loading the cluster's kubeconfig");
    Client::try_from(config).expect("building a client")
}

/// A namespace of its own for one test, deleted (with everything in it) when dropped.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
}

impl TestNamespace {
    /// `prefix` names the test; `labels` e.g. enforce a Pod Security level.
    pub async fn new(prefix: &str, labels: &[(&str, &str)]) -> Self {
        let client = admin_client().await;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{prefix}-{:x}{:05x}",
            std::process::id() & 0xfff,
            nanos & 0xfffff
        );
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        Self { name, client }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_TEST_NAMESPACES").is_some() {
            eprintln!("keeping namespace {}", self.name);
            return;
        }
        let name = self.name.clone();
        clean_up_with_admin(move |client| async move {
            let _ = Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::background())
                .await;
        });
    }
}

/// Runs an async clean-up with an admin client from a `Drop` (which cannot await): on a
/// short-lived runtime of its own thread, waiting for it to finish.
pub fn clean_up_with_admin<F, Fut>(task: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async { task(admin_client().await).await });
    })
    .join();
}
