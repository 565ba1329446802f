//! The tree cache, supervisor side: which archives have a sealed tree, the budget and the
//! least-recently-used order, one fill at a time per archive, and the keeper process that
//! holds the trees (`crate::keeper`).
//!
//! A request's archive is looked up by its key (the client's claimed SHA-256 and the options
//! that change the extracted bytes, [`tree_key`]); the claim only chooses the tree: the bytes
//! are hashed as they arrive all the same, and a tree is given to a jail only after they
//! matched (the service delivers the archive's end only then).
//!  - **hit**: the request's bytes are received and hashed, not extracted; its jail gets the
//!    sealed tree under a private writable layer;
//!  - **fill**: the first request for an archive streams it into a confined filler (as the
//!    cache identity, into a staging directory), which is sealed once it succeeded and the
//!    bytes matched; then that request runs on it like a hit. Requests for the same archive
//!    meanwhile wait (without reading their streams) and then hit, or fill in turn if it failed;
//!  - **uncached**: everything else (no claim, the fills busy, the cache broken) extracts in
//!    its own jail, as with the cache off.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use sha2::{Digest, Sha256};

use crate::keeper::{KEEPER_ARG, KeeperArgs};
use jail_wire::protocol::{
    ENTRY_OVERHEAD, FillLimits, FillReply, KeeperCmd, KeeperReply, recv_msg, send_msg,
};
use vocab::request::{ErrorKind, RequestError};

/// How long the keeper may take to answer a command (a lend maps a namespace: milliseconds).
const KEEPER_ANSWER: Duration = Duration::from_secs(10);

/// A keeper that died or broke its exchange is started again at most this many times in the
/// life of the server (each logged), no sooner than [`RESTART_AFTER`] after it broke; past
/// that the cache stays out of service and says so.
const MAX_RESTARTS: u32 = 3;
const RESTART_AFTER: Duration = Duration::from_secs(5);

/// How long a fill's stream may deliver nothing before requests waiting for that tree stop
/// waiting and extract in their own jails.
const FILL_STALLED: Duration = Duration::from_secs(1);

/// The cache's configuration (from the policy's `spec.cache`, translated by the plan).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// Sealed trees kept, in bytes.
    pub budget: u64,
    /// Fills under way at once (each may need up to the archive's extracted-bytes limit).
    pub max_fills: usize,
    /// The cache identity (never runs a plugin command; outside the UID range).
    pub uid: u32,
    /// The jails' UID (and GID) range, mapped into the keeper's namespace.
    pub range: (u32, u32),
    /// The archive's extracted-bytes limit.
    pub extracted_bytes: u64,
    /// The archive's entries limit.
    pub entries: u64,
    /// Archives stated smaller than this (`.tar.gz` bytes) are not cached.
    pub min_archive_bytes: u64,
}

impl CacheConfig {
    /// The most tmpfs one fill can take: the archive's bytes, and a page for each of its
    /// entries (a file's last partial page, a long symlink). Without the pages, an archive of
    /// many small files overflowed a fill's room (ENOSPC where its own jail would extract it).
    fn fill_bytes(&self) -> u64 {
        self.extracted_bytes.saturating_add(
            self.entries
                .saturating_add(1)
                .saturating_mul(ENTRY_OVERHEAD),
        )
    }

    /// The keeper's tmpfs: the budget, and room for every fill under way at once.
    fn tmpfs_bytes(&self) -> u64 {
        self.budget
            .saturating_add((self.max_fills as u64).saturating_mul(self.fill_bytes()))
    }
}

/// Why a fill gave no tree.
#[derive(Debug)]
pub enum FillFailed {
    /// It never started (the keeper is gone, its exchange broke): nothing of the stream was
    /// read, so the request extracts it in its own jail, as without the cache.
    NotStarted(RequestError),
    /// It read the stream and failed (the archive refused, the filler or the client gone).
    Failed(RequestError),
}

/// Hits, fills, uncached requests and evictions so far, and bytes held.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheStats {
    /// Requests served from a sealed tree (after a wait for a fill, too).
    pub hits: u64,
    /// Requests whose archive filled a tree.
    pub fills: u64,
    /// Requests extracted in their own jail.
    pub uncached: u64,
    /// Trees removed to stay in the budget.
    pub evictions: u64,
    /// Bytes of sealed trees.
    pub bytes: u64,
    /// Sealed trees.
    pub trees: u64,
    /// Serving (false from `TREE CACHE OUT OF SERVICE` until a new keeper runs).
    pub in_service: bool,
}

