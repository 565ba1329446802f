//! The tree cache through the real server (issue 23): a request whose archive was extracted
//! before runs on the sealed tree, seeing exactly what a fresh extraction gives (its own UID
//! owns every file, modes and links as extracted), and nothing a command does — writing,
//! chmod, unlinking, renaming, replacing a link — reaches the tree or the next request, also
//! when hostile requests run at the same time as honest ones. The policy's off switch gives
//! the same answers without it; the budget evicts trees no request holds.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;

const NEEDS_ROOT: &str =
    "tree cache tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// Describe the tree as commands see it (`MODE=show`), or attack it (`MODE=attack`) and then
/// describe what the attack left in this request's own view.
const SPEC: &str = r#"  generate:
    command: [sh, -c]
    args:
      - |
        me=$(id -u)
        # Hold the request's UID for a while.
        [ "$ARGOCD_ENV_MODE" = sleep ] && sleep 4
        if [ "$ARGOCD_ENV_MODE" = attack ]; then
          echo tampered >> a.txt
          chmod 000 dir
          chmod 777 a.txt
          rm -f dir/b.txt 2>/dev/null; chmod 755 dir; rm -f dir/b.txt
          mv sub gone
          ln -sf /etc/passwd link
          echo new > planted.txt
          # The layers the overlay was made of are nowhere to be found: their directory is
          # covered by an empty read-only tmpfs.
          # (The markers are split so that the logged argv does not contain them.)
          [ -n "$(ls -A ../.cmp-warden-layers 2>/dev/null)" ] && echo LAYERS-VIS''IBLE >&2
          touch ../.cmp-warden-layers/x 2>/dev/null && echo LAYERS-VIS''IBLE >&2
          grep -q ' cmp-warden-cache ' /proc/self/mountinfo && echo CACHE-VIS''IBLE >&2
        fi
        echo "kind: Tree"
        echo "listing:"
        find . -path ./.git -prune -o -print | sort | while read -r p; do
          owner=other; [ "$(stat -c %u "$p")" = "$me" ] && owner=me
          if [ -L "$p" ]; then
            echo "- \"$p link $(readlink "$p") $owner\""
          elif [ -f "$p" ]; then
            echo "- \"$p $(stat -c %a "$p") $(sha256sum < "$p" | cut -c1-12) $owner\""
          else
            echo "- \"$p $(stat -c %a "$p") dir $owner\""
          fi
        done
"#;

/// The policy edit that turns the cache off (it is on by default).
const CACHE_OFF: (&str, &str) = (
    "cache: {enabled: true, bytes: 512Mi}",
    "cache: {enabled: false, bytes: 512Mi}",
);

const FILES: &[(&str, &str)] = &[
    ("a.txt", "alpha\n"),
    ("dir/b.txt", "beta\n"),
    ("sub/deep/c.yaml", "kind: C\n"),
    ("link", "->a.txt"),
    ("up", "->sub/../dir/b.txt"),
];

fn listing(v: &serde_json::Value) -> Vec<String> {
    let doc: serde_json::Value =
        serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
    doc["listing"]
        .as_array()
        .expect("listing")
        .iter()
        .map(|l| l.as_str().expect("line").to_owned())
        .collect()
}

/// A `generate` request for `dir` on a thread of its own.
fn in_background(s: &Server, dir: &str, extra: &[&str]) -> std::thread::JoinHandle<CallResult> {
    let sock = s.sock.clone();
    let args: Vec<String> = ["-rpc", "generate", "-dir", dir]
        .iter()
        .chain(extra)
        .map(|a| (*a).to_owned())
        .collect();
    std::thread::spawn(move || {
        let out = std::process::Command::new(go_client())
            .arg("-socket")
            .arg(&sock)
            .args(&args)
            .output()
            .expect("go client");
        parse_client_output(&out)
    })
}

fn server(pol: &std::path::Path, edits: &[(&str, &str)], extra: &[&str]) -> Server {
    server_for(SPEC, pol, edits, extra)
}

