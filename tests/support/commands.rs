//! Running the real tools of a test (kubectl, helm, promtool, ...) and reading what they print.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};

use serde::Deserialize;
use serde_json::Value;

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs a command to completion and fails the test, with its output, when it fails.
pub fn run(cmd: &mut Command) -> Output {
    let what = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    assert!(
        out.status.success(),
        "`{what}` failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every object of a multi-document YAML stream, keyed by apiVersion/kind/namespace/name.
pub fn objects_by_key(yaml: &str, what: &str) -> BTreeMap<String, Value> {
    let mut objects = BTreeMap::new();
    for document in yaml_serde::Deserializer::from_str(yaml) {
        let value = Value::deserialize(document).unwrap_or_else(|e| panic!("{what}: {e}"));
        if value.is_null() {
            continue;
        }
        let key = format!(
            "{}/{}/{}/{}",
            value["apiVersion"].as_str().unwrap_or_default(),
            value["kind"].as_str().unwrap_or_default(),
            value["metadata"]["namespace"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        );
        assert!(
            objects.insert(key.clone(), value).is_none(),
            "{what} holds {key} twice"
        );
    }
    objects
}

/// One directory per process of a test binary under target/<kind>/ (several runs may share the
/// checkout), created; those of processes that are gone are removed first.
pub fn run_dir(kind: &str) -> std::path::PathBuf {
    let parent = super::cluster::repo_root().join("target").join(kind);
    if let Ok(entries) = std::fs::read_dir(&parent) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("run-")
                && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = parent.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}
