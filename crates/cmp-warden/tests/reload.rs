//! Reloads without a restart: the policy directory and plugin.yaml as Kubernetes mounts a
//! ConfigMap (a timestamped directory, `..data` pointing at it, the files linked through it),
//! swapped 20 times — a valid change, a new tenant, a removed tenant, a plugin.yaml change, and
//! four refused sets (a file that does not parse, a node-wide change, a filter that does not
//! compile here, two policies that tie), each changing a valid file as well — while four
//! clients send requests all along. No request fails because of a reload; each runs under a set
//! that was in force while it ran and its audit event names that set's policy; a refused set
//! changes nothing, not even its valid files (mutant: the tie check skipped -> that set is
//! accepted); every reload is audited and counted.

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use audit_event::ReloadEvent;
use common::*;

const NEEDS_ROOT: &str = "reload tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// Prints its generation (its argument), the server variable only the tenant's policy passes,
/// and its open-files limit (which the jail sets on itself from its policy as it is prepared:
/// a spare jail of a replaced set would show the old one).
const PLUGIN: &str = r#"
import json, os, resource, sys
nofile = str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gen"},
                  "data": {"gen": sys.argv[1], "team": os.environ.get("TEAM_VAR", "none"),
                           "nofile": nofile}}))
"#;

fn plugin_yaml(generation: &str) -> String {
    plugin(&format!(
        "  generate: {{command: [python3, plugin.py, {generation}]}}\n  discover: {{fileName: {generation}.marker}}\n"
    ))
}

/// The generations whose discovery matches the test's repository (it holds their markers):
/// MatchRepository's answer changes with plugin.yaml.
const MARKED: [&str; 2] = ["p0", "p11"];

/// A directory as the kubelet keeps a ConfigMap volume: `..<version>/` with the files,
/// `..data` → the version, and each top-level name a link through `..data`. A swap writes the
/// next version, renames a new `..data` link over the old one (the one atomic step), then fixes
/// the top-level links and removes the old version, as the kubelet's atomic writer does.
struct ConfigMapDir {
    dir: PathBuf,
    version: usize,
    names: BTreeSet<String>,
}

impl ConfigMapDir {
    fn new(dir: &Path, files: &[(&str, String)]) -> Self {
        std::fs::create_dir_all(dir).expect("mkdir");
        let mut d = ConfigMapDir {
            dir: dir.to_path_buf(),
            version: 0,
            names: BTreeSet::new(),
        };
        d.swap(files);
        d
    }

    fn swap(&mut self, files: &[(&str, String)]) {
        self.version += 1;
        let version = format!("..2026_11_28_{:06}", self.version);
        let new = self.dir.join(&version);
        for (name, text) in files {
            let p = new.join(name);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).expect("link");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        let top: BTreeSet<String> = files
            .iter()
            .map(|(n, _)| n.split('/').next().expect("name").to_owned())
            .collect();
        for name in &top {
            // Made beside and renamed over: a plain file there (the first swap of a
            // directory the server already reads) is replaced without a moment missing.
            let link = self.dir.join(name);
            if std::fs::read_link(&link).is_err() {
                let tmp = self.dir.join(format!("..{name}_tmp"));
                std::os::unix::fs::symlink(format!("..data/{name}"), &tmp).expect("link");
                std::fs::rename(&tmp, &link).expect("link in place");
            }
        }
        for gone in self.names.difference(&top) {
            std::fs::remove_file(self.dir.join(gone)).expect("unlink");
        }
        self.names = top;
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).expect("old version");
        }
    }
}

