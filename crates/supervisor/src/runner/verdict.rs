//! The request's outcome: the jail's reply judged with what the cgroup and the kernel saw
//! (`verdict`), and a failure explained by what the sandbox refused (`explain_denials`).

use super::internal;
use crate::plan::Plan;
use cgroups::CgroupStats;
use jail_sys::cancel::CancelToken;
use jail_wire::protocol::Reply;
use jail_wire::record::Recorder;
use vocab::record::Limit;
use vocab::request::{ErrorKind, RequestError};

/// The address of a direct TCP connect Go reports as refused (`dial tcp ADDR: connect:
/// permission denied`, as Landlock's refusal reads).
fn direct_connect_refused(message: &str) -> Option<&str> {
    let (before, _) = message.split_once(": connect: permission denied")?;
    let (_, addr) = before.rsplit_once("dial tcp ")?;
    (!addr.is_empty() && addr.len() < 300).then_some(addr)
}

/// The address a tool reports it could not listen on, as Landlock's refusal of a TCP bind
/// reads: Go's `listen tcp ADDR: bind: permission denied`, Node's `listen EACCES: permission
/// denied ADDR`.
fn listen_refused(message: &str) -> Option<&str> {
    if let Some((before, _)) = message.split_once(": bind: permission denied") {
        let (_, addr) = before.rsplit_once("listen tcp ")?;
        return (!addr.is_empty() && addr.len() < 300).then_some(addr);
    }
    let (_, after) = message.split_once("listen EACCES: permission denied ")?;
    let addr = after.split_whitespace().next()?;
    (addr.len() < 300).then_some(addr)
}

/// How tools say an allocation failed (Python, C/glibc, C++, Go, Node.js, Java).
const OUT_OF_MEMORY: &[&str] = &[
    "MemoryError",
    "Cannot allocate memory",
    "std::bad_alloc",
    "runtime: out of memory",
    "JavaScript heap out of memory",
    "OutOfMemoryError",
];

