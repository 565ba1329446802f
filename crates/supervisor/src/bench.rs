//! For the benchmark harness only.
//!
//! One command run as the jail runs it, to measure the runner's cost over a bare spawn; the
//! orphan reaping a harness that is the subreaper of other sandboxes needs to count their CPU
//! in the right window; and the switches of benches/cpu.py's layer pass (issue 51), each of
//! which turns one protection off so its system-wide cost can be measured by its absence.
//!
//! The switches exist only in a build with the cargo feature `bench-layers` (benches/run
//! makes one, aside, for that pass; no release, image or test build has it). Elsewhere every
//! switch reads false, so the compiler drops what they guard, and [`init`] refuses to start a
//! server whose environment asks for one: a production binary never runs with less than its
//! policy says, however it is started.

pub use jail::{CmdSpec, run};
pub use jail_sys::reaper::{reap_orphans, spawn_tracked, untrack};

/// The environment variable naming the layers to switch off, comma-separated
/// ([`Off::NAMES`]).
pub const OFF_ENV: &str = "CMP_WARDEN_BENCH_OFF";

/// Which protections a bench build leaves out. All false in every other build.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Off {
    /// No Landlock ruleset (step 10 of `confine`). A policy that requires `landlock` still
    /// refuses to start: the pass's policy leaves it out of `spec.require`.
    pub landlock: bool,
    /// No seccomp filter and so no listener thread (step 11); likewise for `seccomp`.
    pub seccomp: bool,
    /// No per-request cgroup (nor its removal).
    pub cgroups: bool,
    /// No spare jails: each request prepares its own.
    pub spare: bool,
    /// No audit event and no request metrics.
    pub audit: bool,
}

impl Off {
    /// The names [`OFF_ENV`] takes.
    pub const NAMES: [&'static str; 5] = ["landlock", "seccomp", "cgroups", "spare", "audit"];

    /// Parse [`OFF_ENV`]'s value.
    pub fn parse(text: &str) -> Result<Off, String> {
        let mut off = Off::default();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let flag = match name {
                "landlock" => &mut off.landlock,
                "seccomp" => &mut off.seccomp,
                "cgroups" => &mut off.cgroups,
                "spare" => &mut off.spare,
                "audit" => &mut off.audit,
                other => {
                    return Err(format!(
                        "{OFF_ENV}: unknown layer {other:?} (one of {:?})",
                        Off::NAMES
                    ));
                }
            };
            *flag = true;
        }
        Ok(off)
    }

    /// The names of the layers switched off.
    pub fn names(&self) -> Vec<&'static str> {
        let on = [
            self.landlock,
            self.seccomp,
            self.cgroups,
            self.spare,
            self.audit,
        ];
        Off::NAMES
            .into_iter()
            .zip(on)
            .filter_map(|(n, o)| o.then_some(n))
            .collect()
    }
}

#[cfg(feature = "bench-layers")]
static OFF: std::sync::OnceLock<Off> = std::sync::OnceLock::new();

/// Read [`OFF_ENV`] once, at start-up, before any request. A build without `bench-layers`
/// refuses a non-empty value rather than ignore it.
pub fn init() -> Result<Off, String> {
    let text = std::env::var(OFF_ENV).unwrap_or_default();
    let off = Off::parse(&text)?;
    #[cfg(feature = "bench-layers")]
    {
        let _ = OFF.set(off);
        Ok(off)
    }
    #[cfg(not(feature = "bench-layers"))]
    {
        if off != Off::default() {
            return Err(format!(
                "{OFF_ENV}={text:?} asks to switch protections off, and this build has no such switches (only a benchmark build, cargo feature bench-layers, does); unset it"
            ));
        }
        Ok(off)
    }
}

/// The layers switched off: what [`init`] read in a bench build, none in any other.
#[inline]
pub fn off() -> Off {
    #[cfg(feature = "bench-layers")]
    {
        OFF.get().copied().unwrap_or_default()
    }
    #[cfg(not(feature = "bench-layers"))]
    {
        Off::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_read_back() {
        let off = Off::parse("landlock, spare,,audit").unwrap();
        assert_eq!(off.names(), ["landlock", "spare", "audit"]);
        assert_eq!(Off::parse("").unwrap(), Off::default());
        let e = Off::parse("landlock,net").unwrap_err();
        assert!(e.contains("unknown layer \"net\""), "{e}");
    }
}
