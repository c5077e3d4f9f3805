//! The chaos suite: failover proved on the real pods of the local cluster's real nodes
//! (hack/cluster with VALKEY_OPERATOR_REAL_NODES >= 3). Each test creates a 3-pod Valkey in a
//! namespace of its own, runs the operator as its own process under the shipped RBAC (the e2e
//! harness), and runs one scenario `CHAOS_RUNS` times (default 1) with a writer and a reader on
//! the host (`chaos/traffic.rs`), checking after each run (`chaos/instance.rs`,
//! `chaos/scenarios.rs`): exactly one pod answers role:master, the read-write Service's
//! EndpointSlices hold exactly that pod, every other pod (the old primary included) is a replica
//! with its link up, status.primary names the primary, every WAIT-acknowledged write is on it,
//! and, when the primary moved, a PrimaryPromoted event and status.lastFailover say so.
//!
//! The tests run one at a time (a lost node would disturb a neighbour) and are ignored by plain
//! `cargo test`: they need real nodes, the failover in the operator, and minutes.
//!
//!   cargo build -p kubectl-valkey     # the switchover scenario runs `kubectl valkey failover`
//!   cargo test -p valkey-operator --test chaos -- --ignored
//!   CHAOS_RUNS=5 CHAOS_RESULTS=/tmp/r.jsonl cargo test ... # what bench/failover.sh does
//!
//! Each run's figures are printed (`chaos figures: {...}`) and appended to `$CHAOS_RESULTS`;
//! the clients' logs (one JSON line per attempt) are under target/tmp/e2e/<namespace>/.

#[path = "e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "chaos/instance.rs"]
#[allow(dead_code)]
mod instance;
#[path = "e2e/observe.rs"]
#[allow(dead_code)]
mod observe;
#[path = "chaos/scenarios.rs"]
mod scenarios;
#[path = "../../tests/support/mod.rs"]
mod support;
#[path = "chaos/traffic.rs"]
#[allow(dead_code)]
mod traffic;

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};
use valkey_core::api::Phase;

use harness::Env;
use instance::Instance;
use scenarios::{Ctx, Scenario};

const NAME: &str = "chaos";
const PODS: usize = 3;

/// One scenario at a time in this binary (each test has a runtime of its own; a tokio Mutex
/// serves them all and is not poisoned by a failed test).
async fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::const_new(());
    SERIAL.lock().await
}

fn runs() -> usize {
    std::env::var("CHAOS_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|&r| r >= 1)
        .unwrap_or(1)
}

async fn chaos(scenario: Scenario, spec: Value) {
    let _serial = serial().await;
    let mut env = Env::new(&format!("chaos-{}", scenario.name())).await;
    let mut operator = env.start_leader().await;
    observe::create(&env, NAME, spec).await;
    observe::wait_for(
        &env,
        NAME,
        "Running with every pod ready",
        Duration::from_secs(300),
        |v| {
            let s = v.status.as_ref().ok_or("no status")?;
            match (s.status, s.ready_replicas) {
                (Some(Phase::Running), ready) if ready == PODS as i32 => Ok(()),
                _ => Err("not yet".to_owned()),
            }
        },
    )
    .await;
    let instance = Instance::new(&env, NAME, PODS).await;
    let dir = env.dir.clone();
    let password = instance.auth.password.clone();
    let mut ctx = Ctx {
        env: &mut env,
        operator: &mut operator,
        instance: &instance,
        clock: traffic::Clock::new(),
        dir,
    };
    for run in 1..=runs() {
        scenarios::run(&mut ctx, scenario, run).await;
    }
    let log = operator.log_text();
    observe::assert_secret_not_leaked(&env, &password, &[("the operator's log", log)]).await;
}

fn replicated() -> Value {
    json!({"replicas": PODS})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn sigkill_of_the_primary_server() {
    chaos(Scenario::KillServer, replicated()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn deletion_of_the_primary_pod() {
    chaos(Scenario::DeletePod, replicated()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn a_hung_primary() {
    chaos(Scenario::Hang, replicated()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn loss_of_the_primary_node() {
    chaos(Scenario::NodeLoss, replicated()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn the_operator_killed_mid_failover() {
    chaos(Scenario::OperatorKilled, replicated()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn a_planned_switchover() {
    chaos(Scenario::Switchover, replicated()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn a_rolling_update_of_three_pods() {
    chaos(Scenario::RollingUpdate, replicated()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos suite: needs real nodes; cargo test -p valkey-operator --test chaos -- --ignored"]
async fn without_volumes_the_primary_pod_deleted() {
    chaos(
        Scenario::NoVolumePodDeleted,
        json!({"replicas": PODS, "volume": {"enabled": false}}),
    )
    .await;
}
