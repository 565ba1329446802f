//! Generated types for `plugin.ConfigManagementPluginService` and `repository.ParameterAnnouncement`.
//! Only this crate knows protobuf; everything else converts at the server edge.
#![forbid(unsafe_code)]
#![allow(
    missing_docs,
    missing_debug_implementations,
    unused_qualifications,
    clippy::all
)]

/// Package `repository` (only `ParameterAnnouncement`).
pub mod repository {
    tonic::include_proto!("repository");
}

/// Package `askpass`: Argo CD's git credential service (the askpass helper is its client).
pub mod askpass {
    tonic::include_proto!("askpass");
}

/// Package `plugin`: messages, client and server.
pub mod plugin {
    tonic::include_proto!("plugin");
}
