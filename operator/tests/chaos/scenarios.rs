//! The scenarios of the chaos suite and the one way each is run and measured.
//!
//! A run: the instance is settled (the checks of `Instance::settled` hold); a writer writes
//! through the read-write Service's ClusterIP, a reader reads through the read-only Service's,
//! and a second writer holds a connection straight to the primary's pod IP (what a cut-off old
//! primary could still be written through: the fencing probe); once 50 writes are acknowledged
//! the fault is injected (suite clock `fault`); the run waits until writes are accepted again
//! through the read-write Service, heals what the scenario broke (SIGCONT, node start, a new
//! operator), waits until the instance is settled again with the old primary back as a replica,
//! writes one more second, stops the clients and reads every acknowledged key (of both writers)
//! back from the primary. The figures of the run are one JSON line (`Figures`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde::Serialize;
use serde_json::{Value, json};
use valkey_core::api::Valkey;
use valkey_core::api::names::{labels, roles};

use crate::harness::{Env, Operator, eventually};
use crate::instance::{self, Instance, PodView, Settled, event_time};
use crate::observe;
use crate::support::cluster;
use crate::traffic::{self, Attempt, Clock, Reader, Writer, WriterConfig};

/// The reasons of the operator's events that tell a failover happened (see the operator's
/// failover code).
pub const FAILOVER_STARTED: &str = "FailoverStarted";
pub const PRIMARY_PROMOTED: &str = "PrimaryPromoted";
/// A pod promoted but not recorded (an operator killed mid-failover) pointed back at the
/// recorded primary.
pub const STRAY_PRIMARY: &str = "StrayPrimaryRepointed";

/// How long a run may take to recover, and then to settle: generous bounds, never figures.
const RECOVERY: Duration = Duration::from_secs(120);
const SETTLE: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// SIGKILL of the primary's valkey-server (the container's PID 1, from the host).
    KillServer,
    /// `kubectl delete pod` of the primary (default grace period).
    DeletePod,
    /// SIGSTOP of the primary's valkey-server; SIGCONT once writes are accepted elsewhere.
    Hang,
    /// The primary's node stopped (`hack/cluster node stop`), started again after recovery.
    NodeLoss,
    /// SIGKILL of the primary's server, and of the operator as soon as it starts failing over;
    /// a new operator is started 2 s later.
    OperatorKilled,
    /// `kubectl valkey failover NAME`.
    Switchover,
    /// A change of spec.resource.memory: every pod restarts.
    RollingUpdate,
    /// `volume.enabled: false` (emptyDir) and the primary's pod deleted.
    NoVolumePodDeleted,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Self::KillServer => "kill-server",
            Self::DeletePod => "delete-pod",
            Self::Hang => "hang",
            Self::NodeLoss => "node-loss",
            Self::OperatorKilled => "operator-killed",
            Self::Switchover => "switchover",
            Self::RollingUpdate => "rolling-update",
            Self::NoVolumePodDeleted => "no-volume-pod-deleted",
        }
    }

    /// Whether writes may keep flowing (a pause, no failure) because the operator hands the
    /// primary over itself.
    fn planned(self) -> bool {
        matches!(self, Self::Switchover | Self::RollingUpdate)
    }
}

/// The figures of one run (one JSON line in `$CHAOS_RESULTS`).
#[derive(Clone, Debug, Serialize)]
pub struct Figures {
    pub scenario: Scenario,
    pub run: usize,
    pub old_primary: String,
    pub new_primary: String,
    pub old_node: String,
    /// Seconds from the fault to the first write accepted through the read-write Service after
    /// writes started failing (0 when none failed).
    pub time_to_first_write: Option<f64>,
    pub time_to_first_acked_write: Option<f64>,
    /// The longest time after the fault with no write accepted through the read-write Service.
    pub write_pause: f64,
    pub acked: usize,
    pub unacked: usize,
    pub failed: usize,
    /// Acknowledged writes (of both writers) not readable with their value on the primary
    /// afterwards. Must be 0.
    pub lost_acked: usize,
    /// Accepted but unacknowledged writes missing afterwards (allowed).
    pub unacked_missing: usize,
    /// Of `lost_acked`, those of the writer connected straight to the old primary's pod IP.
    pub lost_acked_direct: usize,
    /// Seconds from the fault until another pod than the old primary answered role:master.
    pub promoted_after: Option<f64>,
    /// The fencing window: how long after that promotion the old primary still accepted a write
    /// from the writer connected straight to its pod IP (0: none), and how many it accepted.
    /// None when no other pod became primary.
    pub fencing_window: Option<f64>,
    pub fencing_writes: usize,
    /// How long two pods answered role:master at once (200 ms samples).
    pub two_primaries: f64,
    pub direct_acked_after_fault: usize,
    pub read_failures: usize,
    pub read_wrong: usize,
    /// Seconds from the fault until the instance passed every check again.
    pub time_to_settled: f64,
    pub events: Vec<String>,
    pub last_failover: Value,
    pub note: String,
}