/// A failed request in which the sandbox refused something says what and which policy field
/// allows it, after the tool's own message (which may only say "403" or "no such host"):
/// destinations the egress proxy refused, calls the seccomp profile denied (inet sockets under
/// `network: none` named as such), and the server variables commands did not get.
pub(super) fn explain_denials(reply: Reply, record: &Recorder, plan: &Plan) -> Reply {
    let network = plan.network();
    let Reply::Err {
        kind,
        message,
        report,
        record: r,
    } = reply
    else {
        return reply;
    };
    let rec = jail_wire::record::snapshot(record);
    let mut refused: Vec<String> = rec
        .egress
        .iter()
        .filter(|c| c.decision == vocab::egress::Decision::Denied)
        .filter_map(|c| c.reason.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .take(3)
        .collect();
    for e in rec
        .seccomp_audit
        .iter()
        .filter(|e| e.action == vocab::record::SeccompAction::Denied)
        .take(3)
    {
        refused.push(if e.syscall == "socket" && network == policy::NetworkMode::None {
            format!(
                "network access ({} socket calls by {}): spec.network.mode is none; allowList with spec.network.allow (or egress) allows connections",
                e.count, e.comm
            )
        } else {
            format!(
                "system call {} ({} times, by {}), denied by the spec.seccomp profile",
                e.syscall, e.count, e.comm
            )
        });
    }
    // Tools probe many paths they can do without (locale files, cgroup limits, Go's hugepage
    // size): when the command's own message names some refused paths, those alone are the
    // cause; the rest stay in the audit event's `landlockDenials`.
    let named = |d: &&vocab::record::LandlockDenial| {
        !d.object.is_empty() && message.contains(d.object.as_str())
    };
    let mut landlock: Vec<_> = rec.landlock_denials.iter().collect();
    if landlock.iter().any(named) {
        landlock.retain(named);
    }
    for d in landlock.into_iter().take(3) {
        refused.push(match &d.allowed_by {
            Some(field) => format!("{} on {} (Landlock; {field})", d.blockers, d.object),
            None => format!(
                "{} on {} (Landlock; no policy field allows this)",
                d.blockers, d.object
            ),
        });
    }
    // A command failed on its own (no resource limit or deadline ended it; a refusal of the
    // sandbox may be why, and is named below): it may have missed a server variable it is
    // configured by. Only the names the failed command itself mentioned (in its message or its
    // argv) are worth the reader's attention; the full list stays in the audit event. (Not when
    // its output was refused: Argo CD's own words then stand alone.)
    let ended_by_a_limit = matches!(
        rec.limit,
        Some(
            Limit::Memory
                | Limit::Pids
                | Limit::Disk
                | Limit::WorkDisk
                | Limit::Timeout
                | Limit::ClientDeadline
                | Limit::Output
                | Limit::Cancelled
        )
    );
    let failed = rec
        .commands
        .last()
        .filter(|c| c.exit_code != Some(0) || c.signal.is_some());
    let command_failed = !ended_by_a_limit && failed.is_some();
    let original = message.clone();
    let mut message = message;
    if command_failed && !plan.withheld_env.is_empty() {
        jail_wire::record::update(record, |r| r.withheld_env = plan.withheld_env.clone());
        let argv = failed.map(|c| c.argv.join(" ")).unwrap_or_default();
        let named = mentioned(&plan.nameable_withheld_env, &[&original, &argv]);
        if !named.is_empty() {
            message = format!(
                "{message} (server variables not passed to commands: {}; spec.env.pass allows them)",
                named.join(", ")
            );
        }
    }
    // A Go tool (helm, kustomize, …) skips the proxy for loopback and IP destinations: the
    // direct connect is refused, and its error says only "permission denied".
    if network == policy::NetworkMode::AllowList
        && let Some(addr) = direct_connect_refused(&original)
    {
        refused.push(format!(
            "a direct connection to {addr}, not through the egress proxy: under spec.network.mode allowList commands reach destinations only through HTTPS_PROXY/HTTP_PROXY, which Go tools skip for localhost and IP addresses (NO_PROXY cannot change that); name the destination by a hostname in spec.network.allow, pinned to its address in spec.network.hosts"
        ));
    }
    // A tool whose processes talk to each other over TCP (Pulumi's CLI and its plugins) is
    // refused its listening socket by Landlock, which the kernel reports only with audit on.
    if network != policy::NetworkMode::Egress
        && !plan.loopback()
        && let Some(addr) = listen_refused(&original)
    {
        refused.push(format!(
            "listening on {addr}: Landlock refuses TCP bind under spec.network.mode {}; spec.network.loopback: true lets commands listen and connect on the jail's own loopback (its network namespace, with no other device)",
            if network == policy::NetworkMode::None { "none" } else { "allowList" }
        ));
    }
    // What the sandbox refused is the likelier cause: it comes last, where a reader looks.
    if !refused.is_empty() {
        message = format!("{message} (the sandbox refused: {})", refused.join("; "));
    }
    // A tool that ran out of memory with no OOM kill of the request's cgroup: an allocation
    // refused under the per-process heap limit, not the request's memory limit.
    if command_failed && OUT_OF_MEMORY.iter().any(|m| original.contains(m)) {
        jail_wire::record::update(record, |r| r.limit = Some(Limit::Heap));
        // The address space bounds an allocation too, where a policy set it below the
        // default (64 GiB, which only a runaway reservation reaches).
        let address_space = if plan.address_space_bytes() < 64 << 30 {
            format!(
                " and its address space by spec.limits.addressSpaceBytes: {}",
                plan.address_space_bytes()
            )
        } else {
            String::new()
        };
        message = format!(
            "{message} (an allocation was refused: each process's heap is bounded by policy spec.limits.dataBytes: {}{address_space}; spec.limits.memoryBytes bounds the request as a whole)",
            plan.data_bytes()
        );
    }
    Reply::Err {
        kind,
        message,
        report,
        record: r,
    }
}

/// The names of `vars` that any of `texts` names ([`policy::names_var`]).
fn mentioned<'a>(vars: &'a [String], texts: &[&str]) -> Vec<&'a str> {
    vars.iter()
        .map(String::as_str)
        .filter(|name| texts.iter().any(|t| policy::names_var(t, name)))
        .collect()
}

/// A signal's name, for messages.
fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        _ => "another signal",
    }
}