/// One step of the sequence: the new policy files or the new plugin.yaml (its generation),
/// and whether the set is accepted.
struct Step {
    what: &'static str,
    policies: Option<(String, Option<String>)>,
    /// More policy directory files (beside `seccomp/default.json`).
    extra: Vec<(&'static str, String)>,
    plugin: Option<String>,
    accepted: bool,
}

/// What the client saw of one request.
struct Seen {
    app: String,
    started: Instant,
    ended: Instant,
    result: CallResult,
}

#[test]
fn configmap_swaps_under_load_reload_atomically_and_a_refused_set_changes_nothing() {
    needs_root!(NEEDS_ROOT);
    let root = tempfile::tempdir().expect("tmp");
    // The default as the tests write it (its UID range fixed once), and a tenant from it.
    let scratch = root.path().join("scratch/default.yaml");
    write_policy(&scratch, &[]);
    let base = std::fs::read_to_string(&scratch).expect("policy");
    let profile =
        std::fs::read_to_string(scratch.parent().expect("dir").join("seccomp/default.json"))
            .expect("profile");
    let tenant = {
        let t = selected_policy(&base, "team-a", "team-a");
        let from = "pass: [PATH, LANG, LC_ALL, TZ]";
        assert!(t.contains(from), "fixture: {from}");
        t.replacen(from, "pass: [PATH, LANG, LC_ALL, TZ, TEAM_VAR]", 1)
    };
    let policies = root.path().join("policies");
    let files_with = |default: &str, tenant: &Option<String>, extra: &[(&'static str, String)]| {
        let mut f = vec![
            ("default.yaml", default.to_owned()),
            ("seccomp/default.json", profile.clone()),
        ];
        if let Some(t) = tenant {
            f.push(("team-a.yaml", t.clone()));
        }
        f.extend(extra.iter().cloned());
        f
    };
    let files = |default: &str, tenant: &Option<String>| files_with(default, tenant, &[]);
    let mut pol_dir = ConfigMapDir::new(&policies, &files(&base, &None));
    let s = Server::start_env(
        &plugin_yaml("p0"),
        &[
            "--policy",
            policies.to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
            "--audit-log",
            root.path().join("audit.log").to_str().expect("utf8"),
        ],
        &[("TEAM_VAR", "team-a-value")],
    );
    let audit_log = root.path().join("audit.log");
    // The server's config directory, turned into a ConfigMap volume (the same plugin.yaml:
    // no reload comes of it).
    let cfg = s.dir.path().join("config");
    let mut cfg_dir = ConfigMapDir::new(&cfg, &[("plugin.yaml", plugin_yaml("p0"))]);

    let r = repo(&[("plugin.py", PLUGIN), ("p0.marker", ""), ("p11.marker", "")]);
    let repo_dir = r.path().to_str().expect("utf8").to_owned();
    let matches = || -> bool {
        let v = go(&s, "match", &["-dir", &repo_dir]).unwrap_or_else(|e| panic!("match: {e:?}"));
        v["isSupported"].as_bool().expect("isSupported")
    };
    let call = |app: &str, project: &str| {
        go(
            &s,
            "generate",
            &[
                "-dir",
                &repo_dir,
                "-env",
                &format!("ARGOCD_APP_NAME={app}"),
                "-env",
                &format!("ARGOCD_APP_PROJECT_NAME={project}"),
            ],
        )
    };
    let data = |v: &serde_json::Value| -> (String, String, String) {
        let m: serde_json::Value = serde_json::from_str(&manifests(v)[0]).expect("manifest");
        (
            m["data"]["gen"].as_str().expect("gen").to_owned(),
            m["data"]["team"].as_str().expect("team").to_owned(),
            m["data"]["nofile"].as_str().expect("nofile").to_owned(),
        )
    };
    let audit_text = || std::fs::read_to_string(&audit_log).unwrap_or_default();
    let reloads = || -> Vec<ReloadEvent> {
        audit_text()
            .lines()
            .filter_map(ReloadEvent::from_line)
            .collect()
    };
    let request_events = || audit_events_in(&audit_text());
    let sha = |text: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    };

    // The sequence: every step's files differ from every other's (a comment numbers them),
    // and each default has an open-files limit of its own.
    assert!(base.contains("openFiles: 4096"), "fixture: openFiles");
    let mark = |text: &str, i: usize| format!("{text}\n# step {i}\n");
    let own_limit = |text: String, i: usize| {
        text.replacen("openFiles: 4096", &format!("openFiles: {}", 4000 + i), 1)
    };
    let mut steps = Vec::new();
    let mut tenant_now = None;
    // A refused step changes a valid file too (the tenant's, or the default's limit), so a
    // reloader applying files one by one would show it; and the two refusals of a set whose
    // files each parse: a filter that does not compile here, two policies that tie.
    let foreign = profile.replacen("\"unshare\"", "\"socketcall\", \"unshare\"", 1);
    assert_ne!(foreign, profile, "fixture: unshare");
    for i in 0..20 {
        let mut extra = Vec::new();
        let step = match i % 8 {
            0 => (
                "a valid change",
                Some((own_limit(mark(&base, i), i), tenant_now.clone())),
                true,
            ),
            1 => {
                tenant_now = Some(mark(&tenant, i));
                (
                    "a new tenant",
                    Some((own_limit(mark(&base, i), i), tenant_now.clone())),
                    true,
                )
            }
            2 => (
                "a broken file, and the tenant removed",
                Some((
                    mark(&base, i).replacen("spec:\n", "spec:\n  limits: [\n", 1),
                    None,
                )),
                false,
            ),
            3 => (
                "a node-wide change, and the tenant removed",
                Some((
                    own_limit(mark(&base, i), i).replacen("count: 16}", "count: 15}", 1),
                    None,
                )),
                false,
            ),
            4 => {
                tenant_now = None;
                (
                    "the tenant removed",
                    Some((own_limit(mark(&base, i), i), None)),
                    true,
                )
            }
            5 => ("a plugin.yaml change", None, true),
            6 => {
                extra.push(("seccomp/team-a.json", foreign.clone()));
                (
                    "a tenant whose filter does not compile here, and a valid default",
                    Some((
                        own_limit(mark(&base, i), i),
                        Some(mark(&tenant, i).replacen(
                            "seccomp/default.json",
                            "seccomp/team-a.json",
                            1,
                        )),
                    )),
                    false,
                )
            }
            _ => {
                extra.push((
                    "team-b.yaml",
                    mark(&tenant, i).replacen("name: team-a", "name: team-b", 1),
                ));
                (
                    "two tenants selecting one project equally, and a valid default",
                    Some((own_limit(mark(&base, i), i), Some(mark(&tenant, i)))),
                    false,
                )
            }
        };
        let (what, policies, accepted) = step;
        steps.push(Step {
            what,
            plugin: policies.is_none().then(|| format!("p{i}")),
            policies,
            extra,
            accepted,
        });
    }
    assert!(
        steps[3]
            .policies
            .as_ref()
            .is_some_and(|(d, _)| d.contains("count: 15}")),
        "fixture: the uidRange edit"
    );

    // Four clients, all along; a request's app name finds its audit event.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    // The clients stop when the test ends, a failed assertion included (the scope waits for
    // them).
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _stop_clients = StopOnDrop(stop.clone());
        for c in 0..4 {
            let (stop, seen, call) = (stop.clone(), seen.clone(), &call);
            scope.spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let app = format!("c{c}-{n}");
                    let project = if c % 2 == 0 { "team-a" } else { "team-b" };
                    let started = Instant::now();
                    let result = call(&app, project);
                    let ended = Instant::now();
                    seen.lock().expect("seen").push(Seen {
                        app,
                        started,
                        ended,
                        result,
                    });
                }
            });
        }

        // The sets in force, each with when it came in (its swap began) and when it went
        // (the next accepted reload was seen).
        struct InForce {
            shas: BTreeSet<String>,
            from: Instant,
            until: Option<Instant>,
        }
        let mut in_force = vec![InForce {
            shas: [sha(&base)].into(),
            from: Instant::now() - Duration::from_secs(3600),
            until: None,
        }];
        let mut expected = (sha(&base), None::<String>, "p0".to_owned());
        let mut nofile = "4096".to_owned();
        let mut files_in_force: BTreeMap<&str, String> = files(&base, &None).into_iter().collect();
        let mut accepted = 0;
        let mut refused = 0;
        for (i, step) in steps.iter().enumerate() {
            let began = Instant::now();
            match (&step.policies, &step.plugin) {
                (Some((default, tenant)), _) => {
                    pol_dir.swap(&files_with(default, tenant, &step.extra));
                }
                (None, Some(generation)) => {
                    cfg_dir.swap(&[("plugin.yaml", plugin_yaml(generation))]);
                }
                (None, None) => unreachable!("a step changes something"),
            }
            // Its reload's event (inotify: well within the periodic check's 30 s).
            assert!(
                wait_until(Duration::from_secs(20), || reloads().len() > i),
                "step {i} ({}): no reload event\n{}",
                step.what,
                s.logs()
            );
            let ev = reloads().swap_remove(i);
            let result = if step.accepted { "accepted" } else { "refused" };
            assert_eq!(ev.result, result, "step {i} ({}): {ev:?}", step.what);
            assert_ne!(ev.trigger, "signal", "step {i}");
            let (file, new_sha) = match (&step.policies, &step.plugin) {
                (Some((default, _)), _) => ("/default.yaml", sha(default)),
                (None, Some(generation)) => ("/plugin.yaml", sha(&plugin_yaml(generation))),
                (None, None) => unreachable!(),
            };
            assert!(
                ev.files
                    .iter()
                    .any(|f| f.path.ends_with(file)
                        && f.new_sha256.as_deref() == Some(new_sha.as_str())),
                "step {i}: the event names the new {file}'s SHA-256: {ev:?}"
            );
            // Only what changed against the set in force: added, removed or new content.
            let changed = match &step.policies {
                Some((default, tenant)) => {
                    let now: BTreeMap<&str, String> = files_with(default, tenant, &step.extra)
                        .into_iter()
                        .collect();
                    now.keys()
                        .chain(files_in_force.keys())
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .filter(|k| now.get(*k) != files_in_force.get(*k))
                        .count()
                }
                None => 1,
            };
            assert_eq!(
                ev.files.len(),
                changed,
                "step {i}: only what changed: {ev:?}"
            );
            if step.accepted {
                accepted += 1;
                if let Some((default, tenant)) = &step.policies {
                    files_in_force = files_with(default, tenant, &step.extra)
                        .into_iter()
                        .collect();
                    expected.0 = sha(default);
                    expected.1 = tenant.as_deref().map(sha);
                    nofile = default
                        .split("openFiles: ")
                        .nth(1)
                        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                        .expect("openFiles")
                        .to_owned();
                }
                if let Some(generation) = &step.plugin {
                    expected.2 = generation.clone();
                }
                let shas: BTreeSet<String> = [Some(expected.0.clone()), expected.1.clone()]
                    .into_iter()
                    .flatten()
                    .collect();
                let now = Instant::now();
                in_force.last_mut().expect("set").until = Some(now);
                in_force.push(InForce {
                    shas,
                    from: began,
                    until: None,
                });
                let policies: Vec<&str> = ev.policies.iter().map(|p| p.sha256.as_str()).collect();
                assert!(policies.contains(&expected.0.as_str()), "step {i}: {ev:?}");
            } else {
                refused += 1;
                let reason = ev.reason.clone().unwrap_or_default();
                let why = match i % 8 {
                    2 => reason.contains("default.yaml"),
                    3 => reason.contains("spec.uidRange") && reason.contains("restart"),
                    6 => reason.contains("team-a") && reason.contains("socketcall"),
                    _ => {
                        reason.contains("team-a.yaml")
                            && reason.contains("team-b.yaml")
                            && reason.contains("select the same request equally")
                    }
                };
                assert!(why, "step {i} ({}): {reason}", step.what);
            }
            // A request from now on runs under the set in force: the default's or the
            // tenant's policy, the plugin's generation.
            let app = format!("probe-{i}");
            let v = call(&app, "team-a")
                .unwrap_or_else(|e| panic!("step {i} ({}): {e:?}\n{}", step.what, s.logs()));
            let (generation, team, limit) = data(&v);
            assert_eq!(
                generation, expected.2,
                "step {i} ({}): plugin.yaml in force",
                step.what
            );
            assert_eq!(
                matches(),
                MARKED.contains(&expected.2.as_str()),
                "step {i} ({}): discovery of the plugin.yaml in force ({})",
                step.what,
                expected.2
            );
            let tenant_in_force = expected.1.is_some();
            assert_eq!(
                team,
                if tenant_in_force {
                    "team-a-value"
                } else {
                    "none"
                },
                "step {i} ({}): the tenant's policy in force or not",
                step.what
            );
            // The tenant's policy keeps the base's limit; the default's is its step's.
            let want = if tenant_in_force {
                "4096"
            } else {
                nofile.as_str()
            };
            assert_eq!(
                limit, want,
                "step {i} ({}): the jail's own limits",
                step.what
            );
            let e = request_events()
                .into_iter()
                .find(|e| e.app == app)
                .unwrap_or_else(|| panic!("step {i}: no audit event for {app}"));
            assert_eq!(
                Some(&e.policy.sha256),
                expected.1.as_ref().or(Some(&expected.0)),
                "step {i} ({}): the probe's policy",
                step.what
            );
        }
        stop.store(true, Ordering::Relaxed);

        // A refused set is not tried again while its files stay as they are (the periodic
        // check is quiet), but SIGHUP tries it again, and says it did.
        let n = reloads().len();
        pol_dir.swap(&files(&format!("{base}\nspec: [\n"), &None));
        assert!(
            wait_until(Duration::from_secs(20), || reloads().len() > n),
            "no reload event for the last broken set"
        );
        let pid = s.child.as_ref().expect("server").id();
        let hup = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(hup.success());
        assert!(
            wait_until(Duration::from_secs(20), || reloads().len() > n + 1),
            "SIGHUP made no reload\n{}",
            s.logs()
        );
        let last = reloads().pop().expect("event");
        assert_eq!(
            (last.trigger.as_str(), last.result.as_str()),
            ("signal", "refused"),
            "{last:?}"
        );
        refused += 2;
        // And the server, which SIGHUP would have ended without its handler, still serves.
        call("after-hup", "team-b").unwrap_or_else(|e| panic!("after SIGHUP: {e:?}"));

        // Every client request succeeded, and ran under a set in force while it ran.
        let seen = seen.lock().expect("seen");
        let events = request_events();
        assert!(seen.len() >= 20, "the clients sent {} requests", seen.len());
        for q in seen.iter() {
            let v = q.result.as_ref().unwrap_or_else(|e| {
                panic!("{}: failed during reloads: {e:?}\n{}", q.app, s.logs())
            });
            let _ = data(v);
            let e = events
                .iter()
                .find(|e| e.app == q.app)
                .unwrap_or_else(|| panic!("{}: no audit event", q.app));
            let possible: BTreeSet<&String> = in_force
                .iter()
                .filter(|f| f.from <= q.ended && f.until.is_none_or(|u| u >= q.started))
                .flat_map(|f| &f.shas)
                .collect();
            assert!(
                possible.contains(&e.policy.sha256),
                "{}: its policy {} was not in force while it ran ({possible:?})",
                q.app,
                e.policy.sha256
            );
        }
        // Counted as audited.
        let m = s.metrics();
        for (result, n) in [("accepted", accepted), ("refused", refused)] {
            let line = format!("cmp_warden_config_reloads_total{{result=\"{result}\"}} {n}");
            assert!(m.contains(&line), "{line}\n{m}");
        }
        assert!(
            m.contains(&format!("default={}", expected.0)),
            "cmp_warden_config_info names the default in force\n{m}"
        );

        // doctor, run beside the server as an operator would, names the set in force and the
        // reload it refused, against the files it reads now (a node-wide change).
        let n = reloads().len();
        pol_dir.swap(&files(
            &mark(&base, 99).replacen("count: 16}", "count: 15}", 1),
            &None,
        ));
        assert!(
            wait_until(Duration::from_secs(20), || reloads().len() > n),
            "no reload event for the node-wide change"
        );
        let out = std::process::Command::new(bin())
            .args(["doctor", "--json", "--policy"])
            .arg(&policies)
            .arg("--work-dir")
            .arg(&s.work)
            .output()
            .expect("doctor");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("doctor: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
        let c = v["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "configInForce"))
            .unwrap_or_else(|| panic!("doctor has no configInForce check: {v}"));
        let detail = c["detail"].as_str().unwrap_or_default();
        assert_eq!(c["status"], "partial", "{c}");
        for part in [
            format!("pid {pid}"),
            format!("default={}", &expected.0[..12]),
            "is not the one in force".to_owned(),
            "was REFUSED".to_owned(),
            "spec.uidRange".to_owned(),
        ] {
            assert!(
                detail.contains(&part),
                "doctor's configInForce lacks {part:?}: {detail}"
            );
        }

        // A reload refused because a file does not parse: doctor says why it cannot read the
        // files, and still shows the set in force, since when, and the refusal (mutant: the
        // parse error returned before the in-force check -> nothing but the error).
        let n = reloads().len();
        pol_dir.swap(&files(&format!("{base}\nspec: [\n# step 100\n"), &None));
        assert!(
            wait_until(Duration::from_secs(20), || reloads().len() > n),
            "no reload event for the broken file"
        );
        let out = std::process::Command::new(bin())
            .args(["doctor", "--policy"])
            .arg(&policies)
            .arg("--work-dir")
            .arg(&s.work)
            .output()
            .expect("doctor");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
        assert!(stderr.contains("default.yaml"), "{stderr}");
        for part in [
            "configInForce: the server here".to_owned(),
            format!("pid {pid}"),
            format!("default={}", &expected.0[..12]),
            "since ".to_owned(),
            "do not parse".to_owned(),
            "was REFUSED".to_owned(),
        ] {
            assert!(stdout.contains(&part), "doctor lacks {part:?}: {stdout}");
        }
    });
}