/// A server of the plugin `spec` under the default policy with `edits`, written to `pol`.
fn server_for(spec: &str, pol: &std::path::Path, edits: &[(&str, &str)], extra: &[&str]) -> Server {
    write_policy(pol, edits);
    let mut args = vec!["--policy", pol.to_str().expect("utf8")];
    args.extend_from_slice(extra);
    Server::start(&plugin(spec), &args)
}

/// A server (default policy, in `dir`) whose cache holds the tree of `FILES`: the repository
/// and the listing its filling request saw.
fn with_a_filled_tree(dir: &std::path::Path) -> (Server, tempfile::TempDir, Vec<String>) {
    with_a_filled_tree_and(dir, &[])
}

/// [`with_a_filled_tree`], the server started with `extra` flags.
fn with_a_filled_tree_and(
    dir: &std::path::Path,
    extra: &[&str],
) -> (Server, tempfile::TempDir, Vec<String>) {
    let s = server(&dir.join("policy.yaml"), &[], extra);
    let r = repo(FILES);
    let seen =
        listing(&go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")]).expect("fill"));
    (s, r, seen)
}

#[test]
fn a_cached_tree_is_a_fresh_extraction_and_nothing_a_command_does_reaches_it() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let r = repo(FILES);
    let dir = r.path().to_str().expect("utf8");

    // The reference: the cache off, every request extracts in its own jail.
    let off = server(&t.path().join("off/policy.yaml"), &[CACHE_OFF], &[]);
    let fresh = listing(&go(&off, "generate", &["-dir", dir]).expect("fresh"));
    assert!(
        fresh
            .iter()
            .all(|l| l.ends_with(" me\"") || l.ends_with(" me")),
        "{fresh:?}"
    );
    assert!(
        off.audit_events().iter().all(|e| e.tree_cache.is_none()),
        "the off switch leaves no cache in the audit event"
    );
    drop(off);

    // The default policy: the cache on.
    let s = server(&t.path().join("on/policy.yaml"), &[], &[]);
    // Start-up says the cache runs (logged once the probe is done, after the socket exists).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.logs().contains("\"tree_cache\":\"on (") {
        assert!(
            Instant::now() < deadline,
            "start-up says the cache runs:\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // From a cold cache, hostile requests race the fill beside honest ones: one of them fills
    // the tree while the others wait, and no command runs before it is sealed; each attack
    // succeeds in its own writable layer only; every honest request sees the fresh extraction
    // (each owns every file: its own UID).
    let attacks: Vec<_> = (0..3)
        .map(|_| in_background(&s, dir, &["-env", "ARGOCD_ENV_MODE=attack"]))
        .collect();
    let honest: Vec<_> = (0..3).map(|_| in_background(&s, dir, &[])).collect();
    for h in honest {
        assert_eq!(
            listing(&h.join().expect("thread").expect("honest request")),
            fresh
        );
    }
    for a in attacks {
        let seen = listing(&a.join().expect("thread").expect("attack request"));
        // Its own view changed as it asked...
        assert!(
            seen.iter().any(|l| l.starts_with("./planted.txt")),
            "{seen:?}"
        );
        assert!(seen.iter().any(|l| l.starts_with("./gone")), "{seen:?}");
        assert!(
            !seen.iter().any(|l| l.starts_with("./dir/b.txt")),
            "{seen:?}"
        );
        assert!(
            seen.iter()
                .any(|l| l.starts_with("./link link /etc/passwd")),
            "{seen:?}"
        );
        assert!(
            seen.iter().any(|l| l.starts_with("./a.txt 777")),
            "{seen:?}"
        );
    }
    // ... and nothing of it reached the tree: the next request sees it pristine.
    assert_eq!(
        listing(&go(&s, "generate", &["-dir", dir]).expect("after")),
        fresh
    );
    assert!(!s.logs().contains("LAYERS-VISIBLE"), "{}", s.logs());
    assert!(!s.logs().contains("CACHE-VISIBLE"), "{}", s.logs());

    let uses = s.tree_cache_uses(7);
    // Exactly one request filled the tree; every other one was served from it.
    assert_eq!(
        uses.iter().filter(|u| **u == "filled").count(),
        1,
        "{uses:?}"
    );
    assert_eq!(uses.iter().filter(|u| **u == "hit").count(), 6, "{uses:?}");
    assert_eq!(uses.len(), 7, "{uses:?}");
    s.assert_work_dir_empties();
}

/// A request whose claimed checksum names a cached tree but whose bytes differ is refused as
/// a checksum mismatch, and never runs on the tree it claimed.
#[test]
fn claiming_a_cached_trees_checksum_with_other_bytes_gets_nothing() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let (s, r, pristine) = with_a_filled_tree(t.path());
    let dir = r.path().to_str().expect("utf8");
    let event = s.audit_events().pop().expect("event");
    let sha = event.archive.sha256.expect("sha");
    // Other bytes, the cached tree's checksum claimed.
    let other = repo(&[("evil.txt", "not the cached tree\n")]);
    let (code, msg) = go(
        &s,
        "generate",
        &[
            "-dir",
            other.path().to_str().expect("utf8"),
            "-checksum",
            &sha,
        ],
    )
    .expect_err("mismatch");
    assert_eq!(code, DATA_LOSS, "{msg}");
    assert!(msg.contains("checksum"), "{msg}");
    // The jail had the tree while the bytes arrived, but no command ran on it.
    // (Its event follows the response.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        if let Some(e) = s.audit_events().into_iter().find(|e| e.code == "DataLoss") {
            break e;
        }
        assert!(Instant::now() < deadline, "no audit event:\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(refused.tree_cache, Some(TreeCacheUse::Hit), "{refused}");
    assert!(refused.commands.is_empty(), "{refused}");
    // The tree is still there and still pristine.
    assert_eq!(
        listing(&go(&s, "generate", &["-dir", dir]).expect("hit")),
        pristine
    );
}

