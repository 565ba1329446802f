//! What a request's jail works on — the archive, a tree lent from the cache, or a tree this
//! request fills — and the descriptors the jail hands over (its egress listener, its mounter).

use super::{Inner, internal};
use crate::RequestSpec;
use crate::cache::{Borrow, FillFailed, FillTicket, Lookup};
use crate::plan::Plan;
use jail_wire::record::Recorder;
use std::io::Read;
use std::time::{Duration, Instant};
use vocab::record::Limit;
use vocab::request::{ErrorKind, RequestError};

/// What a jail's request works on: the archive, to extract as it arrives, or a tree from the
/// cache with what is left of the archive's stream to receive and verify (nothing after a
/// fill; all of it on a hit, drained while the jail gets the tree, before its `E`).
pub(super) enum Feed {
    Archive(Box<dyn Read + Send>),
    Tree(Borrow, Box<dyn Read + Send>),
    /// This request fills the tree from its stream, once its jail is taken (so that the
    /// jail's identity and cgroup are in its record whatever the fill's outcome).
    Fill(FillTicket, Box<dyn Read + Send>, Box<FillJob>),
}

/// How a fill extracts: the request's archive options and the filler's limits.
pub(super) struct FillJob {
    pub(super) options: archive::Options,
    pub(super) limits: jail_wire::protocol::FillLimits,
}

/// A borrowed tree, returned to the cache when dropped.
pub(super) struct TreeHold(
    pub(super) Option<Borrow>,
    pub(super) Option<crate::cache::SharedCache>,
);

impl Drop for TreeHold {
    fn drop(&mut self) {
        if let (Some(b), Some(c)) = (self.0.take(), &self.1) {
            c.release(b);
        }
    }
}

impl Inner {
    /// What the request's jail works on: a sealed tree from the cache (with `input` still to
    /// drain: it ends only once the bytes matched their checksum, and the jail gets the tree
    /// meanwhile), a tree this request fills (from `input`), or the archive to extract in its
    /// own jail. The audit record says which.
    pub(super) fn cached_tree(
        &self,
        plan: &Plan,
        spec: &RequestSpec,
        input: Box<dyn Read + Send>,
    ) -> Result<Feed, RequestError> {
        use vocab::record::TreeCacheUse;
        let Some(cache) = self.cache.get() else {
            return Ok(Feed::Archive(input));
        };
        // This policy's own limits are tighter than a cached tree is held to.
        if let Some(why) = &plan.cache_refused {
            tracing::debug!(
                why,
                "tree cache: not for this policy's requests; it extracts in its own jail"
            );
            jail_wire::record::update(&spec.record, |r| {
                r.tree_cache = Some(TreeCacheUse::Uncached)
            });
            return Ok(Feed::Archive(input));
        }
        let mut options = spec.task.archive.clone();
        options.preserve_file_mode = spec.task.config.spec.preserve_file_mode;
        let key = spec
            .task
            .archive_sha256
            .as_deref()
            .and_then(|c| crate::cache::tree_key(c, &options));
        // Too small to be worth a tree: a fill costs more than its hits save.
        let small = spec
            .task
            .archive_size
            .is_some_and(|n| n < cache.min_archive_bytes());
        let Some(key) = key.filter(|_| !small) else {
            if small {
                tracing::debug!(
                    "tree cache: the archive is smaller than spec.cache.minArchiveBytes; it extracts in its own jail"
                );
            }
            jail_wire::record::update(&spec.record, |r| {
                r.tree_cache = Some(TreeCacheUse::Uncached)
            });
            return Ok(Feed::Archive(input));
        };
        match cache.lookup(&key, spec.deadline) {
            // Drained by `run_jail` while the jail takes the tree.
            Lookup::Hit(b) => {
                note_tree(&spec.record, &b, None);
                Ok(Feed::Tree(b, input))
            }
            Lookup::Fill(ticket) => {
                let limits = jail_wire::protocol::FillLimits {
                    cpu_seconds: options.limits.wall_clock.as_secs().max(1),
                    data_bytes: plan.data_bytes(),
                    address_space_bytes: plan.address_space_bytes(),
                    file_size_bytes: options.limits.file_bytes,
                };
                Ok(Feed::Fill(
                    ticket,
                    input,
                    Box::new(FillJob { options, limits }),
                ))
            }
            Lookup::Uncached(why) => {
                tracing::debug!(why, "tree cache: this request extracts in its own jail");
                jail_wire::record::update(&spec.record, |r| {
                    r.tree_cache = Some(TreeCacheUse::Uncached)
                });
                Ok(Feed::Archive(input))
            }
        }
    }

