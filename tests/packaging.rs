//! Packaging, proven with the real tools rather than by reading our own scripts back:
//!
//! - the operator image that `hack/image.sh` (`make image`) assembles without a container engine
//!   is read by skopeo and unpacked by umoci (which check every digest); its config runs a
//!   non-root user with the right entrypoint and labels; its root filesystem is the static binary
//!   and nothing else; and that binary, run from the unpacked root (chroot, as uid 65532, with the
//!   in-cluster service-account files a kubelet would mount and the manifests' own RBAC), reconciles
//!   a Valkey on the local control plane to Running;
//! - the kubectl-valkey archive of `hack/dist.sh` (`make dist`) and the krew manifest rendered for
//!   it pass real krew's `validate-krew-manifest` (which installs every platform of the manifest,
//!   here from a loopback HTTP server), install with `kubectl krew install --manifest --archive`
//!   into a temporary KREW_ROOT, answer `kubectl valkey version` through kubectl's plugin
//!   discovery, and uninstall;
//! - `kubectl valkey install --dry-run -o yaml` and `kubectl kustomize manifests/` (what
//!   `kubectl apply -k manifests/` applies) are the same objects, and both name the image by the
//!   version tag `make image` gives it;
//! - the Dockerfile, the committed krew/valkey.yaml, LICENSE and CHANGELOG agree with the rest.
//!
//! The builds are release builds (the first run of this file compiles the operator and the plugin
//! for x86_64-unknown-linux-gnu with a static C runtime); they land in target/ as `make image` /
//! `make dist` would, and the artifacts of the tests in target/packaging-test/.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine as _;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::config::Kubeconfig;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use support::cluster::{self, TestNamespace};
use support::commands::{describe, objects_by_key, run, stdout};
use valkey_core::api::Valkey;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const LICENSE_ID: &str = env!("CARGO_PKG_LICENSE");
const OPERATOR_UID: u32 = 65532;

fn root() -> PathBuf {
    cluster::repo_root()
}

/// `repository` of [workspace.package] in Cargo.toml.
fn workspace_repository() -> String {
    let toml = fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    toml.lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| l.trim().strip_prefix("repository"))
        .and_then(|l| l.split('"').nth(1))
        .expect("a repository in [workspace.package]")
        .to_owned()
}

fn tag() -> String {
    format!("v{VERSION}")
}

/// Where this test binary puts its artifacts: not dist/, which belongs to `make`, and one
/// directory per process, as several test runs may share the checkout. Those of processes that
/// are gone are removed.
fn work_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| support::commands::run_dir("packaging-test"))
        .clone()
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = work_dir().join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// PATH with the control plane's tools (kubectl, kubectl-krew, validate-krew-manifest) first.
fn tools_path() -> String {
    format!(
        "{}:{}",
        cluster::tools_path(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The full path of a program on PATH (for commands run with a cleared environment).
fn which(name: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not on PATH"))
}

fn has_command(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// skopeo and umoci read the image independently of hack/image.sh. Installed from Debian when
/// missing, as hack/cluster installs redis-tools: a fresh CI machine has neither.
fn ensure_image_tools() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let missing: Vec<&str> = ["skopeo", "umoci"]
            .into_iter()
            .filter(|t| !has_command(t))
            .collect();
        if missing.is_empty() {
            return;
        }
        let apt = |args: &[&str]| {
            let mut apt = if is_root() {
                Command::new("apt-get")
            } else {
                let mut c = Command::new("sudo");
                c.args(["-n", "apt-get"]);
                c
            };
            apt.env("DEBIAN_FRONTEND", "noninteractive")
                .args(args)
                .stdin(Stdio::null())
                .output()
        };
        let install: Vec<&str> = ["install", "-y", "--no-install-recommends"]
            .into_iter()
            .chain(missing.iter().copied())
            .collect();
        let mut out = apt(&install);
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            // Package lists may be missing or stale on a fresh machine.
            let _ = apt(&["update"]);
            out = apt(&install);
        }
        assert!(
            out.as_ref().is_ok_and(|o| o.status.success()),
            "this test reads the image with skopeo and umoci; installing {missing:?} with apt-get \
             failed ({out:?}): install them and rerun"
        );
    });
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

// ------------------------------------------------------------------------------------ the image

struct Image {
    /// The OCI image layout directory.
    layout: PathBuf,
    /// The same layout as one tar (what `make image` ships).
    archive: PathBuf,
}

/// `hack/image.sh --out target/packaging-test/image`, once per test binary.
fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let out = fresh_dir("image");
        let started = Instant::now();
        let report = run(Command::new(root().join("hack/image.sh"))
            .arg("--out")
            .arg(&out)
            .stderr(Stdio::inherit()));
        eprintln!(
            "hack/image.sh ({:.0?}):\n{}",
            started.elapsed(),
            stdout(&report)
        );
        Image {
            layout: out.join("image"),
            archive: out.join(format!("valkey-operator-{}.oci.tar", tag())),
        }
    })
}

