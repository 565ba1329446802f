//! One request in its jail, step by step (docs/supervisor.md, "Per request").

use super::*;
use jail_wire::protocol::LandlockStatus;

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

    /// Step 8's record, once the reply is read: the egress connections, the jail's identity
    /// and its cgroup's figures.
    fn record_after(
        &self,
        proxy: Option<egress::ProxyHandle>,
        record: &Recorder,
    ) -> Option<CgroupStats> {
        if let Some(p) = proxy {
            let (connections, unrecorded) = p.finish();
            jail_wire::record::update(record, |r| {
                r.egress = connections;
                r.egress_unrecorded = unrecorded;
            });
        }
        let stats = self.cgroup.as_ref().map(|c| c.stats());
        self.record(record);
        jail_wire::record::update(record, |r| {
            r.peak_memory_bytes = stats.map(|s| s.peak_memory_bytes);
            r.oom_kills = stats.map(|s| s.oom_kills);
        });
        if let Some(s) = stats {
            tracing::debug!(
                peak_memory_bytes = s.peak_memory_bytes,
                oom_kills = s.oom_kills,
                pids_refused = s.pids_refused,
                "request cgroup"
            );
        }
        stats
    }

    /// The supervisor's part of the audit record that names the jail.
    fn record(&self, record: &Recorder) {
        jail_wire::record::update(record, |r| {
            r.uid = self.creds.map(|c| c.uid);
            r.gid = self.creds.map(|c| c.gid);
            r.cgroup = self.cgroup.as_ref().map(|_| self.name.clone());
        });
    }
}

