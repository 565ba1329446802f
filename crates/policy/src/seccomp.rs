//! The seccomp profile file (`policies/seccomp/*.json`): a reviewed list of rules, each with a
//! reason. Parsed strictly here; compiled to BPF by the jail.

use serde::{Deserialize, Serialize};

use crate::error::{API_VERSION, PolicyError};

/// The embedded default profile (`policies/seccomp/default.json`).
pub const DEFAULT_SECCOMP_JSON: &str = include_str!("../../../policies/seccomp/default.json");

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RuleAction {
    /// Fail the call with this errno.
    Errno(Errno),
    /// Kill the whole process.
    KillProcess,
    /// Allow, but have the kernel log it.
    Log,
}

/// The errnos a profile may name (by name in the file, so reviewers need no table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Errno {
    /// Operation not permitted.
    EPERM,
    /// Permission denied.
    EACCES,
    /// Function not implemented (what a kernel without the call says).
    ENOSYS,
    /// Address family not supported.
    EAFNOSUPPORT,
    /// Invalid argument.
    EINVAL,
}

impl Errno {
    /// The number (the same on every architecture seccompiler targets).
    pub fn number(self) -> u32 {
        match self {
            Errno::EPERM => 1,
            Errno::EACCES => 13,
            Errno::EINVAL => 22,
            Errno::ENOSYS => 38,
            Errno::EAFNOSUPPORT => 97,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
enum RawAction {
    Errno(Errno),
    KillProcess,
    Log,
}

/// Comparison of one syscall argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ArgOp {
    /// `arg == value`.
    Eq,
    /// `arg != value`.
    Ne,
    /// `arg & mask == value`.
    MaskedEq,
}

/// Argument width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ArgWidth {
    /// 32 bits.
    Dword,
    /// 64 bits.
    Qword,
}

/// One argument condition (all of a rule's conditions must hold).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ArgCondition {
    /// Argument index, 0–5.
    pub index: u8,
    /// Width.
    #[serde(rename = "type")]
    pub width: ArgWidth,
    /// Comparison.
    pub op: ArgOp,
    /// Mask for `maskedEq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<u64>,
    /// Value compared with.
    pub value: u64,
    /// What the number means (constants have no names in BPF).
    #[serde(default)]
    pub comment: String,
}

/// When a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Condition {
    /// Only when the policy's `network.mode` is `none`.
    NetworkNone,
    /// Only when the policy's `network.mode` is `allowList` (commands may open TCP sockets,
    /// to their proxy only).
    NetworkAllowList,
    /// Only on x86_64 (a call other architectures do not have).
    #[serde(rename = "x86_64")]
    X86_64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRule {
    reason: String,
    syscalls: Vec<String>,
    action: RawAction,
    #[serde(default)]
    args: Vec<ArgCondition>,
    #[serde(default)]
    only_when: Option<Condition>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProfile {
    api_version: String,
    kind: String,
    metadata: RawMeta,
    default_action: String,
    #[serde(default)]
    notes: Vec<String>,
    rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeta {
    name: String,
}

/// One validated rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Why the rule exists (one line, required).
    pub reason: String,
    /// Syscall names (resolved per architecture at compile time).
    pub syscalls: Vec<String>,
    /// What happens on a match.
    pub action: RuleAction,
    /// Conditions, all of which must hold; empty = always.
    pub args: Vec<ArgCondition>,
    /// Applies only under this condition.
    pub only_when: Option<Condition>,
}

/// A validated seccomp profile. The default action is always allow (see the file's notes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SeccompProfile {
    /// `metadata.name`.
    pub name: String,
    /// The rules, in file order.
    pub rules: Vec<Rule>,
}

fn bad(why: impl Into<String>) -> PolicyError {
    crate::error::invalid("spec.seccomp.profile", why)
}

impl SeccompProfile {
    /// The embedded default.
    pub fn default_profile() -> Result<Self, PolicyError> {
        Self::parse(DEFAULT_SECCOMP_JSON)
    }

