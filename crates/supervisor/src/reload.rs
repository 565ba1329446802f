//! A new policy set while serving: translated, checked and probed as start-up does, then put in
//! force for new requests at once (requests already under way keep the set they started
//! under), the old set's spare jails retired. A set that fails any check changes nothing.

use std::sync::Arc;

use policy::{PolicySet, Protection};
use seccomp::SeccompError;
use vocab::request::RequestError;

use crate::plan::{Plan, Plans};
use crate::start::{Supervisor, log_selection, missing_required};

/// Why a set was refused, one variant per check; the set in force stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadRefused {
    /// The default policy changes fields start-up sets up once (each `field: old → new`).
    #[error(
        "the default policy changes node-wide fields, which start-up sets up once and a reload cannot: {}; restart the server to change them",
        .0.join("; ")
    )]
    NodeWide(Vec<String>),
    /// A policy's seccomp profile does not compile, and the default policy requires seccomp.
    #[error("policy {policy:?}: {source} (spec.require has seccomp)")]
    Seccomp {
        /// The policy's name.
        policy: String,
        /// Why its profile does not compile.
        source: SeccompError,
    },
    /// A policy's jail could not be confined and self-tested.
    #[error("the sandbox probe of policy {policy:?} failed: {source}")]
    Probe {
        /// The policy's name.
        policy: String,
        /// The probe's error.
        source: RequestError,
    },
    /// A policy requires protections this environment cannot enforce.
    #[error(
        "policy {policy:?} requires {:?}, which this environment cannot enforce",
        .missing.iter().map(|m| m.as_str()).collect::<Vec<_>>()
    )]
    Missing {
        /// The policy's name.
        policy: String,
        /// What it requires and the probe did not find.
        missing: Vec<Protection>,
    },
}

/// A set put in force: its plans and the set it replaced.
#[derive(Debug)]
pub struct Reloaded {
    pub old: Arc<Plans>,
    pub new: Arc<Plans>,
}

impl Supervisor {
    /// Put `set` in force for new requests, after the checks start-up makes (each policy
    /// translated, its seccomp profile compiled, a jail of each confined and self-tested, every
    /// required protection present) and one more: the node-wide fields, which start-up sets up
    /// once (the UID pool and its leases, the namespaces the probe found, `require`, the tree
    /// cache's keeper), must not change; changing one needs a restart, and the refusal says so.
    pub fn reload(&self, set: &PolicySet) -> Result<Reloaded, ReloadRefused> {
        let old = self.plans.current();
        let new = Arc::new(Plans::new(set, &self.overrides, std::env::vars()));
        let changed = node_wide_changes(old.default_plan(), new.default_plan());
        if !changed.is_empty() {
            return Err(ReloadRefused::NodeWide(changed));
        }
        let default = new.default_plan();
        for p in new.all() {
            if let Err(e) = p.seccomp()
                && default.requires(Protection::Seccomp)
            {
                return Err(ReloadRefused::Seccomp {
                    policy: p.policy_name.clone(),
                    source: e.clone(),
                });
            }
        }
        for p in new.all() {
            let (report, _) = self.runner.probe(p).map_err(|e| ReloadRefused::Probe {
                policy: p.policy_name.clone(),
                source: e,
            })?;
            let missing = missing_required(&report, p);
            if !missing.is_empty() {
                return Err(ReloadRefused::Missing {
                    policy: p.policy_name.clone(),
                    missing,
                });
            }
        }
        let old = self.plans.replace(new.clone());
        self.runner.set_plans(&new);
        log_selection(&new);
        Ok(Reloaded { old, new })
    }
}

/// The node-wide fields of the default policy that differ between `old` and `new`, each as
/// `field: old → new`.
fn node_wide_changes(old: &Plan, new: &Plan) -> Vec<String> {
    let mut changed = Vec::new();
    if old.uid_range != new.uid_range {
        changed.push(format!(
            "spec.uidRange: {}+{} → {}+{}",
            old.uid_range.0, old.uid_range.1, new.uid_range.0, new.uid_range.1
        ));
    }
    if old.namespaces() != new.namespaces() {
        changed.push(format!(
            "spec.namespaces: {:?} → {:?}",
            old.namespaces(),
            new.namespaces()
        ));
    }
    let names = |p: &Plan| {
        let mut r: Vec<&str> = p.require.iter().map(|r| r.as_str()).collect();
        r.sort_unstable();
        r.join(", ")
    };
    if names(old) != names(new) {
        changed.push(format!("spec.require: [{}] → [{}]", names(old), names(new)));
    }
    if old.cache != new.cache {
        changed.push("spec.cache".to_owned());
    }
    changed
}
