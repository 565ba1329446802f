//! What every file of this crate refers to: the schema version of our own formats and why
//! one was refused.

/// The schema version this build reads (policies, seccomp profiles, generator configs).
pub const API_VERSION: &str = "cmp-warden.io/v1alpha1";

/// Why a policy was refused; messages name the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not YAML, or a field unknown / of the wrong type.
    #[error("policy: {0}")]
    Parse(String),
    /// A value out of range.
    #[error("policy: {}{field}: {why}", at_line(*.line))]
    Invalid {
        /// Dotted field path.
        field: &'static str,
        /// What is wrong.
        why: String,
        /// The field's 1-based line in the YAML, where it can be told.
        line: Option<usize>,
    },
    /// One file of a policy directory was refused.
    #[error("{file}: {error}")]
    InFile {
        /// The file, as found in the directory.
        file: String,
        /// Why.
        error: Box<PolicyError>,
    },
    /// A policy directory's files do not make one set (no default, two defaults, the same
    /// name twice, two policies that can select the same request equally).
    #[error("policy directory {dir}: {why}")]
    Set {
        /// The directory.
        dir: String,
        /// What is wrong, naming the files.
        why: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!("line {l}, ")).unwrap_or_default()
}

pub(crate) fn invalid(field: &'static str, why: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field,
        why: why.into(),
        line: None,
    }
}
