//! What a hostile guest (and a careless operator) feeds the egress code: arbitrary
//! bytes as the head of a proxy request (`sandbox_agent::egress::http`), as the host
//! of a `Dial`, and as allowlist entries (`sandbox_vmm::egress::allowlist`).
//!
//! Invariants: nothing panics; a forwarded request's head is in origin form, ends in
//! `Connection: close` and a blank line, and names a host the host side accepts; a
//! parsed entry prints as text that parses to the same entry; the allowlist check
//! answers for any host and port.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_agent::egress::http::{check_prefix, head_len, parse, Target};
use sandbox_vmm::egress::{Allowlist, Host};

fuzz_target!(|data: &[u8]| {
    let _ = check_prefix(data);
    let _ = head_len(data);
    if let Ok(target) = parse(data) {
        let (host, port) = target.destination();
        assert!(port != 0, "port 0 from {data:?}");
        assert!(Host::parse(host).is_some(), "the host side refuses {host:?}");
        if let Target::Forward { head, .. } = &target {
            assert!(head.ends_with(b"Connection: close\r\n\r\n"), "{head:?}");
            let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
            let target_part = line.split(|b| *b == b' ').nth(1).unwrap_or_default();
            assert!(target_part.starts_with(b"/"), "not origin form: {line:?}");
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let entries: Vec<&str> = text.split('\n').collect();
    if let Ok(list) = Allowlist::parse(&entries) {
        let again = Allowlist::parse(&list.entries()).expect("a printed entry does not parse");
        assert_eq!(again, list);
        for host in ["a.io", "x.a.io", "127.0.0.1", "::1", "8.8.8.8"] {
            let host = Host::parse(host).expect("a fixed host");
            let _ = list.allows_destination(&host, 443);
        }
    }
    if let Some(host) = Host::parse(text) {
        let list = Allowlist::parse(&["*", "10.0.0.0/8"]).expect("fixed entries");
        let _ = list.allows_destination(&host, 1);
    }
});