#[derive(Debug)]
enum Entry {
    /// Being filled from a request's stream; the instant is when that stream last delivered
    /// bytes, so a request waiting for the tree can tell a fill in progress from a stalled one.
    Filling(Instant),
    Ready(Tree),
    /// Out of the budget, its removal under way in the keeper: a request for the key waits
    /// (a fill now would be sealed under the name the removal is about to delete).
    Evicting,
}

#[derive(Debug, Clone, Copy)]
struct Tree {
    bytes: u64,
    entries: u64,
    file_bytes: u64,
    refs: u32,
    last_used: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    used: u64,
    fills: usize,
    clock: u64,
    /// Why the cache is out of service, and since when.
    broken: Option<(String, Instant)>,
    /// Keepers started after the first.
    restarts: u32,
    /// Bumped at each restart: fills of an earlier keeper settle nothing of this one's.
    generation: u64,
    stats: CacheStats,
}

/// What a request's key finds.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// A sealed tree, held for this request until released.
    Hit(Borrow),
    /// No tree: this request fills it.
    Fill(FillTicket),
    /// Not from the cache: extract in the request's own jail.
    Uncached(&'static str),
}

/// A sealed tree a request holds (released after its jail is reclaimed).
#[derive(Debug)]
pub(crate) struct Borrow {
    key: String,
    /// Entries of the archive the tree holds.
    pub entries: u64,
    /// Its regular-file bytes.
    pub file_bytes: u64,
    /// Whether this request filled it.
    pub filled: bool,
}

/// The right (and the duty) to fill the tree of a key. Dropped unused (no jail could be taken
/// for the request, it was cancelled first, a panic), it gives the key back: requests waiting
/// for it fill it in turn, and the fill slot is free again.
#[derive(Debug)]
pub(crate) struct FillTicket {
    key: String,
    generation: u64,
    /// `None` once [`TreeCache::fill`] has settled the key.
    cache: Option<Arc<TreeCache>>,
}

impl Drop for FillTicket {
    fn drop(&mut self) {
        if let Some(c) = self.cache.take() {
            c.fill_settled(&self.key, self.generation, None);
            tracing::debug!(key = %self.key, "tree cache: a fill was given up before it started");
        }
    }
}

/// The keeper process and our end of its socket.
#[derive(Debug)]
struct KeeperConn {
    child: Child,
    sock: OwnedFd,
    /// Why the socket can no longer be trusted to pair an answer with its command (a command
    /// timed out, so its late answer may still arrive; the keeper went away). Replies carry
    /// no id: after this no command is sent again, and the cache is out of service.
    poisoned: Option<String>,
}

/// The tree cache.
#[derive(Debug)]
pub(crate) struct TreeCache {
    cfg: CacheConfig,
    /// How to start a keeper again: the binary, its logging flags, where it mounts.
    spawn: (std::path::PathBuf, Vec<String>, std::path::PathBuf),
    keeper: Mutex<KeeperConn>,
    state: Mutex<State>,
    changed: Condvar,
    next_fill: AtomicU64,
    /// The lock on the cache identity in the lease directory, held while the cache lives.
    _identity: Option<std::fs::File>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key of a request's tree: the claimed SHA-256 of its archive (lowercase hex, as Argo CD
/// sends it) and a digest of the options that change what is extracted. `None` for a claim
/// that is not a SHA-256.
pub fn tree_key(claimed_sha256: &str, options: &archive::Options) -> Option<String> {
    let hex_ok = claimed_sha256.len() == 64
        && claimed_sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex_ok {
        return None;
    }
    let mut opts = options.clone();
    // What only checks the bytes (not what is written) is not part of the key.
    opts.expected_sha256 = None;
    opts.skip_digest = false;
    let fp = Sha256::digest(serde_json::to_vec(&opts).ok()?);
    Some(format!("{claimed_sha256}-{}", hex::encode(&fp[..8])))
}

impl TreeCache {
    /// Start the keeper and hand it its namespace's maps: the cache identity and the jails'
    /// range onto themselves (the supervisor holds CAP_SETUID and CAP_SETGID for this).
    pub fn start(
        exe: &std::path::Path,
        log_args: &[String],
        mount_at: &std::path::Path,
        cfg: CacheConfig,
    ) -> Result<TreeCache, String> {
        let keeper = spawn_keeper(exe, log_args, mount_at, &cfg)?;
        Ok(TreeCache {
            spawn: (exe.to_owned(), log_args.to_vec(), mount_at.to_owned()),
            cfg,
            keeper: Mutex::new(keeper),
            state: Mutex::default(),
            changed: Condvar::new(),
            next_fill: AtomicU64::new(0),
            _identity: None,
        })
    }

