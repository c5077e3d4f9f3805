//! The directive table (src/api/directives.tsv) against the pinned valkey-server: it must be
//! what `hack/valkey-directives` generates from the binary today, and its verdict on a value
//! must agree with the server's own (each checked value is booted with `valkey-server`): never
//! refuse what it takes, and refuse every malformed value it refuses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use valkey_core::api::directives::{self, ConfigProblem, Kind};
use valkey_core::api::{OPERATOR_OWNED_CONFIG_KEYS, defaults};

/// valkey-server of the test tools: `hack/cluster env`'s bin dir, else the only one in the cache.
fn valkey_server() -> PathBuf {
    let root = env!("CARGO_MANIFEST_DIR");
    let from_env = Command::new(Path::new(root).join("hack/cluster"))
        .arg("env")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("export VALKEY_OPERATOR_BIN="))
                .map(|p| PathBuf::from(p.trim_matches('"').trim_matches('\'')))
        });
    if let Some(dir) = from_env.filter(|d| d.join("valkey-server").is_file()) {
        return dir.join("valkey-server");
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
        .map(|e| e.path().join("valkey-server"))
        .find(|p| p.is_file())
        .expect("no valkey-server: run `hack/cluster build` once to build the test tools")
}

#[test]
fn the_table_is_what_the_pinned_valkey_server_says() {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/hack/valkey-directives"
    ))
    .arg("--check")
    .env("VALKEY_SERVER", valkey_server())
    .stdin(Stdio::null())
    .output()
    .expect("running hack/valkey-directives");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// valkey-server's error for the config line `key value`, or None when it takes it (an accepted
/// config exits at once: with port 0 it listens nowhere).
fn server_error(server: &Path, dir: &Path, key: &str, value: &str) -> Option<String> {
    let conf = dir.join("probe.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\nsave \"\"\nappendonly no\ndir {}\n{key} {value}\n",
            dir.display()
        ),
    )
    .unwrap();
    let out = Command::new(server)
        .arg(&conf)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    let fatal = lines
        .iter()
        .position(|l| l.contains("FATAL CONFIG FILE ERROR"))?;
    Some(lines[fatal..].last().unwrap_or(&"").to_string())
}

/// The errors of valkey-server's argument parsing, which the table models; other refusals
/// (e.g. activedefrag on a server built without jemalloc) depend on the build, not the value's
/// form, and are left to the server.
const PARSE_ERRORS: &[&str] = &[
    "argument must be 'yes' or 'no'",
    "argument couldn't be parsed into an integer",
    "argument must be between",
    "argument must be a memory",
    "argument(s) must be one of the following",
    "argument couldn't be parsed as an octal number",
    "wrong number of arguments",
];