pub struct Ctx<'a> {
    pub env: &'a mut Env,
    pub operator: &'a mut Operator,
    pub instance: &'a Instance,
    pub clock: Clock,
    pub dir: PathBuf,
}

/// The instance settled (every check holds), within `timeout`.
pub async fn wait_settled(
    env: &Env,
    instance: &Instance,
    old: Option<&str>,
    timeout: Duration,
) -> Settled {
    eventually(
        &format!("Valkey {} settled", instance.name),
        timeout,
        || instance.settled(env, old),
    )
    .await
}

pub async fn run(ctx: &mut Ctx<'_>, scenario: Scenario, run: usize) -> Figures {
    let Ctx {
        env,
        operator,
        instance,
        clock,
        dir,
    } = ctx;
    let (clock, instance) = (*clock, *instance);
    let settled = wait_settled(env, instance, None, SETTLE).await;
    let old: PodView = instance
        .primary(env)
        .await
        .unwrap_or_else(|e| panic!("before {}: {e}", scenario.name()));
    assert_eq!(old.name, settled.primary);
    let old_ip = old.ip.clone().expect("the primary has a pod IP");
    let tag = format!("{}-{run}", scenario.name());

    let rw = instance
        .read_write(env)
        .await
        .expect("the read-write ClusterIP");
    let ro = instance
        .read_only(env)
        .await
        .expect("the read-only ClusterIP");
    let mut config = WriterConfig::new(rw, &format!("chaos:{tag}"));
    config.log = Some(dir.join(format!("{tag}.writes.jsonl")));
    let writer = Writer::start(config, clock);
    let mut direct = WriterConfig::new(
        instance.auth.at(&old_ip, instance.auth.port),
        &format!("chaos:{tag}:direct"),
    );
    direct.log = Some(dir.join(format!("{tag}.direct.jsonl")));
    direct.pace = Duration::from_millis(20);
    let direct = Writer::start(direct, clock);
    let reader = Reader::start(
        ro,
        &format!("chaos:{tag}"),
        writer.last_acked.clone(),
        Duration::from_millis(10),
        Some(dir.join(format!("{tag}.reads.jsonl"))),
        clock,
    );
    let roles = instance::RoleWatcher::start(env, instance, clock);
    eventually(
        "50 acknowledged writes",
        Duration::from_secs(60),
        || async {
            let acked = writer
                .journal
                .snapshot()
                .iter()
                .filter(|a| a.acked())
                .count();
            if acked >= 50 {
                Ok(())
            } else {
                Err(format!(
                    "{acked} so far; last attempt {:?}",
                    writer.journal.snapshot().last()
                ))
            }
        },
    )
    .await;

    // The fault.
    let fault_at = Timestamp::now();
    let fault = clock.now();
    let mut note = String::new();
    let mut broken = Breakage::default();
    let mut revision_before = String::new();
    match scenario {
        Scenario::KillServer | Scenario::OperatorKilled => {
            signal_container(&old, "KILL");
        }
        Scenario::DeletePod | Scenario::NoVolumePodDeleted => {
            env.api::<Pod>()
                .delete(&old.name, &DeleteParams::default())
                .await
                .expect("deleting the primary's pod");
        }
        Scenario::Hang => broken.pid = Some(signal_container(&old, "STOP")),
        Scenario::NodeLoss => {
            // Recorded first: a stop that fails half-way is undone too.
            broken.node = Some(old_node(&old));
            node(&old_node(&old), "stop").unwrap_or_else(|e| panic!("{e}"));
        }
        Scenario::Switchover => {
            let out = plugin(&["failover", &instance.name, "-n", &env.ns.name]).await;
            note = out;
        }
        Scenario::RollingUpdate => {
            revision_before = update_revision(env, instance).await;
            let valkey = observe::get(env, &instance.name).await;
            let memory = match valkey.spec.resource.memory.as_str() {
                "200Mi" => "256Mi",
                _ => "200Mi",
            };
            env.api::<Valkey>()
                .patch(
                    &instance.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"resource": {"memory": memory}}})),
                )
                .await
                .expect("changing spec.resource.memory");
            note = format!("memory -> {memory}");
        }
    }

    if scenario == Scenario::OperatorKilled {
        note = kill_operator_mid_failover(env, operator, instance, &old, fault_at).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        **operator = env.start_leader().await;
    }

    // Writes accepted through the read-write Service again.
    let planned = scenario.planned();
    eventually(
        &format!("{tag}: writes accepted again"),
        RECOVERY,
        || async {
            let d = traffic::disruption(&writer.journal.snapshot(), fault);
            match (d.first_failure, d.recovered) {
                (Some(_), Some(_)) => Ok(()),
                (None, _) if planned => Ok(()),
                _ => Err(format!("{d:?}")),
            }
        },
    )
    .await;

    // Heal.
    match scenario {
        Scenario::Hang => {
            if let Err(e) = broken.heal() {
                note = e;
            }
        }
        Scenario::NodeLoss => {
            broken.heal().unwrap_or_else(|e| panic!("{e}"));
        }
        Scenario::RollingUpdate => {
            wait_rolled(env, instance, &revision_before).await;
        }
        _ => {}
    }

    let settled = wait_settled(env, instance, Some(&old.name), SETTLE).await;
    let time_to_settled = clock.now() - fault;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attempts = writer.stop().await;
    let direct = direct.stop().await;
    let reads = reader.stop().await;

    // Every acknowledged write of both writers, read back from the primary.
    let mut conn = instance
        .auth
        .at(&settled.primary_ip, instance.auth.port)
        .connect(Duration::from_secs(5))
        .await
        .expect("connecting to the primary");
    let all: Vec<Attempt> = attempts.iter().chain(direct.iter()).cloned().collect();
    let lost = traffic::lost_acked_writes(&mut conn, &all)
        .await
        .expect("reading the acknowledged keys back");
    let unacked_missing = traffic::missing_unacked_writes(&mut conn, &attempts)
        .await
        .expect("reading the unacknowledged keys back");
    let d = traffic::disruption(&attempts, fault);
    let samples = roles.stop().await;
    let promoted = instance::promoted_at(&samples, &old.name, fault);
    let (fencing_window, fencing_writes) = match promoted {
        Some(at) => {
            let (window, writes) = traffic::accepting_window(&direct, at);
            (Some(window), writes)
        }
        None => (None, 0),
    };
    let direct_keys: std::collections::BTreeSet<&str> =
        direct.iter().map(|a| a.key.as_str()).collect();
    let lost_direct = lost
        .iter()
        .filter(|a| direct_keys.contains(a.key.as_str()))
        .count();

    let valkey = observe::get(env, &instance.name).await;
    let events: Vec<String> = instance
        .events_since(
            env,
            &valkey,
            fault_at.saturating_sub(jiff_seconds(1)).unwrap_or(fault_at),
        )
        .await
        .iter()
        .map(|e| {
            format!(
                "{} {}: {}",
                event_time(e).map(|t| t.to_string()).unwrap_or_default(),
                e.reason.as_deref().unwrap_or("?"),
                e.note.as_deref().unwrap_or("")
            )
        })
        .collect();
    let last_failover = serde_json::to_value(&valkey.status)
        .ok()
        .and_then(|s| s.get("lastFailover").cloned())
        .unwrap_or(Value::Null);

    let figures = Figures {
        scenario,
        run,
        old_primary: old.name.clone(),
        new_primary: settled.primary.clone(),
        old_node: old_node(&old),
        time_to_first_write: d.time_to_first_write,
        time_to_first_acked_write: d.time_to_first_acked_write,
        write_pause: d.write_pause,
        acked: d.acked,
        unacked: d.unacked,
        failed: d.failed,
        lost_acked: lost.len(),
        unacked_missing,
        lost_acked_direct: lost_direct,
        promoted_after: promoted.map(|at| at - fault),
        fencing_window,
        fencing_writes,
        two_primaries: instance::two_primaries(&samples),
        direct_acked_after_fault: direct.iter().filter(|a| a.acked() && a.end > fault).count(),
        read_failures: reads
            .iter()
            .filter(|r| matches!(r.outcome, traffic::ReadOutcome::Failed { .. }))
            .count(),
        read_wrong: reads
            .iter()
            .filter(|r| matches!(r.outcome, traffic::ReadOutcome::Wrong { .. }))
            .count(),
        time_to_settled,
        events,
        last_failover,
        note,
    };
    record(&figures);
    assert!(
        lost.is_empty(),
        "{tag}: {} acknowledged writes lost ({lost_direct} of them written straight to the old \
         primary's pod IP), e.g. {:?}; figures {figures:?}",
        lost.len(),
        lost.first()
    );
    assert_eq!(
        figures.read_wrong, 0,
        "{tag}: a read returned a wrong value"
    );
    // Status and events say what happened: another pod seen as primary at any time means a
    // failover the operator must have told about.
    if figures.promoted_after.is_some() {
        assert!(
            figures
                .events
                .iter()
                .any(|e| [FAILOVER_STARTED, PRIMARY_PROMOTED, STRAY_PRIMARY]
                    .iter()
                    .any(|reason| e.contains(reason))),
            "{tag}: another pod than {} answered role:master {:.2} s after the fault, and no \
             {FAILOVER_STARTED}, {PRIMARY_PROMOTED} or {STRAY_PRIMARY} event since the fault: {:#?}",
            figures.old_primary,
            figures.promoted_after.unwrap_or_default(),
            figures.events
        );
    }
    // A planned switchover moves the primary once, and it stays moved; so does a rolling update
    // (the operator restarts the primary's pod last, after handing its role over).
    if scenario.planned() {
        let promoted = figures
            .events
            .iter()
            .filter(|e| e.contains(PRIMARY_PROMOTED))
            .count();
        assert!(
            figures.new_primary != figures.old_primary && promoted == 1,
            "{tag}: after the planned move the primary is {} (was {}), with {promoted} \
             {PRIMARY_PROMOTED} events: {:#?}",
            figures.new_primary,
            figures.old_primary,
            figures.events
        );
    }
    if figures.new_primary != figures.old_primary {
        assert!(
            figures.events.iter().any(|e| e.contains(PRIMARY_PROMOTED)),
            "{tag}: the primary moved from {} to {}, and no {PRIMARY_PROMOTED} event since the \
             fault: {:#?}",
            figures.old_primary,
            figures.new_primary,
            figures.events
        );
        assert_eq!(
            figures.last_failover.get("to").and_then(Value::as_str),
            Some(figures.new_primary.as_str()),
            "{tag}: status.lastFailover is {}",
            figures.last_failover
        );
    }
    figures
}