/// Prints the generation of its plugin.yaml (its argument) and which of two server variables
/// it got: the policy of generation `k` passes `GEN_EVEN` or `GEN_ODD` by `k`'s parity.
const PAIRED: &str = r#"
import json, os, sys
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gen"},
                  "data": {"plugin": sys.argv[1],
                           "even": os.environ.get("GEN_EVEN", "-"),
                           "odd": os.environ.get("GEN_ODD", "-")}}))
"#;

/// The fifth attack round's third finding, attacked again: policies and plugin.yaml changed
/// together, twelve times, while four clients send requests. Every request ran under one set
/// that was in force as a whole — its policy (the audit event's SHA-256, and the variable it
/// passed) and its plugin.yaml (the generation the command printed) a pair some accepted
/// reload put in force, never the new policy with the old command or the reverse (mutant: the
/// plans put in force before plugin.yaml, as two replacements, as they were -> requests of a
/// pair no reload accepted).
#[test]
fn policies_and_plugin_yaml_change_together_and_no_request_sees_half_of_it() {
    needs_root!(NEEDS_ROOT);
    let root = tempfile::tempdir().expect("tmp");
    let scratch = root.path().join("scratch/default.yaml");
    write_policy(&scratch, &[]);
    let base = std::fs::read_to_string(&scratch).expect("policy");
    let profile =
        std::fs::read_to_string(scratch.parent().expect("dir").join("seccomp/default.json"))
            .expect("profile");
    let from = "pass: [PATH, LANG, LC_ALL, TZ]";
    assert!(base.contains(from), "fixture: {from}");
    let policy_of = |k: usize| {
        let var = if k.is_multiple_of(2) {
            "GEN_EVEN"
        } else {
            "GEN_ODD"
        };
        format!(
            "{}\n# generation {k}\n",
            base.replacen(from, &format!("pass: [PATH, LANG, LC_ALL, TZ, {var}]"), 1)
        )
    };
    let plugin_of = |k: usize| {
        plugin(&format!(
            "  generate: {{command: [python3, plugin.py, \"{k}\"]}}\n"
        ))
    };
    let sha = |text: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    };
    let policies = root.path().join("policies");
    let files = |k: usize| {
        vec![
            ("default.yaml", policy_of(k)),
            ("seccomp/default.json", profile.clone()),
        ]
    };
    let mut pol_dir = ConfigMapDir::new(&policies, &files(0));
    let audit_log = root.path().join("audit.log");
    let s = Server::start_env(
        &plugin_of(0),
        &[
            "--policy",
            policies.to_str().expect("utf8"),
            "--audit-log",
            audit_log.to_str().expect("utf8"),
        ],
        &[("GEN_EVEN", "even"), ("GEN_ODD", "odd")],
    );
    let cfg = s.dir.path().join("config");
    let mut cfg_dir = ConfigMapDir::new(&cfg, &[("plugin.yaml", plugin_of(0))]);
    let r = repo(&[("plugin.py", PAIRED)]);
    let repo_dir = r.path().to_str().expect("utf8").to_owned();
    let audit_text = || std::fs::read_to_string(&audit_log).unwrap_or_default();
    let reloads = || -> Vec<ReloadEvent> {
        audit_text()
            .lines()
            .filter_map(ReloadEvent::from_line)
            .collect()
    };
    // Generation by the SHA-256 of each file.
    let policy_gen = |h: &str| (0..=12).find(|k| sha(&policy_of(*k)) == h);
    let plugin_gen = |h: &str| (0..=12).find(|k| sha(&plugin_of(*k)) == h);

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<(String, CallResult)>::new()));
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _stop_clients = StopOnDrop(stop.clone());
        for c in 0..4 {
            let (stop, seen, repo_dir) = (stop.clone(), seen.clone(), repo_dir.clone());
            let s = &s;
            scope.spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let app = format!("c{c}-{n}");
                    let result = go(
                        s,
                        "generate",
                        &["-dir", &repo_dir, "-env", &format!("ARGOCD_APP_NAME={app}")],
                    );
                    seen.lock().expect("seen").push((app, result));
                }
            });
        }
        for k in 1..=12 {
            let n = reloads().iter().filter(|e| e.result == "accepted").count();
            // Both at once, as one commit of a GitOps repository changes both ConfigMaps.
            pol_dir.swap(&files(k));
            cfg_dir.swap(&[("plugin.yaml", plugin_of(k))]);
            assert!(
                wait_until(Duration::from_secs(30), || {
                    reloads().iter().any(|e| {
                        e.result == "accepted"
                            && plugin_gen(&e.plugin_sha256) == Some(k)
                            && e.policies.first().and_then(|p| policy_gen(&p.sha256)) == Some(k)
                    })
                }),
                "generation {k} was never in force whole ({n} accepted before)\n{}",
                s.logs()
            );
        }
        stop.store(true, Ordering::Relaxed);
    });

    // The pairs in force, from the start and from every accepted reload.
    let mut pairs: BTreeSet<(usize, usize)> = [(0, 0)].into();
    for e in reloads().iter().filter(|e| e.result == "accepted") {
        let policy = e.policies.first().and_then(|p| policy_gen(&p.sha256));
        let plugin = plugin_gen(&e.plugin_sha256);
        pairs.insert((
            policy.unwrap_or_else(|| panic!("a policy of no generation: {e:?}")),
            plugin.unwrap_or_else(|| panic!("a plugin.yaml of no generation: {e:?}")),
        ));
    }
    let events = audit_events_in(&audit_text());
    let seen = seen.lock().expect("seen");
    assert!(seen.len() >= 12, "the clients sent {} requests", seen.len());
    let mut halves = Vec::new();
    for (app, result) in seen.iter() {
        let v = result
            .as_ref()
            .unwrap_or_else(|e| panic!("{app}: failed during reloads: {e:?}\n{}", s.logs()));
        let m: serde_json::Value = serde_json::from_str(&manifests(v)[0]).expect("manifest");
        let plugin: usize = m["data"]["plugin"]
            .as_str()
            .and_then(|g| g.parse().ok())
            .expect("generation");
        let e = events
            .iter()
            .find(|e| &e.app == app)
            .unwrap_or_else(|| panic!("{app}: no audit event"));
        let policy = policy_gen(&e.policy.sha256).expect("policy generation");
        // The variable the command got is its policy's.
        let (even, odd) = (m["data"]["even"].as_str(), m["data"]["odd"].as_str());
        let want = if policy.is_multiple_of(2) {
            (Some("even"), Some("-"))
        } else {
            (Some("-"), Some("odd"))
        };
        assert_eq!((even, odd), want, "{app}: policy {policy}'s variable");
        if !pairs.contains(&(policy, plugin)) {
            halves.push(format!("{app}: policy {policy} with plugin.yaml {plugin}"));
        }
    }
    assert!(
        halves.is_empty(),
        "{} of {} requests ran on half of an update (sets in force: {pairs:?}):\n{}",
        halves.len(),
        seen.len(),
        halves.join("\n")
    );
}

