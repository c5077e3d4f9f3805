//! Every table the plugin prints, as pure functions of [`crate::view`] data, the time "now" and a
//! [`Style`]: the same input always gives the same text, so snapshot tests need no cluster.

use comfy_table::{Attribute, Cell, Color, ContentArrangement, Table};
use jiff::Timestamp;

use crate::view::{ConditionRow, EventRow, InstanceReport, InstanceRow, PodRow};

/// How to draw: with ANSI colours or not, and within a terminal width or unbounded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Style {
    pub color: bool,
    /// Wrap long cells to fit this width; `None` never wraps (pipes, files, tests).
    pub width: Option<u16>,
}

const NONE: &str = "-";

/// The instances table of `list` and `status` without a name.
pub fn instances(
    rows: &[InstanceRow],
    all_namespaces: bool,
    now: Timestamp,
    style: Style,
) -> String {
    let mut table = table(style);
    let mut header = Vec::new();
    if all_namespaces {
        header.push("NAMESPACE");
    }
    header.extend([
        "NAME", "STATUS", "READY", "PRIMARY", "IMAGE", "VOLUME", "AGE", "ERROR",
    ]);
    table.set_header(heading(&header, style));
    for row in rows {
        let mut cells = Vec::new();
        if all_namespaces {
            cells.push(Cell::new(&row.namespace));
        }
        cells.extend([
            Cell::new(&row.name),
            phase_cell(row.status.as_deref(), style),
            Cell::new(format!("{}/{}", row.ready_replicas, row.replicas)),
            Cell::new(or_none(row.primary.as_deref())),
            Cell::new(&row.image),
            Cell::new(row.volume.as_deref().unwrap_or("none")),
            Cell::new(age(row.created, now)),
            error_cell(row.error.as_deref(), style),
        ]);
        table.add_row(cells);
    }
    finish(table)
}

/// `status NAME`: the instance, its conditions, its pods and its recent events.
pub fn report(report: &InstanceReport, now: Timestamp, style: Style) -> String {
    let mut out = String::new();
    let row = &report.instance;
    out.push_str(&title(
        &format!("Valkey {} in namespace {}", row.name, row.namespace),
        style,
    ));
    out.push_str(&summary(report, now, style));
    out.push_str("\n\n");
    out.push_str(&title("Conditions", style));
    out.push_str(&conditions(&report.conditions, now, style));
    out.push_str("\n\n");
    out.push_str(&title("Pods", style));
    out.push_str(&pods(&report.pods, now, style));
    out.push_str("\n\n");
    if report.pods.iter().any(|p| p.problem.is_some()) {
        out.push_str(&title("Why pods are not running", style));
        out.push_str(&problems(&report.pods, style));
        out.push_str("\n\n");
    }
    out.push_str(&title("Events", style));
    out.push_str(&events(&report.events, now, style));
    out.push('\n');
    out
}

fn summary(report: &InstanceReport, now: Timestamp, style: Style) -> String {
    let row = &report.instance;
    let mut table = table(style);
    let pairs: Vec<(&str, Cell)> = vec![
        ("Status:", phase_cell(row.status.as_deref(), style)),
        ("Image:", Cell::new(&row.image)),
        (
            "Ready:",
            Cell::new(format!("{}/{} pods", row.ready_replicas, row.replicas)),
        ),
        ("Primary:", Cell::new(or_none(row.primary.as_deref()))),
        ("Read-write:", Cell::new(&report.endpoints.read_write)),
        (
            "Read-only:",
            Cell::new(if row.replicas > 1 {
                report.endpoints.read_only.clone()
            } else {
                format!("{} (no replicas)", report.endpoints.read_only)
            }),
        ),
        (
            "User:",
            Cell::new(format!(
                "{} (password in Secret {}, key {})",
                report.user, report.password_secret.name, report.password_secret.key
            )),
        ),
        ("Volume:", Cell::new(volume(report))),
        (
            "Resources:",
            Cell::new(format!("cpu {}, memory {}", report.cpu, report.memory)),
        ),
        ("Age:", Cell::new(age(row.created, now))),
        (
            "Last reconcile:",
            Cell::new(match report.last_reconcile {
                Some(t) => format!("{} ago", age(Some(t), now)),
                None => NONE.to_owned(),
            }),
        ),
        ("Generation:", Cell::new(generation(report))),
        ("Error:", error_cell(row.error.as_deref(), style)),
    ];
    for (key, value) in pairs {
        table.add_row(vec![Cell::new(key), value]);
    }
    finish(table)
}

