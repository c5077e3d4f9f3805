//! The valkey.conf directives of the Valkey release the default image runs, and what each takes,
//! generated from that valkey-server binary by `hack/valkey-directives` into `directives.tsv`
//! (a test fails when the two drift apart). Used to refuse a `spec.config` that valkey-server
//! would refuse at boot, before any pod is changed: by the operator (status error, event) and by
//! `kubectl valkey create` (exit 2, no API call).
//!
//! What is checked, and no more: the key must be a directive of that release; booleans must be
//! yes/no, integers within the server's bounds, memory sizes in valkey's units, enums one of
//! the server's values. Strings, and the directives with their own parsers (`save`,
//! `client-output-buffer-limit`, `notify-keyspace-events`, ...), are left to valkey-server.
//!
//! Only images of the table's release are checked ([`checks_image`]): another Valkey release has
//! other directives, so its `spec.config` goes to valkey-server as written, and a directive it
//! refuses shows as a crash-looping pod with the server's own message in the status.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use super::defaults;

/// The generated table (see the header of the file for its columns).
pub const TABLE: &str = include_str!("directives.tsv");

/// What values a directive takes, as the server told the generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// yes or no.
    Bool,
    /// A whole number within `min..=max`.
    Int { min: i64, max: i64 },
    /// A byte size within `min..=max` bytes: digits with an optional unit (b, k, kb, m, mb,
    /// g, gb).
    /// A few are signed (e.g. -1 for "no limit"): a negative number takes no unit.
    Memory { min: i128, max: i128 },
    /// A byte size (as [`Kind::Memory`]) or a percentage (`10%`).
    MemoryOrPercent { min: i128, max: i128 },
    /// An octal number (e.g. `700`).
    Octal,
    /// One of the values.
    Enum(Vec<&'static str>),
    /// One or more of the values, separated by spaces.
    Flags(Vec<&'static str>),
    /// Any single word (the server takes any string).
    String,
    /// Any words.
    Words,
    /// The server's own parser; not checked here.
    Other,
    /// Taken in a config file only (not listed by CONFIG GET); not checked here.
    FileOnly,
}

/// One directive of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    pub name: &'static str,
    pub kind: Kind,
    /// The server's default, as CONFIG GET prints it.
    pub default: &'static str,
    /// The other name of the same setting (`slaveof`/`replicaof`, `masterauth`/`primaryauth`).
    pub alias: Option<&'static str>,
}

/// The parsed table.
pub struct Table {
    /// The Valkey release the table was generated from, e.g. `9.1.2`.
    pub version: &'static str,
    pub directives: BTreeMap<&'static str, Directive>,
}

/// The table of the default image's release.
pub fn table() -> &'static Table {
    static TABLE_PARSED: LazyLock<Table> = LazyLock::new(|| parse(TABLE));
    &TABLE_PARSED
}

/// Parses the generated file; a malformed line is skipped (the drift test regenerates and
/// compares the whole file, so a bad line cannot go unnoticed).
pub fn parse(text: &'static str) -> Table {
    let mut version = "";
    let mut directives = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let fields: Vec<&'static str> = line.split('\t').collect();
        match fields.as_slice() {
            ["version", v] => version = v,
            [name, kind, detail, default, alias] => {
                let values = || detail.split('|').filter(|v| !v.is_empty()).collect();
                let kind = match *kind {
                    "bool" => Kind::Bool,
                    "int" => {
                        let (min, max) = detail
                            .split_once("..")
                            .and_then(|(lo, hi)| Some((lo.parse().ok()?, hi.parse().ok()?)))
                            .unwrap_or((i64::MIN, i64::MAX));
                        Kind::Int { min, max }
                    }
                    "memory" | "memory-or-percent" => {
                        let (min, max) = detail
                            .split_once("..")
                            .and_then(|(lo, hi)| Some((lo.parse().ok()?, hi.parse().ok()?)))
                            .unwrap_or((0, i128::from(u64::MAX)));
                        if *kind == "memory" {
                            Kind::Memory { min, max }
                        } else {
                            Kind::MemoryOrPercent { min, max }
                        }
                    }
                    "octal" => Kind::Octal,
                    "enum" => Kind::Enum(values()),
                    "flags" => Kind::Flags(values()),
                    "string" => Kind::String,
                    "words" => Kind::Words,
                    "file-only" => Kind::FileOnly,
                    _ => Kind::Other,
                };
                directives.insert(
                    *name,
                    Directive {
                        name,
                        kind,
                        default,
                        alias: (!alias.is_empty()).then_some(*alias),
                    },
                );
            }
            _ => {}
        }
    }
    Table {
        version,
        directives,
    }
}

/// Whether `spec.config` of an instance running `image` is checked against the table: the
/// default image, or any image whose tag is the table's release (`9.1.2`, `9.1.2-alpine`, ...).
/// A floating tag (`9.1`, `latest`) or a digest may be another release, so it is not checked.
pub fn checks_image(image: &str) -> bool {
    if image == defaults::IMAGE {
        return true;
    }
    let version = table().version;
    let Some((_, tag)) = image.rsplit_once(':') else {
        return false;
    };
    // `host:5000/valkey` has no tag: a tag never holds a '/'.
    if tag.contains('/') || image.contains('@') {
        return false;
    }
    tag == version
        || tag
            .strip_prefix(version)
            .is_some_and(|rest| rest.starts_with('-'))
}

