//! Argo CD plugin semantics, with no processes and no sockets: `plugin.yaml` parsing exactly as
//! Argo CD accepts it, discovery matching (Go `filepath.Glob`, go-zglob), parameters, environment
//! composition, and generate-output splitting.
#![forbid(unsafe_code)]

pub mod config;
pub mod duration;
pub mod env;
pub mod glob;
pub mod gojson;
pub mod gonum;
pub mod goyaml;
mod isprint;
pub mod json;
pub mod locate;
pub mod params;
pub mod split;
pub mod yaml;

pub use split::{
    SplitError, split_manifests, split_manifests_within, split_output, split_output_within,
};

pub use config::{Command, ConfigError, Discover, Loaded, PluginConfig};