/// The reference `make image` tags the image with.
fn image_ref() -> String {
    stdout(&run(Command::new(root().join("hack/image.sh")).arg("ref")))
        .trim()
        .to_owned()
}

fn skopeo_json(args: &[&str], image: &Image) -> Value {
    ensure_image_tools();
    let out = run(Command::new("skopeo")
        .args(["--insecure-policy", "inspect"])
        .args(args)
        .arg(format!("oci-archive:{}", image.archive.display())));
    serde_json::from_slice(&out.stdout).expect("skopeo prints JSON")
}

/// The image config (the OCI config blob), as skopeo reads it from the archive.
fn image_config(image: &Image) -> Value {
    skopeo_json(&["--config"], image)
}

/// Every path below `dir`, relative, with its metadata.
fn walk(dir: &Path, base: &Path, found: &mut Vec<(String, fs::Metadata)>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let entry = entry.expect("a directory entry");
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).expect("metadata");
        let rel = path
            .strip_prefix(base)
            .expect("below the base")
            .to_string_lossy()
            .into_owned();
        let is_dir = meta.is_dir();
        found.push((rel, meta));
        if is_dir {
            walk(&path, base, found);
        }
    }
}

/// True for an ELF executable without a program interpreter (PT_INTERP): the kernel runs it
/// without ld.so and no shared library is ever loaded.
fn is_static_elf(bytes: &[u8]) -> bool {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false; // not a 64-bit little-endian ELF
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[o..o + 8]);
        u64::from_le_bytes(b) as usize
    };
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let off = phoff + i * phentsize;
        off + 4 <= bytes.len() && u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()) != 3
    })
}

#[test]
fn the_image_is_a_static_binary_alone_run_as_a_non_root_user() {
    let image = image();
    let config = image_config(image);
    let c = &config["config"];
    assert_eq!(config["os"], "linux", "{config:#}");
    assert_eq!(config["architecture"], "amd64", "{config:#}");
    assert_eq!(
        c["User"],
        format!("{OPERATOR_UID}:{OPERATOR_UID}"),
        "{config:#}"
    );
    assert_eq!(c["Entrypoint"], serde_json::json!(["/valkey-operator"]));
    assert_eq!(c["Cmd"], serde_json::json!(["run"]));
    assert!(c["ExposedPorts"]["8080/tcp"].is_object(), "{config:#}");
    let labels = &c["Labels"];
    assert_eq!(labels["org.opencontainers.image.title"], "valkey-operator");
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    assert_eq!(labels["org.opencontainers.image.licenses"], LICENSE_ID);
    assert_eq!(
        labels["org.opencontainers.image.source"],
        workspace_repository()
    );
    assert_eq!(
        config["rootfs"]["diff_ids"].as_array().map(Vec::len),
        Some(1)
    );

    // The tag: the version, as in the manifests; never `latest`.
    let layout_index: Value =
        serde_json::from_slice(&fs::read(image.layout.join("index.json")).expect("index.json"))
            .expect("index.json is JSON");
    let annotations = &layout_index["manifests"][0]["annotations"];
    assert_eq!(annotations["org.opencontainers.image.ref.name"], tag());
    assert_eq!(annotations["io.containerd.image.name"], image_ref());
    assert!(
        image_ref().ends_with(&format!(":{}", tag())),
        "{}",
        image_ref()
    );
    assert!(!image_ref().ends_with(":latest"));

    // umoci unpacks it (checking every digest) and derives the runtime config from the image's.
    let bundle = unpack(image, "bundle-check");
    let runtime: Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).expect("config.json"))
            .expect("config.json is JSON");
    assert_eq!(runtime["process"]["user"]["uid"], OPERATOR_UID);
    assert_eq!(runtime["process"]["user"]["gid"], OPERATOR_UID);
    assert_eq!(
        runtime["process"]["args"],
        serde_json::json!(["/valkey-operator", "run"])
    );

    // The root filesystem: one file. No shell, no libc, no /etc, nothing else.
    let rootfs = bundle.join("rootfs");
    let mut entries = Vec::new();
    walk(&rootfs, &rootfs, &mut entries);
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["valkey-operator"],
        "the root filesystem holds {names:?}"
    );
    let meta = &entries[0].1;
    assert!(meta.is_file());
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "owned by root");
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o755,
        "executable, not writable by the runtime user"
    );
    let binary = fs::read(rootfs.join("valkey-operator")).expect("reading the binary");
    assert!(
        is_static_elf(&binary),
        "the binary has a program interpreter"
    );
    assert!(!rootfs.join("bin/sh").exists());

    let archive_size = fs::metadata(&image.archive).expect("archive").len();
    eprintln!(
        "image {}: archive {} bytes, root filesystem {} bytes (one file)",
        image_ref(),
        archive_size,
        binary.len()
    );
    assert!(
        archive_size < 40 << 20,
        "the image is small ({archive_size} bytes)"
    );
}

