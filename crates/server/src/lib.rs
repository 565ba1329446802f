//! The CMP gRPC service and its listeners. Knows gRPC; knows nothing of how requests are
//! confined (that is the runner's business, `supervisor::Runner`).
#![forbid(unsafe_code)]

pub mod admission;
pub mod appset;
pub mod audit;
pub mod auth;
pub mod authority;
pub mod conns;
mod lifecycle;
pub mod listener;
pub mod metrics;
mod refuse;
pub mod reload;
pub mod reply_memory;
pub mod service;
pub mod sparse;
pub mod status;
pub mod tls;
pub mod trace;
pub mod watch_cap;

pub use listener::{ListenOptions, TcpOptions, bind, serve};
pub use service::{CmpService, ServiceConfig};
