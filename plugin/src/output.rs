//! Writing results to stdout: tables, JSON and YAML; and whether to colour them.

use std::io::{IsTerminal, Write};

use anyhow::Context;
use serde::Serialize;

use crate::cli::{ColorChoice, ObjectFormat};
use crate::render::Style;

/// The style of tables written to stdout now.
pub fn style(choice: ColorChoice) -> Style {
    let terminal = std::io::stdout().is_terminal();
    let color = match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            terminal
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::env::var("TERM").map_or(true, |t| t != "dumb")
        }
    };
    let width = terminal
        .then(crossterm::terminal::size)
        .and_then(Result::ok)
        .map(|(columns, _)| columns);
    Style { color, width }
}

/// Prints `text` and a final newline to stdout.
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .or_else(ignore_closed_pipe)
}

/// A reader that went away (`| head`) is not an error worth reporting.
fn ignore_closed_pipe(err: std::io::Error) -> anyhow::Result<()> {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(err).context("writing to stdout")
    }
}

pub fn to_json<T: Serialize>(value: &T) -> anyhow::Result<String> {
    serde_json::to_string_pretty(value).context("encoding JSON")
}

pub fn to_yaml<T: Serialize>(value: &T) -> anyhow::Result<String> {
    yaml_serde::to_string(value).context("encoding YAML")
}

/// Prints an object as JSON or YAML.
pub fn print_object<T: Serialize>(value: &T, format: ObjectFormat) -> anyhow::Result<()> {
    match format {
        ObjectFormat::Json => print(&to_json(value)?),
        ObjectFormat::Yaml => print(to_yaml(value)?.trim_end()),
    }
}