/// `umoci unpack` of the image into target/packaging-test/<name> (a runtime bundle).
fn unpack(image: &Image, name: &str) -> PathBuf {
    ensure_image_tools();
    let bundle = fresh_dir(name);
    fs::remove_dir(&bundle).expect("umoci creates the bundle itself");
    let mut cmd = Command::new("umoci");
    cmd.arg("unpack");
    if !is_root() {
        cmd.arg("--rootless");
    }
    run(cmd
        .arg("--image")
        .arg(format!("{}:{}", image.layout.display(), tag()))
        .arg(&bundle));
    bundle
}

// ----------------------------------------------------------- the operator, run from the image

/// The Deployment's container of manifests/deployment.yaml.
fn deployment_container() -> Value {
    let text = fs::read_to_string(root().join("manifests/deployment.yaml")).expect("deployment");
    let deployment: Value = yaml_serde::from_str(&text).expect("deployment.yaml is YAML");
    deployment["spec"]["template"]["spec"]["containers"][0].clone()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// GET on a loopback port: (status code, body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

/// Kills the operator if the test ends early.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn process_uid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_from_the_image_root_and_reconciles_a_valkey() {
    let image = image();
    let config = image_config(image);
    let bundle = unpack(image, "bundle-run");
    let rootfs = bundle.join("rootfs");

    // The control plane with the manifests installed: the CRD, and the operator's ServiceAccount
    // with its ClusterRole, whose rights this run uses (not the admin's).
    cluster::install_manifests().await;
    let ns = TestNamespace::new("packaging", &[]).await;
    let kubeconfig = Kubeconfig::read_from(cluster::kubeconfig_path()).expect("kubeconfig");
    let cluster_info = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .expect("a cluster entry");
    let server = url_host_port(cluster_info.server.as_deref().expect("a server URL"));
    let ca = base64::engine::general_purpose::STANDARD
        .decode(
            cluster_info
                .certificate_authority_data
                .as_deref()
                .expect("an inlined CA (hack/cluster flattens the kubeconfig)"),
        )
        .expect("base64 CA");
    let sa_namespace = "valkey-operator-system";
    let token = stdout(&run(cluster::kubectl().args([
        "-n",
        sa_namespace,
        "create",
        "token",
        "valkey-operator",
        "--duration=1h",
    ])));

    // What a kubelet mounts into the operator's pod: the service-account token, CA and namespace.
    let sa_dir = rootfs.join("var/run/secrets/kubernetes.io/serviceaccount");
    fs::create_dir_all(&sa_dir).expect("creating the service-account dir");
    for (file, content) in [
        ("token", token.trim().as_bytes()),
        ("ca.crt", &ca[..]),
        ("namespace", sa_namespace.as_bytes()),
    ] {
        fs::write(sa_dir.join(file), content).expect("writing a service-account file");
        fs::set_permissions(sa_dir.join(file), fs::Permissions::from_mode(0o644)).expect("chmod");
    }

    // entrypoint + the Deployment's args (they replace the image's cmd, as in a pod), and flags
    // that keep this run apart from other tests on the shared control plane.
    let mut argv: Vec<String> = config["config"]["Entrypoint"]
        .as_array()
        .expect("an entrypoint")
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect();
    argv.extend(
        deployment_container()["args"]
            .as_array()
            .expect("the Deployment's args")
            .iter()
            .map(|v| v.as_str().expect("a string").to_owned()),
    );
    let port = free_port();
    argv.extend([
        "--no-leader-election".to_owned(),
        "--watch-namespace".to_owned(),
        ns.name.clone(),
        "--http-addr".to_owned(),
        format!("127.0.0.1:{port}"),
    ]);
    let user = config["config"]["User"]
        .as_str()
        .expect("a user")
        .to_owned();
    let log_path = bundle.join("operator.log");
    let log = fs::File::create(&log_path).expect("creating the log file");
    let mut cmd = if is_root() {
        let mut c = Command::new(which("chroot"));
        c.arg(format!("--userspec={user}")).arg(&rootfs);
        c
    } else {
        let (uid, gid) = user.split_once(':').expect("uid:gid");
        let mut c = Command::new(which("unshare"));
        c.args(["--user", "--map-user", uid, "--map-group", gid, "--root"])
            .arg(&rootfs);
        c
    };
    cmd.args(&argv)
        .env_clear()
        .env("KUBERNETES_SERVICE_HOST", &server.0)
        .env("KUBERNETES_SERVICE_PORT", &server.1)
        .env("POD_NAME", "valkey-operator-packaging-test")
        .env("POD_NAMESPACE", sa_namespace)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log);
    eprintln!("running {}", describe(&cmd));
    let mut operator = Running(
        cmd.spawn()
            .expect("starting the operator from the image root"),
    );
    let pid = operator.0.id();

    // A Valkey (docs/examples/minimal.yaml) reaches Running.
    let example: Value = yaml_serde::from_str(
        &fs::read_to_string(root().join("docs/examples/minimal.yaml")).expect("minimal.yaml"),
    )
    .expect("minimal.yaml is YAML");
    let name = example["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned();
    let valkeys: Api<DynamicObject> = Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::erase::<Valkey>(&()),
    );
    valkeys
        .patch(
            &name,
            &PatchParams::apply("packaging-test"),
            &Patch::Apply(&example),
        )
        .await
        .expect("creating the Valkey");
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut phase = String::new();
    let mut uid_seen = None;
    while Instant::now() < deadline {
        if let Some(status) = operator.0.try_wait().expect("polling the operator") {
            panic!(
                "the operator exited ({status}):\n{}",
                fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        // The latest reading: right after the spawn, chroot may not have switched user yet.
        uid_seen = process_uid(pid).or(uid_seen);
        let valkey = valkeys.get(&name).await.expect("reading the Valkey");
        phase = valkey.data["status"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if phase == "Running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let logs = fs::read_to_string(&log_path).unwrap_or_default();
    assert_eq!(
        phase, "Running",
        "the Valkey did not reach Running; operator log:\n{logs}"
    );
    assert_eq!(
        uid_seen,
        Some(OPERATOR_UID),
        "the operator runs as the image's user"
    );

    // Health and metrics answer on the address given.
    let ready = http_get(port, "/readyz");
    assert_eq!(ready.as_ref().map(|r| r.0), Some(200), "{ready:?}");
    let metrics = http_get(port, "/metrics").expect("/metrics answers");
    assert_eq!(metrics.0, 200);
    assert!(!metrics.1.is_empty());

    // The Deployment's --log-format=json took effect: every line is a JSON object.
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let parsed: Result<Value, _> = serde_json::from_str(line);
        assert!(
            parsed.is_ok_and(|v| v.is_object()),
            "a log line is not JSON: {line}"
        );
    }

    // SIGTERM (what the kubelet sends) ends it cleanly.
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = operator.0.try_wait().expect("polling the operator") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the operator did not stop within 30s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "the operator exited with {status} after SIGTERM:\n{}",
        fs::read_to_string(&log_path).unwrap_or_default()
    );
}

/// ("127.0.0.1", "6443") from "https://127.0.0.1:6443".
fn url_host_port(url: &str) -> (String, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let (host, port) = authority
        .rsplit_once(':')
        .expect("the API server URL has a port");
    (host.trim_matches(['[', ']']).to_owned(), port.to_owned())
}

// -------------------------------------------------------------------------- the plugin and krew

struct Dist {
    dir: PathBuf,
    archive: PathBuf,
    manifest: PathBuf,
}

const GITHUB_RELEASES: &str = "https://github.com/kuberly/valkey-operator/releases/download";

/// `hack/dist.sh --platforms linux/amd64`, into target/packaging-test/dist, once per test binary.
fn dist() -> &'static Dist {
    static DIST: OnceLock<Dist> = OnceLock::new();
    DIST.get_or_init(|| {
        let dir = fresh_dir("dist");
        let manifest = fresh_dir("krew").join("valkey.yaml");
        let started = Instant::now();
        let report = run(Command::new(root().join("hack/dist.sh"))
            .args(["--platforms", "linux/amd64", "--out"])
            .arg(&dir)
            .arg("--manifest")
            .arg(&manifest)
            .stderr(Stdio::inherit()));
        eprintln!(
            "hack/dist.sh ({:.0?}):\n{}",
            started.elapsed(),
            stdout(&report)
        );
        Dist {
            archive: dir.join(format!("kubectl-valkey_{}_linux_amd64.tar.gz", tag())),
            dir,
            manifest,
        }
    })
}

