//! The rendered valkey.conf, auth.conf, start.sh and probes, run for real: valkey-server from the
//! test cluster's tool dir (`hack/cluster env`) boots them, and a minimal RESP client checks
//! auth, replication and spec.config over TCP. The password never goes on a command line.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use valkey_core::api::Valkey;
use valkey_core::desired::{
    self, AUTH_CONF_KEY, CONFIG_DIR, DATA_DIR, Desired, Facts, START_SH_KEY, VALKEY_CONF_KEY,
};

/// Everything valkey's config parser could trip over: spaces, both quotes, backslashes, `#`, a
/// line break followed by a directive that would open a password-less user, CR, tab, NUL and
/// non-ASCII.
const NASTY_PASSWORD: &str = "p a\"s's\\w#rd\nuser intruder on nopass ~* +@all\r\t\0é€ \\x41\" end";

/// Tests listen on loopback only, except the one proving the rendered `bind` works.
const LOOPBACK: Option<&str> = Some("127.0.0.1");

const WAIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// valkey-server and temp dirs.

/// The dir holding valkey-server and valkey-cli: the one `hack/cluster env` names, else the only
/// dir under the tool cache (the cluster's script may have moved on to a newer build).
fn bin_dir() -> PathBuf {
    let root = env!("CARGO_MANIFEST_DIR");
    let from_env = Command::new(Path::new(root).join("hack/cluster"))
        .arg("env")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("export PATH="))
                .and_then(|p| p.trim_matches('"').split(':').next().map(PathBuf::from))
        });
    if let Some(dir) = from_env.filter(|d| d.join("valkey-server").is_file()) {
        return dir;
    }
    let cache = std::env::var_os("VALKEY_OPERATOR_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/valkey-operator")
        });
    std::fs::read_dir(cache.join("bin"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|d| d.join("valkey-server").is_file())
        .expect("no valkey-server: run `hack/cluster up` once to build the test tools")
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "valkey-conf-test-{}-{what}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("creating a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running valkey-server, killed when dropped.
struct Server {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Boots the rendered files, changed only where a test must: the include path and `dir`
    /// point into the temp dir (valkey applies `dir` while parsing the file, so /data must exist
    /// before a command-line `--dir` could override it), and port, dir and bind are overridden on
    /// the command line.
    fn boot(files: &Rendered, bind: Option<&str>, extra: &[&str]) -> Self {
        let dir = TempDir::new("server");
        let auth = dir.0.join(AUTH_CONF_KEY);
        std::fs::write(&auth, &files.auth_conf).unwrap();
        let include = format!("include {CONFIG_DIR}/auth/{AUTH_CONF_KEY}");
        assert!(
            files.valkey_conf.contains(&include),
            "{}",
            files.valkey_conf
        );
        let data = dir.0.join("data");
        let conf = files
            .valkey_conf
            .replace(&include, &format!("include {}", auth.display()))
            .replace(
                &format!("\ndir {DATA_DIR}\n"),
                &format!("\ndir {}\n", data.display()),
            );
        let conf_path = dir.0.join(VALKEY_CONF_KEY);
        std::fs::write(&conf_path, conf).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.0.join("server.log")).unwrap();
        let child = Command::new(bin_dir().join("valkey-server"))
            .arg(&conf_path)
            .args(["--port", &port.to_string()])
            .arg("--dir")
            .arg(&data)
            .args(bind.map(|b| ["--bind", b]).into_iter().flatten())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting valkey-server");
        let mut server = Server { child, port, dir };
        server.wait_until_listening();
        server
    }

    fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("valkey-server exited with {status}:\n{}", self.log());
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "valkey-server did not listen within {WAIT:?}:\n{}",
            self.log()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default()
    }

    fn connect(&self) -> Conn {
        Conn::open(IpAddr::from([127, 0, 0, 1]), self.port)
    }

    /// A connection logged in as `user`.
    fn login(&self, user: &str, password: &str) -> Conn {
        let mut conn = self.connect();
        let reply = conn.cmd(&["AUTH", user, password]);
        assert_eq!(
            reply,
            Reply::Simple("OK".into()),
            "AUTH {user}\n{}",
            self.log()
        );
        conn
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------------------------
// A minimal RESP2 client.

#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Reply {
    fn error(&self) -> &str {
        match self {
            Reply::Error(e) => e,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    fn text(&self) -> String {
        match self {
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            Reply::Simple(s) => s.clone(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(ip: IpAddr, port: u16) -> Self {
        let stream = TcpStream::connect((ip, port)).expect("connecting to valkey-server");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let writer = stream.try_clone().unwrap();
        Self {
            reader: BufReader::new(stream),
            writer,
        }
    }

    fn cmd(&mut self, args: &[&str]) -> Reply {
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend(format!("${}\r\n", arg.len()).bytes());
            request.extend(arg.bytes());
            request.extend(b"\r\n");
        }
        self.writer.write_all(&request).expect("sending a command");
        self.read()
    }

    fn read(&mut self) -> Reply {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("reading a reply");
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1);
        match kind {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" => match rest.parse::<i64>().unwrap() {
                n if n < 0 => Reply::Bulk(None),
                n => {
                    let mut body = vec![0; n as usize + 2];
                    self.reader.read_exact(&mut body).unwrap();
                    body.truncate(n as usize);
                    Reply::Bulk(Some(body))
                }
            },
            "*" => {
                let n: i64 = rest.parse().unwrap();
                Reply::Array((0..n.max(0)).map(|_| self.read()).collect())
            }
            _ => panic!("unexpected reply {line:?}"),
        }
    }

    /// One field of `INFO <section>`.
    fn info(&mut self, section: &str, field: &str) -> Option<String> {
        let info = self.cmd(&["INFO", section]).text();
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(str::to_owned)
    }

    fn config_get(&mut self, key: &str) -> String {
        match self.cmd(&["CONFIG", "GET", key]) {
            Reply::Array(kv) if kv.len() == 2 => kv[1].text(),
            other => panic!("CONFIG GET {key}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering.

struct Rendered {
    valkey_conf: String,
    auth_conf: String,
    start_sh: String,
    desired: Desired,
}

fn valkey(spec: serde_json::Value) -> Valkey {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "database.kuberly.io/v1alpha1",
        "kind": "Valkey",
        "metadata": {"name": "cache", "namespace": "ns", "uid": "00000000-0000-4000-8000-00000000c0de"},
        "spec": spec,
    }))
    .expect("a valid Valkey")
}

/// The operator user's password in every rendered config.
const OPERATOR_PASSWORD: &str = "operator-pass\"word\n with # and spaces";
/// The metrics user's password in every rendered config.
const METRICS_PASSWORD: &str = "metrics-pass\"word";

fn render(valkey: &Valkey, password: &str) -> Rendered {
    let facts = Facts {
        primary: None,
        old_password: None,
        rotation_started: None,
        password: password.into(),
        new_password: true,
        operator_password: OPERATOR_PASSWORD.into(),
        new_operator_password: true,
        initialized: false,
        metrics_password: METRICS_PASSWORD.into(),
        new_metrics_password: true,
    };
    let desired = desired::objects(valkey, &facts).expect("building the objects");
    let data = desired.config_map.data.clone().unwrap_or_default();
    let acl = desired.acl_secret.data.clone().unwrap_or_default();
    Rendered {
        valkey_conf: data[VALKEY_CONF_KEY].clone(),
        start_sh: data[START_SH_KEY].clone(),
        auth_conf: String::from_utf8(acl[AUTH_CONF_KEY].0.clone()).unwrap(),
        desired,
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn the_default_user_needs_the_password() {
    let files = render(
        &valkey(serde_json::json!({"volume": {"enabled": false}})),
        NASTY_PASSWORD,
    );
    let server = Server::boot(&files, LOOPBACK, &[]);

    let mut anonymous = server.connect();
    assert!(anonymous.cmd(&["GET", "k"]).error().starts_with("NOAUTH"));
    assert!(
        anonymous
            .cmd(&["AUTH", "not-the-password"])
            .error()
            .starts_with("WRONGPASS")
    );
    // The line break in the password did not smuggle a user in.
    let intruder = anonymous.cmd(&["AUTH", "intruder", "x"]);
    assert!(intruder.error().starts_with("WRONGPASS"), "{intruder:?}");

    let mut client = server.connect();
    assert_eq!(
        client.cmd(&["AUTH", NASTY_PASSWORD]),
        Reply::Simple("OK".into())
    );
    assert_eq!(client.cmd(&["SET", "k", "v"]), Reply::Simple("OK".into()));
    assert_eq!(client.cmd(&["GET", "k"]).text(), "v");
    let mut named = server.login("default", NASTY_PASSWORD);
    assert_eq!(named.cmd(&["ACL", "WHOAMI"]).text(), "default");
    let users = named.cmd(&["ACL", "USERS"]);
    // Besides the user's, only the operator's own (restricted) user.
    assert_eq!(
        users,
        Reply::Array(vec![
            Reply::Bulk(Some(b"default".to_vec())),
            Reply::Bulk(Some(b"valkey-operator".to_vec())),
        ])
    );
    // Persistence on the emptyDir too: a container restart in the same pod keeps the data.
    assert_eq!(named.config_get("appendonly"), "yes");
}

#[test]
fn another_user_shuts_the_default_user_out() {
    let spec = serde_json::json!({
        "user": "admin",
        "resource": {"memory": "512Mi"},
        "config": {"maxmemory-policy": "allkeys-lru", "notify-keyspace-events": "Ex"},
    });
    let files = render(&valkey(spec), NASTY_PASSWORD);
    let server = Server::boot(&files, LOOPBACK, &[]);

    let mut anonymous = server.connect();
    assert!(anonymous.cmd(&["PING"]).error().starts_with("NOAUTH"));
    for attempt in [
        vec!["AUTH", NASTY_PASSWORD],
        vec!["AUTH", "default", NASTY_PASSWORD],
        vec!["AUTH", "default", ""],
    ] {
        let reply = anonymous.cmd(&attempt);
        assert!(
            reply.error().starts_with("WRONGPASS"),
            "{attempt:?}: {reply:?}"
        );
    }

    let mut admin = server.login("admin", NASTY_PASSWORD);
    assert_eq!(admin.cmd(&["SET", "k", "v"]), Reply::Simple("OK".into()));
    assert_eq!(admin.cmd(&["GET", "k"]).text(), "v");
    assert_eq!(admin.config_get("maxmemory-policy"), "allkeys-lru");
    assert!(admin.config_get("notify-keyspace-events").contains('E'));
    assert_eq!(
        admin.config_get("maxmemory"),
        (512u64 * 1024 * 1024 * 3 / 4).to_string()
    );
    assert_eq!(admin.config_get("appendonly"), "yes");
    assert_eq!(admin.config_get("appendfsync"), "everysec");
    assert_eq!(admin.config_get("masteruser"), "admin");
}

#[test]
fn a_replica_syncs_from_the_primary_and_refuses_writes() {
    let spec = serde_json::json!({"replicas": 3, "user": "admin"});
    let files = render(&valkey(spec), NASTY_PASSWORD);
    let primary = Server::boot(&files, LOOPBACK, &[]);
    let mut writer = primary.login("admin", NASTY_PASSWORD);
    assert_eq!(
        writer.cmd(&["SET", "before", "1"]),
        Reply::Simple("OK".into())
    );

    let replica_of = primary.port.to_string();
    let replica = Server::boot(&files, LOOPBACK, &["--replicaof", "127.0.0.1", &replica_of]);
    let mut reader = replica.login("admin", NASTY_PASSWORD);
    let deadline = Instant::now() + WAIT;
    while reader.info("replication", "master_link_status").as_deref() != Some("up") {
        assert!(
            Instant::now() < deadline,
            "the replica did not sync within {WAIT:?}:\n{}\nprimary:\n{}",
            replica.log(),
            primary.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(reader.cmd(&["GET", "before"]).text(), "1");

    // Writes after the sync stream over.
    assert_eq!(
        writer.cmd(&["SET", "after", "2"]),
        Reply::Simple("OK".into())
    );
    let deadline = Instant::now() + WAIT;
    while reader.cmd(&["GET", "after"]) != Reply::Bulk(Some(b"2".to_vec())) {
        assert!(
            Instant::now() < deadline,
            "the write did not reach the replica"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        reader
            .cmd(&["SET", "k", "v"])
            .error()
            .starts_with("READONLY")
    );
}

/// The rendered `bind * -::*` (not overridden here) with protected mode on lets remote clients
/// in with the password, and only with it. Skipped when the machine has no non-loopback address.
#[test]
fn remote_clients_get_in_with_the_password() {
    let Some(ip) = outbound_ip() else {
        eprintln!("no non-loopback address; skipping");
        return;
    };
    for user in ["default", "admin"] {
        let files = render(&valkey(serde_json::json!({"user": user})), NASTY_PASSWORD);
        let server = Server::boot(&files, None, &[]);
        let mut remote = Conn::open(ip, server.port);
        let reply = remote.cmd(&["PING"]);
        assert!(
            reply.error().starts_with("NOAUTH"),
            "{user} via {ip}: {reply:?}"
        );
        assert_eq!(
            remote.cmd(&["AUTH", user, NASTY_PASSWORD]),
            Reply::Simple("OK".into())
        );
        assert_eq!(remote.cmd(&["PING"]), Reply::Simple("PONG".into()));
    }
}

/// This machine's address towards the outside (no packet is sent: UDP connect only routes).
fn outbound_ip() -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The StatefulSet's probes, run as the kubelet would (argv as built, password from the env).
/// The probes log in through cli.sh with the password file the ACL Secret projects (which
/// follows a rotation, unlike the environment), falling back to the old-password file while the
/// server does not accept the new one yet; a wrong password fails readiness.
#[test]
fn the_probes_authenticate_through_their_password_files() {
    let password = "probe password with \"quotes\" and \\ and # and $(date)";
    let files = render(&valkey(serde_json::json!({"user": "admin"})), password);
    let server = Server::boot(&files, LOOPBACK, &[]);
    let etc = TempDir::new("probe-etc");
    let conf_dir = etc.0.display().to_string();
    let cli_sh = files.desired.config_map.data.as_ref().unwrap()[desired::CLI_SH_KEY]
        .replace(CONFIG_DIR, &conf_dir);
    std::fs::write(etc.0.join(desired::CLI_SH_KEY), cli_sh).unwrap();
    std::fs::create_dir_all(etc.0.join("auth")).unwrap();
    let files_with = |new: &str, old: &str| {
        std::fs::write(etc.0.join(desired::PASSWORD_PATH), new).unwrap();
        std::fs::write(etc.0.join(desired::OLD_PASSWORD_PATH), old).unwrap();
    };
    let container = &files
        .desired
        .statefulset
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let probes = [
        ("readiness", container.readiness_probe.as_ref()),
        ("liveness", container.liveness_probe.as_ref()),
    ];
    for (name, probe) in probes {
        let argv: Vec<String> = probe
            .and_then(|p| p.exec.as_ref())
            .and_then(|e| e.command.clone())
            .unwrap_or_else(|| panic!("{name} probe is an exec"))
            .into_iter()
            .map(|a| a.replace(CONFIG_DIR, &conf_dir))
            .collect();
        // The environment holds a stale password: the files win.
        let run = || probe_status(&argv, "stale-environment-password", server.port);
        files_with(password, "");
        assert!(run().status.success(), "{name}: {:?}", run());
        files_with("not-on-this-server-yet", password);
        assert!(
            run().status.success(),
            "{name} during a rotation: {:?}",
            run()
        );
        if name == "readiness" {
            files_with("wrong", "");
            assert!(!run().status.success(), "{name} passes a wrong password");
            files_with("wrong", "also-wrong");
            assert!(!run().status.success(), "{name} passes wrong passwords");
        }
    }
    files_with(password, "");
    let liveness = container.liveness_probe.as_ref().unwrap();
    let argv: Vec<String> = liveness
        .exec
        .as_ref()
        .unwrap()
        .command
        .clone()
        .unwrap()
        .into_iter()
        .map(|a| a.replace(CONFIG_DIR, &conf_dir))
        .collect();
    let port = server.port;
    drop(server);
    let dead = probe_status(&argv, password, port);
    assert!(
        !dead.status.success(),
        "liveness passes without a server: {dead:?}"
    );
}

/// auth.conf of a rotation in progress boots: the user accepts the old and the new password, and
/// replicas log in to their primary with the old one (which every pod accepts until the end).
#[test]
fn a_rotation_in_progress_accepts_both_passwords() {
    let valkey = valkey(serde_json::json!({"user": "admin", "replicas": 2}));
    let facts = Facts {
        primary: None,
        old_password: Some(NASTY_PASSWORD.into()),
        rotation_started: Some("2026-12-01T10:00:00Z".into()),
        password: "the new one".into(),
        new_password: true,
        operator_password: OPERATOR_PASSWORD.into(),
        new_operator_password: true,
        initialized: false,
        metrics_password: METRICS_PASSWORD.into(),
        new_metrics_password: true,
    };
    let desired = desired::objects(&valkey, &facts).expect("building the objects");
    let data = desired.config_map.data.clone().unwrap_or_default();
    let acl = desired.acl_secret.data.clone().unwrap_or_default();
    let files = Rendered {
        valkey_conf: data[VALKEY_CONF_KEY].clone(),
        start_sh: data[START_SH_KEY].clone(),
        auth_conf: String::from_utf8(acl[AUTH_CONF_KEY].0.clone()).unwrap(),
        desired,
    };
    let server = Server::boot(&files, LOOPBACK, &[]);
    server.login("admin", NASTY_PASSWORD);
    let mut admin = server.login("admin", "the new one");
    let masterauth = admin.cmd(&["CONFIG", "GET", "masterauth"]);
    assert_eq!(
        masterauth,
        Reply::Array(vec![
            Reply::Bulk(Some(b"masterauth".to_vec())),
            Reply::Bulk(Some(NASTY_PASSWORD.as_bytes().to_vec())),
        ])
    );
    let mut other = server.connect();
    assert!(
        !other.cmd(&["AUTH", "admin", "neither"]).error().is_empty(),
        "a third password is refused"
    );
}

fn probe_status(argv: &[String], password: &str, port: u16) -> Output {
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .env("PATH", path)
        .env("VALKEYCLI_AUTH", password)
        // Test hook of the cluster's valkey-cli wrapper: the probe's fixed address goes here.
        .env("VALKEYCLI_FORCE_HOST", "127.0.0.1")
        .env("VALKEYCLI_FORCE_PORT", port.to_string())
        .output()
        .expect("running the probe")
}

/// start.sh with a stand-in valkey-server that prints its arguments.
#[test]
fn the_start_script_starts_a_primary_or_a_replica() {
    let files = render(&valkey(serde_json::json!({"replicas": 3})), "pw");
    let dir = TempDir::new("start");
    let bin = dir.0.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let stub = bin.join("valkey-server");
    std::fs::write(&stub, "#!/bin/sh\necho \"$@\"\n").unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&stub)
        .status()
        .unwrap();
    let conf_dir = dir.0.join("etc");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let script = files
        .start_sh
        .replace(CONFIG_DIR, &conf_dir.display().to_string());
    std::fs::write(dir.0.join("start.sh"), &script).unwrap();

    let data_dir = dir.0.join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    let script = script.replace(&format!("{DATA_DIR}/"), &format!("{}/", data_dir.display()));
    std::fs::write(dir.0.join("start.sh"), &script).unwrap();
    let write = |key: &str, value: Option<&str>| match value {
        Some(v) => std::fs::write(conf_dir.join(key), v).unwrap(),
        None => {
            let _ = std::fs::remove_file(conf_dir.join(key));
        }
    };
    write("min-replicas-to-write", Some("1"));

    let start = |pod: &str, primary: Option<&str>| {
        write("primary", primary);
        let out = Command::new("sh")
            .arg(dir.0.join("start.sh"))
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("POD_NAME", pod)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    };
    let conf = format!(
        "{}/valkey.conf --min-replicas-to-write 1",
        conf_dir.display()
    );
    assert_eq!(start("cache-0", Some("cache-0")), (true, conf.clone()));
    assert_eq!(
        start("cache-0", Some("cache-2")),
        (
            true,
            format!("{conf} --replicaof cache-2.cache-headless.ns.svc 6379")
        ),
        "a replica's primary is named without a cluster domain: the pod's search path adds it"
    );
    assert_eq!(
        start("cache-1", None),
        (false, String::new()),
        "no primary known"
    );

    // The boot guard: once the instance has run, a primary with an empty data dir refuses to
    // start (the operator promotes a replica that has the data); a replica starts anyway.
    write("initialized", Some("true"));
    assert_eq!(
        start("cache-0", Some("cache-0")),
        (false, String::new()),
        "an empty primary must not serve"
    );
    assert!(
        start("cache-1", Some("cache-0")).0,
        "a replica may start empty"
    );
    std::fs::create_dir_all(data_dir.join("appendonlydir")).unwrap();
    assert_eq!(start("cache-0", Some("cache-0")), (true, conf.clone()));
    std::fs::remove_dir_all(data_dir.join("appendonlydir")).unwrap();
    std::fs::write(data_dir.join("dump.rdb"), "x").unwrap();
    assert_eq!(start("cache-0", Some("cache-0")), (true, conf.clone()));
    std::fs::remove_file(data_dir.join("dump.rdb")).unwrap();
    // A new instance (or one the operator has not seen run) starts empty as it must.
    write("initialized", Some("false"));
    assert_eq!(start("cache-0", Some("cache-0")), (true, conf.clone()));
    // Garbage in the fencing key reads as no fencing rather than breaking the start.
    write("min-replicas-to-write", Some("1; rm -rf /"));
    assert_eq!(
        start("cache-0", Some("cache-0")),
        (
            true,
            format!(
                "{}/valkey.conf --min-replicas-to-write 0",
                conf_dir.display()
            )
        )
    );
}

/// The operator's own ACL user may run what the operator needs and nothing else: no key, no
/// data, no ACL, no shutdown.
#[test]
fn the_operator_user_may_only_steer_replication() {
    let files = render(
        &valkey(serde_json::json!({"replicas": 3, "user": "admin"})),
        NASTY_PASSWORD,
    );
    let server = Server::boot(&files, LOOPBACK, &[]);
    let mut admin = server.login("admin", NASTY_PASSWORD);
    assert_eq!(admin.cmd(&["SET", "k", "v"]), Reply::Simple("OK".into()));
    let mut op = server.login("valkey-operator", OPERATOR_PASSWORD);
    assert_eq!(op.cmd(&["PING"]), Reply::Simple("PONG".into()));
    assert!(op.info("replication", "role").is_some());
    assert_eq!(op.config_get("min-replicas-to-write"), "0");
    assert_eq!(
        op.cmd(&["CONFIG", "SET", "min-replicas-to-write", "0"]),
        Reply::Simple("OK".into())
    );
    for forbidden in [
        vec!["GET", "k"],
        vec!["SET", "k", "x"],
        vec!["KEYS", "*"],
        vec!["FLUSHALL"],
        vec!["ACL", "LIST"],
        vec!["CLIENT", "LIST"],
        vec!["EVAL", "return 1", "0"],
        vec!["SHUTDOWN", "NOSAVE"],
        vec!["MODULE", "LIST"],
        vec!["CONFIG", "REWRITE"],
    ] {
        let reply = op.cmd(&forbidden);
        assert!(
            reply.error().starts_with("NOPERM"),
            "{forbidden:?}: {reply:?}"
        );
    }
    assert_eq!(admin.cmd(&["GET", "k"]).text(), "v");
    // The password appears in no argv of the server.
    assert!(!server.log().contains(OPERATOR_PASSWORD));
}

/// The metrics exporter's user (spec.metrics) reads statistics and nothing else; the real
/// redis_exporter (the cache's build, what the sidecar image runs) logged in as it, with the
/// environment the sidecar gets, serves the Valkey's metrics without a permission error.
#[test]
fn the_metrics_user_may_only_read_statistics() {
    let files = render(
        &valkey(serde_json::json!({"replicas": 1, "metrics": {"enabled": true}})),
        NASTY_PASSWORD,
    );
    let server = Server::boot(&files, LOOPBACK, &[]);
    let mut admin = server.login("default", NASTY_PASSWORD);
    assert_eq!(admin.cmd(&["SET", "k", "v"]), Reply::Simple("OK".into()));
    let mut metrics = server.login("valkey-metrics", METRICS_PASSWORD);
    assert_eq!(metrics.cmd(&["PING"]), Reply::Simple("PONG".into()));
    assert!(metrics.info("memory", "used_memory").is_some());
    assert_eq!(
        metrics.cmd(&["CLIENT", "SETNAME", "redis_exporter"]),
        Reply::Simple("OK".into())
    );
    for allowed in [
        vec!["LATENCY", "LATEST"],
        vec!["LATENCY", "HISTOGRAM"],
        vec!["SLOWLOG", "LEN"],
    ] {
        let reply = metrics.cmd(&allowed);
        assert!(!matches!(reply, Reply::Error(_)), "{allowed:?}: {reply:?}");
    }
    for forbidden in [
        vec!["GET", "k"],
        vec!["SET", "k", "x"],
        vec!["SCAN", "0"],
        vec!["CONFIG", "GET", "masterauth"],
        vec!["CONFIG", "GET", "*"],
        vec!["SLOWLOG", "GET", "1"],
        vec!["CLIENT", "LIST"],
        vec!["ACL", "LIST"],
        vec!["REPLICAOF", "NO", "ONE"],
        vec!["FLUSHALL"],
        vec!["SUBSCRIBE", "c"],
    ] {
        let reply = metrics.cmd(&forbidden);
        assert!(
            reply.error().starts_with("NOPERM"),
            "{forbidden:?}: {reply:?}"
        );
    }

    // The exporter, as the sidecar runs it: everything through the environment.
    let exporter = bin_dir().join("redis_exporter");
    assert!(
        exporter.is_file(),
        "no redis_exporter in the tool dir: run `hack/cluster build`"
    );
    let container = desired_metrics_env(&files.desired);
    let web = free_port();
    let dir = TempDir::new("exporter");
    let log = std::fs::File::create(dir.0.join("exporter.log")).unwrap();
    let mut command = Command::new(&exporter);
    command.env_clear();
    for (name, value) in &container {
        command.env(name, value);
    }
    let mut child = command
        .env("REDIS_ADDR", format!("redis://127.0.0.1:{}", server.port))
        .env("REDIS_PASSWORD", METRICS_PASSWORD)
        .env(
            "REDIS_EXPORTER_WEB_LISTEN_ADDRESS",
            format!("127.0.0.1:{web}"),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting redis_exporter");
    let scraped = (|| {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(body) = http_get(web, "/metrics").filter(|b| b.contains("redis_up")) {
                return Some(body);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    })();
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.0.join("exporter.log")).unwrap_or_default();
    let body = scraped.unwrap_or_else(|| panic!("redis_exporter served no metrics:\n{log}"));
    assert!(body.lines().any(|l| l == "redis_up 1"), "{body}");
    let used = metric(&body, "redis_memory_used_bytes").expect("redis_memory_used_bytes");
    assert!(used > 0.0, "{used}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("redis_instance_info{") && l.contains("role=\"master\"")),
        "{body}"
    );
    assert!(metric(&body, "redis_connected_slaves").is_some(), "{body}");
    assert!(!log.contains("NOPERM"), "{log}");
    assert!(!log.contains(METRICS_PASSWORD) && !server.log().contains(METRICS_PASSWORD));
}

/// The literal environment of the metrics sidecar (its password comes from a Secret).
fn desired_metrics_env(d: &Desired) -> Vec<(String, String)> {
    let spec = d.statefulset.spec.template.spec.as_ref().unwrap();
    let container = spec
        .containers
        .iter()
        .find(|c| c.name == desired::METRICS_CONTAINER)
        .expect("the metrics sidecar");
    container
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// The body of `GET path` on 127.0.0.1:`port`, when it answers 200.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.1 200").then(|| body.to_owned()))
}

/// The value of an unlabelled series.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

async fn eventually<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The operator's client (valkey_core::replication) against real servers booted from the
/// rendered configs, as the operator's own user: INFO facts, a planned switchover with
/// FAILOVER TO, a promotion and a repoint by hand, fencing and client kill.
#[test]
fn the_operator_steers_replication_through_its_client() {
    use valkey_core::replication::{Conn, FailoverStarted, Role, Target};
    let files = render(
        &valkey(serde_json::json!({"replicas": 3, "user": "admin"})),
        NASTY_PASSWORD,
    );
    let a = Server::boot(&files, LOOPBACK, &[]);
    let a_port = a.port.to_string();
    let b = Server::boot(&files, LOOPBACK, &["--replicaof", "127.0.0.1", &a_port]);
    let mut admin = a.login("admin", NASTY_PASSWORD);
    for key in ["k1", "k2", "k3"] {
        assert_eq!(admin.cmd(&["SET", key, "v"]), Reply::Simple("OK".into()));
    }
    let target =
        |port: u16| Target::operator("127.0.0.1", port, OPERATOR_PASSWORD, Duration::from_secs(2));
    block_on(async {
        let ca = Conn::open(&target(a.port))
            .await
            .expect("the operator logs in");
        let cb = Conn::open(&target(b.port))
            .await
            .expect("the operator logs in");
        ca.ping().await.unwrap();
        let ib = eventually("the replica syncs", async || {
            cb.info().await.ok().filter(|i| i.link_up && i.keys == 3)
        })
        .await;
        assert_eq!(ib.role, Some(Role::Replica));
        assert_eq!(ib.primary_host.as_deref(), Some("127.0.0.1"));
        assert_eq!(ib.primary_port, Some(a.port));
        assert!(ib.has_synced(), "{ib:?}");
        let ia = ca.info().await.unwrap();
        assert_eq!(ia.role, Some(Role::Primary));
        assert_eq!((ia.connected_replicas, ia.online_replicas), (1, 1));
        assert_eq!(ia.keys, 3);
        assert!(ia.offset > 0 && ia.offset >= ib.offset, "{ia:?} {ib:?}");

        // A planned switchover: FAILOVER TO the replica by its address.
        assert_eq!(
            ca.failover_to("127.0.0.1", b.port, Duration::from_secs(5))
                .await
                .unwrap(),
            FailoverStarted::Started
        );
        eventually("the roles swap", async || {
            let (ia, ib) = (ca.info().await.ok()?, cb.info().await.ok()?);
            (ia.role == Some(Role::Replica) && ib.role == Some(Role::Primary)).then_some(())
        })
        .await;
        // A second FAILOVER on what is now a replica is refused, in the server's words.
        assert!(matches!(
            ca.failover_to("127.0.0.1", b.port, Duration::from_secs(1))
                .await
                .unwrap(),
            FailoverStarted::Refused(_)
        ));

        // And back by hand, as a failover does: promote a, point b at it.
        ca.promote().await.unwrap();
        cb.replicate_from("127.0.0.1", a.port).await.unwrap();
        eventually("b follows a again", async || {
            cb.info()
                .await
                .ok()
                .filter(|i| i.link_up && i.primary_port == Some(a.port))
        })
        .await;
        assert_eq!(ca.info().await.unwrap().role, Some(Role::Primary));

        // Fencing: asking for more in-sync replicas than a has stops its writes.
        ca.config_set("min-replicas-to-write", "2").await.unwrap();
        assert_eq!(
            ca.config_get("min-replicas-to-write")
                .await
                .unwrap()
                .as_deref(),
            Some("2")
        );
        let mut admin = a.login("admin", NASTY_PASSWORD);
        assert!(
            admin
                .cmd(&["SET", "k4", "v"])
                .error()
                .starts_with("NOREPLICAS"),
            "a fenced primary refuses writes"
        );
        ca.config_set("min-replicas-to-write", "1").await.unwrap();
        assert_eq!(admin.cmd(&["SET", "k4", "v"]), Reply::Simple("OK".into()));

        // CLIENT KILL TYPE normal drops the clients, not the operator's own connection.
        assert!(ca.kill_normal_clients().await.unwrap() >= 1);
        ca.ping().await.expect("the operator's connection survives");

        // A replica of a primary that never answered has never synced.
        let nobody = free_port().to_string();
        let c = Server::boot(&files, LOOPBACK, &["--replicaof", "127.0.0.1", &nobody]);
        let ic = Conn::open(&target(c.port))
            .await
            .unwrap()
            .info()
            .await
            .unwrap();
        assert_eq!(ic.role, Some(Role::Replica));
        assert!(!ic.has_synced(), "{ic:?}");
        assert_eq!(ic.keys, 0);

        // Wrong password, or nobody listening: an error, within the timeout, not a hang.
        let mut wrong = target(a.port);
        wrong.password = "not-it".into();
        assert!(Conn::open(&wrong).await.is_err());
        let started = Instant::now();
        assert!(Conn::open(&target(free_port())).await.is_err());
        assert!(started.elapsed() < Duration::from_secs(5));
    });
}
