//! What is wrong with a configuration, and where.

use std::io;
use std::path::{Path, PathBuf};

/// A configuration that cannot be loaded: the file, and for a bad value
/// the line, column and field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A file or directory could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file is not valid YAML or not a valid rate limit configuration.
    #[error("{}{}: {field}: {message}", path.display(), position(*line, *column))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line, when the parser knows it.
        line: Option<usize>,
        /// 1-based column, when the parser knows it.
        column: Option<usize>,
        /// The field, as a path from the file's root (`descriptors[0].rate_limit.unit`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Two files configure the same domain.
    #[error("{}: duplicate domain `{domain}`, already configured by {}", path.display(), first.display())]
    DuplicateDomain {
        /// The second file.
        path: PathBuf,
        /// The domain.
        domain: String,
        /// The first file.
        first: PathBuf,
    },
    /// A limit the chosen backend cannot serve.
    #[error("{}: domain `{domain}`, descriptor `{descriptor}`: {message}", path.display())]
    Unservable {
        /// The file.
        path: PathBuf,
        /// The domain.
        domain: String,
        /// The descriptor's path in the tree (`key_value.key`).
        descriptor: String,
        /// Why it cannot be served.
        message: String,
    },
}

/// `:line L column C` after the file's name, or nothing when the parser
/// knows no line (a file with no `domain` at all).
fn position(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!(":line {line} column {column}"),
        (Some(line), None) => format!(":line {line}"),
        _ => String::new(),
    }
}

impl ConfigError {
    pub(crate) fn yaml(
        path: &Path,
        error: serde_path_to_error::Error<serde_norway::Error>,
    ) -> ConfigError {
        let field = match error.path().to_string() {
            p if p == "." || p.is_empty() => "(root)".to_string(),
            p => p,
        };
        let inner = error.into_inner();
        let location = inner.location();
        // serde_norway appends " at line L column C" to its message; the
        // position is printed once, in front.
        let mut message = inner.to_string();
        if let Some(cut) = message.find(" at line ") {
            message.truncate(cut);
        }
        // ...and starts with its own path ("descriptors[0]: "): the field
        // is printed once, from serde_path_to_error, which sees deeper.
        if let Some((head, tail)) = message.split_once(": ") {
            if !head.contains(' ') && !head.contains('`') {
                message = tail.to_owned();
            }
        }
        ConfigError::Invalid {
            path: path.to_path_buf(),
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
            field,
            message,
        }
    }

    /// The 1-based line of an invalid value, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Invalid { line, .. } => *line,
            _ => None,
        }
    }
}