#[derive(Deserialize)]
struct KrewPlugin {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: BTreeMap<String, String>,
    spec: KrewSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KrewSpec {
    version: String,
    short_description: String,
    platforms: Vec<KrewPlatform>,
}

#[derive(Deserialize)]
struct KrewPlatform {
    selector: KrewSelector,
    uri: String,
    sha256: String,
    bin: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KrewSelector {
    match_labels: BTreeMap<String, String>,
}

fn read_krew(path: &Path) -> KrewPlugin {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn archive_entries(archive: &Path) -> Vec<String> {
    let mut entries: Vec<String> = stdout(&run(Command::new("tar").arg("-tzf").arg(archive)))
        .lines()
        .map(str::to_owned)
        .collect();
    entries.sort();
    entries
}

/// Serves the files of `dir` over HTTP on a loopback port, for krew's downloads.
fn serve(dir: PathBuf) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(&stream);
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    return;
                }
                loop {
                    let mut header = String::new();
                    match reader.read_line(&mut header) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if header == "\r\n" || header == "\n" => break,
                        Ok(_) => {}
                    }
                }
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let file = path.trim_start_matches('/');
                let mut stream = &stream;
                match (!file.contains("..") && !file.contains('/'))
                    .then(|| fs::read(dir.join(file)).ok())
                    .flatten()
                {
                    Some(body) => {
                        let _ = write!(
                            stream,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/gzip\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = stream.write_all(&body);
                    }
                    None => {
                        let _ = write!(
                            stream,
                            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                    }
                }
            });
        }
    });
    port
}

