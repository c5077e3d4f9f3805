//! The rolling update's next step from YAML fixtures (tests/fixtures/rollout): each file is what
//! the operator observed of an instance during a rollout and the one step it must take. And a
//! whole rollout played step by step: whatever ordinal the primary is on, every pod restarts
//! once, the primary last, and the role moves exactly once.

use serde::Deserialize;
use valkey_core::failover::{Observation, Role};
use valkey_core::rollout::{self, Step};

#[derive(Deserialize)]
struct Case {
    observation: Observation,
    expect: Step,
}

fn fixture(name: &str) -> Case {
    let path = format!(
        "{}/tests/fixtures/rollout/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn rollout_fixtures() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rollout");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("the rollout fixtures")
        .map(|e| {
            e.expect("a fixture")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    let mut failures = Vec::new();
    for name in &names {
        let case = fixture(name);
        let got = rollout::next_step(&case.observation);
        if got != case.expect {
            failures.push(format!("{name}:\n  want {:?}\n  got  {got:?}", case.expect));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(names.len() >= 12, "only {} fixtures", names.len());
}

/// Carries out `step` on the observation the way the cluster would once it settled: a
/// restarted pod comes back on the new template, Ready and in sync; a handover swaps roles.
fn settle(obs: &mut Observation, step: &Step) {
    match step {
        Step::Restart { pod } => {
            let p = obs.pods.iter_mut().find(|p| &p.name == pod).expect("a pod");
            p.outdated = false;
        }
        Step::HandOver { from, to } => {
            for p in &mut obs.pods {
                if let Some(r) = p.replication.as_mut() {
                    r.role = if &p.name == to {
                        Role::Primary
                    } else {
                        Role::Replica
                    };
                    r.primary_host = (&p.name != to).then(|| format!("{to}.cache-headless"));
                    r.link_up = &p.name != to;
                }
            }
            assert_eq!(obs.recorded_primary.as_deref(), Some(from.as_str()));
            obs.recorded_primary = Some(to.clone());
        }
        other => panic!("a settled instance needs no {other:?}"),
    }
}

#[test]
fn a_whole_rollout_restarts_every_pod_once_the_primary_last_and_moves_the_role_once() {
    for primary in ["cache-0", "cache-1", "cache-2"] {
        let mut obs = fixture("replicas-first-highest-ordinal.yaml").observation;
        for p in &mut obs.pods {
            let r = p.replication.as_mut().expect("INFO");
            r.role = if p.name == primary {
                Role::Primary
            } else {
                Role::Replica
            };
            r.primary_host = (p.name != primary).then(|| format!("{primary}.cache-headless"));
            r.link_up = p.name != primary;
        }
        obs.recorded_primary = Some(primary.to_owned());
        let mut restarts = Vec::new();
        let mut handovers = Vec::new();
        loop {
            let step = rollout::next_step(&obs);
            match &step {
                Step::Done => break,
                Step::Restart { pod } => restarts.push(pod.clone()),
                Step::HandOver { from, to } => handovers.push((from.clone(), to.clone())),
                other => panic!("primary {primary}: stuck at {other:?}"),
            }
            settle(&mut obs, &step);
            assert!(
                restarts.len() + handovers.len() <= 4,
                "{restarts:?} {handovers:?}"
            );
        }
        assert_eq!(restarts.len(), 3, "primary {primary}: {restarts:?}");
        assert_eq!(restarts.last().map(String::as_str), Some(primary));
        assert_eq!(handovers.len(), 1, "primary {primary}: {handovers:?}");
        assert_ne!(handovers[0].1, primary);
    }
}

/// The failover decision does not look at templates: an outdated primary is no failed one.
#[test]
fn an_outdated_primary_is_no_reason_to_fail_over() {
    let obs = fixture("hands-over-last.yaml").observation;
    assert_eq!(
        valkey_core::failover::decide(&obs),
        valkey_core::failover::Action::Nothing
    );
}
