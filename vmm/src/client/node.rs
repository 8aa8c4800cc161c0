//! The data plane of a node daemon, client side: one HTTP/1.1 `Upgrade` request turns
//! a TCP (or TLS) connection into an agent byte stream.
//!
//! ```text
//! client ── TCP ─[TLS]─► GET /v1/sandboxes/ID/agent       ─► daemon
//!                        Connection: Upgrade
//!                        Upgrade: sandbox-agent
//!                        Authorization: Bearer T
//!        ◄────────────── 101 Switching Protocols (or a JSON error)
//!        ═══════ agent protocol (Hello, requests, …) ═══════► daemon ═► agent
//! ```
//!
//! After the `101` the stream is handed to the client's demultiplexer exactly as a
//! Unix socket would be. The Bearer token is [`super::ConnectOptions::token`]; the
//! client's `Hello` then carries no token, because the daemon puts the agent's own
//! token into it ([`crate::splice::forward_hello`]): the node's tokens never enter a
//! guest, and the agent's token never leaves the node.
//!
//! The handshake is hyper's HTTP/1.1 client (`hyper::upgrade::on` yields the stream
//! with whatever bytes hyper read past the response head), bounded in head size by
//! [`MAX_HEAD_BYTES`] and in error-body size by [`MAX_ERROR_BODY_BYTES`]; the caller's
//! connect timeout bounds it in time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, HOST, UPGRADE};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::connect::{
    agent_path, AgentStream, AgentUrl, NodeEndpoint, NodeUrl, NODE_UPGRADE_TOKEN,
};
use super::error::ClientError;

/// Longest response head accepted (status line plus headers). hyper's floor for its
/// read buffer is 8 KiB; a daemon's `101` is a few hundred bytes.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Most of an error answer's body read for its message; the rest is not read.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Longest message kept from an error body that is not the daemon's JSON.
const MAX_PLAIN_MESSAGE_BYTES: usize = 1024;

