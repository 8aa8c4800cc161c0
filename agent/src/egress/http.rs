//! The proxy's view of HTTP: just enough to read one request head and decide where
//! it goes. Pure functions over bytes, no I/O.
//!
//! Two forms are proxied:
//! - `CONNECT host:port HTTP/1.x`: a tunnel (https, git over https, pip);
//! - an absolute-URI request, `GET http://host[:port]/path HTTP/1.x`: plain HTTP.
//!   The head is rewritten to origin form (`GET /path`), the `Proxy-*` headers go,
//!   and `Connection: close` is set, so the upstream ends the connection after one
//!   response: a later request on the same proxy connection may name another host,
//!   and must never ride a connection the host checked for this one.
//!
//! Everything else (a TLS hello, a SOCKS greeting, an origin-form request, an
//! `https://` URI outside CONNECT) is refused with a [`HeadError`] the program sees
//! as a 400 and the host logs.

/// Longest request head read: a real client's is well under 8 KiB.
pub const HEAD_MAX_BYTES: usize = 16 * 1024;

/// Where a request goes and what to send first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A tunnel to `host:port`: answer `200`, then splice.
    Connect {
        /// Name or IP literal (brackets removed).
        host: String,
        /// Port.
        port: u16,
    },
    /// A plain HTTP request to `host:port`: send `head` upstream, then splice.
    Forward {
        /// Name or IP literal.
        host: String,
        /// Port (80 unless given).
        port: u16,
        /// The rewritten head, ending in the blank line.
        head: Vec<u8>,
    },
}

impl Target {
    /// The destination.
    pub fn destination(&self) -> (&str, u16) {
        match self {
            Self::Connect { host, port } | Self::Forward { host, port, .. } => (host, *port),
        }
    }
}

/// A head the proxy will not carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// The bytes are not an HTTP/1.x request line.
    #[error("Not an HTTP proxy request (first bytes {0:?})")]
    NotHttp(String),
    /// No blank line within [`HEAD_MAX_BYTES`].
    #[error("The request head is longer than {HEAD_MAX_BYTES} bytes")]
    TooLong,
    /// An origin-form or `https://` request: the program did not use the proxy as one.
    #[error("Only CONNECT and absolute http:// requests are proxied (got {0:?})")]
    Unsupported(String),
    /// The authority is not `host[:port]`.
    #[error("Bad destination {0:?}")]
    BadAuthority(String),
}

/// The length of the head in `buf` (through the blank line), if it is all there.
pub fn head_len(buf: &[u8]) -> Option<usize> {
    memchr::memmem::find(buf, b"\r\n\r\n").map(|at| at + 4)
}

/// Refuses early what cannot become an HTTP request line (a TLS or SOCKS client
/// would otherwise wait for a blank line that never comes).
pub fn check_prefix(buf: &[u8]) -> Result<(), HeadError> {
    let method_len = buf
        .iter()
        .position(|b| *b == b' ')
        .unwrap_or(buf.len())
        .min(16);
    if buf[..method_len].iter().all(u8::is_ascii_uppercase) && (method_len < 16 || buf.len() < 16) {
        Ok(())
    } else {
        Err(HeadError::NotHttp(printable(&buf[..buf.len().min(16)])))
    }
}

