//! The CMP service as a Rust client sees it (tonic over the unix socket): requests built frame
//! by frame, for tests that stop or break a stream where the grpc-go client would not.
use super::{Server, repo};
use proto::plugin::config_management_plugin_service_client::ConfigManagementPluginServiceClient;
use proto::plugin::{AppStreamRequest, File, ManifestRequestMetadata, app_stream_request};
use std::path::PathBuf;

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

pub async fn channel(s: &Server) -> tonic::transport::Channel {
    channel_at(s.sock.clone()).await
}

/// A channel to the unix socket `sock`.
pub async fn channel_at(sock: PathBuf) -> tonic::transport::Channel {
    tonic::transport::Endpoint::try_from("http://localhost")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_| {
            let p = sock.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .expect("connect")
}

pub async fn client(s: &Server) -> ConfigManagementPluginServiceClient<tonic::transport::Channel> {
    client_at(s.sock.clone()).await
}

/// A client of the unix socket `sock` (for a thread that does not hold the [`Server`]).
pub async fn client_at(
    sock: PathBuf,
) -> ConfigManagementPluginServiceClient<tonic::transport::Channel> {
    ConfigManagementPluginServiceClient::new(channel_at(sock).await)
}

pub fn meta(checksum: &str, app_rel_path: &str) -> AppStreamRequest {
    AppStreamRequest {
        request: Some(app_stream_request::Request::Metadata(
            ManifestRequestMetadata {
                app_name: "app".into(),
                app_rel_path: app_rel_path.into(),
                checksum: checksum.into(),
                size: 0,
                env: vec![],
            },
        )),
    }
}

pub fn file(chunk: &[u8]) -> AppStreamRequest {
    AppStreamRequest {
        request: Some(app_stream_request::Request::File(File {
            chunk: chunk.to_vec(),
        })),
    }
}

pub fn sha(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

pub fn good_tgz() -> Vec<u8> {
    let r = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let mut buf = Vec::new();
    archive::pack_dir(r.path(), &|_| false, &mut buf).expect("pack");
    buf
}