    /// Parse and validate profile JSON.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let raw: RawProfile =
            serde_json::from_str(text).map_err(|e| bad(format!("not a valid profile: {e}")))?;
        if raw.api_version != API_VERSION || raw.kind != "SeccompProfile" {
            return Err(bad(format!(
                "must be apiVersion {} kind SeccompProfile",
                API_VERSION
            )));
        }
        if raw.default_action != "allow" {
            return Err(bad(format!(
                "defaultAction must be \"allow\" (a reviewed denylist), got {:?}",
                raw.default_action
            )));
        }
        let _ = raw.notes;
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (i, r) in raw.rules.into_iter().enumerate() {
            if r.reason.trim().is_empty() {
                return Err(bad(format!("rule {i} has no reason")));
            }
            if r.syscalls.is_empty() || r.syscalls.iter().any(|s| s.is_empty()) {
                return Err(bad(format!("rule {i} names no syscall")));
            }
            for a in &r.args {
                if a.index > 5 {
                    return Err(bad(format!("rule {i}: argument index {} > 5", a.index)));
                }
                if (a.op == ArgOp::MaskedEq) != a.mask.is_some() {
                    return Err(bad(format!(
                        "rule {i}: `mask` is required with maskedEq and only with it"
                    )));
                }
                if a.width == ArgWidth::Dword
                    && (a.value > u64::from(u32::MAX)
                        || a.mask.is_some_and(|m| m > u64::from(u32::MAX)))
                {
                    return Err(bad(format!("rule {i}: dword value above 32 bits")));
                }
            }
            let action = match r.action {
                RawAction::Errno(e) => RuleAction::Errno(e),
                RawAction::KillProcess => RuleAction::KillProcess,
                RawAction::Log => RuleAction::Log,
            };
            rules.push(Rule {
                reason: r.reason,
                syscalls: r.syscalls,
                action,
                args: r.args,
                only_when: r.only_when,
            });
        }
        if rules.is_empty() {
            return Err(bad("no rules"));
        }
        Ok(SeccompProfile {
            name: raw.metadata.name,
            rules,
        })
    }

    /// Every syscall some unconditional rule denies (for reports and tests).
    pub fn unconditionally_denied(&self) -> Vec<&str> {
        self.rules
            .iter()
            .filter(|r| r.args.is_empty() && r.only_when.is_none() && r.action != RuleAction::Log)
            .flat_map(|r| r.syscalls.iter().map(String::as_str))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_profile_validates_and_denies_the_required_calls() {
        let p = SeccompProfile::default_profile().expect("default profile");
        let denied = p.unconditionally_denied();
        for s in [
            "unshare",
            "setns",
            "clone3",
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "keyctl",
            "add_key",
            "request_key",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "open_by_handle_at",
            "settimeofday",
            "clock_settime",
            "swapon",
            "swapoff",
            "reboot",
            "acct",
        ] {
            assert!(denied.contains(&s), "{s} is not denied");
        }
        let clone3 = p
            .rules
            .iter()
            .find(|r| r.syscalls == ["clone3"])
            .expect("clone3 rule");
        assert_eq!(clone3.action, RuleAction::Errno(Errno::ENOSYS));
        let ioctls: Vec<u64> = p
            .rules
            .iter()
            .filter(|r| r.syscalls == ["ioctl"])
            .map(|r| r.args[0].value)
            .collect();
        assert_eq!(ioctls, [0x5412, 0x541c]);
        assert!(p.rules.iter().all(|r| !r.reason.is_empty()));
    }

    #[test]
    fn malformed_profiles_are_refused() {
        let e = |t: &str| SeccompProfile::parse(t).expect_err(t).to_string();
        let d = DEFAULT_SECCOMP_JSON;
        assert!(e(&d.replacen("\"allow\"", "\"errno\"", 1)).contains("defaultAction"));
        assert!(e(&d.replacen("\"reason\"", "\"why\"", 1)).contains("unknown field `why`"));
        assert!(
            e(&d.replacen("\"maskedEq\", \"mask\": 131072,", "\"maskedEq\",", 1))
                .contains("`mask` is required")
        );
        assert!(e(&d.replacen("\"EPERM\"", "\"EWHAT\"", 1)).contains("unknown variant"));
        assert!(e("{}").contains("missing field"));
    }
}
