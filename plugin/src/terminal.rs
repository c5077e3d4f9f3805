//! The person at the keyboard: whether there is one, confirmations, a password typed without
//! echo, and raw mode for interactive sessions (always restored, even on error).

use std::io::{BufRead, IsTerminal, Read, Write};

use anyhow::Context;
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::error::UsageError;

pub fn stdin_is_terminal() -> bool {
    std::io::stdin().is_terminal()
}

/// Someone can answer a question: stdin and stderr (where the question goes) are terminals.
pub fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Asks a yes/no question on stderr; only "y" or "yes" is a yes.
pub fn confirm(question: &str) -> anyhow::Result<bool> {
    let mut stderr = std::io::stderr().lock();
    write!(stderr, "{question} [y/N] ").context("writing to stderr")?;
    stderr.flush().context("writing to stderr")?;
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .context("reading the answer from stdin")?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// The password given on stdin: typed without echo on a terminal, else all of stdin with one
/// trailing newline removed (what `echo` or a here-string adds).
pub fn read_password() -> anyhow::Result<String> {
    let password = if stdin_is_terminal() {
        prompt_hidden("Password: ")?
    } else {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the password from stdin (it must be UTF-8 text)")?;
        let trimmed = text
            .strip_suffix("\r\n")
            .or_else(|| text.strip_suffix('\n'))
            .unwrap_or(&text);
        trimmed.to_owned()
    };
    if password.is_empty() {
        return Err(UsageError::new("--password-stdin read an empty password")
            .hint("pipe the password in, e.g. printf '%s' \"$PASSWORD\" | kubectl valkey create NAME --password-stdin")
            .into());
    }
    Ok(password)
}

fn prompt_hidden(prompt: &str) -> anyhow::Result<String> {
    eprint!("{prompt}");
    let mut password = String::new();
    {
        let _raw = RawMode::enable()?;
        loop {
            let Event::Key(KeyEvent {
                code,
                modifiers,
                kind: KeyEventKind::Press,
                ..
            }) = event::read().context("reading the password from the terminal")?
            else {
                continue;
            };
            match code {
                KeyCode::Enter => break,
                KeyCode::Backspace => {
                    password.pop();
                }
                KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => {
                    drop(_raw);
                    eprintln!();
                    return Err(UsageError::new("interrupted while reading the password").into());
                }
                KeyCode::Char(c) => password.push(c),
                _ => {}
            }
        }
    }
    eprintln!();
    Ok(password)
}

/// Raw mode while alive: keys go to the remote program, not to the local line editor.
pub struct RawMode(());

impl RawMode {
    pub fn enable() -> anyhow::Result<Self> {
        crossterm::terminal::enable_raw_mode().context("switching the terminal to raw mode")?;
        Ok(Self(()))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}