    /// Start a new keeper in place of one that broke, when the bound allows (the caller saw
    /// `broken` set at least [`RESTART_AFTER`] ago and fewer than [`MAX_RESTARTS`] restarts).
    /// Every tree went with the old keeper's tmpfs (clones lent to running requests live on
    /// in their mounts); fills still feeding the old one fail and settle nothing here.
    fn restart(&self) {
        let mut k = lock(&self.keeper);
        {
            let mut st = lock(&self.state);
            let due = st
                .broken
                .as_ref()
                .is_some_and(|(_, since)| since.elapsed() >= RESTART_AFTER);
            if !due || st.restarts >= MAX_RESTARTS {
                return;
            }
            st.restarts += 1;
        }
        let (exe, log_args, mount_at) = &self.spawn;
        let fresh = spawn_keeper(exe, log_args, mount_at, &self.cfg);
        let mut st = lock(&self.state);
        match fresh {
            Ok(new) => {
                let old = std::mem::replace(&mut *k, new);
                stop_keeper(old);
                let why = st.broken.take().map(|(w, _)| w).unwrap_or_default();
                st.entries.clear();
                st.used = 0;
                st.fills = 0;
                st.generation += 1;
                tracing::warn!(
                    restart = st.restarts,
                    of = MAX_RESTARTS,
                    after = %why,
                    "tree cache: keeper restarted (its trees are gone; they fill again)"
                );
            }
            Err(e) => {
                tracing::error!(
                    restart = st.restarts,
                    of = MAX_RESTARTS,
                    error = %e,
                    "tree cache: the keeper could not be restarted"
                );
                if let Some((_, since)) = &mut st.broken {
                    *since = Instant::now();
                }
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Keep `lock` (the cache identity's lease lock) for as long as the cache lives.
    pub fn hold_identity(&mut self, lock: Option<std::fs::File>) {
        self._identity = lock;
    }

    /// The tree of `key`: held, to be filled by the caller, or not from the cache. Waits
    /// (until `deadline`) while another request fills it.
    pub fn lookup(self: &Arc<Self>, key: &str, deadline: Option<Instant>) -> Lookup {
        let restart_due = {
            let st = lock(&self.state);
            st.restarts < MAX_RESTARTS
                && st
                    .broken
                    .as_ref()
                    .is_some_and(|(_, since)| since.elapsed() >= RESTART_AFTER)
        };
        if restart_due {
            self.restart();
        }
        let mut st = lock(&self.state);
        loop {
            if st.broken.is_some() {
                st.stats.uncached += 1;
                return Lookup::Uncached("the cache is out of service");
            }
            st.clock += 1;
            let now = st.clock;
            let fills = st.fills;
            let used = st.used;
            match st.entries.get_mut(key) {
                Some(Entry::Ready(t)) => {
                    t.refs += 1;
                    t.last_used = now;
                    let b = Borrow {
                        key: key.to_owned(),
                        entries: t.entries,
                        file_bytes: t.file_bytes,
                        filled: false,
                    };
                    st.stats.hits += 1;
                    return Lookup::Hit(b);
                }
                Some(entry @ (Entry::Filling(_) | Entry::Evicting)) => {
                    // Waiting is worth it only while the filling stream moves: a request
                    // never waits on another client's stalled stream (it extracts in its own
                    // jail instead).
                    if let Entry::Filling(moved) = entry
                        && moved.elapsed() >= FILL_STALLED
                    {
                        st.stats.uncached += 1;
                        return Lookup::Uncached(
                            "the archive's tree is being filled by a stream that paused",
                        );
                    }
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    if left == Some(Duration::ZERO) {
                        st.stats.uncached += 1;
                        return Lookup::Uncached("the archive's tree is still being filled");
                    }
                    let wait = left.map_or(FILL_STALLED / 4, |l| l.min(FILL_STALLED / 4));
                    st = self
                        .changed
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                None if fills >= self.cfg.max_fills => {
                    st.stats.uncached += 1;
                    return Lookup::Uncached("other archives are being filled");
                }
                // Trees requests hold can keep the cache over its budget; a fill needs room
                // for a whole archive on the keeper's tmpfs beside them and the other fills.
                None if used
                    .saturating_add((fills as u64 + 1).saturating_mul(self.cfg.fill_bytes()))
                    > self.cfg.tmpfs_bytes() =>
                {
                    st.stats.uncached += 1;
                    return Lookup::Uncached("no room for a fill beside the trees in use");
                }
                None => {
                    st.entries
                        .insert(key.to_owned(), Entry::Filling(Instant::now()));
                    st.fills += 1;
                    return Lookup::Fill(FillTicket {
                        key: key.to_owned(),
                        generation: st.generation,
                        cache: Some(self.clone()),
                    });
                }
            }
        }
    }

    /// Fill the ticket's tree from `input` (the archive as it arrives; its end only after the
    /// bytes matched their checksum) in a confined filler, and seal it. On failure the entry
    /// is gone (a waiting request may fill it in turn) and the error is the one extracting
    /// in the request's own jail would have given.
    pub fn fill(
        &self,
        ticket: FillTicket,
        input: &mut dyn Read,
        options: &archive::Options,
        limits: FillLimits,
        deadline: Option<Instant>,
    ) -> Result<Borrow, FillFailed> {
        let mut ticket = ticket;
        let key = ticket.key.clone();
        let generation = ticket.generation;
        let id = self.next_fill.fetch_add(1, Ordering::Relaxed);
        let result = self.fill_inner(id, &key, input, options, limits, deadline);
        let out = match result {
            Ok((entries, file_bytes)) => {
                let bytes = file_bytes.saturating_add(entries.saturating_mul(ENTRY_OVERHEAD));
                self.fill_settled(
                    &key,
                    generation,
                    Some(Tree {
                        bytes,
                        entries,
                        file_bytes,
                        refs: 1,
                        last_used: 0,
                    }),
                );
                Ok(Borrow {
                    key,
                    entries,
                    file_bytes,
                    filled: true,
                })
            }
            Err(e) => {
                self.fill_settled(&key, generation, None);
                if matches!(e, FillFailed::NotStarted(_)) {
                    lock(&self.state).stats.uncached += 1;
                }
                Err(e)
            }
        };
        // Settled above: nothing for the ticket to give back.
        ticket.cache = None;
        self.evict_over_budget();
        out
    }

    /// The stream filling `key` delivered bytes.
    fn fill_moved(&self, key: &str) {
        if let Some(Entry::Filling(moved)) = lock(&self.state).entries.get_mut(key) {
            *moved = Instant::now();
        }
    }

    /// A fill of `key` is over: its tree is sealed (held once, by the request that filled
    /// it), or it failed or never started and the key is free again.
    fn fill_settled(&self, key: &str, generation: u64, sealed: Option<Tree>) {
        let mut st = lock(&self.state);
        if st.generation != generation {
            // A fill of a keeper since replaced: its tree went with it.
            return;
        }
        st.fills = st.fills.saturating_sub(1);
        match sealed {
            Some(mut tree) => {
                st.clock += 1;
                tree.last_used = st.clock;
                st.entries.insert(key.to_owned(), Entry::Ready(tree));
                st.used += tree.bytes;
                st.stats.fills += 1;
            }
            None => {
                if matches!(st.entries.get(key), Some(Entry::Filling(_))) {
                    st.entries.remove(key);
                }
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    fn fill_inner(
        &self,
        id: u64,
        key: &str,
        input: &mut dyn Read,
        options: &archive::Options,
        limits: FillLimits,
        deadline: Option<Instant>,
    ) -> Result<(u64, u64), FillFailed> {
        // Up to the keeper's answer to `Fill`, nothing of the stream has been read.
        let not_started =
            |e: String| FillFailed::NotStarted(self.out_of_service(format!("fill: {e}")));
        let (arch_r, arch_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| not_started(e.to_string()))?;
        let (reply_r, reply_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| not_started(e.to_string()))?;
        self.command(
            &KeeperCmd::Fill {
                id,
                options: options.clone(),
                limits,
            },
            &[arch_r.as_fd(), reply_w.as_fd()],
        )
        .map_err(not_started)?;
        // The filler's ends are the keeper's now.
        drop((arch_r, reply_w));
        self.fill_from(id, key, input, arch_w, reply_r, deadline)
            .map_err(FillFailed::Failed)
    }

    /// The rest of a fill, once the keeper took it: the stream into the filler, then the
    /// seal or the discard.
    fn fill_from(
        &self,
        id: u64,
        key: &str,
        input: &mut dyn Read,
        arch_w: OwnedFd,
        reply_r: OwnedFd,
        deadline: Option<Instant>,
    ) -> Result<(u64, u64), RequestError> {
        // Feed: the archive as it arrives, `E` once it ended (verified), nothing more if it
        // was aborted. A write error means the filler stopped; its reply says why.
        let mut w = std::fs::File::from(arch_w);
        let mut buf = vec![0u8; 64 * 1024];
        let mut ended = false;
        loop {
            match input.read(&mut buf) {
                Ok(0) => {
                    ended = jail_wire::protocol::write_frame(&mut w, b'E', &[]).is_ok()
                        && w.flush().is_ok();
                    break;
                }
                Ok(n) => {
                    self.fill_moved(key);
                    if jail_wire::protocol::write_frame(&mut w, b'D', &buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        drop(w);
        let reply = read_fill_reply(std::fs::File::from(reply_r), deadline);
        match (reply, ended) {
            (
                Ok(FillReply::Ok {
                    entries,
                    file_bytes,
                }),
                true,
            ) => {
                self.command(
                    &KeeperCmd::Seal {
                        id,
                        key: key.to_owned(),
                    },
                    &[],
                )
                .map_err(|e| {
                    let _ = self.command(&KeeperCmd::Discard { id }, &[]);
                    RequestError::internal(format!("tree cache: {e}"))
                })?;
                Ok((entries, file_bytes))
            }
            (reply, _) => {
                let _ = self.command(&KeeperCmd::Discard { id }, &[]);
                Err(match reply {
                    // The filler could not confine itself or open its staging directory:
                    // the cache, not the archive, is at fault.
                    Ok(FillReply::Err {
                        kind: ErrorKind::Internal,
                        message,
                    }) => self.out_of_service(format!("the filler: {message}")),
                    Ok(FillReply::Err { kind, message }) => RequestError::new(kind, message),
                    // Aborted before its end: the service says why (checksum, client gone).
                    Ok(FillReply::Ok { .. }) => {
                        RequestError::new(ErrorKind::Cancelled, "archive stream aborted")
                    }
                    Err(e) => RequestError::internal(format!("tree cache: the filler: {e}")),
                })
            }
        }
    }

    /// A read-only clone of the borrowed tree whose files appear owned by `uid`/`gid`.
    pub fn lend(&self, b: &Borrow, uid: u32, gid: u32) -> Result<OwnedFd, RequestError> {
        let mut fds = self
            .command_fds(
                &KeeperCmd::Lend {
                    key: b.key.clone(),
                    uid,
                    gid,
                },
                &[],
            )
            .map_err(|e| RequestError::internal(format!("tree cache: {e}")))?;
        fds.pop()
            .ok_or_else(|| RequestError::internal("tree cache: lend: no mount"))
    }

    /// A hit whose tree could not be lent, extracted in its request's own jail instead:
    /// counted as uncached.
    pub fn not_lent(&self) {
        let mut st = lock(&self.state);
        st.stats.hits = st.stats.hits.saturating_sub(1);
        st.stats.uncached += 1;
    }

    /// The request holding `b` is reclaimed (its jail, and so its clone, is gone).
    pub fn release(&self, b: Borrow) {
        {
            let mut st = lock(&self.state);
            if let Some(Entry::Ready(t)) = st.entries.get_mut(&b.key) {
                t.refs = t.refs.saturating_sub(1);
            }
        }
        self.evict_over_budget();
    }

    /// Remove least-recently-used trees no request holds until the budget holds.
    fn evict_over_budget(&self) {
        loop {
            let victim = {
                let mut st = lock(&self.state);
                if st.used <= self.cfg.budget {
                    return;
                }
                let v = st
                    .entries
                    .iter()
                    .filter_map(|(k, e)| match e {
                        Entry::Ready(t) if t.refs == 0 => Some((t.last_used, k.clone(), t.bytes)),
                        _ => None,
                    })
                    .min();
                let Some((_, key, bytes)) = v else { return };
                st.entries.insert(key.clone(), Entry::Evicting);
                st.used -= bytes;
                st.stats.evictions += 1;
                key
            };
            let done = self.command(
                &KeeperCmd::Evict {
                    key: victim.clone(),
                },
                &[],
            );
            {
                let mut st = lock(&self.state);
                if matches!(st.entries.get(&victim), Some(Entry::Evicting)) {
                    st.entries.remove(&victim);
                }
            }
            self.changed.notify_all();
            if let Err(e) = done {
                // The tree may still be on the tmpfs: no new fill could seal under its name
                // (the command failed, so the cache is out of service).
                tracing::warn!(error = %e, "tree cache: eviction failed");
                return;
            }
        }
    }

    /// Archives stated smaller than this are not cached (`spec.cache.minArchiveBytes`).
    pub fn min_archive_bytes(&self) -> u64 {
        self.cfg.min_archive_bytes
    }

    /// Counters and sizes.
    pub fn stats(&self) -> CacheStats {
        let st = lock(&self.state);
        let mut s = st.stats;
        s.bytes = st.used;
        s.in_service = st.broken.is_none();
        s.trees = st
            .entries
            .values()
            .filter(|e| matches!(e, Entry::Ready(_)))
            .count() as u64;
        s
    }

    /// The cache stops serving (every later request extracts in its own jail) and says why.
    fn out_of_service(&self, why: String) -> RequestError {
        let mut st = lock(&self.state);
        if st.broken.is_none() {
            if st.restarts < MAX_RESTARTS {
                tracing::error!(error = %why, restarts_left = MAX_RESTARTS - st.restarts, "TREE CACHE OUT OF SERVICE: requests extract in their own jails until the keeper is restarted");
            } else {
                tracing::error!(error = %why, "TREE CACHE OUT OF SERVICE: the keeper was restarted {MAX_RESTARTS} times; requests extract in their own jails from now on");
            }
            st.broken = Some((why.clone(), Instant::now()));
        }
        RequestError::internal(format!("tree cache: {why}"))
    }

    fn command(&self, cmd: &KeeperCmd, fds: &[std::os::fd::BorrowedFd<'_>]) -> Result<(), String> {
        self.command_fds(cmd, fds).map(|_| ())
    }

    fn command_fds(
        &self,
        cmd: &KeeperCmd,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<Vec<OwnedFd>, String> {
        let mut k = lock(&self.keeper);
        if let Some(why) = &k.poisoned {
            return Err(format!("keeper: out of service ({why})"));
        }
        let why = match send_msg(k.sock.as_fd(), cmd, fds) {
            Err(e) => format!("keeper: sending {}: {e}", cmd.name()),
            Ok(()) => match recv_msg::<KeeperReply>(k.sock.as_fd()) {
                Ok(Some((KeeperReply::Ok | KeeperReply::Started { .. }, fds))) => return Ok(fds),
                Ok(Some((KeeperReply::Failed(e), _))) => return Err(e),
                Ok(None) => "keeper: gone".to_owned(),
                Err(e) => format!("keeper: no answer to {}: {e}", cmd.name()),
            },
        };
        // The exchange broke: a late answer could be read as the next command's. Never send
        // on this socket again.
        k.poisoned = Some(why.clone());
        let _ = rustix::net::shutdown(&k.sock, rustix::net::Shutdown::Both);
        drop(k);
        let _ = self.out_of_service(why.clone());
        Err(why)
    }

    /// Stop the keeper (the cache's tmpfs goes with its namespaces).
    pub fn shutdown(&self) {
        let mut k = lock(&self.keeper);
        let _ = rustix::net::shutdown(&k.sock, rustix::net::Shutdown::Both);
        wait_or_kill(&mut k.child);
    }
}

/// End a keeper that is no longer ours: its socket closed, then waited for briefly.
fn stop_keeper(mut k: KeeperConn) {
    let _ = rustix::net::shutdown(&k.sock, rustix::net::Shutdown::Both);
    wait_or_kill(&mut k.child);
}

/// Wait up to 2 s for a keeper that saw its socket close, else kill it; untracked either way.
fn wait_or_kill(child: &mut Child) {
    let pid = child.id() as i32;
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            jail_sys::reaper::untrack(pid);
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Still running: it cannot outlive us by much, and its cache goes with its namespaces.
    let _ = child.kill();
    jail_sys::reaper::untrack(pid);
}

/// Start a keeper and hand it its namespace's maps: the cache identity and the jails' range
/// onto themselves (the supervisor holds CAP_SETUID and CAP_SETGID for this).
fn spawn_keeper(
    exe: &std::path::Path,
    log_args: &[String],
    mount_at: &std::path::Path,
    cfg: &CacheConfig,
) -> Result<KeeperConn, String> {
    let (first, count) = cfg.range;
    if (first..first.saturating_add(count)).contains(&cfg.uid) {
        return Err(format!(
            "spec.cache.uid {} is inside spec.uidRange {first}+{count}: the cache identity must never run a request",
            cfg.uid
        ));
    }
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| e.to_string())?;
    rustix::net::sockopt::set_socket_timeout(
        &ours,
        rustix::net::sockopt::Timeout::Recv,
        Some(KEEPER_ANSWER),
    )
    .map_err(|e| e.to_string())?;
    let tmpfs = cfg.tmpfs_bytes();
    let args = KeeperArgs {
        uid: cfg.uid,
        gid: cfg.uid,
        mount: mount_at.to_owned(),
        bytes: tmpfs,
    };
    let mut cmd = Command::new(exe);
    cmd.arg(KEEPER_ARG)
        .args(log_args)
        .args(args.to_args())
        .env_clear()
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut child = jail_sys::reaper::spawn_tracked(&mut cmd).map_err(|e| e.to_string())?;
    let pid = child.id();
    let handshake = (|| {
        expect_ok(recv_msg::<KeeperReply>(ours.as_fd()))?;
        for (file, id) in [("uid_map", cfg.uid), ("gid_map", cfg.uid)] {
            std::fs::write(
                format!("/proc/{pid}/{file}"),
                format!("{id} {id} 1\n{first} {first} {count}\n"),
            )
            .map_err(|e| format!("keeper's {file}: {e}"))?;
        }
        send_msg(ours.as_fd(), &KeeperReply::Ok, &[]).map_err(|e| e.to_string())?;
        expect_ok(recv_msg::<KeeperReply>(ours.as_fd()))
    })();
    if let Err(e) = handshake {
        // Closing the socket ends it (a signal may not reach it once it is the cache
        // identity); reaped by the orphan reaper if it takes longer than this.
        drop(ours);
        let _ = child.kill();
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end && !matches!(child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(5));
        }
        jail_sys::reaper::untrack(pid as i32);
        return Err(e);
    }
    tracing::debug!(pid, bytes = tmpfs, "tree cache keeper started");
    Ok(KeeperConn {
        child,
        sock: ours,
        poisoned: None,
    })
}

fn expect_ok(r: std::io::Result<Option<(KeeperReply, Vec<OwnedFd>)>>) -> Result<(), String> {
    match r {
        Ok(Some((KeeperReply::Ok, _))) => Ok(()),
        Ok(Some((KeeperReply::Failed(e), _))) => Err(e),
        Ok(Some((other, _))) => Err(format!("keeper: unexpected {other:?}")),
        Ok(None) => Err("keeper: exited during start-up".into()),
        Err(e) => Err(format!("keeper: {e}")),
    }
}

/// The filler's `R` frame (it is written as the filler ends; bounded in time by `deadline`
/// and in size by the frame limit).
fn read_fill_reply(r: std::fs::File, deadline: Option<Instant>) -> Result<FillReply, String> {
    let timeout = deadline
        .map(|d| d.saturating_duration_since(Instant::now()))
        .unwrap_or(Duration::from_secs(600))
        .max(Duration::from_millis(100));
    let mut fds = [rustix::event::PollFd::new(&r, rustix::event::PollFlags::IN)];
    let t = rustix::event::Timespec::try_from(timeout).ok();
    match rustix::event::poll(&mut fds, t.as_ref()) {
        Ok(0) => return Err("no answer before the request's deadline".into()),
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    let mut r = r;
    jail_wire::protocol::read_json_frame::<FillReply>(&mut r, b'R')?
        .ok_or_else(|| "it ended without an answer".to_owned())
}

impl Drop for TreeCache {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The cache shared by the runner's threads.
pub(crate) type SharedCache = Arc<TreeCache>;