/// Why valkey-server would refuse one `spec.config` entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    #[error(
        "spec.config.{key}: valkey-server {version} has no directive {key:?}{}; remove it or fix its name",
        suggestion.map(|s| format!(" (did you mean {s}?)")).unwrap_or_default()
    )]
    UnknownDirective {
        key: String,
        version: &'static str,
        suggestion: Option<&'static str>,
    },
    #[error("spec.config.{key}: {value:?} is not {expected}; valkey-server would refuse to start")]
    BadValue {
        key: String,
        value: String,
        expected: String,
    },
}

impl ConfigProblem {
    /// A short CamelCase reason for events and conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            ConfigProblem::UnknownDirective { .. } => "UnknownDirective",
            ConfigProblem::BadValue { .. } => "InvalidConfigValue",
        }
    }
}

/// Every problem of `config`, in key order. Directives the operator manages are the CRD's
/// business (and refused there); they are in the table and pass here.
pub fn check(config: &BTreeMap<String, String>) -> Vec<ConfigProblem> {
    config
        .iter()
        .filter_map(|(key, value)| check_one(key, value).err())
        .collect()
}

/// Checks one `key value` line against the table.
pub fn check_one(key: &str, value: &str) -> Result<(), ConfigProblem> {
    let table = table();
    let Some(directive) = table.directives.get(key) else {
        return Err(ConfigProblem::UnknownDirective {
            key: key.to_owned(),
            version: table.version,
            suggestion: suggest(key, table),
        });
    };
    match expected(&directive.kind, value) {
        None => Ok(()),
        Some(expected) => Err(ConfigProblem::BadValue {
            key: key.to_owned(),
            value: value.to_owned(),
            expected,
        }),
    }
}

/// What `value` should have been, if the table can tell it is wrong. valkey.conf splits a line
/// on spaces (the CRD keeps quotes out of values), so a one-value directive takes one word.
fn expected(kind: &Kind, value: &str) -> Option<String> {
    let words: Vec<&str> = value.split_whitespace().collect();
    let one = match words.as_slice() {
        [word] => Some(*word),
        _ => None,
    };
    let ok = match kind {
        Kind::Bool => {
            one.is_some_and(|w| w.eq_ignore_ascii_case("yes") || w.eq_ignore_ascii_case("no"))
        }
        Kind::Int { min, max } => one
            .filter(|w| !w.starts_with('+'))
            .and_then(|w| w.parse::<i64>().ok())
            .is_some_and(|n| (*min..=*max).contains(&n)),
        Kind::Memory { min, max } => one.and_then(bytes).is_some_and(|b| within(b, *min, *max)),
        Kind::MemoryOrPercent { min, max } => one.is_some_and(|w| {
            bytes(w).is_some_and(|b| within(b, *min, *max))
                || w.strip_suffix('%')
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        }),
        Kind::Octal => {
            one.is_some_and(|w| !w.is_empty() && w.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        }
        Kind::Enum(values) => one.is_some_and(|w| values.iter().any(|v| v.eq_ignore_ascii_case(w))),
        Kind::Flags(values) => {
            !words.is_empty()
                && words
                    .iter()
                    .all(|w| values.iter().any(|v| v.eq_ignore_ascii_case(w)))
        }
        Kind::String => words.len() <= 1,
        Kind::Words | Kind::Other | Kind::FileOnly => true,
    };
    if ok {
        return None;
    }
    Some(match kind {
        Kind::Bool => "yes or no".to_owned(),
        Kind::Int { min, max } => format!("a whole number from {min} to {max}"),
        Kind::Memory { min, max } => format!(
            "a memory size such as 100mb, 2gb or 1048576 (units b, k, kb, m, mb, g, gb){}",
            bounds_text(*min, *max)
        ),
        Kind::MemoryOrPercent { min, max } => format!(
            "a memory size such as 100mb{}, or a percentage such as 10%",
            bounds_text(*min, *max)
        ),
        Kind::Octal => "an octal number such as 700".to_owned(),
        Kind::Enum(values) => format!("one of {}", values.join(", ")),
        Kind::Flags(values) => {
            format!("one or more of {} (separated by spaces)", values.join(", "))
        }
        Kind::String => {
            "a single word (valkey.conf would read the spaces as more arguments)".to_owned()
        }
        Kind::Words | Kind::Other | Kind::FileOnly => String::new(),
    })
}

/// valkey's memory values: digits (at most 64 bits) with an optional unit, or a plain negative
/// number; the size in bytes.
fn bytes(word: &str) -> Option<i128> {
    if let Some(negative) = word.strip_prefix('-') {
        if negative.is_empty() || !negative.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return Some(-i128::from(negative.parse::<u64>().ok()?));
    }
    let digits = word.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = word.split_at(digits);
    let multiplier: i128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    Some(i128::from(number.parse::<u64>().ok()?) * multiplier)
}

fn within(bytes: i128, min: i128, max: i128) -> bool {
    (min..=max).contains(&bytes)
}

fn bounds_text(min: i128, max: i128) -> String {
    if min == 0 && max == i128::from(u64::MAX) {
        String::new()
    } else if max >= i128::from(i64::MAX) {
        format!(", at least {min} bytes")
    } else {
        format!(", from {min} to {max} bytes")
    }
}

/// The closest directive name, if one is close enough to be a typo.
fn suggest(key: &str, table: &Table) -> Option<&'static str> {
    table
        .directives
        .keys()
        .map(|name| (edit_distance(key, name), *name))
        .filter(|(d, name)| *d <= 2.max(name.len() / 5))
        .min()
        .map(|(_, name)| name)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}
