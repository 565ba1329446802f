//! The sandbox policy: schema, strict validation, and Kubernetes-style quantities.
#![forbid(unsafe_code)]

pub mod policy;
pub mod quantity;

pub use policy::{NetworkMode, Policy, PolicyError, Protection, SeccompMode};
pub use quantity::{QuantityError, parse_quantity};