/// Appends the figures to `$CHAOS_RESULTS` (bench/failover.sh reads it) and prints them.
fn record(figures: &Figures) {
    let line = serde_json::to_string(figures).expect("serializing figures");
    eprintln!("chaos figures: {line}");
    if let Some(path) = std::env::var_os("CHAOS_RESULTS") {
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            panic!("writing {}: {e}", PathBuf::from(path).display());
        }
    }
}

fn jiff_seconds(s: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(s)
}

/// Kills the operator as soon as it has started failing over from `old` (its role label gone,
/// or a FailoverStarted event), or after 30 s; says what it saw.
async fn kill_operator_mid_failover(
    env: &Env,
    operator: &mut Operator,
    instance: &Instance,
    old: &PodView,
    since: Timestamp,
) -> String {
    let started = std::time::Instant::now();
    let seen = loop {
        if started.elapsed() > Duration::from_secs(30) {
            break "nothing within 30 s".to_owned();
        }
        let pod = env.api::<Pod>().get_opt(&old.name).await.ok().flatten();
        let role = pod
            .as_ref()
            .and_then(|p| p.labels().get(labels::ROLE).cloned());
        if role.as_deref() != Some(roles::PRIMARY) {
            break format!("role label of {} is {role:?}", old.name);
        }
        let valkey = observe::get(env, &instance.name).await;
        let events = instance.events_since(env, &valkey, since).await;
        if let Some(e) = events
            .iter()
            .find(|e| e.reason.as_deref() == Some(FAILOVER_STARTED))
        {
            break format!(
                "event {FAILOVER_STARTED}: {}",
                e.note.as_deref().unwrap_or("")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    operator.kill();
    format!(
        "operator killed {:.2} s after the fault ({seen})",
        started.elapsed().as_secs_f64()
    )
}

/// The StatefulSet's update revision.
async fn update_revision(env: &Env, instance: &Instance) -> String {
    env.api::<StatefulSet>()
        .get(&instance.names().statefulset())
        .await
        .ok()
        .and_then(|s| s.status)
        .and_then(|s| s.update_revision)
        .unwrap_or_default()
}

/// Waits until the StatefulSet has a new update revision (not `before`) and every pod runs it
/// and is Ready.
async fn wait_rolled(env: &Env, instance: &Instance, before: &str) {
    eventually("the rolling update", SETTLE, || async {
        let revision = update_revision(env, instance).await;
        if revision == before {
            return Err(format!("the update revision is still {before}"));
        }
        let pods = instance.pods(env).await;
        let updated = pods
            .values()
            .filter(|p| {
                p.labels().get("controller-revision-hash") == Some(&revision)
                    && p.metadata.deletion_timestamp.is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if updated == instance.replicas {
            Ok(())
        } else {
            Err(format!(
                "{updated}/{} pods Ready on revision {revision}",
                instance.replicas
            ))
        }
    })
    .await;
}

fn old_node(pod: &PodView) -> String {
    pod.node.clone().unwrap_or_default()
}

/// The host pid of a container's PID 1: the process whose cgroup names the container and whose
/// pid in its own namespace is 1. Signals come from the host: inside the container PID 1 ignores
/// SIGKILL and SIGSTOP (it is its namespace's init).
pub fn container_pid(container_id: &str) -> Result<u32, String> {
    let id = container_id
        .split_once("://")
        .map(|(_, id)| id)
        .unwrap_or(container_id);
    let entries = std::fs::read_dir("/proc").map_err(|e| format!("reading /proc: {e}"))?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if !cgroup.contains(id) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let ns_init = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last())
            == Some("1");
        if ns_init {
            return Ok(pid);
        }
    }
    Err(format!("no process of container {id} with namespace pid 1"))
}

/// Sends `signal` (KILL, STOP) to the valkey-server of a pod, from the host; returns its pid.
pub fn signal_container(pod: &PodView, signal: &str) -> u32 {
    let id = pod
        .container_id
        .as_deref()
        .unwrap_or_else(|| panic!("{} has no container id", pod.name));
    let pid = container_pid(id).unwrap_or_else(|e| panic!("{}: {e}", pod.name));
    assert!(
        signal_pid(pid, signal),
        "kill -{signal} {pid} ({}) failed",
        pod.name
    );
    pid
}

/// `kill -SIGNAL pid`; false when the process is gone.
pub fn signal_pid(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `hack/cluster node stop|start NODE`.
pub fn node(name: &str, action: &str) -> Result<(), String> {
    let out = Command::new(cluster::repo_root().join("hack/cluster"))
        .args(["node", action, name])
        .output()
        .map_err(|e| format!("running hack/cluster node: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "hack/cluster node {action} {name} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// What a run stopped and must bring back: healed by the run, or when dropped (a failed run
/// leaves no frozen server or stopped node behind for the next test).
#[derive(Default)]
struct Breakage {
    /// A valkey-server stopped with SIGSTOP.
    pid: Option<u32>,
    /// A node stopped with `hack/cluster node stop`.
    node: Option<String>,
}

impl Breakage {
    fn heal(&mut self) -> Result<(), String> {
        let mut result = Ok(());
        if let Some(pid) = self.pid.take()
            && !signal_pid(pid, "CONT")
        {
            // The kubelet's liveness probe may have restarted the container meanwhile.
            result = Err(format!(
                "pid {pid} was gone at SIGCONT (the container was restarted)"
            ));
        }
        if let Some(name) = self.node.take() {
            result = result.and(node(&name, "start"));
        }
        result
    }
}

impl Drop for Breakage {
    fn drop(&mut self) {
        if let Err(e) = self.heal() {
            eprintln!("healing after a failed run: {e}");
        }
    }
}

/// Runs `kubectl valkey ARGS` with the admin kubeconfig; returns its output, panics on failure.
pub async fn plugin(args: &[&str]) -> String {
    let bin = crate::harness::plugin_bin();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin)
            .args(&args)
            .env("KUBECONFIG", cluster::kubeconfig_path())
            .output()
    })
    .await
    .expect("joining the plugin")
    .expect("running kubectl-valkey");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubectl valkey failed: {text}");
    text.trim().to_owned()
}