/// Why the upgrade failed before the daemon gave an HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The CA file named by `?ca=` could not be read.
    #[error("Cannot read the CA file {}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        error: std::io::Error,
    },
    /// The CA file holds no PEM certificate.
    #[error("No certificate in the CA file {}", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A certificate of the CA file was refused as a trust root.
    #[error("Bad certificate in the CA file {}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// Why rustls refused it.
        #[source]
        error: rustls::Error,
    },
    /// The system's certificate store holds no usable root.
    #[error("No trusted root certificates on this system; name a CA file with ?ca=")]
    NoSystemRoots,
    /// The TLS configuration could not be built.
    #[error("Cannot configure TLS")]
    TlsConfig(#[source] rustls::Error),
    /// The host is not a valid TLS server name.
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
    /// The TLS handshake failed (certificate refused, protocol error).
    #[error("TLS handshake failed")]
    Tls(#[source] std::io::Error),
    /// The request could not be built (the URL's parts were checked when parsed, so
    /// only a hand-made [`NodeUrl`] gets here).
    #[error("Cannot build the upgrade request")]
    Request(#[source] hyper::http::Error),
    /// The token cannot go in an HTTP header (it is not printed here).
    #[error("The token holds characters an HTTP header cannot carry")]
    BadToken,
    /// The HTTP exchange failed: the daemon closed the connection before its
    /// answer was complete, sent a malformed or oversize head, and so on.
    #[error("HTTP exchange failed")]
    Http(#[source] hyper::Error),
    /// The daemon answered `101` but switched to something else.
    #[error("Node switched to {0:?}, not {NODE_UPGRADE_TOKEN}")]
    WrongUpgrade(String),
    /// The answer's body could not be read or the request's written.
    #[error("Bad HTTP body: {0}")]
    Reply(String),
    /// hyper could not hand over the upgraded connection.
    #[error("Upgrade failed")]
    Upgrade(#[source] hyper::Error),
}

/// The daemon's error answer: seed 000's `{"error": "...", "code": "..."}` (what
/// `sandboxd` sends), or `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, serde::Deserialize)]
struct ErrorBody {
    error: ErrorField,
    #[serde(default)]
    code: String,
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum ErrorField {
    Text(String),
    Detail {
        #[serde(default)]
        code: String,
        message: String,
    },
}

/// Aborts the task driving the HTTP connection when the dial ends or is dropped (a
/// timeout), so that no task outlives its caller. After a successful upgrade the task
/// has already finished: it hands the connection over as its last step.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why [`open`] failed.
#[derive(Debug)]
pub(crate) enum Opened {
    /// The TCP connection failed.
    Connect(std::io::Error),
    /// TLS failed (configuration or handshake).
    Node(NodeError),
}

/// A TCP connection to `endpoint`, inside TLS for `https` (with `ca` as the only
/// root when given): the byte stream both planes speak HTTP over.
pub(crate) async fn open(
    endpoint: &NodeEndpoint,
    ca: Option<&Path>,
) -> Result<Box<dyn AgentStream>, Opened> {
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(Opened::Connect)?;
    // Small frames in both directions (a request, a pty keystroke): no Nagle delay.
    let _ = tcp.set_nodelay(true);
    if !endpoint.tls {
        return Ok(Box::new(tcp));
    }
    let config = tls_config(ca).map_err(Opened::Node)?;
    let name = ServerName::try_from(endpoint.host.clone())
        .map_err(|_| Opened::Node(NodeError::ServerName(endpoint.host.clone())))?;
    let tls = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|error| Opened::Node(NodeError::Tls(error)))?;
    Ok(Box::new(tls))
}

/// Connects to the node `url` names and upgrades `GET /v1/sandboxes/{id}/agent` to
/// the agent protocol (no timeout: the caller bounds it).
/// `url` is the whole URL, for errors; `node` its parts.
pub(crate) async fn upgrade(
    url: &AgentUrl,
    node: &NodeUrl,
    bearer: Option<&str>,
) -> Result<Box<dyn AgentStream>, ClientError> {
    let failed = |error| ClientError::Node {
        url: url.clone(),
        error: Box::new(error),
    };
    let endpoint = NodeEndpoint::parse(&node.base)?;
    let stream = open(&endpoint, node.tls_ca.as_deref())
        .await
        .map_err(|error| match error {
            Opened::Connect(error) => ClientError::Connect {
                url: url.clone(),
                error,
            },
            Opened::Node(error) => failed(error),
        })?;

    let request = upgrade_request(&endpoint, &node.sandbox, bearer).map_err(failed)?;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|error| failed(NodeError::Http(error)))?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        // Its error, if any, is the one `send_request` reports.
        let _ = conn.with_upgrades().await;
    }));
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| failed(NodeError::Http(error)))?;
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        return Err(refused(url, response).await);
    }
    let switched_to = response
        .headers()
        .get(UPGRADE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .unwrap_or_default();
    if !switched_to.eq_ignore_ascii_case(NODE_UPGRADE_TOKEN) {
        return Err(failed(NodeError::WrongUpgrade(switched_to)));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|error| failed(NodeError::Upgrade(error)))?;
    Ok(Box::new(TokioIo::new(upgraded)))
}

/// `GET /v1/sandboxes/{sandbox}/agent` with the upgrade headers and the token.
fn upgrade_request(
    endpoint: &NodeEndpoint,
    sandbox: &str,
    bearer: Option<&str>,
) -> Result<Request<Empty<Bytes>>, NodeError> {
    let mut request = Request::get(agent_path(sandbox))
        .header(HOST, endpoint.authority.as_str())
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, NODE_UPGRADE_TOKEN)
        .body(Empty::new())
        .map_err(NodeError::Request)?;
    if let Some(token) = bearer {
        let mut value =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| NodeError::BadToken)?;
        // Kept out of hyper's debug output and its HPACK tables.
        value.set_sensitive(true);
        request.headers_mut().insert(AUTHORIZATION, value);
    }
    Ok(request)
}