    /// Fill the tree of `ticket` from `input` (received, verified and sealed when this
    /// returns), recording it as this request's extraction.
    pub(super) fn fill_tree(
        &self,
        ticket: FillTicket,
        input: &mut Box<dyn Read + Send>,
        job: &FillJob,
        deadline: Option<Instant>,
        record: &Recorder,
    ) -> Result<Borrow, FillFailed> {
        use vocab::record::TreeCacheUse;
        let cache = self
            .cache
            .get()
            .ok_or_else(|| FillFailed::NotStarted(internal("tree cache: not running")))?;
        let started = Instant::now();
        match cache.fill(ticket, input, &job.options, job.limits, deadline) {
            Ok(b) => {
                note_tree(record, &b, Some(started));
                Ok(b)
            }
            Err(FillFailed::NotStarted(e)) => Err(FillFailed::NotStarted(e)),
            Err(FillFailed::Failed(e)) => {
                jail_wire::record::update(record, |r| {
                    r.tree_cache = Some(TreeCacheUse::Filled);
                    if e.kind != ErrorKind::Internal && e.kind != ErrorKind::Cancelled {
                        r.limit = Some(Limit::Archive);
                    }
                });
                Err(FillFailed::Failed(e))
            }
        }
    }
}

/// Receive the jail's egress listener (one `L` or `S` byte with the descriptor) from its
/// stdin socket, waiting at most as long as a jail may take to confine itself. `true`: it is
/// on the server's loopback (`S`), where other processes of the pod can reach it too.
pub(super) fn receive_listener(
    sock: &std::fs::File,
) -> std::io::Result<(std::net::TcpListener, bool)> {
    match receive_tagged(sock)? {
        (jail_wire::protocol::EGRESS_LISTENER, Some(fd)) => Ok((fd.into(), false)),
        (jail_wire::protocol::EGRESS_LISTENER_SHARED, Some(fd)) => Ok((fd.into(), true)),
        _ => Err(std::io::Error::other("the jail sent no listener")),
    }
}

/// Receive the jail's mounter socket (`T` with the descriptor; `N` when it has none).
pub(super) fn receive_mounter(
    sock: &std::fs::File,
) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    match receive_tagged(sock)? {
        (jail_wire::protocol::MOUNTER_SOCKET, Some(fd)) => Ok(Some(fd)),
        (jail_wire::protocol::NO_MOUNTER, None) => Ok(None),
        _ => Err(std::io::Error::other(
            "the jail sent no word of its mounter",
        )),
    }
}

/// A hit that extracts after all: the record says uncached, and the jail's extraction
/// replaces the tree's figures.
pub(super) fn fall_back_to_extraction(
    record: &Recorder,
    cache: Option<&crate::cache::SharedCache>,
) {
    if let Some(c) = cache {
        c.not_lent();
    }
    jail_wire::record::update(record, |r| {
        r.tree_cache = Some(vocab::record::TreeCacheUse::Uncached);
        r.archive = None;
    });
}

/// The tree in the request's record: from the cache or filled by it, as its extraction (the
/// fill's time, from `filled_since`; a hit extracted nothing).
pub(super) fn note_tree(record: &Recorder, b: &Borrow, filled_since: Option<Instant>) {
    use vocab::record::TreeCacheUse;
    let now = jail_wire::record::unix_nanos();
    let took = filled_since.map_or(0, |t| t.elapsed().as_micros() as u64);
    jail_wire::record::update(record, |r| {
        r.tree_cache = Some(if b.filled {
            TreeCacheUse::Filled
        } else {
            TreeCacheUse::Hit
        });
        r.archive = Some(vocab::record::ArchiveRecord {
            entries: b.entries,
            file_bytes: b.file_bytes,
            started_unix_nanos: now.saturating_sub(took.saturating_mul(1000)),
            duration_us: took,
        });
    });
}

/// Have the jail's mounter put the lent tree `tree` under its `repo/`.
pub(super) fn attach_tree(
    mounter: &std::os::fd::OwnedFd,
    tree: std::os::fd::OwnedFd,
) -> Result<(), String> {
    use std::os::fd::AsFd;
    rustix::net::sockopt::set_socket_timeout(
        mounter,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(10)),
    )
    .map_err(|e| e.to_string())?;
    jail_wire::protocol::send_msg(
        mounter.as_fd(),
        &jail_wire::protocol::MounterCmd::Attach,
        &[tree.as_fd()],
    )
    .map_err(|e| e.to_string())?;
    match jail_wire::protocol::recv_msg::<jail_wire::protocol::MounterReply>(mounter.as_fd()) {
        Ok(Some((jail_wire::protocol::MounterReply::Ok, _))) => Ok(()),
        Ok(Some((jail_wire::protocol::MounterReply::Failed(e), _))) => Err(e),
        Ok(None) => Err("the mounter is gone".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// One tagged byte from the jail's stdin socket, with the descriptor that came with it.
pub(super) fn receive_tagged(
    sock: &std::fs::File,
) -> std::io::Result<(u8, Option<std::os::fd::OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use std::os::fd::AsFd;
    rustix::net::sockopt::set_socket_timeout(
        sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(30)),
    )?;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = rustix::net::recvmsg(
        sock.as_fd(),
        &mut [std::io::IoSliceMut::new(&mut byte)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let fd = anc.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
        _ => None,
    });
    rustix::net::sockopt::set_socket_timeout(sock, rustix::net::sockopt::Timeout::Recv, None)?;
    if got.bytes != 1 {
        return Err(std::io::Error::other("the jail closed its socket"));
    }
    Ok((byte[0], fd))
}
