//! The git askpass helper, compatible with Argo CD's `argocd` in askpass mode: git runs
//! `$GIT_ASKPASS PROMPT` (the repo-server sets `GIT_ASKPASS=argocd` and
//! `ARGOCD_BINARY_NAME=argocd-git-ask-pass` for plugins with `provideGitCreds`); this binary,
//! installed as `argocd` on the sidecar's PATH, reads `ARGOCD_GIT_ASKPASS_NONCE`, calls
//! `askpass.AskPassService/GetCredentials` and prints the username or the password.
//!
//! Inside a jail (`network: allowList`) the repo-server's socket is not reachable; the helper
//! asks the egress proxy (`HTTPS_PROXY`) to `CONNECT` the reserved name
//! [`egress::ASKPASS_HOST`], which the supervisor relays to the socket the operator shared.
//! Elsewhere it dials `ARGOCD_ASK_PASS_SOCK` itself, as Argo's helper does.

use std::process::ExitCode;

use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Endpoint;

/// Whether this process was started as Argo CD's askpass helper.
pub fn invoked() -> bool {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name == "argocd" && std::env::var("ARGOCD_BINARY_NAME").as_deref() == Ok("argocd-git-ask-pass")
}

/// Answer one prompt; exit 1 with the reason on stderr (git shows it).
pub fn run() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match answer(&args) {
        Ok(v) => {
            super::print_out(&format!("{v}\n"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("argocd-git-ask-pass (cmp-warden): {e:#}");
            ExitCode::from(1)
        }
    }
}

fn answer(args: &[String]) -> anyhow::Result<String> {
    let [prompt] = args else {
        bail!("expected 1 argument (the prompt), got {}", args.len());
    };
    let nonce =
        std::env::var("ARGOCD_GIT_ASKPASS_NONCE").context("ARGOCD_GIT_ASKPASS_NONCE is not set")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let creds = rt.block_on(get_credentials(nonce))?;
    if prompt.starts_with("Username") {
        Ok(creds.username)
    } else if prompt.starts_with("Password") {
        Ok(creds.password)
    } else {
        bail!("unknown prompt {prompt:?} (expected Username… or Password…)")
    }
}

/// A stream to the repo-server's askpass service: through the proxy's relay, or direct.
async fn dial() -> anyhow::Result<Box<dyn Io>> {
    let proxy = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    if let Some(p) = proxy {
        let addr = p
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .with_context(|| format!("connecting to the egress proxy {addr}"))?;
        s.write_all(format!("CONNECT {}:1 HTTP/1.1\r\n\r\n", egress::ASKPASS_HOST).as_bytes())
            .await?;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() > 16 * 1024 {
                bail!("the egress proxy's answer is too long");
            }
            let b = s
                .read_u8()
                .await
                .context("reading the egress proxy's answer")?;
            head.push(b);
        }
        let text = String::from_utf8_lossy(&head);
        if !text.starts_with("HTTP/1.1 200") {
            let status = text.lines().next().unwrap_or_default();
            let mut body = String::new();
            let _ = s.read_to_string(&mut body).await;
            bail!("{status}: {}", body.trim());
        }
        return Ok(Box::new(s));
    }
    let path = std::env::var("ARGOCD_ASK_PASS_SOCK")
        .context("neither an egress proxy (HTTPS_PROXY) nor ARGOCD_ASK_PASS_SOCK is set")?;
    let s = tokio::net::UnixStream::connect(&path)
        .await
        .with_context(|| format!("connecting to {path}"))?;
    Ok(Box::new(s))
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

async fn get_credentials(nonce: String) -> anyhow::Result<proto::askpass::CredentialsResponse> {
    let stream = std::sync::Mutex::new(Some(dial().await?));
    let ch = Endpoint::try_from("http://askpass")?
        .connect_with_connector(tower::service_fn(move |_| {
            let s = stream.lock().ok().and_then(|mut g| g.take());
            async move {
                s.map(TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("one connection only"))
            }
        }))
        .await
        .context("speaking gRPC to the askpass service")?;
    let mut client = proto::askpass::ask_pass_service_client::AskPassServiceClient::new(ch);
    let r = client
        .get_credentials(proto::askpass::CredentialsRequest { nonce })
        .await
        .map_err(|s| anyhow::anyhow!("GetCredentials: {}: {}", s.code(), s.message()))?;
    Ok(r.into_inner())
}