impl Inner {
    /// Run one request (or the probe) in the next jail:
    ///
    /// 1. take the prepared jail ([`Inner::take`]);
    /// 2. a fill: stream the archive into the filler and hold its sealed tree, or extract
    ///    in the jail when the fill could not start ([`Inner::fill_tree`]);
    /// 3. lend the tree for the jail's UID; from here the request owns the jail (reclaim
    ///    finds it by the request's name);
    /// 4. `network: allowList`: serve the listener the jail made ([`Inner::serve_egress`]);
    /// 5. put the lent tree in place through the jail's mounter, or fall back to
    ///    extraction ([`Inner::place_tree`]);
    /// 6. stream the header, the archive (drained when a tree is in place) and its end,
    ///    which comes only once the bytes matched their checksum ([`stream_frames`]);
    /// 7. have the watcher bound the jail's life (cancel, deadline);
    /// 8. read the reply ([`read_reply`]) and record the jail's identity, cgroup figures
    ///    and egress connections;
    /// 9. judge it ([`verdict`]) and explain what the sandbox refused
    ///    ([`Inner::landlock_denials`], [`explain_denials`]).
    pub(super) fn run_jail(
        self: &Arc<Self>,
        (request, plan): (&str, &Arc<Plan>),
        header: &Header,
        feed: Feed,
        cancel: &CancelToken,
        deadline: Option<Instant>,
        record: &Recorder,
    ) -> Result<(Reply, ReplyShare), RequestError> {
        // With a tree, the bytes are received and verified but not sent: only their end is.
        let (mut input, tree, fill) = match feed {
            Feed::Archive(input) => (input, None, None),
            Feed::Tree(b, rest) => (rest, Some(b), None),
            Feed::Fill(ticket, input, job) => (input, None, Some((ticket, job))),
        };
        let mut forward = tree.is_none() && fill.is_none();
        // Returned to the cache if this ends before a jail holds it.
        let mut hold = TreeHold(tree, self.cache.get().cloned());

        // 1. The jail.
        let mut jail = self.take(request, plan, deadline, cancel)?;
        let who = Who::of(&jail);
        let ooms_before = self.container_ooms(&who);

        // 2. A fill: the stream goes to the filler; the jail gets the tree once it is sealed.
        let filled = fill.is_some();
        if let Some((ticket, job)) = fill {
            match self.fill_tree(ticket, &mut input, &job, deadline, record) {
                Ok(b) => {
                    input = Box::new(std::io::empty());
                    hold.0 = Some(b);
                }
                // The cache is an optimisation: a fill that never started read nothing of the
                // stream, which the jail now extracts as with the cache off.
                Err(FillFailed::NotStarted(e)) => {
                    tracing::warn!(error = %e.message, "tree cache: the fill could not start; this request extracts in its own jail");
                    jail_wire::record::update(record, |r| {
                        r.tree_cache = Some(jail_wire::record::TreeCacheUse::Uncached);
                        r.archive = None;
                    });
                    forward = true;
                }
                Err(FillFailed::Failed(e)) => {
                    who.record(record);
                    // Reclaimed with the request, as every jail it took.
                    lock(&self.pending).insert(request.to_owned(), jail);
                    return Err(e);
                }
            }
        }

        // 3. The tree lent for the jail's UID, held until the jail is gone; the request owns
        // the jail.
        let mut stdin = jail.stdin.take();
        let stdout = jail.stdout.take();
        let lent = match (&hold.0, who.creds, self.cache.get()) {
            (Some(b), Some(c), Some(cache)) => Some(cache.lend(b, c.uid, c.gid)),
            (Some(_), _, _) => Some(Err(internal("tree cache: a tree needs a leased UID"))),
            _ => None,
        };
        jail.tree = hold.0.take();
        let denial_log = self.landlock_log.get().zip(who.creds.map(|c| c.uid));
        if let Some((log, uid)) = denial_log {
            log.clear(uid);
        }
        lock(&self.pending).insert(request.to_owned(), jail);

        // 4. Egress.
        let proxy = self.serve_egress(plan, header, stdin.as_ref(), who.creds, deadline)?;

        // 5. The tree in place, or the archive to extract.
        let body = self.place_tree(header, stdin.as_ref(), lent, filled, record, &mut forward)?;

        // 6. The frames. A write error means the jail already stopped (it refused the
        // archive, or could not confine itself); its reply says why.
        if let Some(w) = stdin.as_mut()
            && !stream_frames(w, &body, &mut input, forward)
        {
            stdin = None;
        }
        drop(input);

        // 7. After `E`, closing stdin tells the jail to cancel; if it has not exited a grace
        // period later, its whole UID is killed (the runner's one watcher thread).
        let done = Arc::new(AtomicBool::new(false));
        self.watcher.watch(crate::watch::Watch {
            cancel: cancel.clone(),
            deadline,
            done: done.clone(),
            stdin,
            kill: who.creds.map(|c| ReclaimArgs {
                creds: Some((c.uid, c.gid)),
                work_root: self.cfg.work_root.clone(),
                name: None,
            }),
            exe: self.cfg.exe.clone(),
        });

        // 8. The reply carries at most what one gRPC message may (or an error with a
        // command's stderr), with room for the record. Manifests travel as JSON strings
        // inside the JSON frame, where escaping (`"` → `\"`) at most doubles them.
        let cap = match header {
            Header::Request { task, .. } => task.reply_bytes.max(task.output_bytes),
            Header::Probe { .. } => 1024,
        }
        .saturating_mul(2)
        .saturating_add(1 << 20);
        let reply_deadline = deadline.map(|d| d + KILL_GRACE);
        let raw = stdout.map(|mut s| read_reply(&mut s, cap, &self.reply_memory, reply_deadline));
        // The watcher sees `done` and drops the watch (and the jail's stdin, which the jail no
        // longer reads); nothing on the reply's path waits for it.
        done.store(true, Ordering::SeqCst);
        cancel.poke();
        let stats = who.record_after(proxy, record);
        // The permit (supervisor-wide reply memory) goes with the outcome until the response
        // is written.
        let (raw, permit) = match raw {
            Some(Ok(Some((raw, permit)))) => (Some(raw), permit),
            Some(Ok(None)) | None => (None, None),
            Some(Err(e)) => return Err(e),
        };

        // 9. The verdict. No reply: how the jail itself ended says why (an allocation it could
        // not make aborts it).
        let jail_signal = if raw.is_none() {
            self.jail_signal(request)
        } else {
            None
        };
        let container_oom = ooms_before
            .zip(self.container_ooms(&who))
            .is_some_and(|(before, after)| after > before);
        let reply = verdict(raw, stats, container_oom, plan, cancel, record, jail_signal)?;
        self.landlock_denials(plan, denial_log, &reply, record);
        Ok((
            explain_denials(reply, record, plan),
            ReplyShare::new(permit),
        ))
    }

