//! Credentials out of everything a command prints that we log or return (Argo CD's
//! CVE-2023-25163: a repository URL with its password ended up in an error message).
//! Redacted: URL userinfo, `Authorization:` values, `key=value` / `key: value` pairs whose key
//! names a secret, and the values of secret-named request variables wherever they appear.

use std::sync::OnceLock;

use regex::Regex;

/// What replaces a secret.
pub const MASK: &str = "***";

/// Words that make a variable or key name secret.
const SECRET_WORDS: &[&str] = &[
    "PASSWORD",
    "PASSWD",
    "SECRET",
    "TOKEN",
    "CREDENTIAL",
    "APIKEY",
    "API_KEY",
    "PRIVATE",
    "ACCESS_KEY",
    "AUTH",
    "PASS",
];

/// Whether an environment variable's name says it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let up = name.to_ascii_uppercase();
    SECRET_WORDS.iter().any(|w| up.contains(w))
}

fn patterns() -> &'static [(Regex, &'static str)] {
    static P: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    P.get_or_init(|| {
        let mk = |re: &str| Regex::new(re).expect("redaction pattern compiles");
        vec![
            // scheme://user:password@host → scheme://***@host (also a bare token as user).
            (mk(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]+(:[^/@\s]*)?@"), "${1}***@"),
            // Authorization: Bearer xyz / Basic xyz
            (
                mk(r"(?i)\b(authorization\s*[:=]\s*)(bearer|basic|token)?\s*[^\s,;]+"),
                "${1}${2} ***",
            ),
            // password=..., token: ..., "secret": "..." (the key names a secret).
            (
                mk(r#"(?i)\b([a-z0-9_.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|credential)[a-z0-9_.-]*"?\s*[:=]\s*"?)([^\s"',;&]+)"#),
                "${1}***",
            ),
        ]
    })
}

/// `text` with credentials masked; `env` supplies values to mask wherever they appear (those
/// of secret-named variables, at least 4 characters long).
pub fn redact(text: &str, env: &[(String, String)]) -> String {
    let mut out = text.to_owned();
    for (k, v) in env {
        if v.len() >= 4 && is_secret_name(k) {
            out = out.replace(v.as_str(), MASK);
        }
    }
    for (re, with) in patterns() {
        if re.is_match(&out) {
            out = re.replace_all(&out, *with).into_owned();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_credentials_and_keeps_the_rest() {
        let env = vec![
            (
                "ARGOCD_ENV_VAULT_TOKEN".to_owned(),
                "s3cr3t-vault".to_owned(),
            ),
            ("ARGOCD_APP_NAME".to_owned(), "guestbook".to_owned()),
        ];
        let cases = [
            (
                "fatal: could not read from https://alice:hunter2@git.example.com/repo.git",
                "fatal: could not read from https://***@git.example.com/repo.git",
            ),
            (
                "clone https://ghp_abcdef123456@github.com/x/y failed",
                "clone https://***@github.com/x/y failed",
            ),
            (
                "Authorization: Bearer eyJhbGciOi.x.y",
                "Authorization: Bearer ***",
            ),
            (
                "error: password=hunter2 rejected",
                "error: password=*** rejected",
            ),
            (
                r#"{"client_secret": "abc123"}"#,
                r#"{"client_secret": "***"}"#,
            ),
            ("api_key: zzz999 invalid", "api_key: *** invalid"),
            ("vault said s3cr3t-vault is bad", "vault said *** is bad"),
            // Not secrets: the app name, plain URLs, ordinary words.
            (
                "guestbook: GET https://git.example.com/repo.git 404",
                "guestbook: GET https://git.example.com/repo.git 404",
            ),
            ("tokenizer failed at line 3", "tokenizer failed at line 3"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input, &env), want, "{input}");
        }
        assert!(is_secret_name("GIT_PASSWORD") && is_secret_name("aws_secret_access_key"));
        assert!(!is_secret_name("ARGOCD_APP_NAME") && !is_secret_name("PATH"));
    }
}