/// A request that was to fill a tree but got no jail (every UID leased until its deadline)
/// gives the archive back: the next request for it fills it, instead of waiting for a fill
/// nobody is doing until its deadline.
#[test]
fn a_fill_that_never_started_does_not_hold_its_archive() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let pol = t.path().join("policy.yaml");
    // Three UIDs: the idle spare jail's, and two "another instance on this node" holds (the
    // server admits two requests at once: as many as its UIDs beside the spare's).
    let first = write_policy_with_uids(&pol, &[], 3);
    let s = Server::start(&plugin(SPEC), &["--policy", pol.to_str().expect("utf8")]);
    // The other instance: the lease locks (`flock` on <lease dir>/<uid>) of the UIDs the
    // server's spare does not hold.
    let leases = s
        .sock
        .parent()
        .expect("socket dir")
        .join(".cmp-warden-leases");
    // (The start-up probe's UID may still be on its way back: try until two are ours.)
    let mut others: Vec<(u32, std::process::Child)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while others.len() < 2 {
        assert!(Instant::now() < deadline, "no two UIDs free:\n{}", s.logs());
        for uid in first..first + 3 {
            if others.iter().any(|(u, _)| *u == uid) {
                continue;
            }
            // It says when it holds the lock (no guess from a fixed wait); exit 9: taken.
            let mut c = std::process::Command::new("flock")
                .args(["-n", "-E", "9"])
                .arg(leases.join(uid.to_string()))
                .args(["sh", "-c", "echo locked; exec sleep 120"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("flock");
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(
                &mut std::io::BufReader::new(c.stdout.take().expect("stdout")),
                &mut line,
            );
            if line == "locked\n" {
                others.push((uid, c));
            } else {
                let st = c.wait().expect("flock");
                assert_eq!(st.code(), Some(9), "flock: {st}");
            }
        }
    }
    // The holder takes the spare's UID (its command then sleeps).
    let busy = repo(&[("busy.txt", "holds the last UID\n")]);
    let holder = in_background(
        &s,
        busy.path().to_str().expect("utf8"),
        &["-env", "ARGOCD_ENV_MODE=sleep"],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !s
        .logs()
        .lines()
        .any(|l| l.contains("\"jail taken\"") && l.contains("GenerateManifest"))
    {
        assert!(
            Instant::now() < deadline,
            "the holder never started:\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = repo(FILES);
    let dir = r.path().to_str().expect("utf8");
    // Its turn to fill the tree, but no UID before its deadline.
    let (code, msg) = go(&s, "generate", &["-dir", dir, "-timeout", "1s"]).expect_err("no UID");
    assert!(
        (code == RESOURCE_EXHAUSTED || code == DEADLINE_EXCEEDED) && !msg.contains("slots"),
        "{code}: {msg}"
    );
    // Its event follows the client's error (the server writes it once the request is gone).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = s.audit_events();
        if events.iter().any(|e| {
            e.error
                .as_deref()
                .is_some_and(|e| e.contains("no sandbox UID free"))
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B's event never came: {events:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (_, mut c) in others {
        let _ = c.kill();
        let _ = c.wait();
    }
    holder
        .join()
        .expect("thread")
        .expect("the holder's request");
    // The same archive again: this request fills it.
    let v = go(&s, "generate", &["-dir", dir, "-timeout", "20s"]).expect("after the holder");
    assert!(listing(&v).iter().any(|l| l.starts_with("./a.txt")), "{v}");
    let last = s.audit_events().pop().expect("event");
    assert_eq!(last.tree_cache, Some(TreeCacheUse::Filled), "{last}");
}

/// A request's disk below the archive limit: a cached tree would not be held to it, so the
/// cache stays off, the server says why and which fields change it, and requests extract in
/// their own jails.
#[test]
fn the_cache_stays_off_when_the_request_disk_is_below_the_archive_limit() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let s = server(
        &t.path().join("policy.yaml"),
        &[("diskBytes: 2Gi", "diskBytes: 32Mi")],
        &[],
    );
    let r = repo(FILES);
    go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")]).expect("request");
    let logs = s.logs();
    assert!(
        logs.lines().any(|l| l.contains("TREE CACHE UNAVAILABLE")
            && l.contains("spec.limits.diskBytes (33554432) is below spec.archive.extractedBytes")
            && l.contains("raise diskBytes or lower extractedBytes")),
        "{logs}"
    );
    let last = s.audit_events().pop().expect("event");
    assert!(last.tree_cache.is_none(), "{last}");
}

/// A selected policy whose own disk and file-size limits are tighter than the archive limits a
/// cached tree is held to (the fourth attack round: `diskBytes: 16Mi, fileSizeBytes: 4Mi`
/// ran on a cached tree with a 24 MiB file, which its own extraction refuses): its requests
/// never take a tree from the cache, whatever the archive's size claims; they extract in
/// their own jail under their own limits. The default policy's requests keep the cache, and
/// the tenant's honest small request works in the same run.
#[test]
fn a_selected_policys_disk_and_file_limits_hold_on_cached_trees() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    write_policy(&t.path().join("default.yaml"), &[]);
    let default = std::fs::read_to_string(t.path().join("default.yaml")).expect("read");
    let mut tenant = selected_policy(&default, "small-disk", "small");
    for (from, to) in [
        ("fileSizeBytes: 1Gi", "fileSizeBytes: 4Mi"),
        ("diskBytes: 2Gi", "diskBytes: 16Mi"),
    ] {
        assert!(tenant.contains(from), "fixture: {from}");
        tenant = tenant.replacen(from, to, 1);
    }
    std::fs::write(t.path().join("small-disk.yaml"), tenant).expect("write");
    let s = Server::start(
        &plugin(
            "  generate: {command: [sh, -c, 'echo \"{kind: Size, bytes: $(cat *.txt | wc -c)}\"']}\n",
        ),
        &["--policy", t.path().to_str().expect("utf8")],
    );
    s.wait_logged("not used for this policy's requests", 1);
    // 24 MiB that compresses no more than hex does (within the archive's ratio limit).
    let mut big = String::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while big.len() < 24 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        big.push_str(&format!("{x:016x}"));
    }
    let r = repo(&[("big.txt", &big)]);
    let dir = r.path().to_str().expect("utf8");
    // The default policy's request fills the cache with the tree.
    let v = go(&s, "generate", &["-dir", dir]).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert_eq!(
        manifests(&v),
        [format!("{{\"bytes\":{},\"kind\":\"Size\"}}", big.len())]
    );
    // The tenant's request for the same archive: its own extraction, refused by its limit.
    let (_, msg) = go(
        &s,
        "generate",
        &["-dir", dir, "-env", "ARGOCD_APP_PROJECT_NAME=small"],
    )
    .expect_err("the tenant's limits must hold");
    assert!(
        msg.contains("File too large") || msg.contains("fileSizeBytes"),
        "{msg}"
    );
    let events = s.audited(2);
    let last = events.last().expect("event");
    assert_eq!(last.policy.name, "small-disk", "{last}");
    assert_eq!(last.tree_cache, Some(TreeCacheUse::Uncached), "{last}");
    assert_eq!(
        events[0].tree_cache,
        Some(TreeCacheUse::Filled),
        "{}",
        events[0]
    );
    // The tenant's honest request works.
    let small = repo(&[("a.txt", "alpha\n")]);
    let ok = go(
        &s,
        "generate",
        &[
            "-dir",
            small.path().to_str().expect("utf8"),
            "-env",
            "ARGOCD_APP_PROJECT_NAME=small",
        ],
    )
    .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert_eq!(manifests(&ok), [r#"{"bytes":6,"kind":"Size"}"#]);
}

/// SIGKILL the server's keeper (its PID from the start-up log).
/// Kill the keeper started last.
fn kill_the_keeper(s: &Server) {
    let keeper = s.keeper_pid();
    let st = std::process::Command::new("kill")
        .args(["-KILL", &keeper.to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
}

/// The keeper gone (killed) after a fill: the next request for that archive finds its tree
/// listed but cannot borrow it; it extracts in its own jail and gets the same answer, the
/// cache goes out of service (logged), and later requests are answered uncached.
#[test]
fn a_hit_whose_tree_cannot_be_lent_extracts_instead() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let (s, r, first) = with_a_filled_tree_and(t.path(), &["--metrics-address", "127.0.0.1:0"]);
    let dir = r.path().to_str().expect("utf8");
    assert!(
        s.metrics()
            .contains("\ncmp_warden_tree_cache_in_service 1\n")
    );
    kill_the_keeper(&s);
    for _ in 0..2 {
        let again = listing(&go(&s, "generate", &["-dir", dir]).expect("answered"));
        assert_eq!(again, first);
    }
    // What an alert reads (deploy/monitoring): out of service until a new keeper runs.
    assert!(
        s.metrics()
            .contains("\ncmp_warden_tree_cache_in_service 0\n")
    );
    let logs = s.logs();
    assert!(
        logs.contains("the tree could not be lent; this request extracts in its own jail"),
        "{logs}"
    );
    assert!(logs.contains("TREE CACHE OUT OF SERVICE"), "{logs}");
    let uses = s.tree_cache_uses(3);
    assert_eq!(uses, ["filled", "uncached", "uncached"], "{uses:?}");
    // The fallen-back request's extraction is its own: the archive's figures are reported.
    let second = &s.audit_events()[1];
    assert!(second.archive.entries.is_some_and(|n| n > 0), "{second}");
}

/// The keeper gone (killed; the natural cause was a second instance's start-up sweep) before
/// a new archive's fill: the fill cannot start, nothing of the stream was read, so the
/// request extracts it in its own jail and is answered — the cache is an optimisation, never
/// a reason to fail (Argo CD's client once saw `Internal: tree cache: fill: keeper: sending
/// Fill: Broken pipe`).
#[test]
fn a_fill_that_cannot_start_extracts_in_its_own_jail() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let (s, _r, _first) = with_a_filled_tree(t.path());
    kill_the_keeper(&s);
    // A new archive: its first request would fill.
    let other = repo(&[(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: another\n",
    )]);
    let v = go(
        &s,
        "generate",
        &["-dir", other.path().to_str().expect("utf8")],
    )
    .unwrap_or_else(|e| panic!("the fill's failure reached the client: {e:?}\n{}", s.logs()));
    assert!(
        listing(&v).iter().any(|l| l.starts_with("./cm.yaml ")),
        "{v}"
    );
    let logs = s.logs();
    assert!(
        logs.contains("the fill could not start; this request extracts in its own jail"),
        "{logs}"
    );
    let uses = s.tree_cache_uses(2);
    assert_eq!(uses, ["filled", "uncached"], "{uses:?}");
}

/// A request never waits on another client's stalled stream: while a client that sent half
/// of an archive pauses (its fill holding the tree's key), an honest request with the same
/// archive stops waiting for that tree once the fill has not moved for a second and extracts
/// in its own jail, answered within 4 s (waiting for the stalled fill, it would wait until
/// the server ends that stream at 5 s, then fill the tree itself).
#[test]
fn a_request_never_waits_on_a_stalled_fill_of_its_archive() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let s = server(&t.path().join("policy.yaml"), &[], &[]);
    // Incompressible, so the archive is many 64-byte chunks.
    let noise: String = (0..6000u32)
        .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
        .collect();
    let r = repo(&[("noise.txt", &noise), ("a.txt", "alpha\n")]);
    let dir = r.path().to_str().expect("utf8");
    let stalled = in_background(
        &s,
        dir,
        &["-chunk", "64", "-stall-after", "4", "-stall", "30s"],
    );
    // The probe's jail, then the stalled request's (taken before its fill starts).
    let until = Instant::now() + Duration::from_secs(20);
    while s.logs().matches("\"jail taken\"").count() < 2 {
        assert!(Instant::now() < until, "no fill began:\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = go(&s, "generate", &["-dir", dir, "-timeout", "4s"]).unwrap_or_else(|e| {
        panic!(
            "the honest request waited on the stalled one: {e:?}\n{}",
            s.logs()
        )
    });
    assert!(listing(&v).iter().any(|l| l.starts_with("./a.txt ")), "{v}");
    assert!(
        s.logs()
            .contains("the archive's tree is being filled by a stream that paused"),
        "{}",
        s.logs()
    );
    let (code, msg) = stalled.join().expect("thread").expect_err("stalled");
    assert_eq!(code, DEADLINE_EXCEEDED, "{msg}");
    let uses = s.tree_cache_uses(2);
    assert_eq!(uses, ["uncached", "filled"], "{uses:?}");
}

/// A keeper that dies is started again — at most 3 times, each no sooner than 5 s after the
/// cache broke, each logged — so the cache is not out of service for the rest of the
/// server's life; the requests in between extract in their own jails; past the bound it
/// stays out of service and says so.
#[test]
fn a_keeper_that_dies_is_restarted_a_bounded_number_of_times() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let (s, _r, _first) = with_a_filled_tree(t.path());
    let mut expected = vec!["filled"];
    for round in 0..4 {
        kill_the_keeper(&s);
        // A new archive: the fill cannot start; answered from its own jail.
        let a = repo(&[("a.txt", &format!("round {round} a\n"))]);
        go(&s, "generate", &["-dir", a.path().to_str().expect("utf8")])
            .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
        expected.push("uncached");
        // The server found the cache broken at the latest now: 5 s from here are at least
        // 5 s from its own moment, however slowly this machine ran the request above.
        let broken = Instant::now();
        std::thread::sleep(
            Duration::from_secs(5).saturating_sub(broken.elapsed()) + Duration::from_millis(300),
        );
        let b = repo(&[("b.txt", &format!("round {round} b\n"))]);
        go(&s, "generate", &["-dir", b.path().to_str().expect("utf8")])
            .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
        expected.push(if round < 3 { "filled" } else { "uncached" });
    }
    let logs = s.logs();
    assert_eq!(
        logs.matches("tree cache: keeper restarted").count(),
        3,
        "{logs}"
    );
    assert!(
        logs.contains(
            "the keeper was restarted 3 times; requests extract in their own jails from now on"
        ),
        "{logs}"
    );
    let uses = s.tree_cache_uses(expected.len());
    assert_eq!(uses, expected, "{uses:?}");
}

/// The keeper holds capabilities over its own user namespace (to clone and idmap trees), so
/// it runs under what SECURITY.md says: `no_new_privs`, Landlock (required: the cache does
/// not start without it) and a seccomp filter, as the kernel itself reports for its process.
#[test]
fn the_keeper_runs_under_no_new_privs_landlock_and_seccomp() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let (s, _r, _first) = with_a_filled_tree(t.path());
    let pid = s.keeper_pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("keeper status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(field("Seccomp:"), "2", "{status}");
    assert!(
        s.logs()
            .contains("tree cache keeper: Landlock and seccomp in force"),
        "{}",
        s.logs()
    );
}

/// A request on a cached tree has one disk budget, as a fresh extraction has: what its
/// commands write into the tree (the overlay's upper layer) and into `/tmp` come out of the
/// same `spec.limits.diskBytes` tmpfs. 6 MiB into the tree and then 6 MiB into `/tmp` under an
/// 8 MiB limit: the second fails with ENOSPC (the upper layer was once a tmpfs of its own, and
/// both went through), on the request that filled the tree and on a hit alike.
#[test]
fn a_cached_request_has_one_disk_budget_for_its_tree_and_tmp() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let fill = "  generate:\n    command: [sh, -c, 'head -c 6000000 /dev/zero > tree.bin && echo tree=ok >&2; if head -c 6000000 /dev/zero > /tmp/tmp.bin 2>/dev/null; then t=written; else t=refused; fi; echo \"{kind: Disk, tmp: $t}\"']\n";
    let s = server_for(
        fill,
        &t.path().join("policy.yaml"),
        &[
            ("diskBytes: 2Gi", "diskBytes: 8Mi"),
            ("extractedBytes: 1Gi", "extractedBytes: 1Mi"),
            ("fileBytes: 256Mi", "fileBytes: 1Mi"),
        ],
        &[],
    );
    let r = repo(&[("a.txt", "alpha\n")]);
    let dir = r.path().to_str().expect("utf8");
    // The second 6 MB, in /tmp, finds the 8 MiB budget the tree's 6 MB used: the disk is
    // full, and a request whose disk filled up is not served even though its script went on
    // (with a /tmp of its own it would have been written, and the request served).
    for _ in 0..2 {
        let (code, msg) = go(&s, "generate", &["-dir", dir]).expect_err("the shared disk filled");
        assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
        assert!(
            msg.contains("disk limit reached (policy spec.limits.diskBytes: 8388608)")
                && msg.contains("the disk filled up while the commands ran"),
            "{msg}\n{}",
            s.logs()
        );
    }
    let uses = s.tree_cache_uses(2);
    assert_eq!(uses, ["filled", "hit"], "{uses:?}");
}

/// An archive of many small files takes a tmpfs page per file, far more than its bytes: a
/// fill has room for both (within `spec.archive.entries`), so the cache answers such an
/// archive as its own jail would (a fill once overflowed the keeper's tmpfs: ENOSPC).
#[test]
fn an_archive_of_many_small_files_fits_its_fill() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let pol = t.path().join("policy.yaml");
    write_policy(
        &pol,
        &[
            (
                "cache: {enabled: true, bytes: 512Mi}",
                "cache: {enabled: true, bytes: 1Mi}",
            ),
            ("extractedBytes: 1Gi", "extractedBytes: 2Mi"),
            ("entries: 100000", "entries: 2000"),
        ],
    );
    let count = "  generate:\n    command: [sh, -c, 'echo \"{kind: Files, files: $(find . -type f | wc -l)}\"']\n";
    let s = Server::start(&plugin(count), &["--policy", pol.to_str().expect("utf8")]);
    // 1,500 one-byte files: 1.5 KB of bytes, ~6 MiB of pages; the fill's room was once the
    // 2 MiB of extractedBytes (the keeper's tmpfs 1 + 2 x 2 MiB: ENOSPC).
    let names: Vec<String> = (0..1500).map(|i| format!("d{}/f{i}", i % 10)).collect();
    let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "x")).collect();
    let r = repo(&files);
    let dir = r.path().to_str().expect("utf8");
    for _ in 0..2 {
        let v = go(&s, "generate", &["-dir", dir]).expect("request");
        let doc: serde_json::Value =
            serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
        assert_eq!(doc["files"], 1500, "{v}");
    }
    let uses = s.tree_cache_uses(2);
    // Over the budget once released, so the second may find it evicted and fill it again.
    assert_eq!(uses.len(), 2, "{uses:?}");
    assert_eq!(uses[0], "filled", "{uses:?}");
}

