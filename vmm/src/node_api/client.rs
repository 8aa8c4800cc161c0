//! The control plane of a node daemon, client side: one typed method per endpoint,
//! each one HTTP/1.1 request on its own connection (a claim or a listing is rare next
//! to the data plane's traffic, and a fresh connection cannot be left half-read by a
//! cancelled call), bounded in time by [`NodeApi::with_timeout`] and in answer size
//! by [`MAX_REPLY_BYTES`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::wire::*;
use crate::client::node::{error_message, open, NodeError, Opened};
use crate::client::{AgentUrl, NodeEndpoint, NodeUrl, UrlError};

/// The largest answer read: a listing of every sandbox of a full node is well under it.
pub const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// How long one call may take unless told otherwise: a claim without a warm VM boots
/// one, which under emulation takes minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeApiError {
    /// The node address is not usable.
    #[error(transparent)]
    Address(#[from] UrlError),
    /// Nothing answers at the address.
    #[error("Cannot reach the node at {base}")]
    Connect {
        /// The node.
        base: String,
        /// What the connect said.
        #[source]
        error: std::io::Error,
    },
    /// TLS or HTTP failed below the answer.
    #[error("Talking to the node at {base} failed")]
    Transport {
        /// The node.
        base: String,
        /// What failed.
        #[source]
        error: NodeError,
    },
    /// The call took longer than allowed.
    #[error("The node at {base} did not answer {what} within {after:?}")]
    Timeout {
        /// The node.
        base: String,
        /// The call.
        what: &'static str,
        /// The bound.
        after: Duration,
    },
    /// The node answered with an error.
    #[error("{message} (HTTP {status}{})", code_suffix(code))]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The daemon's stable name for it (`not_found`, `gone`, `unauthorized`, ...).
        code: String,
        /// Its message.
        message: String,
    },
    /// A node reached over TLS named a plain-HTTP node to go on to.
    #[error("The node at {base} sent this client on to {to}, without TLS: refused (the operator token would cross the network in the clear)")]
    Downgrade {
        /// The node that named it.
        base: String,
        /// Where it pointed.
        to: String,
    },
    /// A node sent a call elsewhere a second time (a claim with `no_redirect`, or a sandbox whose owner is this node by its own account).
    #[error("The node at {base} sent the call elsewhere again: the fleet's nodes disagree on where it goes")]
    RedirectedAgain {
        /// The node.
        base: String,
    },
    /// The answer is not what this client expects (another daemon, another version).
    #[error("The node's answer to {what} is not what this client understands")]
    Decode {
        /// The call.
        what: &'static str,
        /// What serde said.
        #[source]
        error: serde_json::Error,
    },
}

fn code_suffix(code: &str) -> String {
    if code.is_empty() {
        String::new()
    } else {
        format!(", {code}")
    }
}