#[test]
fn the_tables_verdict_on_values_is_the_servers() {
    let server = valkey_server();
    let dir = std::env::temp_dir().join(format!("directives-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut checked = 0;
    for d in directives::table().directives.values() {
        if OPERATOR_OWNED_CONFIG_KEYS.contains(&d.name) {
            continue;
        }
        let values: Vec<String> = match &d.kind {
            Kind::Bool => ["yes", "NO", "true", "1", "yes no"]
                .map(String::from)
                .to_vec(),
            Kind::Int { min, max } => {
                let mut v = vec![min.to_string(), max.to_string(), "+1".into(), "1k".into()];
                v.extend(min.checked_sub(1).map(|n| n.to_string()));
                v.extend(max.checked_add(1).map(|n| n.to_string()));
                v
            }
            Kind::Memory { min, max } => {
                let mut v: Vec<String> = ["0", "100mb", "2GB", "1k", "1.5gb", "1tb", "-1", "10%"]
                    .map(String::from)
                    .to_vec();
                v.extend([
                    min.to_string(),
                    max.to_string(),
                    "1mb".into(),
                    "1048575".into(),
                ]);
                v.extend(min.checked_sub(1).map(|n| n.to_string()));
                v.extend(max.checked_add(1).map(|n| n.to_string()));
                v
            }
            Kind::MemoryOrPercent { .. } => ["0", "64mb", "10%", "x%", "1.5gb"]
                .map(String::from)
                .to_vec(),
            Kind::Octal => ["700", "0", "8", "x"].map(String::from).to_vec(),
            Kind::Enum(values) | Kind::Flags(values) => {
                let mut v: Vec<String> = values.iter().map(|s| s.to_string()).collect();
                v.push(values[0].to_uppercase());
                v.push(format!("{} {}", values[0], values[values.len() - 1]));
                v.push("not-a-value".into());
                v
            }
            Kind::String => vec!["x".into(), "two words".into()],
            Kind::Words | Kind::Other | Kind::FileOnly => continue,
        };
        for value in values {
            let ours = directives::check_one(d.name, &value);
            let theirs = server_error(&server, &dir, d.name, &value);
            // Never refuse what the server takes; refuse every malformed value it refuses.
            if let Err(problem) = &ours {
                assert!(
                    theirs.is_some(),
                    "{} {value:?}: the table refuses ({problem}), valkey-server takes it",
                    d.name
                );
            }
            if let Some(error) = &theirs
                && PARSE_ERRORS.iter().any(|e| error.contains(e))
            {
                assert!(
                    ours.is_err(),
                    "{} {value:?}: valkey-server refuses ({error}), the table takes it",
                    d.name
                );
            }
            checked += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(checked > 500, "only {checked} values checked");
}

#[test]
fn unknown_directives_are_named_with_a_suggestion() {
    let config = BTreeMap::from([
        ("nonexistent-directive".to_owned(), "yes".to_owned()),
        ("maxmemory-polcy".to_owned(), "allkeys-lru".to_owned()),
        ("maxmemory-policy".to_owned(), "allkeys-lru".to_owned()),
    ]);
    let problems = directives::check(&config);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(problems[0].reason(), "UnknownDirective");
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert!(
        text[0].contains("maxmemory-polcy") && text[0].contains("did you mean maxmemory-policy?"),
        "{text:?}"
    );
    assert!(
        text[1]
            .starts_with("spec.config.nonexistent-directive: valkey-server 9.1.2 has no directive"),
        "{text:?}"
    );
    assert!(!text[1].contains("did you mean"), "{text:?}");
}

#[test]
fn bad_values_say_what_is_expected() {
    let err = directives::check_one("maxmemory-policy", "lru").unwrap_err();
    assert_eq!(err.reason(), "InvalidConfigValue");
    assert!(
        err.to_string()
            .contains("\"lru\" is not one of volatile-lru, volatile-lfu"),
        "{err}"
    );
    let err = directives::check_one("appendonly", "true").unwrap_err();
    assert!(err.to_string().contains("is not yes or no"), "{err}");
    let err = directives::check_one("hz", "100000000000").unwrap_err();
    assert!(
        err.to_string()
            .contains("a whole number from 0 to 2147483647"),
        "{err}"
    );
    assert!(matches!(
        directives::check_one("maxmemory", "1.5gb"),
        Err(ConfigProblem::BadValue { .. })
    ));
    // Left to valkey-server: its own parsers.
    assert!(directives::check_one("save", "anything at all").is_ok());
}

#[test]
fn the_table_knows_every_operator_owned_directive_and_its_aliases() {
    let table = directives::table();
    for key in OPERATOR_OWNED_CONFIG_KEYS {
        assert!(
            table.directives.contains_key(key),
            "{key} is not a directive"
        );
    }
    for d in table.directives.values() {
        if let Some(alias) = d.alias {
            assert_eq!(
                OPERATOR_OWNED_CONFIG_KEYS.contains(&d.name),
                OPERATOR_OWNED_CONFIG_KEYS.contains(&alias),
                "{} and its alias {alias} must both be operator-owned or neither",
                d.name
            );
        }
    }
    assert_eq!(table.directives["masterauth"].alias, Some("primaryauth"));
}

#[test]
fn only_images_of_the_tables_release_are_checked() {
    let version = directives::table().version;
    assert!(
        defaults::IMAGE.ends_with(version),
        "the default image runs the table's release"
    );
    for image in [
        defaults::IMAGE.to_owned(),
        format!("valkey/valkey:{version}"),
        format!("registry.local:5000/mirror/valkey:{version}-alpine"),
    ] {
        assert!(directives::checks_image(&image), "{image}");
    }
    for image in [
        "valkey/valkey:9.1",
        "valkey/valkey:latest",
        "valkey/valkey",
        "registry.local:5000/valkey",
        "valkey/valkey:9.1.20",
        "valkey/valkey@sha256:0123",
        "valkey/valkey:8.1.2",
    ] {
        assert!(!directives::checks_image(image), "{image}");
    }
}
