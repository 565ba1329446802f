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
