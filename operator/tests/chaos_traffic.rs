//! The chaos suite's instrument, proved on its own: the writer and the reader of
//! `tests/chaos/traffic.rs` against real valkey-servers on loopback (a primary and replicas
//! booted from the cluster's tool dir, as tests/valkey_conf.rs does), behind a small TCP
//! forwarder that plays the read-write Service (a fixed address whose backend moves; established
//! connections stay where they were, as with kube-proxy). A failover is done by hand
//! (`REPLICAOF NO ONE`), so these tests need no cluster and no operator.
//!
//!   cargo test -p valkey-operator --test chaos_traffic

#[path = "../../tests/support/mod.rs"]
mod support;
#[path = "chaos/traffic.rs"]
#[allow(dead_code)]
mod traffic;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use traffic::*;

const PASSWORD: &str = "chaos test password: only on loopback, only in a 0600 file";

fn valkey_server() -> PathBuf {
    let from_env = std::env::var_os("VALKEY_OPERATOR_BIN").map(PathBuf::from);
    let dir = from_env
        .filter(|d| d.join("valkey-server").is_file())
        .unwrap_or_else(|| PathBuf::from(support::cluster::tools_path()));
    let bin = dir.join("valkey-server");
    assert!(
        bin.is_file(),
        "no valkey-server in {}: run `hack/cluster build` once",
        dir.display()
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on loopback")
}

/// A valkey-server on loopback, killed when dropped. The password is in its config file (mode
/// 0600), never on its command line.
struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Server {
    fn boot(name: &str, replica_of: Option<u16>) -> Self {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "chaos-traffic-{}-{name}-{port}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut conf = format!(
            "port {port}\nbind 127.0.0.1\nrequirepass \"{PASSWORD}\"\nmasterauth \"{PASSWORD}\"\n\
             save \"\"\nappendonly no\ndir {}\nrepl-diskless-sync yes\nrepl-diskless-sync-delay 0\n",
            dir.display()
        );
        if let Some(primary) = replica_of {
            conf.push_str(&format!("replicaof 127.0.0.1 {primary}\n"));
        }
        let path = dir.join("valkey.conf");
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(conf.as_bytes()))
            .unwrap();
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = Command::new(valkey_server())
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting valkey-server");
        let server = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "valkey-server {name} did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn target(&self) -> Target {
        Target {
            host: "127.0.0.1".into(),
            port: self.port,
            user: "default".into(),
            password: PASSWORD.into(),
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.target().connect(Duration::from_secs(5)).await.unwrap()
    }

    async fn run(&self, args: &[&str]) -> redis::Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        query(&mut self.conn().await, &cmd, Duration::from_secs(5))
            .await
            .unwrap()
    }

    /// Waits until this replica's link to its primary is up.
    async fn wait_synced(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = info(&mut self.conn().await, "replication").await.unwrap();
            if info.get("master_link_status").map(String::as_str) == Some("up") {
                return;
            }
            assert!(Instant::now() < deadline, "replica never synced: {info:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.signal_quiet("CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    fn signal_quiet(&self, signal: &str) -> std::io::Result<()> {
        Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status()
            .map(|_| ())
    }
}

/// A fixed loopback address that forwards each new connection to the current backend (none:
/// the connection is closed at once, like a Service without endpoints).
struct Forwarder {
    port: u16,
    backend: Arc<Mutex<Option<SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    async fn start(backend: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let backend = Arc::new(Mutex::new(Some(backend)));
        let current = backend.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let to = *current.lock().unwrap();
                let Some(to) = to else { continue };
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Self {
            port,
            backend,
            task,
        }
    }

    fn switch(&self, to: Option<SocketAddr>) {
        *self.backend.lock().unwrap() = to;
    }

    fn target(&self) -> Target {
        Target {
            host: "127.0.0.1".into(),
            port: self.port,
            user: "default".into(),
            password: PASSWORD.into(),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn count(writer: &Writer, f: impl Fn(&Attempt) -> bool) -> usize {
    writer.journal.snapshot().iter().filter(|a| f(a)).count()
}

fn log_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("chaos-traffic")
        .join(test);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A failover by hand under the writer: every write the writer counted as acknowledged is on
/// the promoted replica; writes the old primary accepted but no replica acknowledged are not
/// counted (and are indeed gone); the outage is measured from the kill to the first write the
/// new primary accepted; the reader keeps reading through its own address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_failover_and_unacknowledged_ones_are_not_counted() {
    let primary = Server::boot("primary", None);
    let replica = Server::boot("replica", Some(primary.port));
    replica.wait_synced().await;
    let rw = Forwarder::start(primary.addr()).await;
    let ro = Forwarder::start(replica.addr()).await;
    let clock = Clock::new();
    let dir = log_dir("failover");

    let mut config = WriterConfig::new(rw.target(), "k");
    config.wait_ms = 200;
    config.log = Some(dir.join("writes.jsonl"));
    let writer = Writer::start(config, clock);
    let reader = Reader::start(
        ro.target(),
        "k",
        writer.last_acked.clone(),
        Duration::from_millis(5),
        Some(dir.join("reads.jsonl")),
        clock,
    );
    until("100 acknowledged writes", Duration::from_secs(30), || {
        count(&writer, Attempt::acked) >= 100
    })
    .await;

    // The replica leaves (promoted): the primary still accepts writes, no replica acknowledges.
    replica.run(&["REPLICAOF", "NO", "ONE"]).await;
    until("3 unacknowledged writes", Duration::from_secs(30), || {
        count(&writer, |a| a.accepted() && !a.acked()) >= 3
    })
    .await;
    // A replica for the new primary, so that writes after the failover are acknowledged again.
    let second = Server::boot("second", Some(replica.port));
    second.wait_synced().await;

    // The primary dies; 300 ms later the "Service" points at the promoted replica.
    primary.signal("KILL");
    let fault = clock.now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    rw.switch(Some(replica.addr()));
    until(
        "a write accepted after the kill",
        Duration::from_secs(30),
        || accepted_after(&writer.journal.snapshot(), fault + 0.3),
    )
    .await;
    until(
        "an acknowledged write after the kill",
        Duration::from_secs(30),
        || {
            writer
                .journal
                .snapshot()
                .iter()
                .any(|a| a.start > fault && a.acked())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let attempts = writer.stop().await;
    let reads = reader.stop().await;

    let figures = disruption(&attempts, fault);
    eprintln!("{figures:?}");
    let mut new_primary = replica.conn().await;
    let lost = lost_acked_writes(&mut new_primary, &attempts)
        .await
        .unwrap();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(figures.acked >= 100, "{figures:?}");
    // The writes the old primary took alone are gone from the new one, and were never counted.
    let gone = missing_unacked_writes(&mut new_primary, &attempts)
        .await
        .unwrap();
    assert!(
        gone >= 3,
        "{gone} unacknowledged writes missing; {figures:?}"
    );
    // The instrument saw the outage: writes failed after the kill, and none was accepted before
    // the switch 300 ms later.
    assert!(figures.first_failure.is_some(), "{figures:?}");
    let t = figures.time_to_first_write.expect("recovered");
    assert!(
        (0.3..10.0).contains(&t),
        "time to first write {t}: {figures:?}"
    );
    assert!(figures.write_pause >= 0.3, "{figures:?}");
    assert!(figures.failed >= 1, "{figures:?}");
    // The reader read acknowledged keys through its own address, and never a wrong value.
    assert!(reads.iter().any(|r| r.outcome == ReadOutcome::Hit));
    assert!(
        !reads
            .iter()
            .any(|r| matches!(r.outcome, ReadOutcome::Wrong { .. })),
        "{reads:?}"
    );
    // The log holds one JSON line per attempt.
    let log = std::fs::read_to_string(dir.join("writes.jsonl")).unwrap();
    assert_eq!(log.lines().count(), attempts.len());
    assert!(!log.contains(PASSWORD));
}

/// The check can fail: an acknowledged key removed from the new primary is reported, by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acknowledged_write_is_reported() {
    let primary = Server::boot("primary", None);
    let replica = Server::boot("replica", Some(primary.port));
    replica.wait_synced().await;
    let clock = Clock::new();
    let writer = Writer::start(WriterConfig::new(primary.target(), "lost"), clock);
    until("20 acknowledged writes", Duration::from_secs(30), || {
        count(&writer, Attempt::acked) >= 20
    })
    .await;
    let attempts = writer.stop().await;
    let victim = attempts.iter().find(|a| a.acked()).unwrap().key.clone();
    replica.run(&["REPLICAOF", "NO", "ONE"]).await;
    replica.run(&["DEL", &victim]).await;
    let lost = lost_acked_writes(&mut replica.conn().await, &attempts)
        .await
        .unwrap();
    let lost: Vec<&str> = lost.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(lost, [victim.as_str()]);
}

/// A hung primary (SIGSTOP) does not hang the writer: its command deadline fails the attempt,
/// it reconnects through the same address and reaches the new backend. Acknowledged writes are
/// all on the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_does_not_hang_the_writer() {
    let primary = Server::boot("primary", None);
    let replica = Server::boot("replica", Some(primary.port));
    replica.wait_synced().await;
    let rw = Forwarder::start(primary.addr()).await;
    let clock = Clock::new();
    let mut config = WriterConfig::new(rw.target(), "hung");
    config.timeout = Duration::from_millis(500);
    config.wait_ms = 200;
    config.log = Some(log_dir("hung").join("writes.jsonl"));
    let writer = Writer::start(config, clock);
    until("50 acknowledged writes", Duration::from_secs(30), || {
        count(&writer, Attempt::acked) >= 50
    })
    .await;
    primary.signal("STOP");
    // Read after kill(2) returned: the stopped server cannot answer a command sent from now on
    // (read before it, a write issued while `kill` ran was counted as one after the hang).
    let fault = clock.now();
    replica.run(&["REPLICAOF", "NO", "ONE"]).await;
    rw.switch(Some(replica.addr()));
    until(
        "a write accepted after the hang",
        Duration::from_secs(30),
        || accepted_after(&writer.journal.snapshot(), fault),
    )
    .await;
    let attempts = writer.stop().await;
    primary.signal("CONT");
    let figures = disruption(&attempts, fault);
    eprintln!("{figures:?}");
    // The attempt in flight at the hang (or the next one, on the same connection) ran into its
    // deadline: its SET (0.5 s) failed, or its SET had answered and its WAIT (0.7 s) did not.
    let failure = attempts
        .iter()
        .find(|a| a.end >= fault && a.errored())
        .expect("an attempt ran into its deadline on the hung primary");
    assert!(failure.end - failure.start >= 0.45, "{failure:?}");
    let t = figures.time_to_first_write.expect("recovered");
    assert!(t < 10.0, "{figures:?}");
    let lost = lost_acked_writes(&mut replica.conn().await, &attempts)
        .await
        .unwrap();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
}

fn attempt(seq: u64, start: f64, end: f64, outcome: Outcome) -> Attempt {
    Attempt {
        seq,
        key: format!("k:{seq}"),
        value: format!("k:{seq}:v"),
        start,
        end,
        conn: 1,
        outcome,
    }
}

/// The figures from a timeline written out by hand.
#[test]
fn disruption_figures_from_a_timeline() {
    let ok = || Outcome::Acked { replicas: 1 };
    let failed = || Outcome::Failed {
        error: "connection refused".into(),
    };
    let unacked = || Outcome::Unacked { error: None };
    let attempts = vec![
        attempt(1, 0.0, 0.1, ok()),
        attempt(2, 0.9, 1.0, ok()),
        // fault at 1.05: an attempt in flight fails, others fail, then the new primary accepts
        // (unacknowledged first), then acknowledges.
        attempt(3, 1.0, 1.5, failed()),
        attempt(4, 1.6, 1.7, failed()),
        attempt(5, 2.0, 2.5, unacked()),
        attempt(6, 2.5, 2.6, ok()),
        attempt(7, 2.6, 2.7, ok()),
    ];
    let d = disruption(&attempts, 1.05);
    assert_eq!(d.first_failure, Some(1.5));
    assert_eq!(d.recovered, Some(2.5));
    assert!(
        (d.time_to_first_write.unwrap() - 1.45).abs() < 1e-9,
        "{d:?}"
    );
    assert!(
        (d.time_to_first_acked_write.unwrap() - 1.55).abs() < 1e-9,
        "{d:?}"
    );
    assert!((d.write_pause - 1.45).abs() < 1e-9, "{d:?}");
    assert_eq!((d.acked, d.unacked, d.failed), (4, 1, 2));

    // No failure: a planned switchover that only paused writes.
    let paused = vec![
        attempt(1, 0.0, 0.1, ok()),
        attempt(2, 0.1, 0.9, ok()),
        attempt(3, 0.9, 1.0, ok()),
    ];
    let d = disruption(&paused, 0.05);
    assert_eq!(d.first_failure, None);
    assert_eq!(d.time_to_first_write, Some(0.0));
    assert!((d.write_pause - 0.8).abs() < 1e-9, "{d:?}");

    // Still down at the end: no recovery, and the pause runs to the last attempt.
    let down = vec![attempt(1, 0.0, 0.1, ok()), attempt(2, 0.5, 3.0, failed())];
    let d = disruption(&down, 0.2);
    assert_eq!(d.recovered, None);
    assert!((d.write_pause - 2.8).abs() < 1e-9, "{d:?}");

    // The fencing window of a writer connected straight to an old primary.
    let old = vec![
        attempt(1, 0.0, 0.1, unacked()),
        attempt(2, 1.0, 1.2, unacked()),
        attempt(3, 1.3, 1.4, failed()),
    ];
    let (window, n) = accepting_window(&old, 0.5);
    assert!((window - 0.7).abs() < 1e-9);
    assert_eq!(n, 1);
    assert_eq!(accepting_window(&old, 2.0), (0.0, 0));
}
