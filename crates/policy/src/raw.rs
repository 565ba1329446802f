//! The policy file as written: what serde reads, before any check (`crate::policy` validates
//! it into a [`crate::Policy`]). Unknown fields are errors.

use serde::Deserialize;

use crate::choices::{LandlockFeature, Namespace, NetworkMode, Protection, SeccompMode};

/// A number or a Kubernetes-style quantity string in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawQty {
    Num(u64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawPolicy {
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) metadata: RawMeta,
    pub(crate) spec: RawSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMeta {
    pub(crate) name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawSpec {
    /// Only in a policy directory's selected policies (the default has none).
    #[serde(default)]
    pub(crate) select: Option<crate::select::Select>,
    // `require` and `uidRange` are node-wide: the default policy must set them, a selected
    // one must not (`Policy::validate` says which).
    #[serde(default)]
    pub(crate) require: Option<Vec<Protection>>,
    #[serde(default)]
    pub(crate) namespaces: Option<Vec<Namespace>>,
    #[serde(default)]
    pub(crate) uid_range: Option<RawUidRange>,
    pub(crate) filesystem: RawFs,
    pub(crate) network: RawNetwork,
    pub(crate) seccomp: RawSeccomp,
    pub(crate) limits: RawLimits,
    pub(crate) archive: RawArchive,
    #[serde(default)]
    pub(crate) env: RawEnv,
    #[serde(default)]
    pub(crate) landlock: Option<RawLandlock>,
    #[serde(default)]
    pub(crate) cache: Option<RawCache>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawCache {
    #[serde(default)]
    pub(crate) enabled: Option<bool>,
    #[serde(default)]
    pub(crate) bytes: Option<RawQty>,
    #[serde(default)]
    pub(crate) uid: Option<u32>,
    #[serde(default)]
    pub(crate) min_archive_bytes: Option<RawQty>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawLandlock {
    #[serde(default)]
    pub(crate) min_abi: Option<u8>,
    #[serde(default)]
    pub(crate) features: Vec<LandlockFeature>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnv {
    #[serde(default)]
    pub(crate) pass: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUidRange {
    pub(crate) first: u32,
    pub(crate) count: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawFs {
    #[serde(default)]
    pub(crate) read_only: Vec<String>,
    #[serde(default)]
    pub(crate) read_write: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawNetwork {
    pub(crate) mode: NetworkMode,
    #[serde(default)]
    pub(crate) allow: Vec<RawDestination>,
    #[serde(default)]
    pub(crate) audit: bool,
    #[serde(default)]
    pub(crate) max_connections: Option<u64>,
    #[serde(default)]
    pub(crate) hosts: std::collections::BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub(crate) search_domains: bool,
    #[serde(default)]
    pub(crate) loopback: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDestination {
    #[serde(default)]
    pub(crate) host: Option<String>,
    #[serde(default)]
    pub(crate) cidr: Option<String>,
    pub(crate) ports: Vec<u16>,
    #[serde(default)]
    pub(crate) internal: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSeccomp {
    pub(crate) profile: String,
    pub(crate) mode: SeccompMode,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawLimits {
    pub(crate) wall_seconds: RawQty,
    pub(crate) memory_bytes: RawQty,
    pub(crate) pids: RawQty,
    pub(crate) cpu_millis: RawQty,
    pub(crate) output_bytes: RawQty,
    pub(crate) open_files: RawQty,
    pub(crate) file_size_bytes: RawQty,
    pub(crate) disk_bytes: RawQty,
    #[serde(default)]
    pub(crate) data_bytes: Option<RawQty>,
    #[serde(default)]
    pub(crate) address_space_bytes: Option<RawQty>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawArchive {
    pub(crate) compressed_bytes: RawQty,
    pub(crate) extracted_bytes: RawQty,
    pub(crate) file_bytes: RawQty,
    pub(crate) entries: RawQty,
    pub(crate) symlinks: RawQty,
    pub(crate) path_depth: RawQty,
    pub(crate) max_ratio: RawQty,
    pub(crate) wall_seconds: RawQty,
    #[serde(default)]
    pub(crate) strict_names: bool,
}