/// The request's result from the jail's raw reply and what its cgroup saw: an OOM kill or a
/// refused fork is named as the limit that ended the request (ResourceExhausted with the
/// policy field), whatever the jail itself made of the failure; the jail's part of the audit
/// record is merged under the supervisor's.
pub(super) fn verdict(
    raw: Option<Vec<u8>>,
    stats: Option<CgroupStats>,
    container_oom: bool,
    plan: &Plan,
    cancel: &CancelToken,
    record: &Recorder,
    jail_signal: Option<i32>,
) -> Result<Reply, RequestError> {
    // The request's own cgroup saw an OOM kill: memory ended it, whatever else happened. The
    // container's count also moves for another request's kill: it names only a failure.
    let oom = stats.is_some_and(|s| s.oom_kills > 0) || container_oom;
    if stats.is_some_and(|s| s.oom_kills > 0) {
        jail_wire::record::update(record, |r| r.limit = Some(Limit::Memory));
    }
    let oom_error = |detail: &str| {
        jail_wire::record::update(record, |r| r.limit = Some(Limit::Memory));
        RequestError::new(
            ErrorKind::ResourceExhausted,
            if container_oom {
                format!(
                    "memory limit exceeded: the kernel's OOM killer ended a process of the request when the server's own cgroup (the container's memory limit) was full; a per-request bound (policy spec.limits.memoryBytes: {}) needs a delegated cgroup, which this node does not give (doctor's cgroups){detail}",
                    plan.cgroup.memory_bytes
                )
            } else {
                format!(
                    "memory limit exceeded (policy spec.limits.memoryBytes: {}): the kernel killed a process of the request{detail}",
                    plan.cgroup.memory_bytes
                )
            },
        )
    };
    let raw = match raw {
        Some(raw) => raw,
        None if oom => return Err(oom_error("")),
        // The jail aborted: an allocation failed under its heap limit. Rust aborts then; as
        // init of its PID namespace the jail ignores its own SIGABRT, so glibc's fallback
        // ends it with SIGSEGV.
        None if matches!(jail_signal, Some(libc::SIGABRT | libc::SIGSEGV))
            && cancel.reason().is_none() =>
        {
            jail_wire::record::update(record, |r| r.limit = Some(Limit::Memory));
            return Err(RequestError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "the sandbox ran out of memory handling the command's output (it ended by signal {}, as a failed allocation under policy spec.limits.dataBytes: {} per process ends it)",
                    jail_signal.unwrap_or_default(),
                    plan.data_bytes()
                ),
            ));
        }
        None => {
            return Err(match cancel.reason() {
                Some(_) => RequestError::new(ErrorKind::Cancelled, "context canceled"),
                None => internal(match jail_signal {
                    // Not a limit of the request's (its cgroup saw no OOM kill): something
                    // outside it, such as the node's OOM killer or an operator.
                    Some(sig) => format!(
                        "the jail exited without a reply: it was killed by signal {sig} ({}) from outside the request (no limit of the policy ended it; the node's kernel log or the pod's events say who sent it)",
                        signal_name(sig)
                    ),
                    None => "the jail exited without a reply".to_owned(),
                }),
            });
        }
    };
    let mut reply: Reply = serde_json::from_slice(&raw)
        .map_err(|e| internal(format!("bad reply from the jail: {e}")))?;
    // The jail's part (commands, archive, its view of the limit), merged under ours.
    let (Reply::Ok { record: theirs, .. } | Reply::Err { record: theirs, .. }) = &mut reply;
    let theirs = std::mem::take(theirs);
    jail_wire::record::update(record, |r| {
        // (A jail on a cached tree extracted nothing: the record has the tree's.)
        if theirs.archive.is_some() {
            r.archive = theirs.archive;
        }
        r.commands = theirs.commands;
        r.seccomp_audit = theirs.seccomp_audit;
        if r.limit.is_none() {
            r.limit = theirs.limit;
        }
    });
    // Forks refused by the cgroup, or the task count at the limit (RLIMIT_NPROC, set to the
    // same value for the unique UID, usually refuses first).
    let pids_hit = stats.is_some_and(|s| s.pids_refused > 0 || s.pids_peak >= plan.cgroup.pids);
    let rewritten = |e: RequestError| Reply::Err {
        kind: e.kind,
        message: e.message,
        report: None,
        record: Default::default(),
    };
    Ok(match reply {
        Reply::Err { message, .. } if oom => rewritten(oom_error(&format!(": {message}"))),
        // The request's own cgroup killed a process, yet the commands exited 0 (a script whose
        // `wait` or `|| true` hid it): what they printed may be cut short, and Argo CD would
        // apply (and prune by) it. Not served.
        Reply::Ok { .. } if stats.is_some_and(|s| s.oom_kills > 0) => rewritten(oom_error(
            "; the commands exited 0 nonetheless, so their output may be incomplete and is not served",
        )),
        // A failure after forks were refused: name the limit (the tool's own message, e.g.
        // "Cannot fork", follows).
        Reply::Err { message, .. } if pids_hit => {
            jail_wire::record::update(record, |r| r.limit = Some(Limit::Pids));
            rewritten(RequestError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "process limit reached (policy spec.limits.pids: {}): {message}",
                    plan.cgroup.pids
                ),
            ))
        }
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::{listen_refused, mentioned};

    /// Go's and Node's words for a refused TCP bind give the address; other failures none.
    #[test]
    fn a_refused_listen_is_read_from_go_and_node() {
        assert_eq!(
            listen_refused(
                "error: failed to listen on TCP port ':0': listen tcp 127.0.0.1:0: bind: permission denied"
            ),
            Some("127.0.0.1:0")
        );
        assert_eq!(
            listen_refused("Error: listen EACCES: permission denied 127.0.0.1:8080\n    at Server"),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            listen_refused("dial tcp 10.0.0.1:443: connect: permission denied"),
            None
        );
    }

    #[test]
    fn only_the_names_a_command_mentioned_are_noted() {
        let vars: Vec<String> = ["VAULT_ADDR", "VAULT_TOKEN", "AWS_CA_BUNDLE", "HOME"]
            .map(String::from)
            .into();
        assert_eq!(
            mentioned(
                &vars,
                &[
                    "Error: VAULT_TOKEN is not set",
                    "sh -c vault read -address=$VAULT_ADDR"
                ]
            ),
            ["VAULT_ADDR", "VAULT_TOKEN"]
        );
        // A longer name that contains one is not a mention of it.
        assert!(mentioned(&vars, &["MY_VAULT_TOKEN_FILE missing; HOMEDIR"]).is_empty());
        assert!(mentioned(&vars, &["exit status 1", ""]).is_empty());
    }
}
