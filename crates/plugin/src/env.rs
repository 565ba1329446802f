//! Environment composition for plugin commands (as Argo CD's `runCommand` in `cmpserver/plugin/plugin.go`): the base environment, then the
//! request's entries in order; entries with an empty name are dropped, empty values are kept, and
//! the last occurrence of a name wins.

use std::collections::HashMap;

/// Most environment entries a request may carry. Argo CD sends a dozen `ARGOCD_APP_*` plus the
/// Application's plugin env; thousands are an attack on the server, not a configuration.
pub const MAX_REQUEST_ENTRIES: usize = 4096;
/// Most bytes (names and values) a request's environment may hold: Linux refuses to start a
/// command whose environment and arguments exceed a quarter of its stack limit (2 MiB by default).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// A request environment over [`MAX_REQUEST_ENTRIES`] or [`MAX_REQUEST_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// Too many entries.
    #[error(
        "the request carries {0} environment entries; at most {MAX_REQUEST_ENTRIES} are accepted (a fixed limit)"
    )]
    TooManyEntries(usize),
    /// Too many bytes.
    #[error(
        "the request's environment holds more than {MAX_REQUEST_BYTES} bytes of names and values (a fixed limit: commands could not start with it)"
    )]
    TooLarge,
}

/// Refuse a request environment no honest client sends (before anything else reads it).
pub fn check_request<'a>(
    entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Result<(), EnvError> {
    if entries.len() > MAX_REQUEST_ENTRIES {
        return Err(EnvError::TooManyEntries(entries.len()));
    }
    let mut total = 0usize;
    for (k, v) in entries {
        total = total.saturating_add(k.len() + v.len() + 2);
        if total > MAX_REQUEST_BYTES {
            return Err(EnvError::TooLarge);
        }
    }
    Ok(())
}

/// Compose `base` then `request` into the final environment, preserving first-seen order.
/// Linear in the number of entries (an index by name, not a search per entry).
pub fn compose(base: &[(String, String)], request: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(base.len() + request.len());
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(base.len() + request.len());
    for (k, v) in base.iter().chain(request) {
        if k.is_empty() {
            continue;
        }
        match index.get(k.as_str()) {
            Some(&i) => out[i].1.clone_from(v),
            None => {
                index.insert(k.as_str(), out.len());
                out.push((k.clone(), v.clone()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_refused_and_composition_stays_linear() {
        let flood: Vec<(String, String)> = (0..60_000)
            .map(|i| (format!("ARGOCD_ENV_F{i}"), "x".to_owned()))
            .collect();
        assert_eq!(
            check_request(flood.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            Err(EnvError::TooManyEntries(60_000))
        );
        let big = [("A".to_owned(), "x".repeat(MAX_REQUEST_BYTES))];
        assert_eq!(
            check_request(big.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            Err(EnvError::TooLarge)
        );
        let ok = [("ARGOCD_APP_NAME".to_owned(), "guestbook".to_owned())];
        assert!(check_request(ok.iter().map(|(k, v)| (k.as_str(), v.as_str()))).is_ok());
        // Quadratic composition of 60,000 distinct names took ~10 s; linear takes milliseconds.
        // Checked by result, not time: every name once, in first-seen order.
        let out = compose(&[], &flood);
        assert_eq!(out.len(), 60_000);
        assert_eq!(out[59_999].0, "ARGOCD_ENV_F59999");
    }

    #[test]
    fn last_wins_and_empty_values_kept() {
        let base = vec![
            ("PATH".to_owned(), "/bin".to_owned()),
            ("A".to_owned(), "1".to_owned()),
        ];
        let req = vec![
            ("A".into(), "2".into()),
            ("".into(), "x".into()),
            ("E".into(), "".into()),
        ];
        assert_eq!(
            compose(&base, &req),
            vec![
                ("PATH".into(), "/bin".into()),
                ("A".into(), "2".into()),
                ("E".into(), "".into())
            ]
        );
    }
}
