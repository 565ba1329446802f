//! The policy's named choices, shared by the policy file's raw form and the validated
//! [`crate::Policy`]: what can be required, Landlock's features, the network and seccomp
//! modes, and the namespaces.

use serde::{Deserialize, Serialize};

/// A protection that can be required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Protection {
    /// A unique UID/GID leased per request.
    UniqueUid,
    /// `no_new_privs`.
    NoNewPrivs,
    /// Landlock filesystem (and, ABI ≥ 4, network) rules.
    Landlock,
    /// The seccomp profile.
    Seccomp,
    /// cgroup limits (memory, pids, CPU).
    Cgroups,
    /// Namespaces (mount, PID, network, IPC, UTS).
    Namespaces,
}

impl Protection {
    /// The name used in policy files (`uniqueUid`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Protection::UniqueUid => "uniqueUid",
            Protection::NoNewPrivs => "noNewPrivs",
            Protection::Landlock => "landlock",
            Protection::Seccomp => "seccomp",
            Protection::Cgroups => "cgroups",
            Protection::Namespaces => "namespaces",
        }
    }
}

impl std::fmt::Display for Protection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Landlock feature, by the kernel ABI that brought it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LandlockFeature {
    /// Filesystem access rights (ABI 1): the request directory writable, system paths
    /// read-only, everything else denied.
    Filesystem,
    /// Linking and renaming across directories (ABI 2).
    Refer,
    /// Truncating files (ABI 3).
    Truncate,
    /// TCP bind and connect (ABI 4; denied with `network: none`).
    Tcp,
    /// ioctl on devices (ABI 5).
    IoctlDev,
    /// Abstract unix sockets created outside the jail are unreachable (ABI 6).
    AbstractUnixSocketScope,
    /// Processes outside the jail cannot be signalled (ABI 6).
    SignalScope,
}

impl LandlockFeature {
    /// Every feature, oldest first.
    pub const ALL: [LandlockFeature; 7] = [
        LandlockFeature::Filesystem,
        LandlockFeature::Refer,
        LandlockFeature::Truncate,
        LandlockFeature::Tcp,
        LandlockFeature::IoctlDev,
        LandlockFeature::AbstractUnixSocketScope,
        LandlockFeature::SignalScope,
    ];

    /// The Landlock ABI version that brought it.
    pub fn abi(self) -> u8 {
        match self {
            LandlockFeature::Filesystem => 1,
            LandlockFeature::Refer => 2,
            LandlockFeature::Truncate => 3,
            LandlockFeature::Tcp => 4,
            LandlockFeature::IoctlDev => 5,
            LandlockFeature::AbstractUnixSocketScope | LandlockFeature::SignalScope => 6,
        }
    }

    /// The name used in policy files.
    pub fn as_str(self) -> &'static str {
        match self {
            LandlockFeature::Filesystem => "filesystem",
            LandlockFeature::Refer => "refer",
            LandlockFeature::Truncate => "truncate",
            LandlockFeature::Tcp => "tcp",
            LandlockFeature::IoctlDev => "ioctlDev",
            LandlockFeature::AbstractUnixSocketScope => "abstractUnixSocketScope",
            LandlockFeature::SignalScope => "signalScope",
        }
    }
}

/// What the policy requires of Landlock beyond its presence (`spec.landlock`; needs `landlock`
/// in `spec.require`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LandlockRequirement {
    /// The lowest kernel Landlock ABI start-up accepts (1 without a `landlock` section).
    pub min_abi: u8,
    /// Features that must be in effect (each implies its ABI).
    pub features: Vec<LandlockFeature>,
}

impl LandlockRequirement {
    /// The ABI the requirement amounts to.
    pub fn abi(&self) -> u8 {
        self.features
            .iter()
            .map(|f| f.abi())
            .chain([self.min_abi])
            .max()
            .unwrap_or(1)
    }
}

/// Network access for plugin commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NetworkMode {
    /// No TCP connect/bind, no non-unix sockets.
    None,
    /// Outbound connections allowed (e.g. helm dependency fetches).
    Egress,
    /// Only the destinations of `spec.network.allow`, through the supervisor's proxy (the
    /// jail keeps its empty network namespace).
    AllowList,
}

impl NetworkMode {
    /// The name used in policy files.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Egress => "egress",
            NetworkMode::AllowList => "allowList",
        }
    }
}

/// Whether seccomp denies or only logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SeccompMode {
    /// Deny with the profile's action.
    Enforce,
    /// Log what would be denied (for writing a policy).
    Audit,
}

impl SeccompMode {
    /// The name used in policy files.
    pub fn as_str(self) -> &'static str {
        match self {
            SeccompMode::Enforce => "enforce",
            SeccompMode::Audit => "audit",
        }
    }
}

/// A namespace a jail may enter. The policy lists those it wants besides the user namespace
/// (`spec.namespaces`), which is always created when namespaces are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Namespace {
    /// `CLONE_NEWUSER`.
    User,
    /// `CLONE_NEWNS`.
    Mount,
    /// `CLONE_NEWPID`.
    Pid,
    /// `CLONE_NEWNET`.
    Net,
    /// `CLONE_NEWIPC`.
    Ipc,
    /// `CLONE_NEWUTS`.
    Uts,
    /// `CLONE_NEWCGROUP`.
    Cgroup,
}

impl Namespace {
    /// Its name in reports and the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Mount => "mount",
            Self::Pid => "pid",
            Self::Net => "net",
            Self::Ipc => "ipc",
            Self::Uts => "uts",
            Self::Cgroup => "cgroup",
        }
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}
