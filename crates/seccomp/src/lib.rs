//! The seccomp filter, on both sides of the pipe: the supervisor compiles the policy's profile to
//! BPF (seccompiler) once, the filter crosses to each jail as raw instructions, and the jail
//! installs it and serves its user-notification listener.
//!
//! Architecture invariant: no `unsafe` here; every raw call is `jail_sys::sys`.
//!
//! Rules are grouped by action; each group becomes one filter whose mismatch action is allow.
//! The kernel runs every installed filter and keeps the strongest verdict, so the groups
//! compose (e.g. `clone3` → ENOSYS while the rest answers EPERM).
//!
//! Errno rules (all but the `clone3` → ENOSYS shim, a compatibility answer rather than a
//! denial: glibc falls back to `clone`, which the profile inspects) go into one filter whose
//! action is SECCOMP_RET_USER_NOTIF, installed with a listener served by a thread of the jail.
//! Enforce mode: the thread answers with the matching rule's errno (a call it cannot match, or
//! any call once the listener is gone, fails too: fail closed) and records the denial, so the
//! request's audit event names the call that broke it. Audit mode: it answers "continue" and
//! records what enforce mode would have denied. Chosen over SECCOMP_RET_LOG: the kernel's log
//! is rate-limited, needs CAP_SYSLOG to read inside a container, and cannot be tied to a
//! request. Kill and log rules stay plain kernel actions.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use policy::seccomp::{ArgOp, ArgWidth, Condition, RuleAction, SeccompProfile};
use policy::{NetworkMode, SeccompMode};
use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use vocab::record::{SeccompAction, SeccompEvent};

/// Why a profile cannot be compiled or installed.
#[derive(Debug, Clone, thiserror::Error)]
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
#[serde(from = "WireFilter", into = "WireFilter")]
pub struct CompiledFilter {
    programs: Vec<BpfProgram>,
    /// The program installed with a user-notification listener.
    notify: Option<usize>,
    /// System call numbers of the notify program → names (for the audit record).
    names: Vec<(u32, String)>,
    /// The notify program's rules, evaluated again by the listener to pick the errno.
    rules: Vec<NotifyRule>,
    /// Audit mode: let notified calls continue.
    audit: bool,
    /// `network: allowList`: the number of `socket`, whose inet and inet6 calls the listener
    /// answers with a socket of its own bound to the loopback device ([`Answer::OnLoopback`]).
    inet_on_loopback: Option<u32>,
}

/// What the listener does with a notified call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Let it run as if unfiltered (audit mode).
    Continue,
    /// Fail it with this errno.
    Errno(i32),
    /// `socket(AF_INET|AF_INET6, …)` under `network: allowList`: the listener creates the socket
    /// itself, binds it to the loopback device, and installs it as the call's result. The
    /// command cannot undo the binding (that needs CAP_NET_RAW), so with Landlock's rule (TCP
    /// connect to the egress proxy's port only) no packet of it leaves the loopback: the proxy's
    /// port on another host is as unreachable as any other. Decided from the call's registers
    /// alone (no memory of the caller is read), so there is nothing to race.
    OnLoopback,
}

/// One rule of the notify program, as the listener evaluates it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NotifyRule {
    nrs: Vec<u32>,
    /// (arg index, 64-bit, op: 0 eq / 1 ne / 2 masked eq, mask, value), all must hold.
    conds: Vec<(u8, bool, u8, u64, u64)>,
    errno: i32,
    /// A network fence (a rule of the network modes, or on socket families): enforced in
    /// audit mode too, since what it stops is a way out of the pod, not a call to learn.
    #[serde(default)]
    fence: bool,
}

impl NotifyRule {
    fn matches(&self, nr: i32, args: &[u64; 6]) -> bool {
        self.nrs.iter().any(|n| i64::from(*n) == i64::from(nr))
            && self.conds.iter().all(|&(i, wide, op, mask, value)| {
                let a = args.get(usize::from(i)).copied().unwrap_or(0);
                let a = if wide { a } else { a & 0xffff_ffff };
                match op {
                    0 => a == value,
                    1 => a != value,
                    _ => a & mask == value,
                }
            })
    }
}

/// The wire form (raw instructions).
#[derive(Debug, Serialize, Deserialize)]
pub struct WireFilter {
    programs: Vec<Vec<(u16, u8, u8, u32)>>,
    notify: Option<usize>,
    names: Vec<(u32, String)>,
    rules: Vec<NotifyRule>,
    audit: bool,
    inet_on_loopback: Option<u32>,
}

impl From<CompiledFilter> for WireFilter {
    fn from(f: CompiledFilter) -> Self {
        WireFilter {
            programs: f
                .programs
                .iter()
                .map(|p| p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
                .collect(),
            notify: f.notify,
            names: f.names,
            rules: f.rules,
            audit: f.audit,
            inet_on_loopback: f.inet_on_loopback,
        }
    }
}

impl From<WireFilter> for CompiledFilter {
    fn from(v: WireFilter) -> Self {
        CompiledFilter {
            programs: v
                .programs
                .into_iter()
                .map(|p| {
                    p.into_iter()
                        .map(|(code, jt, jf, k)| seccompiler::sock_filter { code, jt, jf, k })
                        .collect()
                })
                .collect(),
            notify: v.notify,
            names: v.names,
            rules: v.rules,
            audit: v.audit,
            inet_on_loopback: v.inet_on_loopback,
        }
    }
}

/// x86_64's x32 ABI: the same calls under numbers with this bit set, in the same architecture
/// token. seccompiler's architecture check passes them and no rule matches their numbers, so
/// on a kernel with x32 enabled they would skip every rule: refused before the rules.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// SECCOMP_RET_ERRNO | ENOSYS: what a kernel without x32 answers.
const RET_ERRNO_ENOSYS: u32 = 0x0005_0000 | libc::ENOSYS as u32;
/// BPF_LD | BPF_W | BPF_ABS and BPF_JMP | BPF_JGE | BPF_K.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JGE_K: u16 = 0x35;

/// SECCOMP_RET_LOG, which seccompiler can emit, and SECCOMP_RET_USER_NOTIF, which it cannot:
/// the notify program is compiled with the former and its return instructions rewritten.
const RET_LOG: u32 = 0x7ffc_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
/// SECCOMP_RET_ALLOW.
const RET_ALLOW: u32 = 0x7fff_0000;
/// BPF_RET | BPF_K and BPF_JMP | BPF_JEQ | BPF_K.
const BPF_RET_K: u16 = 0x06;
const BPF_JEQ_K: u16 = 0x15;

/// Whether profile rule `r` is part of the network's fence: a rule only the network modes
/// turn on (`onlyWhen: networkNone` / `networkAllowList`: inet sockets, their protocols, TCP
/// Fast Open), or one on `socket` itself (the families: netlink, packet, vsock, which reaches
/// the node). Enforced in both modes ([`CompiledFilter::answer`]).
fn is_network_fence(r: &policy::seccomp::Rule) -> bool {
    matches!(
        r.only_when,
        Some(Condition::NetworkNone | Condition::NetworkAllowList)
    ) || r.syscalls.iter().any(|s| s == "socket")
}

/// The number of system call `name` on `arch` (see [`syscall_numbers`]).
fn syscall_number(name: &str, arch: seccompiler::TargetArch) -> Option<u32> {
    syscall_numbers(&[name], arch).ok()?.first().copied()
}

/// The numbers of system calls `names` on `arch`, read back from one-rule programs (the only
/// JEQ constant below the architecture tokens is the call number), all from one compilation
/// (the filler resolves its list on every fill).
fn syscall_numbers(
    names: &[&str],
    arch: seccompiler::TargetArch,
) -> Result<Vec<u32>, SeccompError> {
    let doc: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| {
            let program = json!({
                "mismatch_action": "allow",
                "match_action": "log",
                "filter": [{ "syscall": n }],
            });
            ((*n).to_owned(), program)
        })
        .collect();
    let map = seccompiler::compile_from_json(Value::Object(doc).to_string().as_bytes(), arch)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    names
        .iter()
        .map(|n| {
            map.get(*n)
                .and_then(|p| p.iter().find(|i| i.code == BPF_JEQ_K && i.k < 0x1_0000))
                .map(|i| i.k)
                .ok_or_else(|| SeccompError::Compile(format!("no number for {n}")))
        })
        .collect()
}

