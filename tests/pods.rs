//! Why a pod does not run, from YAML fixtures of pod statuses as the kubelet and the scheduler
//! write them (tests/fixtures/pods): each file is a pod (and the instance's claims) and the
//! cause a user must then be told, with words the message must and must not hold.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde::Deserialize;
use valkey_core::status::pods;

#[derive(Deserialize)]
struct Case {
    pod: Pod,
    #[serde(default)]
    claims: Vec<PersistentVolumeClaim>,
    expect: Expect,
}

#[derive(Deserialize)]
struct Expect {
    reason: Option<String>,
    #[serde(default)]
    contains: Vec<String>,
    #[serde(default)]
    absent: Vec<String>,
}

#[test]
fn pod_fixtures() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pods");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).expect("the pod fixtures") {
        let path = entry.expect("a fixture").path();
        let name = path.display().to_string();
        let case: Case =
            yaml_serde::from_str(&std::fs::read_to_string(&path).expect("readable")).expect(&name);
        let got = pods::diagnose(&case.pod, &case.claims);
        assert_eq!(
            got.as_ref().map(|p| p.cause.reason().to_owned()),
            case.expect.reason,
            "{name}: cause ({got:?})"
        );
        let message = got.map(|p| p.message).unwrap_or_default();
        for want in &case.expect.contains {
            assert!(
                message.contains(want),
                "{name}: {want:?} not in {message:?}"
            );
        }
        for unwanted in &case.expect.absent {
            assert!(
                !message.contains(unwanted),
                "{name}: {unwanted:?} in {message:?}"
            );
        }
        assert!(!message.contains('\n'), "{name}: one line: {message:?}");
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} fixtures");
}

#[test]
fn a_terminating_pod_is_not_blamed() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pods/crash-loop-bad-directive.yaml"
    ))
    .unwrap();
    let mut case: Case = yaml_serde::from_str(&text).unwrap();
    assert!(pods::diagnose(&case.pod, &[]).is_some());
    case.pod.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-30T12:00:00Z".parse().unwrap(),
        ));
    assert_eq!(pods::diagnose(&case.pod, &[]), None);
}

#[test]
fn log_excerpts_keep_the_last_lines_and_withhold_credentials() {
    let log = "1:M 30 Nov 2026 # one\n2\n3\n>>> 'masterauth \"pw\"'\n\n5\n";
    assert_eq!(
        pods::last_lines(log),
        "2 | 3 | (a line of auth.conf, withheld: it holds the password) | 5"
    );
    let long = "x".repeat(5000);
    assert!(pods::last_lines(&long).len() < 700);
}