/// The fifth attack round's sixth finding, attacked again: a policy directory holding two
/// links to `.`, a link out of it named like a policy, a FIFO and `/dev/zero` named `*.yaml`,
/// and a 1 GiB file beside the policies. The server starts (the reloader follows no link to a
/// directory, reads policy files only and each at most 1 MiB); the same entries added while it
/// serves leave the reload thread free, so the next valid change is applied; the server never
/// held the big file (a generous liveness bound on its peak memory, not a measurement).
/// Mutant: the old recursive hash of every file -> no socket within the start-up wait.
#[test]
fn a_policy_directory_of_loops_devices_and_huge_files_neither_wedges_nor_fills_the_reloader() {
    needs_root!(NEEDS_ROOT);
    let root = tempfile::tempdir().expect("tmp");
    let policies = root.path().join("policies");
    write_policy(&policies.join("default.yaml"), &[]);
    let base = std::fs::read_to_string(policies.join("default.yaml")).expect("policy");
    let plant = |dir: &Path, tag: &str| {
        std::os::unix::fs::symlink(".", dir.join(format!("loop-{tag}-a"))).expect("link");
        std::os::unix::fs::symlink(".", dir.join(format!("loop-{tag}-b"))).expect("link");
        std::os::unix::fs::symlink("/etc/passwd", dir.join(format!("outside-{tag}.yaml")))
            .expect("link");
        std::os::unix::fs::symlink("/dev/zero", dir.join(format!("zero-{tag}.yaml")))
            .expect("link");
        let fifo = dir.join(format!("fifo-{tag}.yaml"));
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success(), "mkfifo");
        let big = std::fs::File::create(dir.join(format!("big-{tag}.bin"))).expect("big");
        big.set_len(1 << 30).expect("sparse 1 GiB");
    };
    plant(&policies, "start");
    let audit_log = root.path().join("audit.log");
    let s = Server::start(
        &plugin("  generate: {command: [cat, cm.yaml]}\n"),
        &[
            "--policy",
            policies.to_str().expect("utf8"),
            "--audit-log",
            audit_log.to_str().expect("utf8"),
        ],
    );
    let r = repo(&[(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )]);
    let dir = r.path().to_str().expect("utf8");
    go(&s, "generate", &["-dir", dir]).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    let logs = s.logs();
    for skipped in ["outside-start.yaml", "zero-start.yaml", "fifo-start.yaml"] {
        assert!(
            logs.contains(skipped),
            "start-up says it skipped {skipped}\n{logs}"
        );
    }
    // The same entries while serving, then a valid change, which must be applied.
    plant(&policies, "serving");
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(
        policies.join("default.yaml"),
        format!("{base}\n# a valid change\n"),
    )
    .expect("write");
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(
            format!("{base}\n# a valid change\n").as_bytes(),
        ))
    };
    let accepted = || {
        std::fs::read_to_string(&audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(ReloadEvent::from_line)
            .any(|e| e.result == "accepted" && e.policies.first().is_some_and(|p| p.sha256 == sha))
    };
    assert!(
        wait_until(Duration::from_secs(40), accepted),
        "the valid change after the loops was never applied\n{}",
        s.logs()
    );
    go(&s, "generate", &["-dir", dir]).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    // Liveness bound: the server never held the 1 GiB file.
    let pid = s.child.as_ref().expect("server").id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM");
    assert!(
        peak_kib < 512 * 1024,
        "the server's peak memory is {peak_kib} KiB: it read the big file"
    );
}