/// Within `spec.cache.bytes` the least recently used tree no request holds is evicted;
/// requests keep getting the right tree.
#[test]
fn the_budget_evicts_least_recently_used_trees() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let s = server(
        &t.path().join("policy.yaml"),
        &[(
            "cache: {enabled: true, bytes: 512Mi}",
            "cache: {enabled: true, bytes: 1Mi}",
        )],
        &["--metrics-address", "127.0.0.1:0"],
    );
    // Three repositories of ~600 KiB each (incompressible names keep them distinct).
    let repos: Vec<_> = (0..3)
        .map(|i| {
            let body: String = (0..600_000u32)
                .map(|j| char::from(b'a' + ((j.wrapping_mul(2_654_435_761) ^ i) >> 27) as u8 % 26))
                .collect();
            repo(&[("big.txt", body.as_str()), ("n.txt", &i.to_string())])
        })
        .collect();
    for r in &repos {
        go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")]).expect("request");
    }
    // The first again: evicted meanwhile, so filled again, with the right content.
    let v = go(
        &s,
        "generate",
        &["-dir", repos[0].path().to_str().expect("utf8")],
    )
    .expect("again");
    assert!(listing(&v).iter().any(|l| l.starts_with("./n.txt")));
    let uses = s.tree_cache_uses(4);
    assert_eq!(uses, ["filled", "filled", "filled", "filled"], "{uses:?}");
    let body = s.metrics();
    let evictions = body
        .lines()
        .find_map(|l| l.strip_prefix("cmp_warden_tree_cache_evictions_total "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .expect("evictions metric");
    assert!(evictions >= 2, "{body}");
    assert!(
        body.contains("cmp_warden_tree_cache_requests_total{result=\"filled\"} 4"),
        "{body}"
    );
}

/// An archive the client states smaller than `spec.cache.minArchiveBytes` extracts in its
/// request's own jail every time (for such archives a fill costs more than its hits save:
/// BENCHMARKS.md); a larger one is filled, then hit, as before.
#[test]
fn archives_below_the_minimum_size_extract_in_their_own_jails() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let s = server(
        &t.path().join("policy.yaml"),
        &[(
            "cache: {enabled: true, bytes: 512Mi}",
            "cache: {enabled: true, bytes: 512Mi, minArchiveBytes: 8Ki}",
        )],
        &[],
    );
    let small = repo(FILES);
    // Text gzip cannot shrink below 8 KiB: 32 KiB of pseudo-random hex.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: String = (0..32 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"0123456789abcdef"[(x & 15) as usize])
        })
        .collect();
    let large = repo(&[("a.txt", "alpha\n"), ("noise.txt", &noise)]);
    for r in [&small, &small, &large, &large] {
        let v = go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")])
            .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
        assert!(listing(&v).iter().any(|l| l.starts_with("./a.txt ")), "{v}");
    }
    let uses = s.tree_cache_uses(4);
    assert_eq!(uses, ["uncached", "uncached", "filled", "hit"], "{uses:?}");
    assert!(
        s.logs().contains("smaller than spec.cache.minArchiveBytes"),
        "{}",
        s.logs()
    );
}
