//! Bearer-token authentication for the TCP listeners. The token is read once from a file or an
//! environment variable, compared in constant time, and never logged (its Debug is redacted).

use std::path::Path;

/// A shared secret clients present as `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct BearerToken(Vec<u8>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Reading the file failed.
    #[error("token file {path}: {source}")]
    File {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The variable is unset.
    #[error("token variable {0} is not set")]
    Unset(String),
    /// Empty after trimming, or not a valid header value.
    #[error("token from {0} is empty or contains characters a header cannot carry")]
    Invalid(String),
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header (or not `Bearer`).
    #[error("missing bearer token")]
    Missing,
    /// Wrong token.
    #[error("invalid bearer token")]
    Invalid,
}

impl BearerToken {
    /// From a file (Kubernetes Secret volume); surrounding whitespace is ignored.
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        let raw = std::fs::read(path).map_err(|source| TokenError::File {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(&raw, &path.display().to_string())
    }

    /// From an environment variable.
    pub fn from_env(name: &str) -> Result<Self, TokenError> {
        let raw = std::env::var_os(name).ok_or_else(|| TokenError::Unset(name.to_owned()))?;
        Self::new(raw.as_encoded_bytes(), &format!("${name}"))
    }

    /// From bytes (trimmed); `origin` names the source in errors.
    pub fn new(raw: &[u8], origin: &str) -> Result<Self, TokenError> {
        let t = raw.trim_ascii();
        if t.is_empty() || !t.iter().all(|b| (0x21..0x7f).contains(b)) {
            return Err(TokenError::Invalid(origin.to_owned()));
        }
        Ok(Self(t.to_vec()))
    }

    /// Check an `Authorization` header value.
    pub fn check(&self, header: Option<&[u8]>) -> Result<(), AuthError> {
        let h = header.ok_or(AuthError::Missing)?;
        // The scheme is case-insensitive (RFC 9110 §11.1).
        if h.len() < 7 || !h[..7].eq_ignore_ascii_case(b"bearer ") {
            return Err(AuthError::Missing);
        }
        if constant_time_eq(h[7..].trim_ascii(), &self.0) {
            Ok(())
        } else {
            Err(AuthError::Invalid)
        }
    }
}

/// Compare without an early exit on the first differing byte (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_scheme_and_token() {
        let t = BearerToken::new(b"  s3cret\n", "test").expect("token");
        assert_eq!(t.check(Some(b"Bearer s3cret")), Ok(()));
        assert_eq!(t.check(Some(b"bearer s3cret")), Ok(()));
        assert_eq!(t.check(Some(b"Bearer s3cres")), Err(AuthError::Invalid));
        assert_eq!(t.check(Some(b"Bearer s3cret2")), Err(AuthError::Invalid));
        assert_eq!(t.check(Some(b"Bearer ")), Err(AuthError::Invalid));
        assert_eq!(t.check(Some(b"Basic s3cret")), Err(AuthError::Missing));
        assert_eq!(t.check(None), Err(AuthError::Missing));
        assert_eq!(format!("{t:?}"), "BearerToken(<redacted>)");
    }

    #[test]
    fn refuses_empty_or_unprintable_tokens() {
        assert!(BearerToken::new(b" \n", "x").is_err());
        assert!(BearerToken::new(b"a b", "x").is_err());
        assert!(BearerToken::new(b"tok\x01", "x").is_err());
    }
}