/// A command with a PATH of: the temporary krew root's bin, the control plane's tools, the
/// system's. No other kubectl-valkey (a `cargo install`ed one, say) can answer in its place.
fn krew_command(program: &str, krew_root: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("HOME", krew_root.join("home"))
        .env("KREW_ROOT", krew_root)
        .env("KREW_NO_UPGRADE_CHECK", "1")
        .env("KUBECONFIG", cluster::kubeconfig_path())
        .env(
            "PATH",
            format!(
                "{}:{}:/usr/local/bin:/usr/bin:/bin",
                krew_root.join("bin").display(),
                cluster::tools_path()
            ),
        );
    cmd
}

#[test]
fn the_plugin_archive_and_its_krew_manifest_install_with_real_krew() {
    let dist = dist();

    // The archive: the binary and LICENSE, nothing else; SHA256SUMS and the manifest agree.
    assert_eq!(
        archive_entries(&dist.archive),
        ["LICENSE", "kubectl-valkey"]
    );
    let archive_bytes = fs::read(&dist.archive).expect("reading the archive");
    let sha = sha256_hex(&archive_bytes);
    let sums = fs::read_to_string(dist.dir.join("SHA256SUMS")).expect("SHA256SUMS");
    let archive_name = dist
        .archive
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        sums.lines().any(|l| l == format!("{sha}  {archive_name}")),
        "SHA256SUMS lacks {sha}  {archive_name}:\n{sums}"
    );
    let plugin = read_krew(&dist.manifest);
    assert_eq!(
        plugin.api_version,
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(plugin.kind, "Plugin");
    assert_eq!(plugin.metadata["name"], "valkey");
    assert_eq!(plugin.spec.version, tag());
    assert!(!plugin.spec.short_description.contains('\n'));
    assert_eq!(plugin.spec.platforms.len(), 1);
    let platform = &plugin.spec.platforms[0];
    assert_eq!(platform.selector.match_labels["os"], "linux");
    assert_eq!(platform.selector.match_labels["arch"], "amd64");
    assert_eq!(platform.sha256, sha);
    assert_eq!(platform.bin, "kubectl-valkey");
    assert_eq!(
        platform.uri,
        format!("{GITHUB_RELEASES}/{}/{archive_name}", tag())
    );

    // validate-krew-manifest, with its install step: each platform is installed by real krew,
    // downloading from the URI and checking the sha256 and the LICENSE. The release URL does not
    // exist yet (and this machine has no internet), so the same archives are served on loopback.
    let port = serve(dist.dir.clone());
    let served = fresh_dir("krew-served").join("valkey.yaml");
    fs::write(
        &served,
        fs::read_to_string(&dist.manifest).unwrap().replace(
            &format!("{GITHUB_RELEASES}/{}", tag()),
            &format!("http://127.0.0.1:{port}"),
        ),
    )
    .unwrap();
    let validated = run(Command::new("validate-krew-manifest")
        .env("PATH", tools_path())
        .arg("-manifest")
        .arg(&served));
    let said = String::from_utf8_lossy(&validated.stderr);
    assert!(
        said.contains("all 1 spec.platforms installed fine"),
        "validate-krew-manifest did not install the platform:\n{said}"
    );

    // kubectl krew install --manifest --archive, into a temporary KREW_ROOT.
    let krew_root = fresh_dir("krew-root");
    fs::create_dir_all(krew_root.join("home")).unwrap();
    run(krew_command("kubectl", &krew_root)
        .args(["krew", "install"])
        .arg(format!("--manifest={}", dist.manifest.display()))
        .arg(format!("--archive={}", dist.archive.display())));
    let link = krew_root.join("bin/kubectl-valkey");
    assert!(
        link.exists(),
        "krew put no kubectl-valkey in {}",
        link.display()
    );
    let receipt = krew_root.join("receipts/valkey.yaml");
    assert!(receipt.is_file(), "no krew receipt {}", receipt.display());
    // Every krew command but install wants a plugin index: a git clone of krew-index, which
    // `kubectl krew update` fetches from the internet. An empty local repository stands in.
    run(Command::new("git")
        .args(["init", "--quiet"])
        .arg(krew_root.join("index/default")));
    let listed = stdout(&run(
        krew_command("kubectl", &krew_root).args(["krew", "list"])
    ));
    // Installed from a manifest rather than from an index: krew lists it as detached/valkey.
    assert!(
        listed.lines().any(|l| matches!(
            l.split_whitespace().next(),
            Some("valkey" | "detached/valkey")
        )),
        "kubectl krew list does not show valkey:\n{listed}"
    );

    // kubectl finds it on PATH: plugin discovery, then `kubectl valkey version`.
    let plugins = stdout(&run(
        krew_command("kubectl", &krew_root).args(["plugin", "list"])
    ));
    assert!(
        plugins.contains(&link.display().to_string()),
        "kubectl plugin list does not show {}:\n{plugins}",
        link.display()
    );
    let version =
        stdout(&run(krew_command("kubectl", &krew_root)
            .args(["valkey", "version", "--client", "-o", "json"])));
    let version: Value = serde_json::from_str(&version).expect("version -o json prints JSON");
    assert_eq!(version["plugin"], tag(), "{version}");
    let text = stdout(&run(
        krew_command("kubectl", &krew_root).args(["valkey", "version", "--client"])
    ));
    assert!(text.contains(&tag()), "{text}");

    // kubectl krew uninstall removes it, and kubectl no longer knows `valkey`.
    run(krew_command("kubectl", &krew_root).args(["krew", "uninstall", "valkey"]));
    assert!(!link.exists() && fs::symlink_metadata(&link).is_err());
    assert!(!krew_root.join("store/valkey").exists());
    assert!(!receipt.exists());
    let gone = krew_command("kubectl", &krew_root)
        .args(["valkey", "version", "--client"])
        .output()
        .expect("running kubectl");
    assert!(
        !gone.status.success(),
        "kubectl valkey still answers after uninstall"
    );
}

