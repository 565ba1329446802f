//! Several policies, one chosen per request (`spec.select`): which of a policy directory's
//! policies a request runs under, from the variables Argo CD's repo-server sets itself
//! (`ARGOCD_APP_PROJECT_NAME`, `ARGOCD_APP_NAMESPACE`, `ARGOCD_APP_NAME`). An application's
//! author reaches commands only through `ARGOCD_ENV_*` and parameters (`ARGOCD_APP_PARAMETERS`,
//! `PARAM_*`), which Argo CD always prefixes: nothing an author writes can name these three.

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::error::invalid;

/// The variables a request is selected by, as Argo CD names them.
pub const PROJECT_VAR: &str = "ARGOCD_APP_PROJECT_NAME";
/// The application's destination namespace.
pub const NAMESPACE_VAR: &str = "ARGOCD_APP_NAMESPACE";
/// `<name>`, or `<appNamespace>_<name>` for an application outside Argo CD's own namespace.
pub const APP_VAR: &str = "ARGOCD_APP_NAME";

/// One entry of a `spec.select` list: a name, or `prefix*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Pattern {
    /// The whole name.
    Exact(String),
    /// Every name starting with this (written with a trailing `*`).
    Prefix(String),
}

impl TryFrom<String> for Pattern {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let (body, prefix) = match s.strip_suffix('*') {
            Some(b) => (b, true),
            None => (s.as_str(), false),
        };
        // Kubernetes object names, and `_`, which joins an application's namespace to its
        // name (apps in any namespace).
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
        if body.is_empty() || !body.chars().all(ok) {
            return Err(format!(
                "{s:?} is not a name or a `prefix*` pattern (letters, digits, '-', '.', '_'; `*` only at the end)"
            ));
        }
        Ok(if prefix {
            Pattern::Prefix(body.to_owned())
        } else {
            Pattern::Exact(body.to_owned())
        })
    }
}

impl From<Pattern> for String {
    fn from(p: Pattern) -> String {
        p.to_string()
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Exact(n) => f.write_str(n),
            Pattern::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// How well one pattern matched: exact beats any prefix, a longer prefix a shorter one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fit {
    Prefix(usize),
    Exact,
}

impl Pattern {
    fn fit(&self, name: &str) -> Option<Fit> {
        match self {
            Pattern::Exact(n) => (n == name).then_some(Fit::Exact),
            Pattern::Prefix(p) => name.starts_with(p.as_str()).then_some(Fit::Prefix(p.len())),
        }
    }
}

/// `spec.select`: the requests a policy is for. Every list given must match (a request with
/// no value for a listed dimension never matches it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Select {
    /// Argo CD projects (`ARGOCD_APP_PROJECT_NAME`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<Pattern>,
    /// Destination namespaces (`ARGOCD_APP_NAMESPACE`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<Pattern>,
    /// Application names (`ARGOCD_APP_NAME`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apps: Vec<Pattern>,
}

/// What a request is, as Argo CD's repo-server says (absent values are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// `ARGOCD_APP_PROJECT_NAME` (sent since Argo CD 3.0, with generate requests).
    pub project: Option<String>,
    /// `ARGOCD_APP_NAMESPACE`.
    pub namespace: Option<String>,
    /// `ARGOCD_APP_NAME`.
    pub app: Option<String>,
}

/// A selecting variable (named) given twice with different values: the request is refused,
/// since commands would see the last and selection cannot guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} is given twice, with different values")]
pub struct GivenTwice(pub &'static str);

impl Identity {
    /// The identity in a request's environment entries. A selecting variable given twice with
    /// different values is refused: commands see the last, and selection must see what they
    /// see without guessing.
    pub fn from_env<'a>(
        env: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Identity, GivenTwice> {
        let mut id = Identity::default();
        for (k, v) in env {
            let (var, slot) = match k {
                PROJECT_VAR => (PROJECT_VAR, &mut id.project),
                NAMESPACE_VAR => (NAMESPACE_VAR, &mut id.namespace),
                APP_VAR => (APP_VAR, &mut id.app),
                _ => continue,
            };
            match slot {
                Some(prev) if prev != v => return Err(GivenTwice(var)),
                _ => *slot = Some(v.to_owned()),
            }
        }
        // Argo CD sends `ARGOCD_APP_NAMESPACE=` when there is none: the same as absent.
        for v in [&mut id.project, &mut id.namespace, &mut id.app] {
            if v.as_deref() == Some("") {
                *v = None;
            }
        }
        Ok(id)
    }
}

/// How specifically a policy matched one request: applications outrank namespaces, which
/// outrank projects; within one, exact beats prefix and a longer prefix a shorter one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank([Option<Fit>; 3]);

impl Select {
    /// Validate: at least one list.
    pub(crate) fn check(&self) -> Result<(), PolicyError> {
        if self.projects.is_empty() && self.namespaces.is_empty() && self.apps.is_empty() {
            return Err(invalid(
                "spec.select",
                "names no projects, namespaces or apps (a policy for every request is the default: leave spec.select out)",
            ));
        }
        Ok(())
    }

    fn lists(&self) -> [&[Pattern]; 3] {
        [&self.apps, &self.namespaces, &self.projects]
    }

    /// How well `id` matches, or `None`.
    pub fn rank(&self, id: &Identity) -> Option<Rank> {
        let values = [&id.app, &id.namespace, &id.project];
        let mut rank = [None; 3];
        for (i, (list, value)) in self.lists().into_iter().zip(values).enumerate() {
            if list.is_empty() {
                continue;
            }
            let value = value.as_deref()?;
            rank[i] = Some(list.iter().filter_map(|p| p.fit(value)).max()?);
        }
        Some(Rank(rank))
    }

    /// Whether one request can match both with the same rank (then neither is more specific
    /// and start-up refuses): in each dimension both are open, or both list the same pattern.
    pub fn may_tie(&self, other: &Select) -> bool {
        self.lists().into_iter().zip(other.lists()).all(|(a, b)| {
            match (a.is_empty(), b.is_empty()) {
                (true, true) => true,
                (false, false) => a.iter().any(|p| b.contains(p)),
                _ => false,
            }
        })
    }

    /// Only names an application's author may choose (apps, namespaces) and no project: a
    /// reviewer should know that another project's application can match it too.
    pub fn without_project(&self) -> bool {
        self.projects.is_empty()
    }
}

/// Which of `selects` (in order; `None` selects nothing: the default) `id` runs under: the
/// index of the most specific one that matches it, or 0 (the default's place) when none does.
pub fn most_specific<'a>(
    selects: impl IntoIterator<Item = Option<&'a Select>>,
    id: &Identity,
) -> usize {
    selects
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| Some((s?.rank(id)?, i)))
        .max()
        .map_or(0, |(_, i)| i)
}

