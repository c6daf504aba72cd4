//! How `hcclc` reports failures: a message for people and an exit code for scripts.

use std::fmt;

/// A failure of one command.
#[derive(Debug)]
pub enum CliError {
    /// Bad input or usage (exit code 2): unreadable files, parse errors, bad flags.
    Input(String),
    /// The input is well-formed but wrong (exit code 1): a plan that does not verify.
    Failed(String),
}

impl CliError {
    pub fn code(&self) -> u8 {
        match self {
            CliError::Failed(_) => 1,
            CliError::Input(_) => 2,
        }
    }

    pub fn input(err: impl fmt::Display) -> CliError {
        CliError::Input(err.to_string())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Input(msg) | CliError::Failed(msg) => f.write_str(msg),
        }
    }
}

/// Prints a JSON document on stdout (the `--json` contract: exactly one document).
pub fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values always serialise")
    );
}