#[test]
fn the_release_binaries_are_static_for_linux() {
    let dist = dist();
    let unpacked = fresh_dir("plugin-unpacked");
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&dist.archive)
        .arg("-C")
        .arg(&unpacked));
    let plugin = fs::read(unpacked.join("kubectl-valkey")).expect("the plugin binary");
    assert!(
        is_static_elf(&plugin),
        "kubectl-valkey for linux is not static"
    );
    assert_eq!(
        fs::read(unpacked.join("LICENSE")).unwrap(),
        fs::read(root().join("LICENSE")).unwrap()
    );
    eprintln!(
        "kubectl-valkey linux/amd64: {} bytes, archive {} bytes",
        plugin.len(),
        fs::metadata(&dist.archive).unwrap().len()
    );
}

#[test]
fn kubectl_valkey_install_and_apply_k_install_the_same_objects() {
    // The plugin of the release archive.
    let dist = dist();
    let unpacked = fresh_dir("plugin-install-check");
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&dist.archive)
        .arg("-C")
        .arg(&unpacked));
    let plugin = unpacked.join("kubectl-valkey");
    let out = Command::new(&plugin)
        .args(["install", "--dry-run", "-o", "yaml"])
        .stdin(Stdio::null())
        .output()
        .expect("running kubectl-valkey");
    assert!(
        out.status.success(),
        "`kubectl-valkey install --dry-run -o yaml` is needed to compare what `kubectl valkey \
         install` installs with `kubectl apply -k manifests/`, and it failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let from_plugin = objects_by_key(&stdout(&out), "kubectl-valkey install --dry-run -o yaml");

    // What `kubectl apply -k manifests/` applies: kubectl's own kustomize build.
    let kustomized = run(Command::new("kubectl")
        .env("PATH", tools_path())
        .arg("kustomize")
        .arg(root().join("manifests")));
    let from_kustomize = objects_by_key(&stdout(&kustomized), "kubectl kustomize manifests/");

    assert_eq!(
        from_plugin.keys().collect::<Vec<_>>(),
        from_kustomize.keys().collect::<Vec<_>>(),
        "the two install different objects"
    );
    for (key, object) in &from_kustomize {
        assert_eq!(
            &from_plugin[key], object,
            "{key} differs between kubectl valkey install and kubectl apply -k"
        );
    }

    // Both run the image `make image` builds, by its version tag.
    let deployment = from_plugin
        .values()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("an image");
    assert_eq!(image, image_ref());
    assert!(image.ends_with(&format!(":{}", tag())) && !image.ends_with(":latest"));
    assert_eq!(deployment_container()["image"], image_ref());
}