    /// The container's OOM kills so far, for a jail without a cgroup of its own: the count
    /// before and after says whether the container's memory limit ended the request.
    fn container_ooms(&self, who: &Who) -> Option<u64> {
        match (&who.cgroup, &self.cfg.container_oom) {
            (None, Some(c)) => c.read(),
            _ => None,
        }
    }

    /// Step 4, `network: allowList`: serve the listener the jail made on its loopback (it
    /// came over its stdin socket while it confined itself).
    fn serve_egress(
        &self,
        plan: &Plan,
        header: &Header,
        stdin: Option<&std::fs::File>,
        creds: Option<Creds>,
        deadline: Option<Instant>,
    ) -> Result<Option<egress::ProxyHandle>, RequestError> {
        let task = match header {
            Header::Request { task, .. } => Some(&**task),
            Header::Probe { .. } => None,
        };
        let (Some(p), Some(sock)) = (plan.egress_proxy(task), stdin) else {
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
                .with_deadline(deadline);
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

    /// Step 5: the jail's mounter puts the lent tree in place before the header; without
    /// one, its socket is closed and the jail extracts. Returns the header frame's body.
    fn place_tree(
        &self,
        header: &Header,
        stdin: Option<&std::fs::File>,
        lent: Option<Result<std::os::fd::OwnedFd, RequestError>>,
        filled: bool,
        record: &Recorder,
        forward: &mut bool,
    ) -> Result<Vec<u8>, RequestError> {
        let body = serde_json::to_vec(&header).map_err(|e| internal(e.to_string()))?;
        // The cache is node-wide: every plan has the default's.
        let mounter = match (&self.cfg.plans.default_plan().cache, stdin) {
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
                let mut h = header.clone();
                if let Header::Request { tree_attached, .. } = &mut h {
                    *tree_attached = true;
                }
                serde_json::to_vec(&h).map_err(|e| internal(e.to_string()))
            }
            // A hit whose tree cannot be lent (the keeper failed or is gone) or attached (no
            // mounter) still has its whole stream to come: the jail extracts it, as without
            // the cache (its mounter socket, if any, is closed unused). A fill's stream went
            // to the filler, so its request fails instead.
            (Some(lent), mounter) if !filled && (lent.is_err() || mounter.is_none()) => {
                let why = match lent {
                    Err(e) => e.message,
                    Ok(_) => "the jail has no mounter".to_owned(),
                };
                tracing::warn!(error = %why, "tree cache: the tree could not be lent; this request extracts in its own jail");
                fall_back_to_extraction(record, self.cache.get());
                *forward = true;
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

    /// Step 9: what Landlock refused the request's commands. The kernel's records when it
    /// gives them: a failed request waits for them (they arrive a few milliseconds after the
    /// denial) to say why it failed; a successful one takes those already there, for the
    /// audit event. A failed request with none (no audit reader in a pod, audit off) gets
    /// the paths its error names as refused that no `spec.filesystem` rule covers
    /// ([`file_denials::inferred`]), when its jail was under Landlock.
    fn landlock_denials(
        &self,
        plan: &Plan,
        denial_log: Option<(&crate::landlock_log::LandlockLog, u32)>,
        reply: &Reply,
        record: &Recorder,
    ) {
        let mut denied = match (denial_log, reply) {
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
            let own = [self.cfg.work_root.as_path(), Path::new("/tmp")];
            denied = file_denials::inferred(message, plan.file_rules(), &own);
        }
        if !denied.is_empty() {
            jail_wire::record::update(record, |r| r.landlock_denials = denied);
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

/// Step 6: the header, then the archive as it arrives (drained, not sent, when `forward` is
/// false: a tree is in place), then its end, which the service lets through only once the
/// bytes matched their checksum. `false` when a write failed or the stream was aborted
/// (checksum mismatch, client gone: closed without `E`).
fn stream_frames(
    w: &mut std::fs::File,
    body: &[u8],
    input: &mut Box<dyn Read + Send>,
    forward: bool,
) -> bool {
    let mut ok = write_frame(w, b'H', body).is_ok();
    let mut buf = vec![0u8; 64 * 1024];
    while ok {
        match input.read(&mut buf) {
            Ok(0) => {
                ok = write_frame(w, b'E', &[]).is_ok() && w.flush().is_ok();
                break;
            }
            Ok(n) if forward => ok = write_frame(w, b'D', &buf[..n]).is_ok(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => ok = false,
        }
    }
    ok
}
