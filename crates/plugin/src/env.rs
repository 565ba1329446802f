//! Environment composition for plugin commands (as Argo CD's `runCommand` in `cmpserver/plugin/plugin.go`): the base environment, then the
//! request's entries in order; entries with an empty name are dropped, empty values are kept, and
//! the last occurrence of a name wins.

/// Compose `base` then `request` into the final environment, preserving first-seen order.
pub fn compose(base: &[(String, String)], request: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in base.iter().chain(request) {
        if k.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(ek, _)| ek == k) {
            Some(slot) => slot.1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
