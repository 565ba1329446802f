//! One request in its jail, step by step (docs/supervisor.md, "Per request").

use super::feed::{
    Feed, TreeHold, attach_tree, fall_back_to_extraction, receive_listener, receive_mounter,
};
use super::reply::ReplyShare;
use super::reply::read_reply;
use super::verdict::{explain_denials, verdict};
use super::{
    Inner, Jail, LANDLOCK_LOG_WAIT, LANDLOCK_LOG_WAIT_NAMED, feed, file_denials, internal, lock,
    reply,
};
use crate::cache::{FillFailed, FillTicket};
use crate::plan::Plan;
use crate::reclaim::ReclaimArgs;
use cgroups::{CgroupStats, RequestCgroup};
use feed::FillJob;
use jail_sys::cancel::CancelToken;
use jail_wire::protocol::KILL_GRACE;
use jail_wire::protocol::LandlockStatus;
use jail_wire::protocol::{Creds, Header, Reply, write_frame};
use jail_wire::record::Recorder;
use reply::{RawReply, ReplyPermit};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use vocab::request::RequestError;

/// Who a taken jail is, for the audit record: its identity, its cgroup and its name.
#[derive(Clone)]
struct Who {
    creds: Option<Creds>,
    cgroup: Option<RequestCgroup>,
    name: String,
}

impl Who {
    fn of(jail: &Jail) -> Self {
        Self {
            creds: jail.creds,
            cgroup: jail.cgroup.clone(),
            name: jail.name.clone(),
        }
    }
}

/// What the supervisor learns of a request's jail on the way (steps 5, 8 and 12), written to
/// the audit record once, after the reply or wherever the request ended
/// ([`Findings::write`]), and before the verdict reads it.
#[derive(Default)]
struct Findings {
    who: Option<Who>,
    /// The egress proxy's connections and how many it could not record.
    egress: Option<(Vec<vocab::egress::Connection>, u64)>,
    stats: Option<CgroupStats>,
}

impl Findings {
    fn write(self, record: &Recorder) {
        if let Some(s) = self.stats {
            tracing::debug!(
                peak_memory_bytes = s.peak_memory_bytes,
                oom_kills = s.oom_kills,
                pids_refused = s.pids_refused,
                "request cgroup"
            );
        }
        jail_wire::record::update(record, |r| {
            if let Some(who) = &self.who {
                r.uid = who.creds.map(|c| c.uid);
                r.gid = who.creds.map(|c| c.gid);
                r.cgroup = who.cgroup.as_ref().map(|_| who.name.clone());
            }
            if let Some((connections, unrecorded)) = self.egress {
                r.egress = connections;
                r.egress_unrecorded = unrecorded;
            }
            if self.who.is_some() {
                r.peak_memory_bytes = self.stats.map(|s| s.peak_memory_bytes);
                r.oom_kills = self.stats.map(|s| s.oom_kills);
            }
        });
    }
}

/// What a request sends its jail: the archive's stream, whether its bytes go to the jail
/// (`forward`: not when a tree is in place or a fill took them), and the tree it works on.
struct Stream {
    input: Box<dyn Read + Send>,
    forward: bool,
    /// Returned to the cache if the request ends before a jail holds it.
    hold: TreeHold,
    /// A fill still to do: the ticket and how to extract.
    fill: Option<(FillTicket, Box<FillJob>)>,
    /// This request filled the tree from its own stream.
    filled: bool,
}

/// The jail once the request owns it (step 7): its pipes, the tree lent for its UID, and
/// where Landlock's records of its denials come from.
struct Owned<'l> {
    stdin: Option<std::fs::File>,
    stdout: Option<std::fs::File>,
    lent: Option<Result<std::os::fd::OwnedFd, RequestError>>,
    denial_log: Option<(&'l crate::landlock_log::LandlockLog, u32)>,
}

/// The reply as step 12 read it, with what step 13 judges it by.
struct ReadReply {
    raw: Option<Vec<u8>>,
    permit: Option<ReplyPermit>,
    stats: Option<CgroupStats>,
    container_oom_before: Option<u64>,
    who: Who,
    denial_log_uid: Option<u32>,
}

/// One request (or the probe) in its jail: what every step needs. Its methods are the steps
/// 5–13 of a request (docs/supervisor.md, "Per request"), in order; [`Inner::run_jail`]
/// calls them top to bottom.
struct Run<'a> {
    inner: &'a Arc<Inner>,
    request: &'a str,
    plan: &'a Arc<Plan>,
    header: &'a Header,
    cancel: &'a CancelToken,
    deadline: Option<Instant>,
    record: &'a Recorder,
}