impl std::fmt::Display for Select {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (name, list) in [
            ("projects", &self.projects),
            ("namespaces", &self.namespaces),
            ("apps", &self.apps),
        ] {
            if !list.is_empty() {
                let l: Vec<String> = list.iter().map(Pattern::to_string).collect();
                parts.push(format!("{name} [{}]", l.join(", ")));
            }
        }
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(projects: &[&str], namespaces: &[&str], apps: &[&str]) -> Select {
        let p = |l: &[&str]| {
            l.iter()
                .map(|s| Pattern::try_from(s.to_string()).unwrap())
                .collect()
        };
        Select {
            projects: p(projects),
            namespaces: p(namespaces),
            apps: p(apps),
        }
    }

    /// `policy suggest` writes a policy back out: each pattern as it was written, so the
    /// written policy selects what the read one did.
    #[test]
    fn patterns_are_written_as_they_were_read() {
        let s = sel(&["team-a*"], &[], &["argocd_guestbook"]);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"projects":["team-a*"],"apps":["argocd_guestbook"]}"#
        );
        assert_eq!(serde_json::from_str::<Select>(&json).unwrap(), s);
    }

    /// The reviewer's warning: a select that names no project matches other projects' apps.
    #[test]
    fn a_select_without_a_project_is_named() {
        assert!(sel(&[], &["team-a"], &["guestbook"]).without_project());
        assert!(!sel(&["team-a"], &[], &["guestbook"]).without_project());
    }

    fn id(project: &str, namespace: &str, app: &str) -> Identity {
        Identity::from_env([
            (PROJECT_VAR, project),
            (NAMESPACE_VAR, namespace),
            (APP_VAR, app),
        ])
        .unwrap()
    }

    #[test]
    fn patterns_are_names_or_prefixes() {
        assert_eq!(
            Pattern::try_from("team-*".to_owned()),
            Ok(Pattern::Prefix("team-".into()))
        );
        for bad in ["*", "a*b", "a b", "", "team/x", "**"] {
            assert!(Pattern::try_from(bad.to_owned()).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_list_must_match_and_a_missing_value_matches_nothing() {
        let s = sel(&["team-a"], &["apps-*"], &[]);
        assert!(s.rank(&id("team-a", "apps-1", "x")).is_some());
        assert!(s.rank(&id("team-a", "other", "x")).is_none());
        assert!(s.rank(&id("team-b", "apps-1", "x")).is_none());
        assert!(s.rank(&id("", "apps-1", "x")).is_none());
    }

    #[test]
    fn apps_outrank_namespaces_outrank_projects_and_exact_outranks_prefix() {
        let i = id("team-a", "ns", "app");
        let r = |s: Select| s.rank(&i).unwrap();
        assert!(r(sel(&[], &[], &["app"])) > r(sel(&[], &["ns"], &[])));
        assert!(r(sel(&[], &["ns"], &[])) > r(sel(&["team-a"], &[], &[])));
        assert!(r(sel(&["team-a"], &[], &[])) > r(sel(&["team-*"], &[], &[])));
        assert!(r(sel(&["team-*"], &[], &[])) > r(sel(&["t*"], &[], &[])));
        assert!(r(sel(&["team-a"], &["ns"], &[])) > r(sel(&[], &["ns"], &[])));
    }

    #[test]
    fn ties_are_the_same_open_dimensions_sharing_a_pattern() {
        assert!(sel(&["team-a"], &[], &[]).may_tie(&sel(&["team-a", "x"], &[], &[])));
        assert!(sel(&["team-*"], &[], &[]).may_tie(&sel(&["team-*"], &[], &[])));
        assert!(!sel(&["team-*"], &[], &[]).may_tie(&sel(&["team-a"], &[], &[])));
        assert!(!sel(&["team-a"], &[], &[]).may_tie(&sel(&["team-a"], &["ns"], &[])));
        assert!(!sel(&["team-a"], &[], &[]).may_tie(&sel(&["team-b"], &[], &[])));
    }

    #[test]
    fn a_selecting_variable_given_twice_differently_is_refused() {
        assert_eq!(
            Identity::from_env([(PROJECT_VAR, "a"), (PROJECT_VAR, "b")]),
            Err(GivenTwice(PROJECT_VAR))
        );
        assert!(Identity::from_env([(PROJECT_VAR, "a"), (PROJECT_VAR, "a")]).is_ok());
        // Only Argo CD's own names select.
        let i = Identity::from_env([
            ("ARGOCD_ENV_ARGOCD_APP_PROJECT_NAME", "team-a"),
            ("PARAM_ARGOCD_APP_PROJECT_NAME", "team-a"),
        ])
        .unwrap();
        assert_eq!(i, Identity::default());
    }
}
