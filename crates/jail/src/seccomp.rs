//! Compiling a policy's seccomp profile to BPF (seccompiler) and installing it.
//!
//! Rules are grouped by action; each group becomes one filter whose mismatch action is allow.
//! The kernel runs every installed filter and keeps the strongest verdict, so the groups
//! compose (e.g. `clone3` → ENOSYS while the rest answers EPERM).

use std::collections::BTreeMap;

use policy::seccomp::{ArgOp, ArgWidth, Condition, RuleAction, SeccompProfile};
use policy::{NetworkMode, SeccompMode};
use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Why a profile cannot be compiled or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// This CPU architecture has no seccompiler backend.
    #[error("seccomp: unsupported architecture {0}")]
    Arch(&'static str),
    /// seccompiler refused the profile (e.g. a syscall unknown on this architecture).
    #[error("seccomp: {0}")]
    Compile(String),
    /// The kernel refused the filter.
    #[error("seccomp: installing the filter failed: {0}")]
    Install(String),
}

/// A compiled profile: one BPF program per action group, installed in order. Compiled once by
/// the supervisor and shipped to each jail as raw instructions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(
    from = "Vec<Vec<(u16, u8, u8, u32)>>",
    into = "Vec<Vec<(u16, u8, u8, u32)>>"
)]
pub struct CompiledFilter {
    programs: Vec<BpfProgram>,
}

impl From<CompiledFilter> for Vec<Vec<(u16, u8, u8, u32)>> {
    fn from(f: CompiledFilter) -> Self {
        f.programs
            .iter()
            .map(|p| p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
            .collect()
    }
}

impl From<Vec<Vec<(u16, u8, u8, u32)>>> for CompiledFilter {
    fn from(v: Vec<Vec<(u16, u8, u8, u32)>>) -> Self {
        CompiledFilter {
            programs: v
                .into_iter()
                .map(|p| {
                    p.into_iter()
                        .map(|(code, jt, jf, k)| seccompiler::sock_filter { code, jt, jf, k })
                        .collect()
                })
                .collect(),
        }
    }
}

fn action_json(a: RuleAction, mode: SeccompMode) -> Value {
    if mode == SeccompMode::Audit {
        return json!("log");
    }
    match a {
        RuleAction::Errno(e) => json!({ "errno": e.number() }),
        RuleAction::KillProcess => json!("kill_process"),
        RuleAction::Log => json!("log"),
    }
}

fn target_arch() -> Result<seccompiler::TargetArch, SeccompError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|_| SeccompError::Arch(std::env::consts::ARCH))
}

/// Compile `profile` for this architecture, honouring `mode` and `network`.
pub fn compile(
    profile: &SeccompProfile,
    mode: SeccompMode,
    network: NetworkMode,
) -> Result<CompiledFilter, SeccompError> {
    let arch = target_arch()?;
    // action → syscall → list of argument-condition lists (OR of ANDs).
    let mut groups: BTreeMap<RuleAction, BTreeMap<&str, Vec<Vec<Value>>>> = BTreeMap::new();
    for r in &profile.rules {
        if r.only_when == Some(Condition::NetworkNone) && network != NetworkMode::None {
            continue;
        }
        let conds: Vec<Value> = r
            .args
            .iter()
            .map(|a| {
                let op = match a.op {
                    ArgOp::Eq => json!("eq"),
                    ArgOp::Ne => json!("ne"),
                    ArgOp::MaskedEq => json!({ "masked_eq": a.mask.unwrap_or(u64::MAX) }),
                };
                let ty = match a.width {
                    ArgWidth::Dword => "dword",
                    ArgWidth::Qword => "qword",
                };
                json!({ "index": a.index, "type": ty, "op": op, "val": a.value })
            })
            .collect();
        for s in &r.syscalls {
            groups
                .entry(r.action)
                .or_default()
                .entry(s.as_str())
                .or_default()
                .push(conds.clone());
        }
    }
    let mut programs = Vec::new();
    for (action, calls) in groups {
        let mut filter = Vec::new();
        for (name, alternatives) in calls {
            // An unconditional rule makes the conditional ones for the same call redundant.
            if alternatives.iter().any(Vec::is_empty) {
                filter.push(json!({ "syscall": name }));
            } else {
                for args in alternatives {
                    filter.push(json!({ "syscall": name, "args": args }));
                }
            }
        }
        let doc = json!({ "g": {
            "mismatch_action": "allow",
            "match_action": action_json(action, mode),
            "filter": filter,
        }});
        let mut map = seccompiler::compile_from_json(doc.to_string().as_bytes(), arch)
            .map_err(|e| SeccompError::Compile(e.to_string()))?;
        let prog = map
            .remove("g")
            .ok_or_else(|| SeccompError::Compile("no program produced".into()))?;
        programs.push(prog);
    }
    Ok(CompiledFilter { programs })
}

impl CompiledFilter {
    /// Total BPF instructions (reported by `doctor` and the start-up log).
    pub fn instructions(&self) -> usize {
        self.programs.iter().map(Vec::len).sum()
    }

    /// Number of stacked filters.
    pub fn filters(&self) -> usize {
        self.programs.len()
    }

    /// Install on the calling thread (and everything it later creates). Also sets
    /// no_new_privs, which the kernel requires of an unprivileged caller.
    pub fn install(&self) -> Result<(), SeccompError> {
        for p in &self.programs {
            seccompiler::apply_filter(p).map_err(|e| SeccompError::Install(e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_profile_compiles_in_both_modes() {
        let p = SeccompProfile::default_profile().expect("profile");
        let enforce = compile(&p, SeccompMode::Enforce, NetworkMode::None).expect("compile");
        // EPERM, EACCES (network none), ENOSYS (clone3), EAFNOSUPPORT (socket families).
        assert_eq!(enforce.filters(), 4);
        assert!(enforce.instructions() < 4096);
        let egress = compile(&p, SeccompMode::Enforce, NetworkMode::Egress).expect("compile");
        assert_eq!(egress.filters(), 3, "no EACCES group without network: none");
        let audit = compile(&p, SeccompMode::Audit, NetworkMode::None).expect("compile");
        assert_eq!(audit.filters(), 4);
    }

    #[test]
    fn unknown_syscalls_are_refused() {
        let text = policy::seccomp::DEFAULT_SECCOMP_JSON.replacen(
            "\"unshare\"",
            "\"unshare_everything\"",
            1,
        );
        let p = SeccompProfile::parse(&text).expect("parse");
        let e = compile(&p, SeccompMode::Enforce, NetworkMode::None).expect_err("unknown call");
        assert!(e.to_string().contains("unshare_everything"), "{e}");
    }
}