impl Inner {
    /// Run one request (or the probe) in the next jail, steps 5–13 of a request
    /// (docs/supervisor.md, "Per request"; 1–4 are the service's, 14–16 the answer, reclaim
    /// and accounting):
    ///
    /// 5. take the prepared jail ([`Run::take`]);
    /// 6. a fill: stream the archive into the filler and hold its sealed tree, or extract
    ///    in the jail when the fill could not start ([`Run::fill`]);
    /// 7. lend the tree for the jail's UID; from here the request owns the jail (reclaim
    ///    finds it by the request's name) ([`Run::own`]);
    /// 8. `network: allowList`: serve the listener the jail made ([`Run::serve_egress`]);
    /// 9. put the lent tree in place through the jail's mounter, or fall back to
    ///    extraction ([`Run::place_tree`]);
    /// 10. stream the header, the archive (drained when a tree is in place) and its end,
    ///     which comes only once the bytes matched their checksum ([`stream_frames`]);
    /// 11. have the watcher bound the jail's life: cancel, deadline ([`Run::watch`]);
    /// 12. read the reply ([`Run::read`]); the jail's identity, cgroup figures and egress
    ///     connections go into the audit record ([`Findings::write`]);
    /// 13. judge it ([`verdict`]) and explain what the sandbox refused
    ///     ([`Run::landlock_denials`], [`explain_denials`]) ([`Run::judge`]).
    pub(super) fn run_jail(
        self: &Arc<Self>,
        (request, plan): (&str, &Arc<Plan>),
        header: &Header,
        feed: Feed,
        cancel: &CancelToken,
        deadline: Option<Instant>,
        record: &Recorder,
    ) -> Result<(Reply, ReplyShare), RequestError> {
        let run = Run {
            inner: self,
            request,
            plan,
            header,
            cancel,
            deadline,
            record,
        };
        let mut findings = Findings::default();
        let read = run.to_the_reply(feed, &mut findings);
        findings.write(record);
        run.judge(read?)
    }
}

