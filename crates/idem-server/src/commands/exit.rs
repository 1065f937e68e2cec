//! [`Exit`]: an error that chooses the exit status.

/// An error that chooses the process's exit status (`idem drill`: 1 when
/// a drill failed, 2 for bad usage), with the message to print, if any.
#[derive(Debug)]
pub struct Exit {
    /// The exit status.
    pub code: u8,
    /// Printed on stderr as is; `None` when everything was said.
    pub message: Option<String>,
}

impl Exit {
    /// Exit with `code` after printing `message`.
    pub fn new(code: u8, message: String) -> Self {
        Self {
            code,
            message: Some(message),
        }
    }

    /// Exit with `code`, printing nothing more.
    pub fn silent(code: u8) -> Self {
        Self {
            code,
            message: None,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.message {
            Some(m) => f.write_str(m),
            None => write!(f, "exit status {}", self.code),
        }
    }
}

impl std::error::Error for Exit {}
