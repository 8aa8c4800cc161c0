//! `port_forward`: a byte stream to `127.0.0.1:PORT` inside the guest, over the
//! agent's port channel (`Client::dial_port`, a connection of its own to the agent).
//!
//! After `ready`, the client's `data` frames are written to the guest connection
//! and `data_end` half-closes it; what the guest server sends comes back as `data`
//! frames, and its end of stream as `done`. The op ends when both directions have
//! ended, or at once when the client hangs up (dropping the guest connection). A
//! port with nothing listening is a `not_found` error before `ready`.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::conn::Conn;
use super::frames::{Request, Response};
use super::{AgentSource, OpError};

/// Bytes read from the guest connection per `data` frame.
const PORT_CHUNK_BYTES: usize = 256 * 1024;

pub async fn forward<S, R, W>(conn: &mut Conn<'_, S, R, W>, port: u16) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if port == 0 {
        return Err(OpError::bad_request(
            "port_forward needs a port from 1 to 65535",
        ));
    }
    let client = conn.client().await?;
    let stream = client
        .dial_port(port)
        .await
        .map_err(|error| OpError::agent("port_forward", &error))?;
    conn.send(&Response::Ready).await?;
    let (mut from_guest, mut to_guest) = tokio::io::split(stream);
    let mut buffer = vec![0u8; PORT_CHUNK_BYTES];
    let (mut upstream_open, mut downstream_open) = (true, true);
    while upstream_open || downstream_open {
        tokio::select! {
            read = from_guest.read(&mut buffer), if downstream_open => match read {
                Ok(0) | Err(_) => {
                    downstream_open = false;
                    conn.send(&Response::Done).await?;
                }
                Ok(read) => {
                    conn.send(&Response::Data { data: buffer[..read].to_vec() }).await?;
                }
            },
            spoke = conn.client_spoke(), if upstream_open => {
                spoke?;
                match conn.next_request().await {
                    Ok(Some(Request::Data { data })) => {
                        if to_guest.write_all(&data).await.is_err() {
                            // The guest side closed for reading: drop what follows.
                            tracing::debug!(port, "guest port closed for writing");
                        }
                    }
                    Ok(Some(Request::DataEnd)) => {
                        let _ = to_guest.shutdown().await;
                        upstream_open = false;
                    }
                    Ok(Some(_)) | Err(OpError::Reply { .. }) => {}
                    // The client went: dropping the stream closes the guest connection.
                    Ok(None) => return Ok(()),
                    Err(error) => return Err(error),
                }
            }
        }
    }
    Ok(())
}