impl Run<'_> {
    /// Steps 5–12, each a call; what they learn of the jail goes into `findings`.
    fn to_the_reply(&self, feed: Feed, findings: &mut Findings) -> Result<ReadReply, RequestError> {
        let mut stream = Stream::of(feed, self.inner.cache.get().cloned());
        // 5.
        let jail = self.take()?;
        let who = Who::of(&jail);
        findings.who = Some(who.clone());
        let container_oom_before = self.inner.container_ooms(&who);
        // 6.
        let jail = self.fill(jail, &mut stream)?;
        // 7.
        let mut owned = self.own(jail, &mut stream);
        // 8.
        let proxy = self.serve_egress(owned.stdin.as_ref(), who.creds)?;
        // 9.
        let body = self.place_tree(owned.stdin.as_ref(), owned.lent.take(), &mut stream)?;
        // 10.
        let stdin = stream_frames(owned.stdin.take(), &body, stream);
        // 11.
        let done = self.watch(stdin, who.creds);
        // 12.
        let raw = self.read(owned.stdout.take(), &done);
        if let Some(p) = proxy {
            findings.egress = Some(p.finish());
        }
        let stats = who.cgroup.as_ref().map(|c| c.stats());
        findings.stats = stats;
        let (raw, permit) = match raw? {
            Some((raw, permit)) => (Some(raw), permit),
            None => (None, None),
        };
        Ok(ReadReply {
            raw,
            permit,
            stats,
            container_oom_before,
            denial_log_uid: owned.denial_log.map(|(_, uid)| uid),
            who,
        })
    }

    /// Step 5: the prepared jail of the request's policy ([`Inner::take`]).
    fn take(&self) -> Result<Jail, RequestError> {
        self.inner
            .take(self.request, self.plan, self.deadline, self.cancel)
    }

    /// Step 6, a fill: the stream goes to the filler; the jail gets the tree once it is
    /// sealed. A failed fill hands the jail to reclaim (as every jail a request took).
    fn fill(&self, jail: Jail, stream: &mut Stream) -> Result<Jail, RequestError> {
        let Some((ticket, job)) = stream.fill.take() else {
            return Ok(jail);
        };
        stream.filled = true;
        match self
            .inner
            .fill_tree(ticket, &mut stream.input, &job, self.deadline, self.record)
        {
            Ok(b) => {
                stream.input = Box::new(std::io::empty());
                stream.hold.0 = Some(b);
                Ok(jail)
            }
            // The cache is an optimisation: a fill that never started read nothing of the
            // stream, which the jail now extracts as with the cache off.
            Err(FillFailed::NotStarted(e)) => {
                tracing::warn!(error = %e.message, "tree cache: the fill could not start; this request extracts in its own jail");
                jail_wire::record::update(self.record, |r| {
                    r.tree_cache = Some(vocab::record::TreeCacheUse::Uncached);
                    r.archive = None;
                });
                stream.forward = true;
                Ok(jail)
            }
            Err(FillFailed::Failed(e)) => {
                lock(&self.inner.pending).insert(self.request.to_owned(), jail);
                Err(e)
            }
        }
    }

    /// Step 7: the tree lent for the jail's UID and held until the jail is gone; the request
    /// owns the jail (reclaim finds it by the request's name).
    fn own(&self, mut jail: Jail, stream: &mut Stream) -> Owned<'_> {
        let inner = self.inner;
        let lent = match (&stream.hold.0, jail.creds, inner.cache.get()) {
            (Some(b), Some(c), Some(cache)) => Some(cache.lend(b, c.uid, c.gid)),
            (Some(_), _, _) => Some(Err(internal("tree cache: a tree needs a leased UID"))),
            _ => None,
        };
        jail.tree = stream.hold.0.take();
        let denial_log = inner.landlock_log.get().zip(jail.creds.map(|c| c.uid));
        if let Some((log, uid)) = denial_log {
            log.clear(uid);
        }
        let owned = Owned {
            stdin: jail.stdin.take(),
            stdout: jail.stdout.take(),
            lent,
            denial_log,
        };
        lock(&inner.pending).insert(self.request.to_owned(), jail);
        owned
    }

    /// Step 8, `network: allowList`: serve the listener the jail made on its loopback (it
    /// came over its stdin socket while it confined itself).
    fn serve_egress(
        &self,
        stdin: Option<&std::fs::File>,
        creds: Option<Creds>,
    ) -> Result<Option<egress::ProxyHandle>, RequestError> {
        let task = match self.header {
            Header::Request { task, .. } => Some(&**task),
            Header::Probe { .. } => None,
        };
        let (Some(p), Some(sock)) = (self.plan.egress_proxy(task), stdin) else {
            return Ok(None);
        };
        match receive_listener(sock) {
            Ok((l, shared)) => {
                // On the server's loopback: only the request's own processes are served (its
                // UID; the server's in the shared-UID model).
                let p = if shared {
                    let own = rustix::process::getuid().as_raw();
                    p.admit_only_uid(creds.map_or(own, |c| c.uid))
                } else {
                    p
                }
                .with_deadline(self.deadline);
                p.start(l)
                    .map(Some)
                    .map_err(|e| internal(format!("egress proxy: {e}")))
            }
            // The jail stopped before handing it over; its reply says why.
            Err(e) => {
                tracing::warn!(error = %e, "no egress listener from the jail");
                Ok(None)
            }
        }
    }

    /// Step 9: the jail's mounter puts the lent tree in place before the header; without
    /// one, its socket is closed and the jail extracts. Returns the header frame's body.
    fn place_tree(
        &self,
        stdin: Option<&std::fs::File>,
        lent: Option<Result<std::os::fd::OwnedFd, RequestError>>,
        stream: &mut Stream,
    ) -> Result<Vec<u8>, RequestError> {
        let inner = self.inner;
        let body = serde_json::to_vec(self.header).map_err(|e| internal(e.to_string()))?;
        // The cache is node-wide: every plan has the default's.
        let mounter = match (&inner.cfg.plans.default_plan().cache, stdin) {
            (Some(_), Some(sock)) => receive_mounter(sock).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "no word of the jail's mounter");
                None
            }),
            _ => None,
        };
        match (lent, mounter) {
            (Some(Ok(tree)), Some(m)) => {
                attach_tree(&m, tree)
                    .map_err(|e| internal(format!("tree cache: attaching the tree: {e}")))?;
                let mut h = self.header.clone();
                if let Header::Request { tree_attached, .. } = &mut h {
                    *tree_attached = true;
                }
                serde_json::to_vec(&h).map_err(|e| internal(e.to_string()))
            }
            // A hit whose tree cannot be lent (the keeper failed or is gone) or attached (no
            // mounter) still has its whole stream to come: the jail extracts it, as without
            // the cache (its mounter socket, if any, is closed unused). A fill's stream went
            // to the filler, so its request fails instead.
            (Some(lent), mounter) if !stream.filled && (lent.is_err() || mounter.is_none()) => {
                let why = match lent {
                    Err(e) => e.message,
                    Ok(_) => "the jail has no mounter".to_owned(),
                };
                tracing::warn!(error = %why, "tree cache: the tree could not be lent; this request extracts in its own jail");
                fall_back_to_extraction(self.record, inner.cache.get());
                stream.forward = true;
                Ok(body)
            }
            (Some(lent), None) => {
                lent?;
                Err(internal(
                    "tree cache: the jail has no mounter (no mount or PID namespace here)",
                ))
            }
            (Some(Err(e)), Some(_)) => Err(e),
            (None, _) => Ok(body),
        }
    }

    /// Step 11: after `E`, closing stdin tells the jail to cancel; if it has not exited a
    /// grace period later, its whole UID is killed (the runner's one watcher thread). The
    /// flag tells the watcher the reply is in.
    fn watch(&self, stdin: Option<std::fs::File>, creds: Option<Creds>) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        self.inner.watcher.watch(crate::watch::Watch {
            cancel: self.cancel.clone(),
            deadline: self.deadline,
            done: done.clone(),
            stdin,
            kill: creds.map(|c| ReclaimArgs {
                creds: Some((c.uid, c.gid)),
                work_root: self.inner.cfg.work_root.clone(),
                name: None,
            }),
            exe: self.inner.cfg.exe.clone(),
        });
        done
    }

    /// Step 12: the reply, which carries at most what one gRPC message may (or an error with
    /// a command's stderr), with room for the record. Manifests travel as JSON strings inside
    /// the JSON frame, where escaping (`"` → `\"`) at most doubles them. `None`: the jail
    /// closed its stdout without one.
    fn read(
        &self,
        stdout: Option<std::fs::File>,
        done: &AtomicBool,
    ) -> Result<Option<RawReply>, RequestError> {
        let cap = match self.header {
            Header::Request { task, .. } => task.reply_bytes.max(task.output_bytes),
            Header::Probe { .. } => 1024,
        }
        .saturating_mul(2)
        .saturating_add(1 << 20);
        let reply_deadline = self.deadline.map(|d| d + KILL_GRACE);
        let raw =
            stdout.map(|mut s| read_reply(&mut s, cap, &self.inner.reply_memory, reply_deadline));
        // The watcher sees `done` and drops the watch (and the jail's stdin, which the jail no
        // longer reads); nothing on the reply's path waits for it.
        done.store(true, Ordering::SeqCst);
        self.cancel.poke();
        Ok(raw.transpose()?.flatten())
    }

    /// Step 13, the verdict. No reply: how the jail itself ended says why (an allocation it
    /// could not make aborts it). Then what the sandbox refused is said.
    fn judge(&self, read: ReadReply) -> Result<(Reply, ReplyShare), RequestError> {
        let jail_signal = if read.raw.is_none() {
            self.inner.jail_signal(self.request)
        } else {
            None
        };
        let container_oom = read
            .container_oom_before
            .zip(self.inner.container_ooms(&read.who))
            .is_some_and(|(before, after)| after > before);
        let reply = verdict(
            read.raw,
            read.stats,
            container_oom,
            self.plan,
            self.cancel,
            self.record,
            jail_signal,
        )?;
        let denial_log = self.inner.landlock_log.get().zip(read.denial_log_uid);
        self.landlock_denials(denial_log, &reply);
        // The permit (supervisor-wide reply memory) goes with the outcome until the response
        // is written.
        Ok((
            explain_denials(reply, self.record, self.plan),
            ReplyShare::new(read.permit),
        ))
    }

    /// Step 13: what Landlock refused the request's commands. The kernel's records when it
    /// gives them: a failed request waits for them (they arrive a few milliseconds after the
    /// denial) to say why it failed; a successful one takes those already there, for the
    /// audit event. A failed request with none (no audit reader in a pod, audit off) gets
    /// the paths its error names as refused that no `spec.filesystem` rule covers
    /// ([`file_denials::inferred`]), when its jail was under Landlock.
    fn landlock_denials(
        &self,
        denial_log: Option<(&crate::landlock_log::LandlockLog, u32)>,
        reply: &Reply,
    ) {
        let mut denied = match (denial_log, reply) {
            // An error that calls an access refused waits longer, for a record of something
            // it names: the records come late and in order, so a tool's start-up probes can
            // be here while the denial that failed it is not.
            (Some((log, uid)), Reply::Err { message, .. })
                if file_denials::says_refused(message) =>
            {
                log.take_when(uid, LANDLOCK_LOG_WAIT_NAMED, |ds| {
                    ds.iter()
                        .any(|d| !d.object.is_empty() && message.contains(d.object.as_str()))
                })
            }
            (Some((log, uid)), Reply::Err { .. }) => log.take(uid, LANDLOCK_LOG_WAIT),
            (Some((log, uid)), Reply::Ok { .. }) => log.take(uid, Duration::ZERO),
            (None, _) => Vec::new(),
        };
        if let Reply::Err {
            message,
            report: Some(report),
            ..
        } = reply
            && denied.is_empty()
            && report.landlock != LandlockStatus::None
        {
            let own = [self.inner.cfg.work_root.as_path(), Path::new("/tmp")];
            denied = file_denials::inferred(message, self.plan.file_rules(), &own);
        }
        // No policy field is the way to the server's own directories (its config, socket
        // and policy directories, the work root with every request's tree), the pod's shared
        // memory, /proc or /sys: the error and `policy suggest` must not point a reader at one.
        let cfg = &self.inner.cfg;
        let shared = [Path::new("/proc"), Path::new("/sys"), Path::new("/dev/shm")];
        let own = cfg.probe_writes.iter().map(PathBuf::as_path);
        let never: Vec<&Path> = shared
            .into_iter()
            .chain(own)
            .chain([cfg.work_root.as_path()])
            .collect();
        for d in &mut denied {
            if never.iter().any(|p| Path::new(&d.object).starts_with(p)) {
                d.allowed_by = None;
            }
        }
        if !denied.is_empty() {
            jail_wire::record::update(self.record, |r| r.landlock_denials = denied);
        }
    }
}