impl NodeApiError {
    /// The daemon's code when it answered with an error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A node daemon's control plane, with one token (the operator's, or a sandbox's).
#[derive(Clone)]
pub struct NodeApi {
    base: String,
    endpoint: NodeEndpoint,
    ca: Option<PathBuf>,
    token: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for NodeApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token.
        f.debug_struct("NodeApi")
            .field("base", &self.base)
            .field("ca", &self.ca)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// `addr` as a node base URL: `HOST:PORT` (seed 000's `-addr`) is `http://HOST:PORT`;
/// `http(s)://HOST[:PORT]` as given, without a trailing `/`; `https://...?ca=PEM`
/// names the CA file to trust.
pub fn node_base(addr: &str) -> Result<(String, Option<PathBuf>), UrlError> {
    let addr = addr.trim();
    let (addr, ca) = match addr.split_once("?ca=") {
        Some((addr, ca)) if !ca.is_empty() => (addr, Some(PathBuf::from(ca))),
        Some(_) => return Err(UrlError::BadNodeQuery(addr.to_owned())),
        None => (addr, None),
    };
    let addr = addr.trim_end_matches('/');
    let base = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let endpoint = NodeEndpoint::parse(&base)?;
    if ca.is_some() && !endpoint.tls {
        return Err(UrlError::BadNodeQuery(format!("{base}?ca=...")));
    }
    Ok((base, ca))
}

impl NodeApi {
    /// The node at `addr` (see [`node_base`]), calling with `token` as the bearer.
    pub fn new(addr: &str, token: Option<String>) -> Result<Self, NodeApiError> {
        let (base, ca) = node_base(addr)?;
        let endpoint = NodeEndpoint::parse(&base)?;
        Ok(Self {
            base,
            endpoint,
            ca,
            token: token.filter(|token| !token.is_empty()),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same node, each call bounded by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same node, calling with another token (a sandbox's own).
    pub fn with_token(&self, token: impl Into<String>) -> Self {
        let mut api = self.clone();
        api.token = Some(token.into()).filter(|token| !token.is_empty());
        api
    }

    /// `http(s)://HOST:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The token calls carry, for a data-plane connection's options.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The data plane of sandbox `id` on this node (connect with this API's token or
    /// the sandbox's as `ConnectOptions::token`).
    pub fn agent_url(&self, id: &str) -> AgentUrl {
        AgentUrl::Node(Box::new(NodeUrl {
            base: self.base.clone(),
            sandbox: id.to_owned(),
            tls_ca: self.ca.clone(),
        }))
    }

    /// `POST /v1/claim`
    ///
    /// In a fleet the node may answer where to claim instead ([`ClaimRedirect`]):
    /// the claim is then sent to each node named, in order, and last to this one,
    /// each time with `no_redirect`. The reply's `owner_addr` says which node made
    /// it; that sandbox's calls go there ([`NodeApi::at`]).
    pub async fn claim(&self, body: &ClaimBody) -> Result<ClaimReply, NodeApiError> {
        let path = "/v1/claim";
        let answer: ClaimAnswer = self
            .call(Method::POST, path.into(), Some(body), "claim")
            .await?;
        let redirect = match answer {
            ClaimAnswer::Claimed(reply) => return Ok(reply),
            ClaimAnswer::Redirect(redirect) => redirect,
        };
        let mut body = body.clone();
        body.no_redirect = true;
        self.follow(&redirect, path, &body, "claim").await
    }

    /// The same client (token, timeout, CA) for the node at `addr`, e.g. a
    /// claim's `owner_addr`; this one when `addr` is empty or this node's. An
    /// `addr` without a scheme takes this node's (a fleet on TLS advertises
    /// `HOST:PORT` as often as `https://...`), and a node reached over TLS never
    /// sends its token on to a plain `http://` one.
    pub fn at(&self, addr: &str) -> Result<Self, NodeApiError> {
        let addr = addr.trim();
        if addr.is_empty() {
            return Ok(self.clone());
        }
        let addr = if !addr.contains("://") && self.endpoint.tls {
            format!("https://{addr}")
        } else {
            addr.to_owned()
        };
        // A `?ca=` in an address a node handed out is ignored: the CA to trust is
        // this client's, never one the other side names.
        let (base, _) = node_base(&addr)?;
        if base == self.base {
            return Ok(self.clone());
        }
        let endpoint = NodeEndpoint::parse(&base)?;
        if self.endpoint.tls && !endpoint.tls {
            return Err(NodeApiError::Downgrade {
                base: self.base.clone(),
                to: base,
            });
        }
        Ok(Self {
            ca: self.ca.clone().filter(|_| endpoint.tls),
            base,
            endpoint,
            token: self.token.clone(),
            timeout: self.timeout,
        })
    }

    /// Follows a claim's `redirect` once: `body` (with `no_redirect` set) to each
    /// node named (the first [`MAX_REDIRECT`], each once), then to this one. It
    /// moves on only when nothing can have been made: no connection, or the node's
    /// own refusal. A node that took the request and then failed (timeout, broken
    /// answer) ends it, since the sandbox may exist there.
    async fn follow<B: Serialize>(
        &self,
        redirect: &ClaimRedirect,
        path: &str,
        body: &B,
        what: &'static str,
    ) -> Result<ClaimReply, NodeApiError> {
        let mut failed = Vec::new();
        let mut tried: Vec<&str> = Vec::new();
        for addr in &redirect.redirect {
            if tried.len() == MAX_REDIRECT {
                break;
            }
            if tried.contains(&addr.as_str()) {
                continue;
            }
            tried.push(addr);
            let attempt = match self.at(addr) {
                Ok(peer) => peer.claim_once(path, body, what).await,
                Err(error) => Err(error),
            };
            match attempt {
                Ok(reply) => {
                    if !failed.is_empty() {
                        tracing::warn!(failed = %failed.join("; "), "placed a claim after refusals");
                    }
                    return Ok(reply);
                }
                Err(error) if nothing_made(&error) => failed.push(format!("{addr}: {error}")),
                Err(error) => return Err(error),
            }
        }
        match self.claim_once(path, body, what).await {
            Err(NodeApiError::Refused {
                status,
                code,
                message,
            }) if !failed.is_empty() => Err(NodeApiError::Refused {
                status,
                code,
                message: format!(
                    "{message} (after the nodes placement chose failed: {})",
                    failed.join("; ")
                ),
            }),
            other => other,
        }
    }

    /// One claim with `no_redirect` set in `body`: a second redirect is refused.
    async fn claim_once<B: Serialize>(
        &self,
        path: &str,
        body: &B,
        what: &'static str,
    ) -> Result<ClaimReply, NodeApiError> {
        match self
            .call::<B, ClaimAnswer>(Method::POST, path.into(), Some(body), what)
            .await?
        {
            ClaimAnswer::Claimed(reply) => Ok(reply),
            ClaimAnswer::Redirect(_) => Err(NodeApiError::RedirectedAgain {
                base: self.base.clone(),
            }),
        }
    }

    /// `GET /v1/sandboxes`: every sandbox for the operator, its own for a sandbox token.
    pub async fn sandboxes(&self) -> Result<Vec<SandboxRow>, NodeApiError> {
        let list: SandboxList = self
            .call(Method::GET, "/v1/sandboxes".into(), None::<&()>, "list")
            .await?;
        Ok(list.sandboxes)
    }

    /// `GET /v1/sandboxes/{id}`
    pub async fn sandbox(&self, id: &str) -> Result<SandboxRow, NodeApiError> {
        self.call_sandbox(id, Method::GET, "".into(), None::<&()>, "show")
            .await
    }

    /// `GET /v1/sandboxes/{id}/egress-log?tail=N`
    pub async fn egress_log(&self, id: &str, tail: usize) -> Result<EgressLogReply, NodeApiError> {
        let verb = format!("/egress-log?tail={tail}");
        self.call_sandbox(id, Method::GET, verb, None::<&()>, "egress log")
            .await
    }

    /// `POST /v1/sandboxes/{id}/release`
    pub async fn release(&self, id: &str) -> Result<Released, NodeApiError> {
        self.call_sandbox(id, Method::POST, "/release".into(), None::<&()>, "release")
            .await
    }

    /// `POST /v1/sandboxes/{id}/renew`: `ttl_seconds` from now (0 for one hour).
    pub async fn renew(&self, id: &str, ttl_seconds: u64) -> Result<Renewed, NodeApiError> {
        let body = RenewBody {
            ttl_seconds,
            ..RenewBody::default()
        };
        self.call_sandbox(id, Method::POST, "/renew".into(), Some(&body), "renew")
            .await
    }

    /// `POST /v1/sandboxes/{id}/preview`: a URL proxying to guest `port`, for
    /// `ttl_seconds` (0: until the claim ends).
    pub async fn preview(
        &self,
        id: &str,
        port: u16,
        ttl_seconds: u64,
    ) -> Result<PreviewReply, NodeApiError> {
        let body = PreviewBody {
            token: String::new(),
            port,
            ttl_seconds,
        };
        self.call_sandbox(id, Method::POST, "/preview".into(), Some(&body), "preview")
            .await
    }

    /// `POST /v1/sandboxes/{id}/fork`: `count` children living `ttl_seconds`.
    pub async fn fork(
        &self,
        id: &str,
        count: u64,
        ttl_seconds: u64,
    ) -> Result<ForkReply, NodeApiError> {
        let body = ForkBody {
            token: String::new(),
            count,
            ttl_seconds,
        };
        self.call_sandbox(id, Method::POST, "/fork".into(), Some(&body), "fork")
            .await
    }

    /// `POST /v1/sandboxes/{id}/checkpoint`
    pub async fn checkpoint(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<CheckpointReply, NodeApiError> {
        let body = CheckpointBody {
            token: String::new(),
            name: name.unwrap_or_default().to_owned(),
            full: false,
        };
        self.call_sandbox(
            id,
            Method::POST,
            "/checkpoint".into(),
            Some(&body),
            "checkpoint",
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/hibernate`
    pub async fn hibernate(&self, id: &str) -> Result<HibernateReply, NodeApiError> {
        self.call_sandbox(
            id,
            Method::POST,
            "/hibernate".into(),
            None::<&()>,
            "hibernate",
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/promote`
    pub async fn promote(&self, id: &str, template: &str) -> Result<PromoteReply, NodeApiError> {
        let body = PromoteBody {
            token: String::new(),
            template: template.to_owned(),
        };
        self.call_sandbox(id, Method::POST, "/promote".into(), Some(&body), "promote")
            .await
    }

    /// `GET /v1/checkpoints`, newest first.
    pub async fn checkpoints(&self) -> Result<Vec<CheckpointRow>, NodeApiError> {
        let list: CheckpointList = self
            .call(
                Method::GET,
                "/v1/checkpoints".into(),
                None::<&()>,
                "checkpoints",
            )
            .await?;
        Ok(list.checkpoints)
    }

    /// `POST /v1/checkpoints/{id}/claim`
    pub async fn claim_checkpoint(
        &self,
        id: &str,
        ttl_seconds: u64,
    ) -> Result<ClaimReply, NodeApiError> {
        let what = "claim from a checkpoint";
        let mut body = CheckpointClaimBody {
            ttl_seconds,
            no_redirect: false,
        };
        let path = format!("/v1/checkpoints/{}/claim", segment(id));
        let answer: ClaimAnswer = self
            .call(Method::POST, path.clone(), Some(&body), what)
            .await?;
        let redirect = match answer {
            ClaimAnswer::Claimed(reply) => return Ok(reply),
            ClaimAnswer::Redirect(redirect) => redirect,
        };
        body.no_redirect = true;
        self.follow(&redirect, &path, &body, what).await
    }

    /// `DELETE /v1/checkpoints/{id}`
    pub async fn delete_checkpoint(&self, id: &str) -> Result<CheckpointDeleted, NodeApiError> {
        let path = format!("/v1/checkpoints/{}", segment(id));
        self.call(Method::DELETE, path, None::<&()>, "delete a checkpoint")
            .await
    }

    /// `DELETE /v1/templates?template=NAME`: a promoted template.
    pub async fn delete_template(&self, name: &str) -> Result<TemplateDeleted, NodeApiError> {
        let path = format!("/v1/templates?template={}", segment(name));
        self.call(Method::DELETE, path, None::<&()>, "delete a template")
            .await
    }

    /// `POST /v1/templates/{name}/publish`: the node's template `name` goes to the
    /// fleet's object store.
    pub async fn publish_template(&self, name: &str) -> Result<TemplatePublished, NodeApiError> {
        let path = format!("/v1/templates/{}/publish", segment(name));
        self.call(Method::POST, path, None::<&()>, "publish a template")
            .await
    }

    /// `POST /v1/store/gc`: the object store's unnamed blobs older than the grace
    /// are deleted (counted only with `dry_run`).
    pub async fn store_gc(
        &self,
        grace_seconds: u64,
        dry_run: bool,
    ) -> Result<serde_json::Value, NodeApiError> {
        let body = super::wire::StoreGcBody {
            grace_seconds,
            dry_run,
        };
        self.call(
            Method::POST,
            "/v1/store/gc".into(),
            Some(&body),
            "collect the store's garbage",
        )
        .await
    }

    /// `GET /v1/info`
    pub async fn info(&self) -> Result<InfoReply, NodeApiError> {
        self.call(Method::GET, "/v1/info".into(), None::<&()>, "info")
            .await
    }

    /// `POST /v1/drain`: refuse new claims; in a fleet with an object store, hand the
    /// hibernated sandboxes (with `hibernate`, every sandbox, hibernated first) to
    /// other nodes.
    pub async fn drain(&self, hibernate: bool) -> Result<DrainReply, NodeApiError> {
        let body = super::wire::DrainBody { hibernate };
        self.call(Method::POST, "/v1/drain".into(), Some(&body), "drain")
            .await
    }

    /// `DELETE /v1/drain`: take claims again.
    pub async fn uncordon(&self) -> Result<DrainReply, NodeApiError> {
        self.call(Method::DELETE, "/v1/drain".into(), None::<&()>, "uncordon")
            .await
    }

    /// `GET /v1/peers`
    pub async fn peers(&self) -> Result<Vec<String>, NodeApiError> {
        let reply: PeersReply = self
            .call(Method::GET, "/v1/peers".into(), None::<&()>, "peers")
            .await?;
        Ok(reply.peers)
    }

    /// A call on sandbox `id` (`verb` after its path, query included). In a fleet,
    /// an operator's call that reached a node which does not hold the sandbox is
    /// answered 421 `elsewhere`: it is then asked for the owner and the call is
    /// sent there, once.
    async fn call_sandbox<B: Serialize, R: DeserializeOwned>(
        &self,
        id: &str,
        method: Method,
        verb: String,
        body: Option<&B>,
        what: &'static str,
    ) -> Result<R, NodeApiError> {
        let path = sandbox_path(id, &verb);
        match self.call(method.clone(), path.clone(), body, what).await {
            Err(misdirected @ NodeApiError::Refused { status: 421, .. }) => {
                let owner: OwnerReply = self
                    .call(Method::GET, sandbox_path(id, "/owner"), None::<&()>, what)
                    .await?;
                if owner.owner_addr.trim().is_empty() {
                    return Err(misdirected);
                }
                let owner = self.at(&owner.owner_addr)?;
                if owner.base == self.base {
                    return Err(NodeApiError::RedirectedAgain {
                        base: self.base.clone(),
                    });
                }
                owner.call(method, path, body, what).await
            }
            other => other,
        }
    }

    /// One request and its decoded answer, within the timeout.
    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: Option<&B>,
        what: &'static str,
    ) -> Result<R, NodeApiError> {
        let exchange = self.exchange(method, &path, body);
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| NodeApiError::Timeout {
                base: self.base.clone(),
                what,
                after: self.timeout,
            })??;
        if !status.is_success() {
            let (code, message) = error_message(status, &bytes);
            return Err(NodeApiError::Refused {
                status: status.as_u16(),
                code,
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(|error| NodeApiError::Decode { what, error })
    }

    async fn exchange<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(StatusCode, Bytes), NodeApiError> {
        let transport = |error| NodeApiError::Transport {
            base: self.base.clone(),
            error,
        };
        let stream =
            open(&self.endpoint, self.ca.as_deref())
                .await
                .map_err(|error| match error {
                    Opened::Connect(error) => NodeApiError::Connect {
                        base: self.base.clone(),
                        error,
                    },
                    Opened::Node(error) => transport(error),
                })?;
        let request = self.request(method, path, body).map_err(transport)?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| transport(NodeError::Http(error)))?;
        // Ends with the exchange (one request per connection); aborted if the call is
        // dropped, through the timeout or the caller.
        let driver = AbortOnDrop(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| transport(NodeError::Http(error)))?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_REPLY_BYTES)
            .collect()
            .await
            .map_err(|error| transport(NodeError::Reply(error.to_string())))?
            .to_bytes();
        drop(driver);
        Ok((status, bytes))
    }

    fn request<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Request<Full<Bytes>>, NodeError> {
        let payload = match body {
            Some(body) => {
                serde_json::to_vec(body).map_err(|error| NodeError::Reply(error.to_string()))?
            }
            None => Vec::new(),
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.endpoint.authority.as_str());
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let mut request = request
            .body(Full::new(Bytes::from(payload)))
            .map_err(NodeError::Request)?;
        if let Some(token) = &self.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| NodeError::BadToken)?;
            value.set_sensitive(true);
            request.headers_mut().insert(AUTHORIZATION, value);
        }
        Ok(request)
    }
}

/// The most nodes of a redirect a client tries (the daemon names at most three).
pub const MAX_REDIRECT: usize = 3;

/// Whether a claim that failed with `error` certainly made nothing: nothing was
/// sent, or the node answered with its refusal.
fn nothing_made(error: &NodeApiError) -> bool {
    match error {
        NodeApiError::Address(_)
        | NodeApiError::Connect { .. }
        | NodeApiError::Downgrade { .. }
        | NodeApiError::RedirectedAgain { .. }
        | NodeApiError::Refused { .. } => true,
        NodeApiError::Transport { .. }
        | NodeApiError::Timeout { .. }
        | NodeApiError::Decode { .. } => false,
    }
}

/// Aborts the connection's task when the call ends or is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn sandbox_path(id: &str, verb: &str) -> String {
    format!("/v1/sandboxes/{}{verb}", segment(id))
}

/// `text` percent-encoded for one path segment or query value: ids and names are
/// `[A-Za-z0-9._-]` in practice, but a caller's typo must not change the path.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_000s_addr_is_a_plain_http_base() {
        assert_eq!(
            node_base("10.0.0.5:7777").unwrap(),
            ("http://10.0.0.5:7777".to_owned(), None)
        );
        assert_eq!(
            node_base("https://node.example:7777/").unwrap().0,
            "https://node.example:7777"
        );
        let (base, ca) = node_base("https://node:7777?ca=/etc/ca.pem").unwrap();
        assert_eq!(base, "https://node:7777");
        assert_eq!(ca, Some(PathBuf::from("/etc/ca.pem")));
        assert!(node_base("http://node:7777?ca=/etc/ca.pem").is_err());
        assert!(node_base("ftp://node:1").is_err());
        assert!(node_base("").is_err());
    }

    #[test]
    fn path_segments_cannot_escape() {
        assert_eq!(sandbox_path("sb-1", "/fork"), "/v1/sandboxes/sb-1/fork");
        assert_eq!(sandbox_path("../info?x", ""), "/v1/sandboxes/..%2Finfo%3Fx");
    }

    #[test]
    fn another_node_inherits_the_scheme_and_tls_is_never_dropped() {
        let plain = NodeApi::new("10.0.0.5:7777", Some("t".into())).unwrap();
        assert_eq!(
            plain.at("10.0.0.6:7777").unwrap().base(),
            "http://10.0.0.6:7777"
        );
        assert_eq!(plain.at("").unwrap().base(), "http://10.0.0.5:7777");
        let tls = NodeApi::new("https://a.internal:7777?ca=/etc/ca.pem", Some("t".into())).unwrap();
        let peer = tls.at("b.internal:7777").unwrap();
        assert_eq!(peer.base(), "https://b.internal:7777");
        assert_eq!(peer.ca, Some(PathBuf::from("/etc/ca.pem")));
        // The CA is this client's, whatever the address handed out says.
        let planted = tls.at("https://evil:7777?ca=/etc/ssl/certs/ca-certificates.crt");
        assert_eq!(planted.unwrap().ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(peer.token(), Some("t"));
        assert!(matches!(
            tls.at("http://b.internal:7777"),
            Err(NodeApiError::Downgrade { .. })
        ));
    }

    #[test]
    fn the_token_is_not_in_debug_output() {
        let api = NodeApi::new("127.0.0.1:7777", Some("s3cret".into())).unwrap();
        assert!(!format!("{api:?}").contains("s3cret"));
    }

    #[tokio::test]
    async fn a_node_that_is_not_there_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let api = NodeApi::new(&addr.to_string(), None).unwrap();
        assert!(matches!(
            api.info().await,
            Err(NodeApiError::Connect { .. })
        ));
    }
}