fn action_json(a: RuleAction) -> Value {
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

/// Compile `profile` for this architecture, honouring `mode` and `network`; `loopback`
/// (`spec.network.loopback`) lifts `network: none`'s refusal of inet sockets, which then reach
/// only the jail's own loopback (its network namespace has no other device).
pub fn compile(
    profile: &SeccompProfile,
    mode: SeccompMode,
    network: NetworkMode,
    loopback: bool,
) -> Result<CompiledFilter, SeccompError> {
    compile_with(profile, mode, network, loopback, true)
}

/// [`compile`], with or without the search in front of the rules (tests compare the two).
fn compile_with(
    profile: &SeccompProfile,
    mode: SeccompMode,
    network: NetworkMode,
    loopback: bool,
    search: bool,
) -> Result<CompiledFilter, SeccompError> {
    compile_for(profile, mode, network, loopback, search, target_arch()?)
}

/// [`compile_with`] for `arch` (tests compile every architecture the build supports).
fn compile_for(
    profile: &SeccompProfile,
    mode: SeccompMode,
    network: NetworkMode,
    loopback: bool,
    search: bool,
    arch: seccompiler::TargetArch,
) -> Result<CompiledFilter, SeccompError> {
    // action → syscall → list of argument-condition lists (OR of ANDs).
    // `None` is the notify group.
    let mut rules = Vec::new();
    let mut names: Vec<(u32, String)> = Vec::new();
    let mut groups: BTreeMap<Option<RuleAction>, BTreeMap<&str, Vec<Vec<Value>>>> = BTreeMap::new();
    for r in &profile.rules {
        let applies = match r.only_when {
            None => true,
            Some(Condition::NetworkNone) => network == NetworkMode::None && !loopback,
            Some(Condition::NetworkAllowList) => network == NetworkMode::AllowList,
            Some(Condition::X86_64) => arch == seccompiler::TargetArch::x86_64,
        };
        if !applies {
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
        let shim = r.action == RuleAction::Errno(policy::seccomp::Errno::ENOSYS);
        let notified = match r.action {
            RuleAction::Errno(_) => !shim,
            RuleAction::KillProcess | RuleAction::Log => mode == SeccompMode::Audit,
        };
        let key = (!notified).then_some(r.action);
        if notified {
            // Each name is resolved once; the listener maps numbers back to names.
            let mut nrs = Vec::new();
            for s in &r.syscalls {
                let known = names
                    .iter()
                    .find(|(_, n): &&(u32, String)| n == s)
                    .map(|(nr, _)| *nr);
                if let Some(nr) = known.or_else(|| syscall_number(s, arch)) {
                    if known.is_none() {
                        names.push((nr, s.clone()));
                    }
                    nrs.push(nr);
                }
            }
            rules.push(NotifyRule {
                nrs,
                conds: r
                    .args
                    .iter()
                    .map(|a| {
                        let op = match a.op {
                            ArgOp::Eq => 0,
                            ArgOp::Ne => 1,
                            ArgOp::MaskedEq => 2,
                        };
                        let wide = a.width == ArgWidth::Qword;
                        (a.index, wide, op, a.mask.unwrap_or(u64::MAX), a.value)
                    })
                    .collect(),
                errno: match r.action {
                    RuleAction::Errno(e) => e.number() as i32,
                    _ => libc::EPERM,
                },
                fence: is_network_fence(r),
            });
        }
        for s in &r.syscalls {
            groups
                .entry(key)
                .or_default()
                .entry(s.as_str())
                .or_default()
                .push(conds.clone());
        }
    }
    // allowList: every inet and inet6 socket is made by the listener, bound to the loopback
    // device (`Answer::OnLoopback`); in both modes, as it is the network's fence, not a rule of
    // the profile's.
    let inet_on_loopback = if network == NetworkMode::AllowList {
        let nr = syscall_number("socket", arch)
            .ok_or_else(|| SeccompError::Compile("no number for socket".into()))?;
        if !names.iter().any(|(n, _)| *n == nr) {
            names.push((nr, "socket".into()));
        }
        let socket = groups.entry(None).or_default().entry("socket").or_default();
        for family in [libc::AF_INET, libc::AF_INET6] {
            socket.push(vec![
                json!({ "index": 0, "type": "dword", "op": "eq", "val": family }),
            ]);
        }
        Some(nr)
    } else {
        None
    };
    let mut programs = Vec::new();
    let mut notify = None;
    for (action, calls) in groups {
        let mut filter = Vec::new();
        let called: Vec<&str> = calls.keys().copied().collect();
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
            "match_action": action.map_or(json!("log"), action_json),
            "filter": filter,
        }});
        let mut map = seccompiler::compile_from_json(doc.to_string().as_bytes(), arch)
            .map_err(|e| SeccompError::Compile(e.to_string()))?;
        let mut prog = map
            .remove("g")
            .ok_or_else(|| SeccompError::Compile("no program produced".into()))?;
        if search {
            allow_unnamed_calls_first(&mut prog, syscall_numbers(&called, arch)?)?;
        }
        if action.is_none() {
            for i in prog.iter_mut() {
                if i.code == BPF_RET_K && i.k == RET_LOG {
                    i.k = RET_USER_NOTIF;
                }
            }
            notify = Some(programs.len());
        }
        programs.push(prog);
    }
    if arch == seccompiler::TargetArch::x86_64
        && let Some(first) = programs.first_mut()
    {
        refuse_x32(first)?;
    }
    Ok(CompiledFilter {
        programs,
        notify,
        names,
        rules,
        audit: mode == SeccompMode::Audit,
        inet_on_loopback,
    })
}

/// What the filler (the process that writes a tree into the cache) may not do: create a
/// process or run a program, signal or trace another, open a socket, enter or make a
/// namespace, or touch mounts. Its work — reading a pipe, creating files and directories
/// beneath one descriptor, writing its answer — needs none of it, and without them nothing of
/// it survives its exit, so a sealed tree has no writer left.
const FILL_DENIED: &[&str] = &[
    "clone",
    "clone3",
    "execve",
    "execveat",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "mount_setattr",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "bpf",
    "perf_event_open",
    "io_uring_setup",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "capset",
    "personality",
];

/// [`FILL_DENIED`] that exist on x86_64 only: aarch64 and riscv64 create processes with
/// `clone` alone and have no LDT (seccompiler refuses names unknown to the architecture).
const FILL_DENIED_X86_64: &[&str] = &["fork", "vfork", "modify_ldt"];

/// What the tree cache's keeper may not do once it is set up (`keeper::start` step 5b): run
/// a program, trace or read another process, open or accept a socket (it has its one to the
/// supervisor), enter another namespace, mount the classic way or make a new filesystem (it
/// only clones and idmaps its own trees: `open_tree`, `mount_setattr`), change its IDs,
/// or reach the kernel's riskier surfaces. What it does need stays: forking the filler and
/// the lending namespaces' helpers (`clone`/`fork`, `unshare`), and what the filler then
/// does before its own filter (`capset`, `prctl`, `setrlimit`, `setsid`).
const KEEPER_DENIED: &[&str] = &[
    "execve",
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "bpf",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "personality",
    "open_by_handle_at",
    "name_to_handle_at",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "syslog",
    "quotactl",
];

/// [`KEEPER_DENIED`] that exist on x86_64 only.
const KEEPER_DENIED_X86_64: &[&str] = &["modify_ldt"];

/// Install the filler's filter ([`FILL_DENIED`] → EPERM, x32 numbers → ENOSYS).
pub fn install_fill_filter() -> Result<(), SeccompError> {
    let prog = fill_program(true)?;
    seccompiler::apply_filter(&prog).map_err(|e| SeccompError::Install(e.to_string()))
}

/// Install the keeper's filter ([`KEEPER_DENIED`] → EPERM, x32 numbers → ENOSYS); returns
/// how many calls it denies.
pub fn install_keeper_filter() -> Result<usize, SeccompError> {
    let prog = keeper_program_for(target_arch()?, true)?;
    seccompiler::apply_filter(&prog).map_err(|e| SeccompError::Install(e.to_string()))?;
    Ok(KEEPER_DENIED.len())
}

fn fill_program(search: bool) -> Result<BpfProgram, SeccompError> {
    fill_program_for(target_arch()?, search)
}

fn fill_program_for(
    arch: seccompiler::TargetArch,
    search: bool,
) -> Result<BpfProgram, SeccompError> {
    deny_program_for(arch, FILL_DENIED, FILL_DENIED_X86_64, search)
}

fn keeper_program_for(
    arch: seccompiler::TargetArch,
    search: bool,
) -> Result<BpfProgram, SeccompError> {
    deny_program_for(arch, KEEPER_DENIED, KEEPER_DENIED_X86_64, search)
}

