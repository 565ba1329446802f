//! The sandbox policy: schema, strict validation, and Kubernetes-style quantities.
#![forbid(unsafe_code)]

pub mod quantity;

pub use quantity::{QuantityError, parse_quantity};