impl Stream {
    /// With a tree, the bytes are received and verified but not sent: only their end is.
    fn of(feed: Feed, cache: Option<crate::cache::SharedCache>) -> Self {
        let (input, tree, fill) = match feed {
            Feed::Archive(input) => (input, None, None),
            Feed::Tree(b, rest) => (rest, Some(b), None),
            Feed::Fill(ticket, input, job) => (input, None, Some((ticket, job))),
        };
        Stream {
            input,
            forward: tree.is_none() && fill.is_none(),
            hold: TreeHold(tree, cache),
            fill,
            filled: false,
        }
    }
}

impl Inner {
    /// The container's OOM kills so far, for a jail without a cgroup of its own: the count
    /// before and after says whether the container's memory limit ended the request.
    fn container_ooms(&self, who: &Who) -> Option<u64> {
        match (&who.cgroup, &self.cfg.container_oom) {
            (None, Some(c)) => c.read(),
            _ => None,
        }
    }

    /// The signal that ended `request`'s jail (or its PID namespace's init), if one did
    /// (waiting briefly: its stdout closes as it exits).
    pub(super) fn jail_signal(&self, request: &str) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            {
                let mut pending = lock(&self.pending);
                let process = pending.get_mut(request)?.process.as_mut()?;
                match process.try_wait() {
                    // Behind its PID namespace's init, a signal arrives as 128 + its number.
                    Ok(Some(st)) => {
                        return st
                            .signal()
                            .or_else(|| st.code().filter(|c| *c > 128).map(|c| c - 128));
                    }
                    Ok(None) => {}
                    Err(_) => return None,
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Step 10: the header, then the archive as it arrives (drained, not sent, when `forward`
/// is false: a tree is in place), then its end, which the service lets through only once the
/// bytes matched their checksum. Returns the jail's stdin for the watcher; `None` when a
/// write failed (the jail already stopped: it refused the archive, or could not confine
/// itself; its reply says why) or there was none.
fn stream_frames(
    stdin: Option<std::fs::File>,
    body: &[u8],
    mut stream: Stream,
) -> Option<std::fs::File> {
    let mut w = stdin?;
    let mut ok = write_frame(&mut w, b'H', body).is_ok();
    let mut buf = vec![0u8; 64 * 1024];
    while ok {
        match stream.input.read(&mut buf) {
            Ok(0) => {
                ok = write_frame(&mut w, b'E', &[]).is_ok() && w.flush().is_ok();
                break;
            }
            Ok(n) if stream.forward => ok = write_frame(&mut w, b'D', &buf[..n]).is_ok(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Aborted: checksum mismatch, or the client gone (closed without `E`).
            Err(_) => ok = false,
        }
    }
    ok.then_some(w)
}
