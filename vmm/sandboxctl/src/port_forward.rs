//! `port-forward ID [LOCAL:]GUEST`: a local TCP listener whose every connection is
//! piped to the guest's `127.0.0.1:GUEST` ([`Client::dial_port`]), like
//! `kubectl port-forward`. Prints `Forwarding from ADDR -> GUEST`, serves until
//! Ctrl-C. A connection the guest refuses (nothing listening, too many) is closed
//! and its reason printed on stderr; the listener goes on.

use std::net::{IpAddr, SocketAddr};

use anyhow::{bail, Context};
use sandbox_vmm::client::Client;
use tokio::net::{TcpListener, TcpStream};

use crate::args::PortForwardArgs;
use crate::output;

/// `LOCAL:GUEST`, `:GUEST` (any free local port) or `GUEST` (the same port).
pub fn parse_ports(spec: &str) -> anyhow::Result<(u16, u16)> {
    let port = |text: &str, what: &str| -> anyhow::Result<u16> {
        text.parse::<u16>()
            .with_context(|| format!("{what} port {text:?} is not a number 0-65535"))
    };
    let (local, guest) = match spec.split_once(':') {
        Some(("", guest)) => (0, port(guest, "guest")?),
        Some((local, guest)) => (port(local, "local")?, port(guest, "guest")?),
        None => {
            let guest = port(spec, "guest")?;
            (guest, guest)
        }
    };
    if guest == 0 {
        bail!("guest port must be 1-65535");
    }
    Ok((local, guest))
}

/// Serves until Ctrl-C; exit code 0.
pub async fn port_forward(client: &Client, args: &PortForwardArgs) -> anyhow::Result<u8> {
    let (local, guest) = parse_ports(&args.ports)?;
    let address: IpAddr = args
        .address
        .parse()
        .with_context(|| format!("--address {:?} is not an IP address", args.address))?;
    let listener = TcpListener::bind(SocketAddr::new(address, local))
        .await
        .with_context(|| format!("Cannot listen on {address}:{local}"))?;
    let bound = listener.local_addr()?;
    output::print(&format!("Forwarding from {bound} -> {guest}\n"))?;
    let serve = async {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let client = client.clone();
                    tokio::spawn(forward(client, stream, guest));
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    };
    tokio::select! {
        () = serve => {}
        signal = tokio::signal::ctrl_c() => signal.context("Cannot wait for Ctrl-C")?,
    }
    Ok(0)
}

/// One local connection.
async fn forward(client: Client, mut local: TcpStream, guest: u16) {
    let _ = local.set_nodelay(true);
    match client.dial_port(guest).await {
        Ok(mut pipe) => {
            if let Err(error) = tokio::io::copy_bidirectional(&mut local, &mut pipe).await {
                tracing::debug!(%error, "forwarded connection ended");
            }
        }
        Err(error) => {
            let _ = output::stderr(
                format!(
                    "sandboxctl: port {guest}: {}\n",
                    sandbox_vmm::error_chain(&error)
                )
                .as_bytes(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs_parse_like_kubectl() {
        assert_eq!(parse_ports("8000").unwrap(), (8000, 8000));
        assert_eq!(parse_ports("9000:80").unwrap(), (9000, 80));
        assert_eq!(parse_ports(":80").unwrap(), (0, 80));
        for bad in ["", "x", "0", "1:0", "70000", "1:2:3", "a:80"] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }
}