// ------------------------------------------------------------ files that must agree with the rest

/// The Dockerfile (no engine here to build it) says what hack/image.sh writes.
#[test]
fn the_dockerfile_describes_the_same_image() {
    let text = fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let final_stage = text
        .rsplit_once("\nFROM scratch")
        .map(|(_, s)| s)
        .expect("a FROM scratch stage");
    let lines: Vec<&str> = final_stage.lines().map(str::trim).collect();
    for want in [
        format!("ARG VERSION={VERSION}"),
        format!("USER {OPERATOR_UID}:{OPERATOR_UID}"),
        r#"ENTRYPOINT ["/valkey-operator"]"#.to_owned(),
        r#"CMD ["run"]"#.to_owned(),
        "EXPOSE 8080/tcp".to_owned(),
        "COPY --from=build --chmod=0755 /out/valkey-operator /valkey-operator".to_owned(),
    ] {
        assert!(
            lines.contains(&want.as_str()),
            "the Dockerfile lacks `{want}`"
        );
    }
    // Only one thing is added to the scratch image.
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("COPY") || l.starts_with("ADD") || l.starts_with("RUN"))
            .count(),
        1
    );
    // The same labels, with the same fixed values.
    let config = image_config(image());
    let labels = config["config"]["Labels"].as_object().expect("labels");
    for (key, value) in labels {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("{key}=")))
            .unwrap_or_else(|| panic!("the Dockerfile sets no label {key}"));
        let set = line
            .split_once(&format!("{key}="))
            .map(|(_, v)| v.trim_end_matches('\\').trim().trim_matches('"'))
            .unwrap();
        if !set.starts_with("${") {
            assert_eq!(set, value.as_str().unwrap(), "label {key}");
        }
    }
}

