//! The container's own OOM-kill counter.

use std::path::{Path, PathBuf};

/// The OOM-kill counter of the server's own memory cgroup (its container's), for nodes that
/// delegate no cgroup to it: v2 `memory.events` `oom_kill`, v1 `memory.oom_control` `oom_kill`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomCounter {
    file: PathBuf,
}

impl OomCounter {
    /// The counter of the cgroup `self_cgroup` (the content of `/proc/self/cgroup`) names under
    /// the cgroupfs mount `root`, where the kernel has one; or, where that path is not there, of
    /// the hierarchy's root as mounted (a container's cgroupfs without a cgroup namespace shows
    /// the container's own cgroup at the root, though `/proc/self/cgroup` names its host path).
    pub fn find(root: &Path, self_cgroup: &str) -> Option<Self> {
        let (dir, own, file) = if root.join("cgroup.controllers").exists() {
            let own = self_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
            (root.to_path_buf(), own, "memory.events")
        } else {
            let own = self_cgroup.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, list, path) = (f.next()?, f.next()?, f.next()?);
                list.split(',').any(|c| c == "memory").then_some(path)
            })?;
            (root.join("memory"), own, "memory.oom_control")
        };
        [dir.join(own.trim().trim_start_matches('/')), dir]
            .into_iter()
            .map(|d| OomCounter { file: d.join(file) })
            .find(|c| c.read().is_some())
    }

    /// The kills so far (`None` if the file cannot be read or has no count).
    pub fn read(&self) -> Option<u64> {
        std::fs::read_to_string(&self.file).ok().and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
            })
        })
    }

    /// Where it is read.
    pub fn file(&self) -> &Path {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The container's OOM-kill counter: the server's own cgroup, or the hierarchy's root as a
    /// container without a cgroup namespace mounts it (its own cgroup at the root).
    #[test]
    fn the_containers_oom_counter_is_found_where_the_mount_shows_it() {
        let t = tempfile::tempdir().expect("tmp");
        let v1 = "4:memory:/kubepods/pod1/ctr\n";
        let mem = t.path().join("memory");
        std::fs::create_dir_all(&mem).expect("mkdir");
        std::fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .expect("w");
        let c = OomCounter::find(t.path(), v1).expect("the mount's root");
        assert_eq!(
            (c.file(), c.read()),
            (mem.join("memory.oom_control").as_path(), Some(3))
        );
        let nested = mem.join("kubepods/pod1/ctr");
        std::fs::create_dir_all(&nested).expect("mkdir");
        std::fs::write(nested.join("memory.oom_control"), "oom_kill 1\n").expect("w");
        assert_eq!(
            OomCounter::find(t.path(), v1).and_then(|c| c.read()),
            Some(1)
        );
        // v2 with a cgroup namespace: "0::/" and memory.events at the root.
        let v2 = tempfile::tempdir().expect("tmp");
        std::fs::write(v2.path().join("cgroup.controllers"), "memory pids").expect("w");
        std::fs::write(
            v2.path().join("memory.events"),
            "low 0\nmax 4\noom 2\noom_kill 2\n",
        )
        .expect("w");
        assert_eq!(
            OomCounter::find(v2.path(), "0::/\n").and_then(|c| c.read()),
            Some(2)
        );
        assert!(OomCounter::find(&t.path().join("none"), v1).is_none());
    }
}
