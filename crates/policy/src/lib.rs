//! The sandbox policy: schema, strict validation, and Kubernetes-style quantities.
#![forbid(unsafe_code)]

pub mod choices;
pub mod emit;
pub mod error;
pub mod generator;
pub mod policy;
pub mod quantity;
mod raw;
pub mod seccomp;
pub mod select;

pub use choices::Namespace;
pub use policy::{
    CachePolicy, DEFAULT_POLICY_YAML, LandlockFeature, LandlockRequirement, Namespaces,
    NetworkMode, Policy, PolicyError, PolicySet, Protection, SeccompMode, is_env_name, names_var,
};
pub use quantity::{QuantityError, parse_quantity};
pub use seccomp::SeccompProfile;
pub use select::{Identity, Pattern, Select};