#[test]
fn the_committed_krew_manifest_is_valid_and_of_this_version() {
    let path = root().join("krew/valkey.yaml");
    let plugin = read_krew(&path);
    assert_eq!(plugin.metadata["name"], "valkey");
    assert_eq!(
        plugin.spec.version,
        tag(),
        "krew/valkey.yaml is of another version: make dist"
    );
    assert!(!plugin.spec.platforms.is_empty());
    for p in &plugin.spec.platforms {
        let (os, arch) = (
            &p.selector.match_labels["os"],
            &p.selector.match_labels["arch"],
        );
        assert_eq!(
            p.uri,
            format!(
                "{GITHUB_RELEASES}/{}/kubectl-valkey_{}_{os}_{arch}.tar.gz",
                tag(),
                tag()
            )
        );
        assert_eq!(p.sha256.len(), 64);
        assert!(
            p.sha256
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        let exe = if os == "windows" {
            "kubectl-valkey.exe"
        } else {
            "kubectl-valkey"
        };
        assert_eq!(p.bin, exe);
    }
    // Structure, platforms and selectors, by krew's own validator (its install step would
    // download from the release, which does not exist until the release workflow publishes it).
    let out = run(Command::new("validate-krew-manifest")
        .env("PATH", tools_path())
        .args(["-skip-install", "-manifest"])
        .arg(&path));
    drop(out);
    // Rendered from the template: every line of the template outside the platform block is there.
    let template = fs::read_to_string(root().join("krew/valkey.yaml.tmpl")).unwrap();
    let rendered = fs::read_to_string(&path).unwrap();
    let mut in_block = false;
    for line in template.lines() {
        if line.contains("# BEGIN PLATFORM") {
            in_block = true;
        } else if line.contains("# END PLATFORM") {
            in_block = false;
        } else if !in_block && !line.starts_with('#') {
            let line = line.replace("@VERSION@", &tag());
            assert!(
                rendered.lines().any(|l| l == line),
                "krew/valkey.yaml is not rendered from the current template (lacks `{line}`): make dist"
            );
        }
    }
}

#[test]
fn license_and_changelog() {
    let license = fs::read_to_string(root().join("LICENSE")).expect("LICENSE");
    assert_eq!(LICENSE_ID, "Apache-2.0");
    assert!(license.contains("Apache License") && license.contains("Version 2.0, January 2004"));
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
    let changelog = fs::read_to_string(root().join("CHANGELOG.md")).expect("CHANGELOG.md");
    assert!(
        changelog
            .lines()
            .any(|l| l.starts_with(&format!("## [{VERSION}]"))),
        "CHANGELOG.md has no section for {VERSION}"
    );
}
