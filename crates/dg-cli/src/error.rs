//! Error kinds and exit codes: input errors (exit 2) are marked with [`Input`], anything else is a
//! runtime failure (exit 1).

use std::fmt;

/// Exit status of a usage or input error (the same as clap's for bad arguments).
pub const EXIT_INPUT: u8 = 2;
/// Exit status of a runtime failure.
pub const EXIT_RUNTIME: u8 = 1;

/// Marks an error as the user's input being wrong (exit status 2). Attach it with
/// `anyhow::Context::context` or create it with [`input`].
#[derive(Debug)]
pub struct Input(pub String);

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Input {}

/// An input error with this message.
pub fn input(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Input(message.into()))
}

/// The exit status for `err`.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<Input>().is_some() { EXIT_INPUT } else { EXIT_RUNTIME }
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn input_marks_survive_further_context() {
        let inner: Result<(), std::io::Error> = Err(std::io::Error::other("disk"));
        let marked = inner.context(Input("opening x".into())).context("while starting").unwrap_err();
        assert_eq!(exit_code(&marked), EXIT_INPUT);
        assert_eq!(format!("{marked:#}"), "while starting: opening x: disk");
        assert_eq!(exit_code(&anyhow::anyhow!("device lost")), EXIT_RUNTIME);
    }
}
