//! The accept loop: one task per connection, HTTP/1.1 with upgrades, a cap on
//! connections, and timeouts for peers that send nothing.
//!
//! A hostile network in front of the daemon can open connections and stall in
//! them: each connection must send its request head within
//! [`HEADER_READ_TIMEOUT_SECS`] (idle keep-alive connections included), and at most
//! [`MAX_CONNECTIONS`] are served at once; past that a newcomer waits in the
//! kernel's backlog. An upgraded agent connection leaves the HTTP server (it is the
//! agent protocol from then on, with the agent's own bounds) and is not counted.
//! With TLS, the handshake must finish within the same bound as a request head.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Most HTTP connections served at once.
pub const MAX_CONNECTIONS: usize = 512;

/// How long a connection may take to send a request's head.
pub const HEADER_READ_TIMEOUT_SECS: u64 = 30;

/// Serves `router` on `listener` (inside TLS when given an acceptor) until
/// `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: axum::Router,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            let bound = Duration::from_secs(HEADER_READ_TIMEOUT_SECS);
            match tls {
                None => serve_connection(stream, service).await,
                Some(acceptor) => {
                    match tokio::time::timeout(bound, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => serve_connection(stream, service).await,
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
}

/// HTTP/1.1 with upgrades on one accepted connection, until it ends.
async fn serve_connection<S>(stream: S, service: TowerToHyperService<axum::Router>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(HEADER_READ_TIMEOUT_SECS))
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(error) = connection.await {
        tracing::debug!(%error, "connection ended with an error");
    }
}