/// A filter that answers EPERM to `common` (and `x86_64_only` there), allows the rest, and
/// refuses x32 numbers on x86_64.
fn deny_program_for(
    arch: seccompiler::TargetArch,
    common: &[&str],
    x86_64_only: &[&str],
    search: bool,
) -> Result<BpfProgram, SeccompError> {
    let x86_64 = arch == seccompiler::TargetArch::x86_64;
    let denied: Vec<&str> = common
        .iter()
        .chain(x86_64.then_some(x86_64_only).into_iter().flatten())
        .copied()
        .collect();
    let doc = json!({ "fill": {
        "mismatch_action": "allow",
        "match_action": { "errno": libc::EPERM },
        "filter": denied.iter().map(|n| json!({ "syscall": n })).collect::<Vec<_>>(),
    }});
    let mut map = seccompiler::compile_from_json(doc.to_string().as_bytes(), arch)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    let mut prog = map
        .remove("fill")
        .ok_or_else(|| SeccompError::Compile("no program".into()))?;
    if search {
        allow_unnamed_calls_first(&mut prog, syscall_numbers(&denied, arch)?)?;
    }
    if x86_64 {
        refuse_x32(&mut prog)?;
    }
    Ok(prog)
}

/// Where the program's syscall number is in the accumulator: right after its first load
/// (seccompiler's prologue checks the architecture, then loads the number). Nothing before
/// that point may jump past it (checked), so code inserted there changes no jump offset.
fn after_number_load(prog: &BpfProgram, what: &str) -> Result<usize, SeccompError> {
    let at = prog
        .iter()
        .position(|i| i.code == BPF_LD_W_ABS && i.k == 0)
        .ok_or_else(|| SeccompError::Compile("no syscall-number load in the program".into()))?
        + 1;
    let jumps_past = prog[..at].iter().enumerate().any(|(i, ins)| {
        let is_jump = ins.code & 0x07 == 0x05;
        is_jump && (i + 1 + usize::from(ins.jt) > at || i + 1 + usize::from(ins.jf) > at)
    });
    if jumps_past {
        return Err(SeccompError::Compile(format!(
            "unexpected prologue: cannot insert {what}"
        )));
    }
    Ok(at)
}

/// Answer "allow" at once for a call the program names nowhere, by a binary search over the
/// numbers it names (`nrs`), before seccompiler's rules, which test the number one rule after
/// the other. The verdicts do not change (every program's mismatch action is allow; a test
/// compares them call by call). What changes is the cost: the kernel, when a filter is
/// installed, runs it once for every system call number to find the calls it always allows
/// (its action cache), under a lock with interrupts off; through a linear chain of ~350
/// instructions that was ~4% of a short request's CPU (BENCHMARKS.md).
///
/// Too many numbers for classic BPF's 8-bit jump offsets: the program is left as it was.
fn allow_unnamed_calls_first(prog: &mut BpfProgram, mut nrs: Vec<u32>) -> Result<(), SeccompError> {
    /// A jump target while the prefix is built: the next instruction plus `n`, or the end of
    /// the prefix (the rules).
    #[derive(Clone, Copy)]
    enum To {
        Skip(usize),
        Rules,
    }
    struct Ins {
        code: u16,
        jt: To,
        jf: To,
        k: u32,
    }
    fn search(nrs: &[u32], out: &mut Vec<Ins>) {
        if nrs.len() <= 4 {
            for &n in nrs {
                out.push(Ins {
                    code: BPF_JEQ_K,
                    jt: To::Rules,
                    jf: To::Skip(0),
                    k: n,
                });
            }
            out.push(Ins {
                code: BPF_RET_K,
                jt: To::Skip(0),
                jf: To::Skip(0),
                k: RET_ALLOW,
            });
            return;
        }
        let (low, high) = nrs.split_at(nrs.len() / 2);
        let mut left = Vec::new();
        search(low, &mut left);
        out.push(Ins {
            code: BPF_JGE_K,
            jt: To::Skip(left.len()),
            jf: To::Skip(0),
            k: high[0],
        });
        out.extend(left);
        search(high, out);
    }
    nrs.sort_unstable();
    nrs.dedup();
    let mut built = Vec::new();
    search(&nrs, &mut built);
    let len = built.len();
    let offset = |at: usize, to: To| match to {
        To::Skip(n) => u8::try_from(n).ok(),
        To::Rules => u8::try_from(len - at - 1).ok(),
    };
    let mut prefix = Vec::with_capacity(len);
    for (at, i) in built.iter().enumerate() {
        let (Some(jt), Some(jf)) = (offset(at, i.jt), offset(at, i.jf)) else {
            return Ok(());
        };
        prefix.push(seccompiler::sock_filter {
            code: i.code,
            jt,
            jf,
            k: i.k,
        });
    }
    let at = after_number_load(prog, "the search for named calls")?;
    prog.splice(at..at, prefix);
    Ok(())
}

/// Put `nr >= X32_SYSCALL_BIT → ENOSYS` right after the program's first load of the syscall
/// number (seccompiler's prologue: check the architecture, then load the number). Nothing
/// before that point may jump past it, which is checked, so no jump offset changes.
fn refuse_x32(prog: &mut BpfProgram) -> Result<(), SeccompError> {
    let at = after_number_load(prog, "the x32 check")?;
    let guard = [
        seccompiler::sock_filter {
            code: BPF_JGE_K,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        seccompiler::sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: RET_ERRNO_ENOSYS,
        },
    ];
    prog.splice(at..at, guard);
    Ok(())
}

impl CompiledFilter {
    /// Total BPF instructions (reported by `doctor` and the start-up log).
    pub fn instructions(&self) -> usize {
        self.programs.iter().map(Vec::len).sum()
    }

    /// Number of filters installed (2 with the default profile: the `clone3` shim and the
    /// user-notification filter).
    pub fn filters(&self) -> usize {
        self.programs.len()
    }

    /// Install on the calling thread (and everything it later creates). Also sets
    /// no_new_privs, which the kernel requires of an unprivileged caller. Returns the
    /// user-notification listener, which must be served ([`Self::install_and_serve`]) or every
    /// notified call blocks until the listener is closed.
    fn install(&self) -> Result<Option<std::os::fd::OwnedFd>, SeccompError> {
        let mut listener = None;
        for (i, p) in self.programs.iter().enumerate() {
            if Some(i) == self.notify {
                let raw: Vec<(u16, u8, u8, u32)> =
                    p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect();
                listener = Some(
                    jail_sys::sys::seccomp_install_with_listener(&raw)
                        .map_err(|e| SeccompError::Install(e.to_string()))?,
                );
            } else {
                seccompiler::apply_filter(p).map_err(|e| SeccompError::Install(e.to_string()))?;
            }
        }
        Ok(listener)
    }

    /// The answer to notified call `nr(args)`, and what to record of it: the first matching
    /// rule's errno (EPERM if none matches: fail closed) and `Denied` in enforce mode,
    /// `Continue` and `Audited` in audit mode. An inet socket under `network: allowList` is made
    /// on the loopback whatever the mode, and recorded only when a rule of the profile matched.
    ///
    /// A network fence's rule ([`is_network_fence`]) answers as in enforce mode whatever the
    /// mode: audit mode learns which calls a plugin makes, and a fence is no call to learn
    /// (Landlock checks TCP ports at `connect`, so a Fast Open `sendto` or a UDP socket let
    /// through would reach any port of the pod, or, without the jail's own network namespace,
    /// any host).
    pub fn answer(&self, nr: i32, args: &[u64; 6]) -> (Answer, Option<SeccompAction>) {
        let rule = self.rules.iter().find(|r| r.matches(nr, args));
        let inet_socket = self
            .inet_on_loopback
            .is_some_and(|n| i64::from(n) == i64::from(nr))
            && matches!(args[0] as i32, libc::AF_INET | libc::AF_INET6);
        let audit = self.audit && !rule.is_some_and(|r| r.fence);
        match (inet_socket, rule, audit) {
            (true, None, _) => (Answer::OnLoopback, None),
            (true, Some(_), true) => (Answer::OnLoopback, Some(SeccompAction::Audited)),
            (_, _, true) => (Answer::Continue, Some(SeccompAction::Audited)),
            (_, rule, false) => (
                Answer::Errno(rule.map_or(libc::EPERM, |r| r.errno)),
                Some(SeccompAction::Denied),
            ),
        }
    }

