//! Exit codes and the error types that choose them. Everything else is an `anyhow::Error` whose
//! message says what went wrong; a [`Problem`] in its chain adds what to do about it.

use std::fmt;

/// Process exit codes (documented in `--help` and the README).
pub mod exit {
    pub const OK: i32 = 0;
    /// The operation failed: API error, not found, forbidden, timed out.
    pub const FAILURE: i32 = 1;
    /// Bad flags or arguments, or input the Valkey API would refuse.
    pub const USAGE: i32 = 2;
}

/// The command line or its input is wrong; nothing was sent to the cluster.
#[derive(Debug)]
pub struct UsageError {
    pub message: String,
    pub hint: Option<String>,
}

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            hint: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UsageError {}

/// A failure explained for a person: what happened, and what to do next.
#[derive(Debug)]
pub struct Problem {
    pub message: String,
    pub hint: Option<String>,
}

impl Problem {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            hint: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Problem {}

/// Ends the process with this code and no message of its own (valkey-cli already spoke).
#[derive(Debug)]
pub struct ExitWith(pub i32);

impl fmt::Display for ExitWith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit code {}", self.0)
    }
}

impl std::error::Error for ExitWith {}

/// The exit code for `err`, and the lines to print on stderr.
pub fn report(err: &anyhow::Error) -> (i32, Vec<String>) {
    if let Some(ExitWith(code)) = err.downcast_ref::<ExitWith>() {
        return (*code, Vec::new());
    }
    let usage = err.chain().find_map(|e| e.downcast_ref::<UsageError>());
    let code = if usage.is_some() {
        exit::USAGE
    } else {
        exit::FAILURE
    };
    let mut lines = vec![format!("error: {err:#}")];
    let hint = usage.and_then(|u| u.hint.clone()).or_else(|| {
        err.chain()
            .find_map(|e| e.downcast_ref::<Problem>())
            .and_then(|p| p.hint.clone())
    });
    if let Some(hint) = hint {
        lines.extend(hint.lines().map(|l| format!("hint: {l}")));
    }
    (code, lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn usage_errors_exit_2_with_their_hint() {
        let err = anyhow::Error::new(UsageError::new("bad").hint("do this"));
        assert_eq!(
            report(&err),
            (2, vec!["error: bad".into(), "hint: do this".into()])
        );
    }

    #[test]
    fn problems_keep_their_context_and_hint() {
        let err: anyhow::Result<()> =
            Err(anyhow::Error::new(Problem::new("refused").hint("start it")));
        let err = err.context("listing valkeys").err();
        let report = err.as_ref().map(report);
        assert_eq!(
            report,
            Some((
                1,
                vec![
                    "error: listing valkeys: refused".into(),
                    "hint: start it".into()
                ]
            ))
        );
    }

    #[test]
    fn exit_with_is_silent() {
        assert_eq!(report(&anyhow::Error::new(ExitWith(3))), (3, vec![]));
    }
}