fn volume(report: &InstanceReport) -> String {
    let storage = &report.storage;
    let Some(size) = storage.size.as_deref().filter(|_| storage.enabled) else {
        return "none: emptyDir, data is lost when a pod restarts".to_owned();
    };
    let class = storage
        .storage_class
        .as_deref()
        .unwrap_or("the cluster's default");
    let policy = match storage.reclaim_policy.as_deref() {
        Some("Delete") => "deleted with the instance",
        _ => "kept when the instance is deleted",
    };
    format!("{size} per pod, storage class {class}, {policy}")
}

fn generation(report: &InstanceReport) -> String {
    match (report.generation, report.observed_generation) {
        (Some(g), Some(o)) if o >= g => format!("{g} (observed)"),
        (Some(g), Some(o)) => format!("{g} (operator has seen {o})"),
        (Some(g), None) => format!("{g} (not yet seen by the operator)"),
        _ => NONE.to_owned(),
    }
}

fn conditions(rows: &[ConditionRow], now: Timestamp, style: Style) -> String {
    if rows.is_empty() {
        return "No conditions: the operator has not reported on this instance yet.".to_owned();
    }
    let mut table = table(style);
    table.set_header(heading(
        &["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
        style,
    ));
    for c in rows {
        table.add_row(vec![
            Cell::new(&c.type_),
            Cell::new(&c.status),
            Cell::new(or_none(Some(&c.reason))),
            Cell::new(age(c.last_transition, now)),
            Cell::new(or_none(Some(&c.message))),
        ]);
    }
    finish(table)
}

/// The pods table of `status NAME`.
pub fn pods(rows: &[PodRow], now: Timestamp, style: Style) -> String {
    if rows.is_empty() {
        return "No pods.".to_owned();
    }
    let mut table = table(style);
    table.set_header(heading(
        &[
            "NAME", "ROLE", "READY", "STATUS", "RESTARTS", "NODE", "IP", "AGE",
        ],
        style,
    ));
    for p in rows {
        let role = match (p.role.as_deref(), style.color) {
            (Some("primary"), true) => Cell::new("primary").add_attribute(Attribute::Bold),
            (role, _) => Cell::new(or_none(role)),
        };
        let ready = if p.ready {
            paint(Cell::new("yes"), Color::Green, style)
        } else {
            paint(Cell::new("no"), Color::Yellow, style)
        };
        table.add_row(vec![
            Cell::new(&p.name),
            role,
            ready,
            Cell::new(&p.status),
            Cell::new(p.restarts),
            Cell::new(or_none(p.node.as_deref())),
            Cell::new(or_none(p.ip.as_deref())),
            Cell::new(age(p.created, now)),
        ]);
    }
    finish(table)
}

/// Each pod that does not run, with the cause the operator reports for it.
pub fn problems(rows: &[PodRow], style: Style) -> String {
    let mut table = table(style);
    table.set_header(heading(&["POD", "REASON", "RESTARTS", "MESSAGE"], style));
    for p in rows {
        let Some(problem) = &p.problem else { continue };
        table.add_row(vec![
            Cell::new(&p.name),
            paint(Cell::new(&problem.reason), Color::Red, style),
            Cell::new(p.restarts),
            Cell::new(&problem.message),
        ]);
    }
    finish(table)
}

/// The events table of `status NAME`.
pub fn events(rows: &[EventRow], now: Timestamp, style: Style) -> String {
    if rows.is_empty() {
        return "No recent events.".to_owned();
    }
    let mut table = table(style);
    table.set_header(heading(
        &["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        style,
    ));
    for e in rows {
        let kind = if e.type_ == "Warning" {
            paint(Cell::new(&e.type_), Color::Yellow, style)
        } else {
            Cell::new(&e.type_)
        };
        let seen = match e.count {
            n if n > 1 => format!("{} (x{n})", age(e.last_seen, now)),
            _ => age(e.last_seen, now),
        };
        table.add_row(vec![
            Cell::new(seen),
            kind,
            Cell::new(&e.reason),
            Cell::new(&e.object),
            Cell::new(&e.message),
        ]);
    }
    finish(table)
}

/// How long ago `then` was, as kubectl prints ages: 45s, 3m20s, 5h, 12d.
pub fn age(then: Option<Timestamp>, now: Timestamp) -> String {
    let Some(then) = then else {
        return NONE.to_owned();
    };
    let seconds = now.as_second().saturating_sub(then.as_second()).max(0);
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 600 && s % 60 == 0 => format!("{minutes}m"),
        s if s < 600 => format!("{minutes}m{}s", s % 60),
        s if s < 3 * 3600 => format!("{minutes}m"),
        s if s < 8 * 3600 && (s / 60) % 60 == 0 => format!("{hours}h"),
        s if s < 8 * 3600 => format!("{hours}h{}m", (s / 60) % 60),
        s if s < 48 * 3600 => format!("{hours}h"),
        s if s < 8 * 86_400 && (s / 3600) % 24 == 0 => format!("{days}d"),
        s if s < 8 * 86_400 => format!("{days}d{}h", (s / 3600) % 24),
        s if s < 2 * 365 * 86_400 => format!("{days}d"),
        _ => format!("{}y", days / 365),
    }
}

fn table(style: Style) -> Table {
    let mut table = Table::new();
    table.load_style(comfy_table::presets::NOTHING);
    match style.width {
        Some(width) => {
            table.set_content_arrangement(ContentArrangement::Dynamic);
            table.set_width(width);
        }
        None => {
            table.set_content_arrangement(ContentArrangement::Disabled);
        }
    }
    if style.color {
        table.enforce_styling();
    } else {
        table.force_no_tty();
    }
    table
}

/// kubectl's look: columns three spaces apart, no borders, no trailing spaces.
fn finish(mut table: Table) -> String {
    let columns = table.column_count();
    for index in 0..columns {
        if let Some(column) = table.column_mut(index) {
            let right = if index + 1 == columns { 0 } else { 3 };
            column.set_padding((0, right));
        }
    }
    table.trim_fmt()
}

fn heading(titles: &[&str], style: Style) -> Vec<Cell> {
    titles
        .iter()
        .map(|t| {
            let cell = Cell::new(t);
            if style.color {
                cell.add_attribute(Attribute::Bold)
            } else {
                cell
            }
        })
        .collect()
}

fn title(text: &str, style: Style) -> String {
    if style.color {
        format!("\x1b[1m{text}\x1b[0m\n")
    } else {
        format!("{text}\n")
    }
}

fn phase_cell(phase: Option<&str>, style: Style) -> Cell {
    let Some(phase) = phase else {
        return Cell::new(NONE);
    };
    let color = match phase {
        "Running" => Color::Green,
        "Creating" | "Pending" | "Degraded" => Color::Yellow,
        "Failed" => Color::Red,
        _ => Color::Blue,
    };
    paint(Cell::new(phase), color, style)
}

fn error_cell(error: Option<&str>, style: Style) -> Cell {
    match error {
        Some(e) => paint(Cell::new(e), Color::Red, style),
        None => Cell::new(NONE),
    }
}

fn paint(cell: Cell, color: Color, style: Style) -> Cell {
    if style.color { cell.fg(color) } else { cell }
}

fn or_none(value: Option<&str>) -> &str {
    value.filter(|v| !v.is_empty()).unwrap_or(NONE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap_or_default()
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now = at(1_000_000_000);
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (3600, "60m"),
            (4 * 3600 + 60 * 5, "4h5m"),
            (30 * 3600, "30h"),
            (3 * 86_400 + 3600, "3d1h"),
            (20 * 86_400, "20d"),
            (3 * 365 * 86_400, "3y"),
        ];
        for (ago, text) in cases {
            assert_eq!(age(Some(at(1_000_000_000 - ago)), now), text, "{ago}s");
        }
        assert_eq!(age(None, now), "-");
        assert_eq!(age(Some(at(1_000_000_100)), now), "0s");
    }
}