/// The `(code, message)` of an error answer's body: the daemon's JSON, or the start
/// of the body as text (a proxy's error page); the status's reason when empty.
pub(crate) fn error_message(status: StatusCode, bytes: &[u8]) -> (String, String) {
    let (code, message) = match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(ErrorBody {
            error: ErrorField::Text(message),
            code,
        }) => (code, message),
        Ok(ErrorBody {
            error: ErrorField::Detail { code, message },
            ..
        }) => (code, message),
        Err(_) => {
            let text = String::from_utf8_lossy(bytes);
            (String::new(), cut(text.trim(), MAX_PLAIN_MESSAGE_BYTES))
        }
    };
    if message.is_empty() {
        let reason = status.canonical_reason().unwrap_or("no message").to_owned();
        (code, reason)
    } else {
        (code, message)
    }
}

/// Turns a non-`101` answer into [`ClientError::NodeRefused`], with the message of
/// its JSON body (or the start of the body as text, for a proxy's error page).
async fn refused(url: &AgentUrl, response: hyper::Response<hyper::body::Incoming>) -> ClientError {
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_ERROR_BODY_BYTES)
        .collect()
        .await
        .map(|collected| collected.to_bytes());
    let (code, message) = match body {
        Ok(bytes) => error_message(status, &bytes),
        Err(error) => (String::new(), format!("(unreadable body: {error})")),
    };
    ClientError::NodeRefused {
        url: url.clone(),
        status: status.as_u16(),
        code,
        message,
    }
}

/// The first `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The TLS client configuration: the CA file's certificates as the only roots when
/// one is named, else the system's store (loaded once per process).
fn tls_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, NodeError> {
    static SYSTEM: OnceLock<Result<Arc<rustls::ClientConfig>, ()>> = OnceLock::new();
    match ca {
        Some(path) => with_roots(ca_file_roots(path)?),
        None => SYSTEM
            .get_or_init(|| system_roots().and_then(with_roots).map_err(|_| ()))
            .clone()
            .map_err(|()| NodeError::NoSystemRoots),
    }
}

