//! [`TestNode`]: a node daemon's data plane in miniature, a real HTTP/1.1 server
//! (hyper) on loopback in front of one agent, for the suite's `upgrade` transport.
//!
//! It serves `GET /v1/sandboxes/{SANDBOX}/agent` with `Authorization: Bearer` its
//! token and `Upgrade: sandbox-agent`: it answers `101` and joins the upgraded
//! connection to the agent with `sandbox_vmm::splice::bridge`, which gives the
//! agent its own token. Everything else gets the daemon's JSON error shape
//! (`{"error": {"code", "message"}}`): a wrong or missing token 401, another path or
//! sandbox 404, a request without the upgrade 426. Only the splice is the daemon's
//! code; the routing here is the test's stand-in for it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE, UPGRADE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sandbox_vmm::client::connect::sandbox_of_agent_path;
use sandbox_vmm::client::{AgentUrl, NODE_UPGRADE_TOKEN};
use sandbox_vmm::error_chain;
use tokio::net::TcpListener;

/// The one sandbox a [`TestNode`] serves.
pub const SANDBOX: &str = "x";

/// Bound on opening the agent and on the client's hello, per connection.
const BRIDGE_SECS: u64 = 20;

/// What every connection's handler needs.
#[derive(Debug)]
struct Node {
    agent_url: AgentUrl,
    agent_token: Option<String>,
    bearer: String,
}

/// The HTTP server, on an ephemeral loopback port; dropping it stops accepting.
#[derive(Debug)]
pub struct TestNode {
    addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl TestNode {
    /// Starts serving [`SANDBOX`] as the agent at `agent_url` (whose token is
    /// `agent_token`) to clients presenting `bearer`.
    pub async fn start(agent_url: AgentUrl, agent_token: Option<String>, bearer: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("cannot bind the test node");
        let addr = listener.local_addr().expect("no local address");
        let node = Arc::new(Node {
            agent_url,
            agent_token,
            bearer: bearer.to_owned(),
        });
        let accept = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let node = node.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request| handle(node.clone(), request));
                    let served = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .with_upgrades()
                        .await;
                    if let Err(error) = served {
                        eprintln!("test node: connection failed: {}", error_chain(&error));
                    }
                });
            }
        });
        Self { addr, accept }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The agent URL of `sandbox` on this node.
    pub fn url(&self, sandbox: &str) -> AgentUrl {
        AgentUrl::node(format!("http://{}", self.addr), sandbox)
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn handle(
    node: Arc<Node>,
    mut request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let sandbox = sandbox_of_agent_path(request.uri().path());
    if request.method() != Method::GET || sandbox != Some(SANDBOX) {
        return Ok(error(StatusCode::NOT_FOUND, "not_found", "No such path"));
    }
    let authorized = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|token| token == node.bearer);
    if !authorized {
        return Ok(error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Missing or wrong Bearer token",
        ));
    }
    let upgrade_asked = request
        .headers()
        .get(UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.eq_ignore_ascii_case(NODE_UPGRADE_TOKEN));
    if !upgrade_asked {
        return Ok(error(
            StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            "Send Connection: Upgrade and Upgrade: sandbox-agent",
        ));
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                eprintln!("test node: upgrade failed: {}", error_chain(&error));
                return;
            }
        };
        let bridged = sandbox_vmm::splice::bridge(
            TokioIo::new(upgraded),
            &node.agent_url,
            node.agent_token.as_deref(),
            Duration::from_secs(BRIDGE_SECS),
        )
        .await;
        if let Err(error) = bridged {
            eprintln!("test node: bridge ended: {}", error_chain(&error));
        }
    });
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static(NODE_UPGRADE_TOKEN));
    Ok(response)
}

/// The daemon's error answer.
fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_vmm::client::{Client, ClientError, ConnectOptions};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A node in front of an agent that is never reached: every request here is
    /// refused before the splice.
    async fn node() -> TestNode {
        TestNode::start(
            AgentUrl::Unix("/nonexistent/agent.sock".into()),
            None,
            "good",
        )
        .await
    }

    async fn refusal(url: &AgentUrl, token: Option<&str>) -> (u16, String, String) {
        let options = ConnectOptions {
            token: token.map(str::to_owned),
            ..ConnectOptions::default()
        };
        match Client::connect(url, &options).await {
            Err(ClientError::NodeRefused {
                status,
                code,
                message,
                ..
            }) => (status, code, message),
            Err(other) => panic!("expected NodeRefused, got {}", error_chain(&other)),
            Ok(_) => panic!("connected through a refusing node"),
        }
    }

    #[tokio::test]
    async fn a_wrong_or_missing_token_is_401_with_the_json_message() {
        let node = node().await;
        for token in [Some("bad"), None] {
            let (status, code, message) = refusal(&node.url(SANDBOX), token).await;
            assert_eq!((status, code.as_str()), (401, "unauthorized"), "{token:?}");
            assert_eq!(message, "Missing or wrong Bearer token");
        }
    }

    #[tokio::test]
    async fn another_sandbox_is_404() {
        let node = node().await;
        let (status, code, _) = refusal(&node.url("y"), Some("good")).await;
        assert_eq!((status, code.as_str()), (404, "not_found"));
    }

    #[tokio::test]
    async fn an_unknown_path_is_404_json() {
        let node = node().await;
        let mut tcp = tokio::net::TcpStream::connect(node.addr()).await.unwrap();
        tcp.write_all(b"GET /v1/nothing HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 404 "), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "not_found");
    }

    #[tokio::test]
    async fn an_unreachable_agent_ends_the_upgraded_connection() {
        // Authorized and upgraded, but the agent is not there: the client's hello
        // gets a closed connection, not a hang.
        let node = node().await;
        let options = ConnectOptions {
            token: Some("good".into()),
            ..ConnectOptions::default()
        };
        let err = Client::connect(&node.url(SANDBOX), &options)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::HelloClosed | ClientError::HelloIo(_)),
            "{}",
            error_chain(&err)
        );
    }
}
