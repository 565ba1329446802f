//! The filler: the one process that writes a tree into the cache. Forked by the keeper for one
//! archive, it confines itself before reading a byte of it — as the cache's identity, which
//! never runs plugin commands — then extracts exactly as a jail would (same extractor, same
//! options, same error words), answers, and exits. It can never write anywhere but its own
//! staging directory, nor leave a process behind, nor reach the keeper:
//!
//!  1. the keeper's descriptors are closed: only the archive (stdin), the reply (stdout),
//!     stderr and the staging directory (fd 3) remain;
//!  2. `setsid`;
//!  3. rlimits: CPU (the archive's wall clock), DATA/AS, FSIZE, NOFILE, CORE 0;
//!  4. every capability (of the keeper's user namespace) cleared, bounding set emptied;
//!  5. not dumpable, `no_new_privs`;
//!  6. Landlock: read-write beneath the staging directory only, nothing else readable; signals
//!     and abstract sockets scoped to itself (a kernel without Landlock: no fill, and the
//!     cache goes out of service);
//!  7. seccomp: no process creation, no exec, no signals to others, no sockets, no
//!     namespaces or mounts (`fill_filter`): when it exits nothing of it can remain, so a
//!     sealed tree has no writer left.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use archive::{DirWriter, ExtractError, Resolver};
use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use rustix::process::{Resource, Rlimit};

use super::request::Failure;
use jail_wire::protocol::{FillLimits, FillReply, FrameReader, write_frame};
use vocab::request::ErrorKind;

/// The staging directory's descriptor in the filler.
pub const STAGING_FD: i32 = 3;

/// Run the filler (in the keeper's fork): never returns.
pub fn fill_main(options: &archive::Options, limits: FillLimits) -> ! {
    let reply = match confine(limits).map_err(|e| (ErrorKind::Internal, e)) {
        Ok(staging) => extract(staging, options),
        Err(e) => Err(e),
    };
    let msg = match reply {
        Ok(r) => r,
        Err((kind, message)) => FillReply::Err { kind, message },
    };
    let ok = matches!(msg, FillReply::Ok { .. });
    let body = serde_json::to_vec(&msg).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    let _ = write_frame(&mut out, b'R', &body).and_then(|()| out.flush());
    std::process::exit(if ok { 0 } else { 1 })
}

fn confine(limits: FillLimits) -> Result<OwnedFd, String> {
    // 1. Only stdin, stdout, stderr and the staging directory stay open.
    jail_sys::sys::close_fds_from(STAGING_FD + 1)
        .map_err(|e| format!("closing descriptors: {e}"))?;
    // fd 3 was placed by the keeper for this process alone: owned here.
    let staging = owned(STAGING_FD);
    // 2. Its own session.
    rustix::process::setsid().map_err(|e| format!("setsid: {e}"))?;
    // 3. rlimits.
    for (res, v) in [
        (Resource::Core, 0),
        (Resource::Cpu, limits.cpu_seconds.max(1)),
        (Resource::Data, limits.data_bytes),
        (Resource::As, limits.address_space_bytes),
        (Resource::Fsize, limits.file_size_bytes),
        (Resource::Nofile, 64),
    ] {
        rustix::process::setrlimit(
            res,
            Rlimit {
                current: Some(v),
                maximum: Some(v),
            },
        )
        .map_err(|e| format!("rlimit {res:?}: {e}"))?;
    }
    // 4. No capability of the keeper's namespace (they would override file permissions in
    // the cache).
    super::confine::clear_bounding_set().map_err(|e| e.to_string())?;
    super::confine::clear_capabilities().map_err(|e| e.to_string())?;
    // 5. Not dumpable, no_new_privs.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("dumpable: {e}"))?;
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    // 6. Landlock.
    landlock_staging_only(staging.as_fd())?;
    // 7. seccomp.
    seccomp::install_fill_filter().map_err(|e| format!("seccomp: {e}"))?;
    Ok(staging)
}

/// `fd` as an owned descriptor (the keeper placed it for this process alone).
fn owned(fd: i32) -> OwnedFd {
    jail_sys::sys::take_fd(fd)
}

fn landlock_staging_only(staging: BorrowedFd<'_>) -> Result<(), String> {
    let abi = ABI::V7;
    let all = AccessFs::from_all(abi);
    Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rule(PathBeneath::new(staging, all)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("landlock: {e}"))
        .and_then(|status| match status.ruleset {
            // An older ABI enforces less (no scopes), but still confines the filler's files
            // to its staging directory; without Landlock it could reach every sealed tree
            // (they are its identity's).
            landlock::RulesetStatus::NotEnforced => Err(
                "landlock: not enforced by this kernel, so the filler would not be confined to its staging directory (turn the cache off: spec.cache.enabled: false)".to_owned(),
            ),
            _ => Ok(()),
        })
}

fn extract(staging: OwnedFd, options: &archive::Options) -> Result<FillReply, (ErrorKind, String)> {
    let fail = |f: Failure| (f.kind(), f.to_string());
    // The filler's umask stays clear: modes exact at creation, no fchmod per entry.
    rustix::process::umask(rustix::fs::Mode::empty());
    let mut writer = DirWriter::new(staging, Resolver::Auto)
        .map_err(|e| fail(Failure::Workdir(e)))?
        .map_err(|r| fail(Failure::Archive(ExtractError::new(r))))?
        .umask_cleared();
    let stdin = std::io::stdin();
    let mut frames = FrameReader::new(stdin.lock());
    match archive::extract(&mut frames, &mut writer, options) {
        Ok(s) => Ok(FillReply::Ok {
            entries: s.entries,
            file_bytes: s.file_bytes,
        }),
        // The supervisor stopped feeding (client gone, checksum mismatch): not the archive's
        // fault, and nothing of it is kept.
        Err(_) if frames.aborted() => Err((ErrorKind::Cancelled, "archive stream aborted".into())),
        Err(e) => Err(fail(Failure::Archive(e))),
    }
}
