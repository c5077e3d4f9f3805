//! The failover decision from YAML fixtures (tests/fixtures/failover): each file is what the
//! operator observed of an instance and the one action it must take.

use serde::Deserialize;
use valkey_core::failover::{self, Action, Observation};

#[derive(Deserialize)]
struct Case {
    observation: Observation,
    expect: Action,
}

#[test]
fn failover_fixtures() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/failover");
    let mut seen = 0;
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("the failover fixtures")
        .map(|e| e.expect("a fixture").path())
        .collect();
    paths.sort();
    let mut failures = Vec::new();
    for path in paths {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let case: Case = yaml_serde::from_str(&std::fs::read_to_string(&path).expect("readable"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = failover::decide(&case.observation);
        if got != case.expect {
            failures.push(format!("{name}:\n  want {:?}\n  got  {got:?}", case.expect));
        }
        seen += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(seen >= 20, "only {seen} fixtures");
}

#[test]
fn a_failing_primary_is_waited_for_exactly_the_failover_delay() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/failover/silent-within-delay.yaml"
    ))
    .unwrap();
    let case: Case = yaml_serde::from_str(&text).unwrap();
    let mut obs = case.observation;
    let delay = obs.failover_delay;
    let primary = obs.pods.iter_mut().find(|p| p.name == "cache-0").unwrap();
    primary.failing_for = delay - std::time::Duration::from_millis(1);
    assert!(matches!(failover::decide(&obs), Action::Report(_)));
    let primary = obs.pods.iter_mut().find(|p| p.name == "cache-0").unwrap();
    primary.failing_for = delay;
    assert!(matches!(failover::decide(&obs), Action::Promote { .. }));
}
