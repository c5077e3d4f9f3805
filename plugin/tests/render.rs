//! Snapshots of the `list` and `status` tables (and of `status -o json`) for the fixed inputs in
//! tests/fixtures/plugin/: rendering is a pure function of the objects and the time, so these
//! need no cluster. Review changes with `cargo insta review` (or INSTA_UPDATE=always).

use std::path::PathBuf;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kubectl_valkey::render::{self, Style};
use kubectl_valkey::view;
use serde::Deserialize;
use valkey_core::api::Valkey;

#[derive(Deserialize)]
struct ListFixture {
    now: String,
    valkeys: Vec<Valkey>,
}

#[derive(Deserialize)]
struct StatusFixture {
    now: String,
    valkey: Valkey,
    pods: Vec<Pod>,
    #[serde(default)]
    claims: Vec<PersistentVolumeClaim>,
    events: Vec<Event>,
}

fn fixture<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/plugin")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn time(text: &str) -> Timestamp {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

const PLAIN: Style = Style {
    color: false,
    width: None,
};

fn list_rows() -> (Vec<view::InstanceRow>, Timestamp) {
    let fixture: ListFixture = fixture("list.yaml");
    let mut rows: Vec<_> = fixture.valkeys.iter().map(view::instance_row).collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    (rows, time(&fixture.now))
}

#[test]
fn list_table() {
    let (rows, now) = list_rows();
    let team_a: Vec<_> = rows
        .iter()
        .filter(|r| r.namespace == "team-a")
        .cloned()
        .collect();
    insta::assert_snapshot!(render::instances(&team_a, false, now, PLAIN));
}

#[test]
fn list_table_all_namespaces() {
    let (rows, now) = list_rows();
    insta::assert_snapshot!(render::instances(&rows, true, now, PLAIN));
}

#[test]
fn list_table_in_colour() {
    let (rows, now) = list_rows();
    let colour = Style {
        color: true,
        width: None,
    };
    let text = render::instances(&rows, true, now, colour);
    assert!(text.contains("\u{1b}["), "colour codes expected");
    insta::assert_snapshot!(text);
}

fn report(name: &str) -> (view::InstanceReport, Timestamp) {
    let fixture: StatusFixture = fixture(name);
    let report = view::instance_report(
        &fixture.valkey,
        &fixture.pods,
        &fixture.claims,
        &fixture.events,
    );
    (report, time(&fixture.now))
}

#[test]
fn status_of_a_replicated_instance() {
    let (report, now) = report("status-replicated.yaml");
    insta::assert_snapshot!(render::report(&report, now, PLAIN));
}

#[test]
fn status_of_a_degraded_instance() {
    let (report, now) = report("status-degraded.yaml");
    insta::assert_snapshot!(render::report(&report, now, PLAIN));
}

#[test]
fn status_of_a_new_instance() {
    let (report, now) = report("status-new.yaml");
    insta::assert_snapshot!(render::report(&report, now, PLAIN));
}

#[test]
fn status_of_an_instance_that_cannot_start() {
    let (report, now) = report("status-failing.yaml");
    let text = render::report(&report, now, PLAIN);
    // Each pod's cause, from its own status (not only the operator's summary).
    assert!(text.contains("Why pods are not running"), "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn status_as_json() {
    let (report, _) = report("status-replicated.yaml");
    let json = serde_json::to_string_pretty(&report).unwrap_or_else(|e| panic!("{e}"));
    insta::assert_snapshot!(json);
}

#[test]
fn narrow_terminals_wrap_long_cells() {
    let (report, now) = report("status-degraded.yaml");
    let narrow = Style {
        color: false,
        width: Some(60),
    };
    let text = render::report(&report, now, narrow);
    for line in text.lines() {
        assert!(line.chars().count() <= 60, "too wide: {line:?}");
    }
}