    /// Whether inet sockets are made on the loopback (`network: allowList`).
    pub fn inet_on_loopback(&self) -> bool {
        self.inet_on_loopback.is_some()
    }

    /// Name of system call `nr` among the audited ones.
    pub fn name_of(&self, nr: i32) -> String {
        self.names
            .iter()
            .find(|(n, _)| i64::from(*n) == i64::from(nr))
            .map_or_else(|| format!("nr:{nr}"), |(_, s)| s.clone())
    }
}

/// Calls recorded by [`CompiledFilter::install_and_serve`]: name → (count, first command, action).
static AUDITED: std::sync::Mutex<BTreeMap<String, (u64, String, SeccompAction)>> =
    std::sync::Mutex::new(BTreeMap::new());

impl CompiledFilter {
    /// Install the filters on the calling thread (and everything it later creates) and serve
    /// the user-notification listener on a thread of its own until the listener is closed.
    /// Returns the number of filters installed.
    ///
    /// The serving thread is started *before* the filters are installed, so it is not under
    /// them: it makes the loopback sockets of [`Answer::OnLoopback`] itself, and a `socket`
    /// call of its own would otherwise be notified to itself and wait forever. It is under
    /// everything installed before (Landlock, `no_new_privs`, the empty capability sets), and
    /// acts only on its own copies (the call's registers), never on the caller's memory.
    pub fn install_and_serve(&self) -> Result<usize, SeccompError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::os::fd::OwnedFd>(1);
        let f = self.clone();
        let serving = self.notify.is_some();
        if serving {
            std::thread::Builder::new()
                .name("seccomp-notify".into())
                .spawn(move || {
                    if let Ok(listener) = rx.recv() {
                        use std::os::fd::AsFd;
                        serve(&Listener(listener.as_fd()), &f);
                    }
                })
                .map_err(|e| SeccompError::Install(format!("notification thread: {e}")))?;
        }
        // Dropping `tx` without a listener (an error below) ends the thread.
        if let Some(listener) = self.install()? {
            tx.send(listener)
                .map_err(|_| SeccompError::Install("notification thread gone".into()))?;
        }
        Ok(self.filters())
    }
}

/// What the listener's thread asks of the kernel, behind a seam: its error paths (a caller
/// gone, a signal, the listener closed) are tested with a scripted fake.
trait Notifications {
    /// The next notified call: (id, pid, nr, args).
    fn recv(&self) -> std::io::Result<(u64, u32, i32, [u64; 6])>;
    /// Answer call `id`: let it proceed (`None`) or fail it with the errno.
    fn respond(&self, id: u64, errno: Option<i32>);
    /// Make the socket call `id` asked for (`args`) on the loopback and hand it to the caller,
    /// whose call returns it.
    fn socket_on_loopback(&self, id: u64, args: &[u64; 6]) -> std::io::Result<()>;
}

/// The kernel's listener.
struct Listener<'a>(std::os::fd::BorrowedFd<'a>);

impl Notifications for Listener<'_> {
    fn recv(&self) -> std::io::Result<(u64, u32, i32, [u64; 6])> {
        jail_sys::sys::seccomp_notif_recv(self.0)
    }

    fn respond(&self, id: u64, errno: Option<i32>) {
        let _ = jail_sys::sys::seccomp_notif_respond(self.0, id, errno);
    }

    fn socket_on_loopback(&self, id: u64, args: &[u64; 6]) -> std::io::Result<()> {
        use std::os::fd::AsFd;
        let (domain, ty, protocol) = (args[0] as i32, args[1] as i32, args[2] as i32);
        let sock = jail_sys::sys::socket_on_loopback(domain, ty, protocol)?;
        jail_sys::sys::seccomp_notif_addfd_send(
            self.0,
            id,
            sock.as_fd(),
            ty & libc::SOCK_CLOEXEC != 0,
        )
        .map(|_| ())
    }
}

/// Answer each notified call until the listener is closed: record it, then deny it with its
/// rule's errno (enforce), let it proceed (audit), or make its socket on the loopback.
fn serve(listener: &impl Notifications, f: &CompiledFilter) {
    loop {
        let (id, pid, nr, args) = match listener.recv() {
            Ok(n) => n,
            // ENOENT: the caller died before we read it; anything else: give up
            // (closing the listener lets waiting calls fail with ENOSYS).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(_) => return,
        };
        let (answer, record) = f.answer(nr, &args);
        if let Some(action) = record {
            note(f, nr, pid, action, answer);
        }
        match answer {
            Answer::Continue => listener.respond(id, None),
            Answer::Errno(e) => listener.respond(id, Some(e)),
            Answer::OnLoopback => on_loopback(listener, id, &args),
        }
    }
}

/// Record notified call `nr` of `pid` (recorded before the answer: once the caller sees the
/// call's result it may exit, and the jail may build its reply, at once; the record must be
/// there).
fn note(f: &CompiledFilter, nr: i32, pid: u32, action: SeccompAction, answer: Answer) {
    let name = f.name_of(nr);
    // Only the first call of each kind is logged and attributed: a command looping on a denied
    // call must not flood the server's log (the count still grows).
    let first = !AUDITED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&name);
    // Read while the caller is still blocked in the call, so the PID is its own.
    let comm = if first {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    AUDITED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(name.clone())
        .or_insert((0, comm.clone(), action))
        .0 += 1;
    if first {
        match answer {
            Answer::Errno(errno) => {
                tracing::info!(syscall = %name, pid, %comm, errno, "seccomp: denied")
            }
            _ => {
                tracing::info!(syscall = %name, pid, %comm, "seccomp audit: would be denied in enforce mode")
            }
        }
    }
}

/// [`Answer::OnLoopback`]: the socket the caller asked for (its own domain, type, flags and
/// protocol), bound to the loopback device, becomes the call's result. Anything that fails
/// fails the call (fail closed): the caller never gets a socket that is not bound.
fn on_loopback(listener: &impl Notifications, id: u64, args: &[u64; 6]) {
    match listener.socket_on_loopback(id, args) {
        Ok(()) => {}
        // The caller is gone (killed while it waited): nothing to answer.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EACCES);
            tracing::warn!(error = %e, "network.mode allowList: a socket on the loopback could not be made; the call fails");
            listener.respond(id, Some(errno));
        }
    }
}