fn with_roots(roots: rustls::RootCertStore) -> Result<Arc<rustls::ClientConfig>, NodeError> {
    // The provider is named here rather than installed process-wide, so that linking
    // another rustls user with another provider cannot make this panic.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(NodeError::TlsConfig)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn ca_file_roots(path: &Path) -> Result<rustls::RootCertStore, NodeError> {
    let pem = std::fs::read(path).map_err(|error| NodeError::CaFile {
        path: path.to_owned(),
        error,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|error| NodeError::CaFile {
            path: path.to_owned(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, error.to_string()),
        })?;
        roots.add(cert).map_err(|error| NodeError::BadCertificate {
            path: path.to_owned(),
            error,
        })?;
    }
    if roots.is_empty() {
        return Err(NodeError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

fn system_roots() -> Result<rustls::RootCertStore, NodeError> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::debug!(%error, "skipped part of the system's certificate store");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(NodeError::NoSystemRoots);
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A node stand-in on loopback: reads the request head, hands it to the test, and
    /// writes `answer`; then echoes what comes after, until the client hangs up.
    async fn fake_node(answer: Vec<u8>) -> (AgentUrl, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let head = read_head(&mut conn).await;
            let _ = conn.write_all(&answer).await;
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = conn.read(&mut buf).await {
                if conn.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            head
        });
        let url = format!("http://127.0.0.1:{port}/v1/sandboxes/sb-1/agent")
            .parse()
            .unwrap();
        (url, server)
    }

    async fn read_head<S: tokio::io::AsyncRead + Unpin>(conn: &mut S) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if conn.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    async fn dial(
        url: &AgentUrl,
        bearer: Option<&str>,
    ) -> Result<Box<dyn AgentStream>, ClientError> {
        super::super::connect::dial(url, bearer).await
    }

    fn node_error(err: &ClientError) -> Option<&NodeError> {
        match err {
            ClientError::Node { error, .. } => Some(error),
            _ => None,
        }
    }

    const SWITCHED: &[u8] =
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: sandbox-agent\r\n\r\n";

    #[tokio::test]
    async fn a_101_answer_yields_the_stream_with_the_bytes_sent_after_it() {
        let mut answer = SWITCHED.to_vec();
        answer.extend_from_slice(b"early");
        let (url, server) = fake_node(answer).await;
        let mut stream = dial(&url, Some("s3cret")).await.unwrap();
        let mut early = [0u8; 5];
        stream.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, b"early");
        stream.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        stream.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        drop(stream);
        let head = server.await.unwrap().to_ascii_lowercase();
        assert!(
            head.starts_with("get /v1/sandboxes/sb-1/agent http/1.1\r\n"),
            "{head}"
        );
        for header in [
            "connection: upgrade\r\n",
            "upgrade: sandbox-agent\r\n",
            "authorization: bearer s3cret\r\n",
            "host: 127.0.0.1:",
        ] {
            assert!(head.contains(header), "{header:?} missing from {head}");
        }
    }

    #[tokio::test]
    async fn no_token_sends_no_authorization() {
        let (url, server) = fake_node(SWITCHED.to_vec()).await;
        drop(dial(&url, None).await.unwrap());
        let head = server.await.unwrap().to_ascii_lowercase();
        assert!(!head.contains("authorization"), "{head}");
    }

    #[tokio::test]
    async fn sandboxds_own_error_shape_gives_its_code_and_message() {
        let body = r#"{"error":"This needs the operator token","code":"forbidden"}"#;
        let answer = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (url, server) = fake_node(answer.into_bytes()).await;
        let err = dial(&url, Some("t")).await.err().unwrap();
        assert!(
            matches!(&err, ClientError::NodeRefused { status: 403, code, message, .. }
                if code == "forbidden" && message == "This needs the operator token"),
            "{err:?}"
        );
        drop(server);
    }

    #[tokio::test]
    async fn a_json_error_answer_is_refused_with_its_status_code_and_message() {
        let body = r#"{"error":{"code":"unauthorized","message":"bad or missing token"}}"#;
        let answer = format!(
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (url, server) = fake_node(answer.into_bytes()).await;
        let err = dial(&url, Some("wrong")).await.err().unwrap();
        match &err {
            ClientError::NodeRefused {
                status,
                code,
                message,
                ..
            } => {
                assert_eq!(*status, 401);
                assert_eq!(code, "unauthorized");
                assert_eq!(message, "bad or missing token");
            }
            other => panic!("expected NodeRefused, got {other:?}"),
        }
        assert!(!err.is_retryable());
        assert!(
            err.to_string()
                .contains("401 unauthorized: bad or missing token"),
            "{err}"
        );
        drop(server);
    }

    #[tokio::test]
    async fn a_plain_error_body_becomes_the_message() {
        let answer =
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\ndraining\n".to_vec();
        let (url, _server) = fake_node(answer).await;
        let err = dial(&url, None).await.err().unwrap();
        assert!(
            matches!(&err, ClientError::NodeRefused { status: 503, code, message, .. }
                if code.is_empty() && message == "draining"),
            "{err:?}"
        );
        // A busy node may take the connection later.
        assert!(err.is_retryable());
    }

    #[tokio::test]
    async fn an_endless_error_body_is_read_only_up_to_its_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            read_head(&mut conn).await;
            let head = b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n";
            conn.write_all(head).await.unwrap();
            let chunk = format!("{:x}\r\n{}\r\n", 4096, "x".repeat(4096));
            // Until the client stops reading and hangs up.
            while conn.write_all(chunk.as_bytes()).await.is_ok() {}
        });
        let url = format!("http://127.0.0.1:{port}/v1/sandboxes/a/agent")
            .parse()
            .unwrap();
        let err = dial(&url, None).await.err().unwrap();
        assert!(
            matches!(&err, ClientError::NodeRefused { status: 500, message, .. }
                if message.starts_with("(unreadable body")),
            "{err:?}"
        );
        drop(err);
        server.await.unwrap();
    }

    /// A node that reads the request head, writes `answer` and hangs up.
    async fn hang_up_node(answer: &'static [u8]) -> AgentUrl {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            read_head(&mut conn).await;
            conn.write_all(answer).await.unwrap();
        });
        format!("http://127.0.0.1:{port}/v1/sandboxes/a/agent")
            .parse()
            .unwrap()
    }

    #[tokio::test]
    async fn a_node_that_hangs_up_mid_answer_is_an_http_failure() {
        for answer in [
            &b""[..],
            b"HTTP/1.1 101 Swit",
            b"HTTP/1.1 101 Switching Protocols\r\nUpg",
        ] {
            let url = hang_up_node(answer).await;
            let err = dial(&url, None).await.err().unwrap();
            assert!(
                matches!(node_error(&err), Some(NodeError::Http(_))),
                "{:?}: {err:?}",
                String::from_utf8_lossy(answer)
            );
        }
    }

    #[tokio::test]
    async fn a_101_to_another_protocol_is_refused() {
        let url = hang_up_node(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .await;
        let err = dial(&url, None).await.err().unwrap();
        assert!(
            matches!(node_error(&err), Some(NodeError::WrongUpgrade(to)) if to == "websocket"),
            "{err:?}"
        );
    }

    /// Regression guard: an answer whose head never ends must fail at the head
    /// bound, not be buffered for as long as the node sends.
    #[tokio::test]
    async fn an_endless_answer_head_fails_at_its_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            read_head(&mut conn).await;
            conn.write_all(b"HTTP/1.1 101 Switching Protocols\r\nX-Junk: ")
                .await
                .unwrap();
            let junk = [b'a'; 4096];
            let mut sent = 0usize;
            while conn.write_all(&junk).await.is_ok() {
                sent += junk.len();
            }
            sent
        });
        let url = format!("http://127.0.0.1:{port}/v1/sandboxes/a/agent")
            .parse()
            .unwrap();
        let err = dial(&url, None).await.err().unwrap();
        assert!(
            matches!(node_error(&err), Some(NodeError::Http(_))),
            "{err:?}"
        );
        drop(err);
        // The client hung up; what the node got out is its socket buffers plus the
        // bounded head, far below the megabytes an unbounded reader would take.
        let sent = server.await.unwrap();
        assert!(
            sent < 64 << 20,
            "the node sent {sent} bytes before the client gave up"
        );
    }

    #[tokio::test]
    async fn a_ca_file_without_certificates_is_refused_before_connecting() {
        let dir = std::env::temp_dir().join(format!("sandbox-node-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(matches!(
            tls_config(Some(&empty)),
            Err(NodeError::NoCertificate { .. })
        ));
        let missing = dir.join("missing.pem");
        assert!(matches!(
            tls_config(Some(&missing)),
            Err(NodeError::CaFile { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn https_upgrades_with_the_nodes_ca_file_and_refuses_an_unknown_certificate() {
        let rcgen::CertifiedKey { cert, key_pair } =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let dir = std::env::temp_dir().join(format!("sandbox-node-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("node.pem");
        std::fs::write(&ca, cert.pem()).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key_pair.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                // A client that refuses the certificate ends here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                read_head(&mut tls).await;
                tls.write_all(SWITCHED).await.unwrap();
                let mut buf = [0u8; 64];
                while let Ok(n @ 1..) = tls.read(&mut buf).await {
                    let _ = tls.write_all(&buf[..n]).await;
                }
            }
        });
        let base = format!("https://127.0.0.1:{port}/v1/sandboxes/a/agent");

        let unknown: AgentUrl = base.parse().unwrap();
        let err = dial(&unknown, None).await.err().unwrap();
        assert!(
            matches!(
                node_error(&err),
                Some(NodeError::Tls(_) | NodeError::NoSystemRoots)
            ),
            "{err:?}"
        );

        let trusted: AgentUrl = format!("{base}?ca={}", ca.display()).parse().unwrap();
        let mut stream = dial(&trusted, Some("t")).await.unwrap();
        stream.write_all(b"over tls").await.unwrap();
        let mut echo = [0u8; 8];
        stream.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"over tls");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