/// Parses a complete head (as [`head_len`] found it).
pub fn parse(head: &[u8]) -> Result<Target, HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::NotHttp(printable(head)))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::NotHttp(printable(request_line.as_bytes())));
    };
    if method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !matches!(version, "HTTP/1.0" | "HTTP/1.1")
    {
        return Err(HeadError::NotHttp(printable(request_line.as_bytes())));
    }
    if method == "CONNECT" {
        let (host, port) = authority(target, None)?;
        return Ok(Target::Connect { host, port });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(HeadError::Unsupported(printable(request_line.as_bytes())));
    };
    let (authority_part, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    let (host, port) = authority(authority_part, Some(80))?;
    let mut out = format!("{method} {path} {version}\r\n");
    let mut has_host = false;
    for line in lines.take_while(|line| !line.is_empty()) {
        let name = line.split(':').next().unwrap_or("").trim();
        if name.eq_ignore_ascii_case("proxy-connection")
            || name.eq_ignore_ascii_case("proxy-authorization")
            || name.eq_ignore_ascii_case("connection")
            || name.eq_ignore_ascii_case("keep-alive")
        {
            continue;
        }
        has_host |= name.eq_ignore_ascii_case("host");
        out.push_str(line);
        out.push_str("\r\n");
    }
    if !has_host {
        out.push_str(&format!("Host: {authority_part}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Target::Forward {
        host,
        port,
        head: out.into_bytes(),
    })
}

/// `host:port`, `[v6]:port`, or (with a default) either without the port. Any
/// `user@` part is refused: credentials in a URI are the program's mistake, and the
/// host would log them.
fn authority(text: &str, default_port: Option<u16>) -> Result<(String, u16), HeadError> {
    let bad = || HeadError::BadAuthority(printable(text.as_bytes()));
    if text.contains('@') || text.is_empty() {
        return Err(bad());
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(bad()),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(bad)?,
        None => default_port.ok_or_else(bad)?,
    };
    if !valid_host(host, text.starts_with('[')) {
        return Err(bad());
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// An IP address (an IPv6 one only in brackets), or a DNS name the host will take:
/// labels of letters, digits, `-` and `_`, 1-63 bytes each, none starting with `-`
/// (the host checks the same; refusing here gives the program a clearer error).
fn valid_host(host: &str, bracketed: bool) -> bool {
    if bracketed {
        return host.parse::<std::net::Ipv6Addr>().is_ok();
    }
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    sandbox_protocol::link::egress::is_valid_host_name(host.trim_end_matches('.'))
}

/// Bytes as a short printable string for errors and logs.
pub fn printable(bytes: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(&bytes[..bytes.len().min(64)])
        .chars()
        .map(|c| if c.is_control() { '.' } else { c })
        .collect();
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_names_a_host_and_port() {
        assert_eq!(
            parse(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"),
            Ok(Target::Connect {
                host: "pypi.org".into(),
                port: 443
            })
        );
        assert_eq!(
            parse(b"CONNECT [::1]:8443 HTTP/1.0\r\n\r\n"),
            Ok(Target::Connect {
                host: "::1".into(),
                port: 8443
            })
        );
        assert!(matches!(
            parse(b"CONNECT pypi.org HTTP/1.1\r\n\r\n"),
            Err(HeadError::BadAuthority(_))
        ));
    }

    #[test]
    fn an_absolute_request_is_rewritten_to_origin_form_with_connection_close() {
        let head = b"GET http://Example.com:8080/a/b?c=1 HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n";
        let Ok(Target::Forward { host, port, head }) = parse(head) else {
            panic!("not forwarded");
        };
        assert_eq!((host.as_str(), port), ("example.com", 8080));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /a/b?c=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let Ok(Target::Forward { port, head, .. }) = parse(b"GET http://a.io HTTP/1.0\r\n\r\n")
        else {
            panic!("not forwarded");
        };
        assert_eq!(port, 80);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET / HTTP/1.0\r\nHost: a.io\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn what_is_not_a_proxy_request_is_refused() {
        assert!(matches!(
            parse(b"GET /index.html HTTP/1.1\r\n\r\n"),
            Err(HeadError::Unsupported(_))
        ));
        assert!(matches!(
            parse(b"GET https://a.io/ HTTP/1.1\r\n\r\n"),
            Err(HeadError::Unsupported(_))
        ));
        assert!(matches!(
            parse(b"hello there\r\n\r\n"),
            Err(HeadError::NotHttp(_))
        ));
        assert!(matches!(
            parse(b"GET http://u:p@a.io/ HTTP/1.1\r\n\r\n"),
            Err(HeadError::BadAuthority(_))
        ));
        // Found by the egress_parse fuzz target: a colon inside an unbracketed host.
        for bad in [
            &b"GET http://aio:8.io:8080/ HTTP/1.1\r\n\r\n"[..],
            b"CONNECT a..io:443 HTTP/1.1\r\n\r\n",
            b"CONNECT [not-v6]:443 HTTP/1.1\r\n\r\n",
            b"CONNECT -a.io:443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(HeadError::BadAuthority(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse(b"GET http://a b/ HTTP/1.1\r\n\r\n"),
            Err(HeadError::NotHttp(_))
        ));
        // A TLS ClientHello and a SOCKS5 greeting are refused from their first bytes.
        assert!(check_prefix(&[0x16, 3, 1, 0, 0xa5]).is_err());
        assert!(check_prefix(&[5, 1, 0]).is_err());
        assert!(check_prefix(b"CONN").is_ok());
        assert!(check_prefix(b"GET http://").is_ok());
    }

    #[test]
    fn the_head_ends_at_the_blank_line() {
        assert_eq!(head_len(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_len(b"GET / HTTP/1.1\r\n"), None);
    }
}