/// The calls denied (enforce) or that would have been (audit), for the request's record.
pub fn audited() -> Vec<SeccompEvent> {
    AUDITED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(s, (n, c, action))| SeccompEvent {
            syscall: s.clone(),
            action: *action,
            count: *n,
            comm: c.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variable that tells a re-run test which inside to run.
    const INSIDE: &str = "CMP_WARDEN_SECCOMP_TEST_INSIDE";

    /// Run `inside` in a process of its own (a filter cannot be taken off): test `test` runs
    /// itself again with [`INSIDE`] set to `key`, and fails with the re-run's output unless it
    /// passed. In the re-run, the call whose key it is runs `inside`; any other does nothing.
    /// A call left unanswered would block the re-run for good: a liveness bound (not a
    /// measurement) kills it.
    fn in_own_process(test: &str, key: &str, inside: fn()) {
        match std::env::var(INSIDE) {
            Ok(k) if k == key => return inside(),
            Ok(_) => return,
            Err(_) => {}
        }
        let name = format!("{test} ({key})");
        use std::io::Read;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &format!("tests::{test}"), "--test-threads=1"])
            .env(INSIDE, key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut text = String::new();
        let _ = child.stdout.take().unwrap().read_to_string(&mut text);
        let _ = child.stderr.take().unwrap().read_to_string(&mut text);
        let status =
            status.unwrap_or_else(|| panic!("{name}: hung (a call never answered): {text}"));
        assert!(
            status.success() && text.contains("1 passed"),
            "{name}: {text}"
        );
    }

    fn installed(mode: SeccompMode, network: NetworkMode) -> CompiledFilter {
        let p = SeccompProfile::default_profile().unwrap();
        let f = compile(&p, mode, network, false).unwrap();
        assert_eq!(f.install_and_serve().unwrap(), f.filters());
        f
    }

    fn unshare_user() -> std::io::Result<()> {
        jail_sys::sys::unshare_namespaces(rustix::thread::UnshareFlags::NEWUSER)
    }

    fn event(name: &str) -> Option<SeccompEvent> {
        audited().into_iter().find(|e| e.syscall == name)
    }

    /// The default profile installed for real: `unshare` refused by its rule's errno through
    /// the served listener (each call counted, the first attributed to its command), an inet
    /// socket under `network: none` by the network fence's, and threads and files still work
    /// beside them. Fails with the filters not installed, the notify program installed without
    /// its listener, the listener not served, or nothing recorded.
    #[test]
    fn installed_filters_refuse_for_real_and_honest_calls_pass() {
        in_own_process(
            "installed_filters_refuse_for_real_and_honest_calls_pass",
            "default",
            inside_the_default_filter,
        );
    }

    fn inside_the_default_filter() {
        installed(SeccompMode::Enforce, NetworkMode::None);
        for _ in 0..2 {
            let e = unshare_user().expect_err("unshare under the filter");
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "unshare: {e}");
        }
        let e = std::net::TcpListener::bind("127.0.0.1:0").expect_err("an inet socket");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "socket: {e}");
        let u = event("unshare").expect("unshare recorded");
        assert_eq!((u.action, u.count), (SeccompAction::Denied, 2));
        assert!(!u.comm.is_empty(), "the first call is attributed: {u:?}");
        assert_eq!(std::thread::spawn(|| 6 * 7).join().unwrap(), 42);
        let file = std::env::temp_dir().join(format!("seccomp-test-{}", std::process::id()));
        std::fs::write(&file, b"ok").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"ok");
        std::fs::remove_file(&file).unwrap();
    }

    /// `network: allowList`: a TCP socket is made by the listener, bound to `lo`, and handed
    /// over as the call's result; UDP stays refused.
    #[test]
    fn allow_list_sockets_are_made_on_the_loopback() {
        in_own_process(
            "allow_list_sockets_are_made_on_the_loopback",
            "allowList",
            inside_the_allow_list_filter,
        );
    }

    fn inside_the_allow_list_filter() {
        installed(SeccompMode::Enforce, NetworkMode::AllowList);
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a TCP socket");
        use std::os::fd::AsFd;
        assert_eq!(jail_sys::sys::bound_device(l.as_fd()).unwrap(), b"lo");
        // The socket handed over keeps the close-on-exec flag the call asked for, or not.
        use rustix::io::FdFlags;
        assert!(
            rustix::io::fcntl_getfd(&l)
                .unwrap()
                .contains(FdFlags::CLOEXEC)
        );
        let plain = rustix::net::socket(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::STREAM,
            None,
        )
        .expect("a TCP socket without SOCK_CLOEXEC");
        assert!(
            !rustix::io::fcntl_getfd(&plain)
                .unwrap()
                .contains(FdFlags::CLOEXEC)
        );
        assert_eq!(jail_sys::sys::bound_device(plain.as_fd()).unwrap(), b"lo");
        let e = std::net::UdpSocket::bind("127.0.0.1:0").expect_err("a UDP socket");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "udp: {e}");
    }

    /// Audit mode lets the profile's calls run and records them as audited; the network
    /// fence still refuses.
    #[test]
    #[allow(clippy::print_stderr)]
    fn audit_mode_lets_calls_run_and_records_them() {
        // The call that runs is one only root may make.
        if !rustix::process::geteuid().is_root() {
            let why = "audit mode's test needs root";
            assert!(
                std::env::var_os("CMP_WARDEN_TESTS_MUST_RUN").is_none(),
                "this test must run here (CMP_WARDEN_TESTS_MUST_RUN): {why}"
            );
            eprintln!("SKIP: {why}");
            return;
        }
        in_own_process(
            "audit_mode_lets_calls_run_and_records_them",
            "audit",
            inside_the_audit_filter,
        );
    }

    fn inside_the_audit_filter() {
        installed(SeccompMode::Audit, NetworkMode::None);
        // A UTS namespace: allowed to root in a process with threads (a user namespace is
        // not), and harmless in this process of its own.
        jail_sys::sys::unshare_namespaces(rustix::thread::UnshareFlags::NEWUTS)
            .expect("unshare runs in audit mode (as root, as the tests run)");
        let u = event("unshare").expect("unshare recorded");
        assert_eq!(u.action, SeccompAction::Audited);
        let e = std::net::TcpListener::bind("127.0.0.1:0").expect_err("the fence holds");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "socket: {e}");
    }

    /// The filler's filter: no program runs; the keeper's: no program, no socket.
    #[test]
    fn the_fillers_and_keepers_filters_refuse_for_real() {
        in_own_process(
            "the_fillers_and_keepers_filters_refuse_for_real",
            "fill",
            inside_the_fill_filter,
        );
        in_own_process(
            "the_fillers_and_keepers_filters_refuse_for_real",
            "keeper",
            inside_the_keeper_filter,
        );
    }

    fn inside_the_fill_filter() {
        install_fill_filter().unwrap();
        let e = std::process::Command::new("/bin/true")
            .status()
            .expect_err("exec");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "exec: {e}");
        assert!(std::fs::read_to_string("/proc/self/comm").is_ok());
    }

    fn inside_the_keeper_filter() {
        assert_eq!(install_keeper_filter().unwrap(), KEEPER_DENIED.len());
        let e = std::net::TcpListener::bind("127.0.0.1:0").expect_err("a socket");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "socket: {e}");
        let e = std::os::unix::net::UnixStream::pair().expect_err("a socket pair");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "socketpair: {e}");
    }

    /// Code is inserted after the number's load only where no jump before it lands beyond
    /// it (a target at the insertion point is fine: offsets are relative).
    #[test]
    fn insertion_after_the_load_refuses_a_prologue_that_jumps_past_it() {
        let ins = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
        let prog = |jt, jf| -> BpfProgram {
            vec![
                ins(BPF_JEQ_K, jt, jf, 7),
                ins(BPF_LD_W_ABS, 0, 0, 0),
                ins(BPF_RET_K, 0, 0, RET_ALLOW),
                ins(BPF_RET_K, 0, 0, RET_ALLOW),
            ]
        };
        assert_eq!(after_number_load(&prog(1, 1), "x").unwrap(), 2);
        assert!(after_number_load(&prog(2, 0), "x").is_err());
        assert!(after_number_load(&prog(0, 2), "x").is_err());
    }

    /// The listener re-evaluates each rule with the profile's own argument widths, and names
    /// `socket` in its records under `allowList` (whose loopback rule the profile does not
    /// write).
    #[test]
    fn the_listeners_rules_keep_the_profiles_widths_and_names() {
        let p = SeccompProfile::default_profile().unwrap();
        let f = compile(&p, SeccompMode::Enforce, NetworkMode::AllowList, false).unwrap();
        let arch = target_arch().unwrap();
        let socket = syscall_number("socket", arch).unwrap();
        assert_eq!(f.name_of(socket as i32), "socket");
        // ... also where the profile names no socket rule of its own.
        let bare = SeccompProfile::parse(
            r#"{"apiVersion": "cmp-warden.io/v1alpha1", "kind": "SeccompProfile",
                "metadata": {"name": "bare"}, "defaultAction": "allow",
                "rules": [{"reason": "r", "syscalls": ["unshare"], "action": {"errno": "EPERM"}}]}"#,
        )
        .unwrap();
        let g = compile(&bare, SeccompMode::Enforce, NetworkMode::AllowList, false).unwrap();
        assert_eq!(g.name_of(socket as i32), "socket");
        assert_eq!(
            g.name_of(socket as i32 + 100_000),
            format!("nr:{}", socket + 100_000)
        );
        // A kill rule is the kernel's in enforce mode, and a notification (recorded, let
        // run) only in audit mode.
        let kill = SeccompProfile::parse(
            r#"{"apiVersion": "cmp-warden.io/v1alpha1", "kind": "SeccompProfile",
                "metadata": {"name": "kill"}, "defaultAction": "allow",
                "rules": [{"reason": "r", "syscalls": ["acct"], "action": "killProcess"}]}"#,
        )
        .unwrap();
        let acct = syscall_number("acct", arch).unwrap();
        let notified = |mode| {
            compile(&kill, mode, NetworkMode::None, false)
                .unwrap()
                .rules
                .iter()
                .any(|r| r.nrs.contains(&acct))
        };
        assert!(!notified(SeccompMode::Enforce));
        assert!(notified(SeccompMode::Audit));
        let on_socket: Vec<_> = f
            .rules
            .iter()
            .filter(|r| r.nrs.contains(&socket) && !r.conds.is_empty())
            .collect();
        assert!(!on_socket.is_empty());
        // socket(2)'s domain is an int: every condition on it is a dword.
        assert!(
            on_socket.iter().all(|r| r.conds.iter().all(|c| !c.1)),
            "{on_socket:?}"
        );
    }

    /// The names audit events and metrics use are the serialised ones.
    #[test]
    fn action_names_are_the_serialised_ones() {
        for a in [SeccompAction::Denied, SeccompAction::Audited] {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
        assert_eq!(SeccompAction::Denied.as_str(), "denied");
    }

    /// A 32-bit argument is compared on its low half, as the kernel's program compares it
    /// (the upper half of the register is whatever the caller left there).
    #[test]
    fn a_dword_condition_reads_the_low_half_only() {
        let rule = NotifyRule {
            nrs: vec![41],
            conds: vec![(0, false, 0, u64::MAX, 2)],
            errno: libc::EPERM,
            fence: false,
        };
        let args = |a0: u64| [a0, 0, 0, 0, 0, 0];
        assert!(rule.matches(41, &args(0xdead_beef_0000_0002)));
        assert!(!rule.matches(41, &args(0xdead_beef_0000_0003)));
        assert!(!rule.matches(42, &args(2)));
        let wide = NotifyRule {
            conds: vec![(0, true, 0, u64::MAX, 2)],
            ..rule
        };
        assert!(!wide.matches(41, &args(0xdead_beef_0000_0002)));
        // A masked comparison looks at the mask's bits only.
        let masked = NotifyRule {
            conds: vec![(0, true, 2, 0xff, 0x02)],
            ..wide
        };
        assert!(masked.matches(41, &args(0x1202)));
        assert!(!masked.matches(41, &args(0x1203)));
    }

    /// The x32 refusal is the kernel's own answer for a missing ABI: SECCOMP_RET_ERRNO with
    /// ENOSYS, spelled here from libc's constants, not from the filter's.
    #[test]
    fn the_x32_refusal_is_errno_enosys() {
        assert_eq!(
            RET_ERRNO_ENOSYS,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
    }

    #[test]
    fn the_default_profile_compiles_in_both_modes() {
        let p = SeccompProfile::default_profile().expect("profile");
        let enforce = compile(&p, SeccompMode::Enforce, NetworkMode::None, false).expect("compile");
        // The ENOSYS shim and one notify filter for every errno rule; the count doctor
        // reports is every program's length, as the wire form carries them.
        assert!(enforce.instructions() < 4096);
        let wire = WireFilter::from(enforce.clone());
        assert_eq!(
            enforce.instructions(),
            wire.programs.iter().map(Vec::len).sum::<usize>()
        );
        assert!(enforce.instructions() > 10 * enforce.filters());
        let egress =
            compile(&p, SeccompMode::Enforce, NetworkMode::Egress, false).expect("compile");
        assert_eq!(egress.filters(), 2);
        assert!(
            egress.rules.len() < enforce.rules.len(),
            "no inet rules with egress"
        );
        let audit = compile(&p, SeccompMode::Audit, NetworkMode::None, false).expect("compile");
        // The clone3 shim, and one notify filter holding every other rule.
        assert_eq!(audit.filters(), 2);
        assert_eq!(enforce.filters(), 2);
        // The listener's answers reproduce each rule's errno.
        let args = |a: [u64; 6]| a;
        let denied = |e| (Answer::Errno(e), Some(SeccompAction::Denied));
        assert_eq!(
            enforce.answer(272, &args([0x1000_0000, 0, 0, 0, 0, 0])),
            denied(1)
        ); // unshare
        assert_eq!(enforce.answer(41, &args([2, 1, 0, 0, 0, 0])), denied(13)); // socket(AF_INET)
        assert_eq!(enforce.answer(41, &args([16, 3, 0, 0, 0, 0])), denied(97)); // AF_NETLINK
        assert_eq!(enforce.answer(41, &args([1, 1, 0, 0, 0, 0])), denied(1)); // no rule: EPERM
        assert_eq!(
            audit.answer(272, &args([0; 6])),
            (Answer::Continue, Some(SeccompAction::Audited))
        );
        let n = audit.notify.expect("notify program");
        assert!(
            audit.programs[n]
                .iter()
                .any(|i| i.code == BPF_RET_K && i.k == RET_USER_NOTIF)
        );
        assert!(
            !audit.programs[n]
                .iter()
                .any(|i| i.code == BPF_RET_K && i.k == RET_LOG)
        );
        assert_eq!(audit.name_of(272), "unshare");
        assert_eq!(audit.name_of(101), "ptrace");
        assert!(enforce.notify.is_some() && !enforce.audit);
    }

    /// `allowList`: every inet and inet6 socket reaches the listener, which makes it on the
    /// loopback (also in audit mode, where the profile's own TCP-only rule is recorded and
    /// not enforced); unix sockets and the other modes never do.
    #[test]
    fn allow_list_inet_sockets_are_made_on_the_loopback() {
        let p = SeccompProfile::default_profile().expect("profile");
        let arch = target_arch().expect("arch");
        let nr = syscall_number("socket", arch).expect("socket") as i32;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        let (inet, inet6, unix) = (
            libc::AF_INET as u64,
            libc::AF_INET6 as u64,
            libc::AF_UNIX as u64,
        );
        for mode in [SeccompMode::Enforce, SeccompMode::Audit] {
            let f = compile(&p, mode, NetworkMode::AllowList, false).expect("compile");
            assert!(f.inet_on_loopback());
            for family in [inet, inet6] {
                assert_eq!(
                    f.answer(nr, &[family, stream, 0, 0, 0, 0]),
                    (Answer::OnLoopback, None),
                    "{mode:?}"
                );
                // The kernel hands it to the listener.
                let n = f.notify.expect("notify program");
                assert_eq!(
                    kernel_verdict_of(&f.programs[n..=n], nr as u32, [family, stream, 0, 0, 0, 0]),
                    RET_USER_NOTIF
                );
            }
            // A UDP socket is refused in both modes: the allow list's inet rules are the
            // network's fence, not calls to learn.
            assert_eq!(
                f.answer(nr, &[inet, dgram, 0, 0, 0, 0]),
                (Answer::Errno(libc::EACCES), Some(SeccompAction::Denied)),
                "{mode:?}"
            );
            let n = f.notify.expect("notify program");
            assert_eq!(
                kernel_verdict_of(&f.programs[n..=n], nr as u32, [unix, stream, 0, 0, 0, 0]),
                RET_ALLOW
            );
        }
        for network in [NetworkMode::None, NetworkMode::Egress] {
            let f = compile(&p, SeccompMode::Enforce, network, false).expect("compile");
            assert!(!f.inet_on_loopback());
            assert_ne!(
                f.answer(nr, &[inet, stream, 0, 0, 0, 0]).0,
                Answer::OnLoopback
            );
        }
    }

    /// Audit mode keeps the network's fence: TCP Fast Open (`sendto`/`sendmsg` with
    /// MSG_FASTOPEN) under allowList, inet sockets under none, and the socket families
    /// (vsock, netlink) are answered as in enforce mode, while the rest of the profile
    /// (`unshare`) is let through and recorded (mutant: `fence` ignored in `answer` -> Fast
    /// Open continues in audit mode, as the attack's `sendto` did).
    #[test]
    fn audit_mode_keeps_every_network_fence() {
        let p = SeccompProfile::default_profile().expect("profile");
        let arch = target_arch().expect("arch");
        let nr = |n: &str| syscall_number(n, arch).expect(n) as i32;
        let denied = |e| (Answer::Errno(e), Some(SeccompAction::Denied));
        let fast_open = libc::MSG_FASTOPEN as u64;
        let (inet, stream) = (libc::AF_INET as u64, libc::SOCK_STREAM as u64);
        let allow =
            compile(&p, SeccompMode::Audit, NetworkMode::AllowList, false).expect("compile");
        assert_eq!(
            allow.answer(nr("sendto"), &[3, 0, 10, fast_open, 0, 0]),
            denied(libc::EACCES)
        );
        assert_eq!(
            allow.answer(nr("sendmsg"), &[3, 0, fast_open, 0, 0, 0]),
            denied(libc::EACCES)
        );
        // Without the flag, sendto is no call of the profile's: never notified at all.
        let n = allow.notify.expect("notify program");
        assert_eq!(
            kernel_verdict_of(
                &allow.programs[n..=n],
                nr("sendto") as u32,
                [3, 0, 10, 0, 0, 0]
            ),
            RET_ALLOW
        );
        let none = compile(&p, SeccompMode::Audit, NetworkMode::None, false).expect("compile");
        assert_eq!(
            none.answer(nr("socket"), &[inet, stream, 0, 0, 0, 0]),
            denied(libc::EACCES)
        );
        assert_eq!(
            none.answer(nr("socket"), &[libc::AF_VSOCK as u64, stream, 0, 0, 0, 0]),
            denied(libc::EAFNOSUPPORT)
        );
        assert_eq!(
            none.answer(nr("unshare"), &[0; 6]),
            (Answer::Continue, Some(SeccompAction::Audited))
        );
    }

    fn kernel_verdict_of(programs: &[BpfProgram], nr: u32, args: [u64; 6]) -> u32 {
        // AUDIT_ARCH_X86_64 / AUDIT_ARCH_AARCH64: the architecture this test runs on.
        let arch = if cfg!(target_arch = "x86_64") {
            0xc000_003e
        } else {
            0xc000_00b7
        };
        verdict_and_steps(programs, arch, nr, args).0
    }

    /// The kernel's verdict for one call through every installed program (the action of
    /// highest precedence wins): a small classic-BPF interpreter over `struct seccomp_data`.
    fn kernel_verdict(f: &CompiledFilter, arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        verdict_and_steps(&f.programs, arch, nr, args).0
    }

    /// The verdict through `programs`, and how many instructions the longest run took.
    fn verdict_and_steps(
        programs: &[BpfProgram],
        arch: u32,
        nr: u32,
        args: [u64; 6],
    ) -> (u32, usize) {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes()); // instruction pointer
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let mut longest = 0;
        let mut run = |p: &BpfProgram| -> u32 {
            let (mut acc, mut pc) = (0u32, 0usize);
            let mut steps = 0;
            loop {
                let i = &p[pc];
                pc += 1;
                steps += 1;
                longest = longest.max(steps);
                match i.code {
                    0x20 => {
                        let k = i.k as usize;
                        acc = u32::from_ne_bytes(data[k..k + 4].try_into().expect("word"));
                    }
                    0x54 => acc &= i.k,         // alu and k
                    0x05 => pc += i.k as usize, // ja
                    0x15 | 0x25 | 0x35 | 0x45 => {
                        let t = match i.code {
                            0x15 => acc == i.k,
                            0x25 => acc > i.k,
                            0x35 => acc >= i.k,
                            _ => acc & i.k != 0,
                        };
                        pc += usize::from(if t { i.jt } else { i.jf });
                    }
                    0x06 => return i.k,
                    c => panic!("opcode {c:#x} not interpreted"),
                }
            }
        };
        // Precedence by action (the high 16 bits): KILL_PROCESS, KILL_THREAD, TRAP, ERRNO,
        // USER_NOTIF, TRACE, LOG, ALLOW.
        let rank = |v: u32| match v & 0xffff_0000 {
            0x8000_0000 => 0,
            0x0000_0000 => 1,
            0x0003_0000 => 2,
            0x0005_0000 => 3,
            0x7fc0_0000 => 4,
            0x7ff0_0000 => 5,
            0x7ffc_0000 => 6,
            _ => 7,
        };
        let verdict = programs
            .iter()
            .map(&mut run)
            .min_by_key(|v| rank(*v))
            .expect("a program");
        (verdict, longest)
    }

    /// The search in front of the rules changes no verdict: every call number (native and
    /// x32, past the highest), with each argument value a rule of the profile compares, under
    /// every mode and network setting, and the filler's program; and it is what makes a call
    /// no rule names cheap (what the kernel's action cache pays per number on install).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_search_for_named_calls_changes_no_verdict() {
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        let p = SeccompProfile::default_profile().expect("profile");
        let mut values: Vec<u64> = p
            .rules
            .iter()
            .flat_map(|r| r.args.iter().map(|a| a.value))
            .chain([0, 1, 2, 0xffff_ffff, u64::MAX, 0x0040000, 0x1000_0000])
            .collect();
        values.sort_unstable();
        values.dedup();
        let compare = |plain: &[BpfProgram], searched: &[BpfProgram], what: &str| {
            assert!(
                searched.iter().map(Vec::len).sum::<usize>()
                    > plain.iter().map(Vec::len).sum::<usize>(),
                "{what}: no search was added"
            );
            for nr in (0..600).chain((0..600).map(|n| n | X32_SYSCALL_BIT)) {
                for &v in &values {
                    for args in [
                        [v; 6],
                        [v, 0, 0, 0, 0, 0],
                        [0, v, 0, 0, 0, 0],
                        [2, v, v, 0, 0, 0],
                    ] {
                        let a = verdict_and_steps(plain, AUDIT_ARCH_X86_64, nr, args).0;
                        let b = verdict_and_steps(searched, AUDIT_ARCH_X86_64, nr, args).0;
                        assert_eq!(a, b, "{what}: call {nr:#x} args {args:x?}");
                    }
                }
            }
            // getpid (39): named by no rule.
            let (_, before) = verdict_and_steps(plain, AUDIT_ARCH_X86_64, 39, [0; 6]);
            let (_, after) = verdict_and_steps(searched, AUDIT_ARCH_X86_64, 39, [0; 6]);
            assert!(
                after <= 16 && before > 4 * after,
                "{what}: {before} → {after} steps"
            );
        };
        for mode in [SeccompMode::Enforce, SeccompMode::Audit] {
            for net in [NetworkMode::None, NetworkMode::Egress] {
                let plain = compile_with(&p, mode, net, false, false).expect("compile");
                let searched = compile_with(&p, mode, net, false, true).expect("compile");
                compare(
                    &plain.programs,
                    &searched.programs,
                    &format!("{mode:?} {net:?}"),
                );
            }
        }
        let fill = |search| vec![fill_program(search).expect("fill program")];
        compare(&fill(false), &fill(true), "filler");
    }

    /// Every filter compiles for every architecture the static builds target, whatever the
    /// machine running the test: a name the architecture lacks (aarch64 has no `fork`) made
    /// seccompiler refuse the whole filler filter on aarch64, and every fill with it (the
    /// kernel matrix found it). The numbers a denied call has there are denied.
    #[test]
    fn every_filter_compiles_for_every_architecture() {
        let p = SeccompProfile::default_profile().expect("profile");
        for arch in [
            seccompiler::TargetArch::x86_64,
            seccompiler::TargetArch::aarch64,
            seccompiler::TargetArch::riscv64,
        ] {
            for mode in [SeccompMode::Enforce, SeccompMode::Audit] {
                for net in [
                    NetworkMode::None,
                    NetworkMode::AllowList,
                    NetworkMode::Egress,
                ] {
                    compile_for(&p, mode, net, false, true, arch)
                        .unwrap_or_else(|e| panic!("{arch:?} {mode:?} {net:?}: {e}"));
                }
            }
            let keeper = keeper_program_for(arch, true)
                .unwrap_or_else(|e| panic!("{arch:?}: the keeper's filter: {e}"));
            for nr in syscall_numbers(&["execve", "socket", "setns"], arch).expect("numbers") {
                assert!(
                    keeper.iter().any(|i| i.code == BPF_JEQ_K && i.k == nr),
                    "{arch:?}: call {nr} not in the keeper's filter"
                );
            }
            let fill = fill_program_for(arch, true)
                .unwrap_or_else(|e| panic!("{arch:?}: the filler's filter: {e}"));
            // clone and execve are denied there, by their numbers on that architecture.
            let nrs = syscall_numbers(&["clone", "execve"], arch).expect("numbers");
            for nr in nrs {
                assert!(
                    fill.iter().any(|i| i.code == BPF_JEQ_K && i.k == nr),
                    "{arch:?}: call {nr} not in the filler's filter"
                );
            }
        }
    }

    /// x32 numbers (the x32 bit over any call) are refused before any rule, on x86_64, while
    /// the native numbers go on to their rules; a foreign architecture is killed.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_and_foreign_architectures_are_refused() {
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        let p = SeccompProfile::default_profile().expect("profile");
        for mode in [SeccompMode::Enforce, SeccompMode::Audit] {
            let f = compile(&p, mode, NetworkMode::None, false).expect("compile");
            let x32 = |nr: u32| kernel_verdict(&f, AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | nr, [0; 6]);
            // unshare, bpf, io_uring_setup, and a call no rule names (getpid).
            for nr in [272, 321, 425, 39] {
                assert_eq!(x32(nr), RET_ERRNO_ENOSYS, "x32 call {nr}");
            }
            // Native: unshare is the listener's, getpid is allowed.
            assert_eq!(
                kernel_verdict(&f, AUDIT_ARCH_X86_64, 272, [0x1000_0000, 0, 0, 0, 0, 0]),
                RET_USER_NOTIF
            );
            assert_eq!(
                kernel_verdict(&f, AUDIT_ARCH_X86_64, 39, [0; 6]),
                0x7fff_0000
            );
            // personality(135): querying and PER_LINUX pass; ADDR_NO_RANDOMIZE goes to the
            // listener, which denies it; modify_ldt(154) is the listener's too.
            assert_eq!(
                kernel_verdict(&f, AUDIT_ARCH_X86_64, 135, [0xffff_ffff, 0, 0, 0, 0, 0]),
                0x7fff_0000
            );
            assert_eq!(
                kernel_verdict(&f, AUDIT_ARCH_X86_64, 135, [0; 6]),
                0x7fff_0000
            );
            assert_eq!(
                kernel_verdict(&f, AUDIT_ARCH_X86_64, 135, [0x0040000, 0, 0, 0, 0, 0]),
                RET_USER_NOTIF
            );
            assert_eq!(
                kernel_verdict(&f, AUDIT_ARCH_X86_64, 154, [0; 6]),
                RET_USER_NOTIF
            );
            if mode == SeccompMode::Enforce {
                assert_eq!(
                    f.answer(135, &[0x0040000, 0, 0, 0, 0, 0]).0,
                    Answer::Errno(libc::EPERM)
                );
                assert_eq!(f.answer(154, &[0; 6]).0, Answer::Errno(libc::EPERM));
            }
            // i386 through int 0x80: killed by the architecture check.
            assert_eq!(
                kernel_verdict(&f, AUDIT_ARCH_I386, 20, [0; 6]) & 0xffff_0000,
                0x8000_0000
            );
        }
    }

    /// The filler's and the keeper's filters refuse x32 numbers too, before their rules (the
    /// jail's filter is checked above): an x32 `execve` or `socket` would otherwise skip
    /// every rule of theirs. Native calls get their rules' answer; i386 is killed (mutant:
    /// `refuse_x32` left out of `deny_program_for` -> the x32 `execve` is allowed).
    #[test]
    fn the_fillers_and_keepers_filters_refuse_x32_and_foreign_architectures() {
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        const RET_ERRNO_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
        let arch = seccompiler::TargetArch::x86_64;
        for (what, prog) in [
            (
                "filler",
                fill_program_for(arch, true).expect("fill program"),
            ),
            (
                "keeper",
                keeper_program_for(arch, true).expect("keeper program"),
            ),
        ] {
            let verdict = |arch_token: u32, nr: u32| {
                verdict_and_steps(std::slice::from_ref(&prog), arch_token, nr, [0; 6]).0
            };
            // execve(59), socket(41), ptrace(101): denied natively, refused as x32.
            for nr in [59, 41, 101] {
                assert_eq!(
                    verdict(AUDIT_ARCH_X86_64, nr),
                    RET_ERRNO_EPERM,
                    "{what} {nr}"
                );
                assert_eq!(
                    verdict(AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | nr),
                    RET_ERRNO_ENOSYS,
                    "{what}: x32 call {nr}"
                );
            }
            // getpid(39) is allowed natively, refused as x32.
            assert_eq!(verdict(AUDIT_ARCH_X86_64, 39), RET_ALLOW, "{what}");
            assert_eq!(
                verdict(AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | 39),
                RET_ERRNO_ENOSYS,
                "{what}"
            );
            assert_eq!(
                verdict(AUDIT_ARCH_I386, 11) & 0xffff_0000,
                0x8000_0000,
                "{what}: i386 killed"
            );
        }
    }

    #[test]
    fn unknown_syscalls_are_refused() {
        let text = policy::seccomp::DEFAULT_SECCOMP_JSON.replacen(
            "\"unshare\"",
            "\"unshare_everything\"",
            1,
        );
        let p = SeccompProfile::parse(&text).expect("parse");
        let e =
            compile(&p, SeccompMode::Enforce, NetworkMode::None, false).expect_err("unknown call");
        assert!(e.to_string().contains("unshare_everything"), "{e}");
    }

    /// A notified call as `recv` gives it: (id, pid, nr, args).
    type Notification = (u64, u32, i32, [u64; 6]);

    /// A scripted listener: what each `recv` returns in turn (then EBADF: the listener is
    /// closed), what each loopback socket's hand-over returns, and what the thread did.
    struct Scripted {
        recvs: std::sync::Mutex<std::collections::VecDeque<std::io::Result<Notification>>>,
        handovers: std::sync::Mutex<std::collections::VecDeque<std::io::Result<()>>>,
        /// ("respond", id, errno) and ("socket", id, 0), in order.
        did: std::sync::Mutex<Vec<(&'static str, u64, i32)>>,
    }

    impl Notifications for Scripted {
        fn recv(&self) -> std::io::Result<Notification> {
            let next = self.recvs.lock().unwrap().pop_front();
            next.unwrap_or_else(|| Err(std::io::Error::from_raw_os_error(libc::EBADF)))
        }
        fn respond(&self, id: u64, errno: Option<i32>) {
            self.did
                .lock()
                .unwrap()
                .push(("respond", id, errno.unwrap_or(0)));
        }
        fn socket_on_loopback(&self, id: u64, _args: &[u64; 6]) -> std::io::Result<()> {
            self.did.lock().unwrap().push(("socket", id, 0));
            self.handovers.lock().unwrap().pop_front().unwrap_or(Ok(()))
        }
    }

    /// The listener's thread over `script` (each an errno or a socket(AF_INET) call with its
    /// id) and the loopback hand-overs' results: what it did, once it returned. A thread that
    /// never returns (spinning on an error it should stop at) fails within a liveness bound.
    fn serve_script(
        script: &[Result<u64, i32>],
        handovers: &[Result<(), i32>],
    ) -> Vec<(&'static str, u64, i32)> {
        let p = SeccompProfile::default_profile().unwrap();
        let f = compile(&p, SeccompMode::Enforce, NetworkMode::AllowList, false).unwrap();
        let socket = syscall_number("socket", target_arch().unwrap()).unwrap() as i32;
        let inet = [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        assert_eq!(
            f.answer(socket, &inet),
            (Answer::OnLoopback, None),
            "the calls the script sends"
        );
        let listener = std::sync::Arc::new(Scripted {
            recvs: std::sync::Mutex::new(
                script
                    .iter()
                    .map(|r| match r {
                        Ok(id) => Ok((*id, std::process::id(), socket, inet)),
                        Err(errno) => Err(std::io::Error::from_raw_os_error(*errno)),
                    })
                    .collect(),
            ),
            handovers: std::sync::Mutex::new(
                handovers
                    .iter()
                    .map(|r| r.map_err(std::io::Error::from_raw_os_error))
                    .collect(),
            ),
            did: std::sync::Mutex::new(Vec::new()),
        });
        let (done, returned) = std::sync::mpsc::channel();
        let l = std::sync::Arc::clone(&listener);
        std::thread::spawn(move || {
            serve(&*l, &f);
            let _ = done.send(());
        });
        returned
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the listener's thread returned (liveness bound: it spins otherwise)");
        listener.did.lock().unwrap().clone()
    }

    /// A caller that died before its notification was read (ENOENT) and a signal (EINTR) leave
    /// the thread serving the calls after them; any other error (the listener closed) ends it.
    #[test]
    fn the_listener_goes_on_past_a_gone_caller_and_a_signal_and_stops_at_anything_else() {
        assert_eq!(
            serve_script(&[Err(libc::ENOENT), Ok(7), Err(libc::EINTR), Ok(8)], &[]),
            [("socket", 7, 0), ("socket", 8, 0)]
        );
        assert_eq!(
            serve_script(&[Ok(7), Err(libc::ENOMEM), Ok(8)], &[]),
            [("socket", 7, 0)],
            "stopped at ENOMEM"
        );
    }

    /// A loopback socket whose hand-over fails fails its call with that errno; one whose caller
    /// is gone meanwhile (ENOENT) is answered no more.
    #[test]
    fn a_loopback_socket_that_cannot_be_handed_over_fails_its_call_unless_the_caller_is_gone() {
        assert_eq!(
            serve_script(
                &[Ok(7), Ok(8), Ok(9)],
                &[Err(libc::EMFILE), Err(libc::ENOENT), Ok(())]
            ),
            [
                ("socket", 7, 0),
                ("respond", 7, libc::EMFILE),
                ("socket", 8, 0),
                ("socket", 9, 0)
            ]
        );
    }
}
