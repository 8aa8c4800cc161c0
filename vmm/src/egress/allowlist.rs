//! The egress allowlist: which destinations a sandbox may reach.
//!
//! # Entries
//! One destination pattern, then an optional `:PORT` or `:LOW-HIGH` (no port: any):
//!
//! | entry | allows |
//! | --- | --- |
//! | `pypi.org` | that name |
//! | `*.github.com` | every name under `github.com` (not `github.com` itself) |
//! | `*` | every name |
//! | `203.0.113.7`, `[2001:db8::1]` | that address |
//! | `10.0.0.0/8`, `[fd00::/8]` | every address in the block |
//!
//! e.g. `pypi.org:443`, `*.pythonhosted.org:443`, `127.0.0.1:8000-8099`.
//!
//! # The check, and DNS rebinding
//! A destination given **by name** must match a name entry; then the host resolves it
//! and each address is checked again before it is dialled: a public address passes,
//! an internal one (loopback, private, link-local, CGNAT, ULA, multicast...) only if
//! an address entry covers it. So `*.example.com` cannot be turned into a way to the
//! host's loopback or the cloud metadata service by a DNS answer, and the address
//! dialled is always the one checked. A destination given **as an address** must be
//! covered by an address entry, or be public and allowed by `*`.
//!
//! # Narrowing
//! An operator's list and a sandbox's own are both [`Allowlist`]s; a [`Policy`]
//! holds both and a destination must pass each. A sandbox's list can only take away.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// An entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Bad allowlist entry {entry:?}: {reason}")]
pub struct EntryError {
    /// The entry as given.
    pub entry: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// Ports an entry allows, inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ports {
    low: u16,
    high: u16,
}

impl Ports {
    const ANY: Self = Self {
        low: 1,
        high: u16::MAX,
    };

    fn contains(self, port: u16) -> bool {
        (self.low..=self.high).contains(&port)
    }
}

/// What an entry matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Every name (not addresses, which need `*` and a public address).
    AnyName,
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// Names ending in `.suffix`.
    Under(String),
    /// Addresses in this block.
    Block { net: IpAddr, prefix: u8 },
}

/// One parsed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    text: String,
    pattern: Pattern,
    ports: Ports,
}

impl std::str::FromStr for Entry {
    type Err = EntryError;

    fn from_str(text: &str) -> Result<Self, EntryError> {
        let error = |reason| EntryError {
            entry: text.to_owned(),
            reason,
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(error("empty"));
        }
        // Split off the port: after `]` for a bracketed address, else after the only
        // colon (an unbracketed IPv6 address has several and no port).
        let (dest, port) = if let Some(rest) = trimmed.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or_else(|| error("no closing ]"))?;
            match after {
                "" => (inner, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (inner, Some(port)),
                    None => return Err(error("junk after ]")),
                },
            }
        } else if trimmed.matches(':').count() == 1 {
            let (dest, port) = trimmed.split_once(':').ok_or_else(|| error("bad port"))?;
            (dest, Some(port))
        } else {
            (trimmed, None)
        };
        let ports = match port {
            None => Ports::ANY,
            Some("*") => Ports::ANY,
            Some(port) => {
                parse_ports(port).ok_or_else(|| error("a port is 1-65535, or LOW-HIGH"))?
            }
        };
        let pattern = parse_pattern(dest).map_err(error)?;
        Ok(Self {
            text: trimmed.to_owned(),
            pattern,
            ports,
        })
    }
}

fn parse_ports(text: &str) -> Option<Ports> {
    let (low, high) = match text.split_once('-') {
        Some((low, high)) => (low.parse().ok()?, high.parse().ok()?),
        None => {
            let port = text.parse().ok()?;
            (port, port)
        }
    };
    (low >= 1 && low <= high).then_some(Ports { low, high })
}

fn parse_pattern(dest: &str) -> Result<Pattern, &'static str> {
    if dest == "*" {
        return Ok(Pattern::AnyName);
    }
    if let Some((net, prefix)) = dest.split_once('/') {
        let net: IpAddr = net.parse().map_err(|_| "a block is ADDRESS/PREFIX")?;
        let prefix: u8 = prefix.parse().map_err(|_| "a block is ADDRESS/PREFIX")?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err("the prefix is longer than the address");
        }
        if masked(net, prefix) != net {
            return Err("the block has bits set past its prefix");
        }
        return Ok(Pattern::Block { net, prefix });
    }
    if let Ok(addr) = dest.parse::<IpAddr>() {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        return Ok(Pattern::Block { net: addr, prefix });
    }
    let (under, name) = match dest.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, dest),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if !valid_name(&name) {
        return Err("not a host name, *.name, *, an address or a block");
    }
    Ok(if under {
        Pattern::Under(name)
    } else {
        Pattern::Name(name)
    })
}

fn valid_name(name: &str) -> bool {
    sandbox_protocol::link::egress::is_valid_host_name(name)
}

/// `addr` with the bits past `prefix` cleared.
fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & mask).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & mask).into())
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// True for an address on the public internet: not loopback, private, link-local,
/// shared (CGNAT), unspecified, broadcast, multicast, documentation, benchmarking,
/// IETF protocol assignments, or IPv6 ULA and site-local. IPv6 forms that carry an
/// IPv4 address to a gateway (NAT64, IPv4-compatible, 6to4, Teredo) are not public
/// either: behind such a gateway they reach whatever IPv4 they embed, internal
/// addresses included, so they need an address entry like any internal one.
pub fn is_public(addr: IpAddr) -> bool {
    match canonical(addr) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || (a == 198 && (18..20).contains(&b))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            let [first, second, ..] = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                || first == 0x2001 && second == 0x0db8
                // NAT64 (64:ff9b::/96 and 64:ff9b:1::/48), IPv4-compatible (::/96),
                // 6to4 (2002::/16) and Teredo (2001::/32).
                || first == 0x0064 && second == 0xff9b
                || v6.to_ipv4().is_some()
                || first == 0x2002
                || first == 0x2001 && second == 0)
        }
    }
}

impl Entry {
    fn allows_name(&self, name: &str, port: u16) -> bool {
        self.ports.contains(port)
            && match &self.pattern {
                Pattern::AnyName => true,
                Pattern::Name(n) => n == name,
                Pattern::Under(suffix) => name
                    .strip_suffix(suffix.as_str())
                    .is_some_and(|head| head.ends_with('.') && head.len() > 1),
                Pattern::Block { .. } => false,
            }
    }

    fn covers_address(&self, addr: IpAddr, port: u16) -> bool {
        let addr = canonical(addr);
        self.ports.contains(port)
            && match self.pattern {
                Pattern::Block { net, prefix } => {
                    let net = canonical(net);
                    let prefix = match (net, self.pattern_is_mapped()) {
                        (IpAddr::V4(_), true) => prefix.saturating_sub(96),
                        _ => prefix,
                    };
                    net.is_ipv4() == addr.is_ipv4() && masked(addr, prefix) == net
                }
                _ => false,
            }
    }

    fn pattern_is_mapped(&self) -> bool {
        matches!(self.pattern, Pattern::Block { net: IpAddr::V6(v6), .. } if v6.to_ipv4_mapped().is_some())
    }

    fn allows_any_public(&self, port: u16) -> bool {
        self.pattern == Pattern::AnyName && self.ports.contains(port)
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A list of entries; empty allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<Entry>,
}

impl Allowlist {
    /// Parses every entry; the first bad one is the error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, EntryError> {
        let entries = entries
            .iter()
            .map(|e| e.as_ref().parse())
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// The entries as given.
    pub fn entries(&self) -> Vec<String> {
        self.entries.iter().map(ToString::to_string).collect()
    }

    /// True when it allows nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `host` (a name, or an address literal) at `port` may be asked for at
    /// all: the first step of the check.
    pub fn allows_destination(&self, host: &Host, port: u16) -> bool {
        match host {
            Host::Name(name) => self.entries.iter().any(|e| e.allows_name(name, port)),
            Host::Address(addr) => self.allows_address(*addr, port),
        }
    }

    /// Whether `addr` may be dialled at `port` (a literal, or what a name resolved to).
    pub fn allows_address(&self, addr: IpAddr, port: u16) -> bool {
        self.entries.iter().any(|e| e.covers_address(addr, port))
            || is_public(addr) && self.entries.iter().any(|e| e.allows_any_public(port))
    }

    /// Whether a resolved address of an allowed name may be dialled.
    pub fn allows_resolved(&self, addr: IpAddr, port: u16) -> bool {
        is_public(addr) || self.entries.iter().any(|e| e.covers_address(addr, port))
    }
}

/// A destination as the program named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name (lowercase, no trailing dot).
    Name(String),
    /// An address literal.
    Address(IpAddr),
}

impl Host {
    /// Reads what a `Dial` carried; `None` when it is neither a name nor an address.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim_start_matches('[').trim_end_matches(']');
        if let Ok(addr) = text.parse::<IpAddr>() {
            return Some(Self::Address(addr));
        }
        let name = text.trim_end_matches('.').to_ascii_lowercase();
        valid_name(&name).then_some(Self::Name(name))
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Address(addr) => write!(f, "{addr}"),
        }
    }
}

/// The operator's list and, optionally, a sandbox's narrower one. Stored in the VM's
/// run folder as JSON ([`PolicyFile`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    lists: Vec<Allowlist>,
}

impl Policy {
    /// A policy of one list.
    pub fn new(list: Allowlist) -> Self {
        Self { lists: vec![list] }
    }

    /// This policy narrowed by `list`: a destination must pass it too.
    pub fn narrowed(mut self, list: Allowlist) -> Self {
        self.lists.push(list);
        self
    }

    /// Step one: the name (or literal) and port.
    pub fn allows_destination(&self, host: &Host, port: u16) -> bool {
        !self.lists.is_empty() && self.lists.iter().all(|l| l.allows_destination(host, port))
    }

    /// Step two, for each address a name resolved to.
    pub fn allows_resolved(&self, addr: IpAddr, port: u16) -> bool {
        !self.lists.is_empty() && self.lists.iter().all(|l| l.allows_resolved(addr, port))
    }

    /// The lists' entries, outermost first.
    pub fn to_file(&self) -> PolicyFile {
        PolicyFile {
            lists: self.lists.iter().map(Allowlist::entries).collect(),
        }
    }

    /// Parses a stored policy.
    pub fn from_file(file: &PolicyFile) -> Result<Self, EntryError> {
        Ok(Self {
            lists: file
                .lists
                .iter()
                .map(|l| Allowlist::parse(l))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A [`Policy`] on disk: `egress.json` in the VM's run folder.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// Each list's entries; a destination must pass every list.
    pub lists: Vec<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::parse(entries).unwrap()
    }

    fn name(n: &str) -> Host {
        Host::parse(n).unwrap()
    }

    #[test]
    fn names_wildcards_and_ports() {
        let l = list(&["pypi.org:443", "*.github.com", "files.io:8000-8099"]);
        assert!(l.allows_destination(&name("pypi.org"), 443));
        assert!(l.allows_destination(&name("PyPI.org."), 443));
        assert!(!l.allows_destination(&name("pypi.org"), 80));
        assert!(l.allows_destination(&name("api.github.com"), 22));
        assert!(l.allows_destination(&name("a.b.github.com"), 443));
        assert!(
            !l.allows_destination(&name("github.com"), 443),
            "the apex is not under it"
        );
        assert!(!l.allows_destination(&name("evilgithub.com"), 443));
        assert!(l.allows_destination(&name("files.io"), 8050));
        assert!(!l.allows_destination(&name("files.io"), 8100));
        assert!(!Allowlist::default().allows_destination(&name("pypi.org"), 443));
    }

    #[test]
    fn addresses_and_blocks() {
        let l = list(&["127.0.0.1:8080", "10.0.0.0/8", "[fd00::/8]:443", "[::1]"]);
        let at = |s: &str| Host::parse(s).unwrap();
        assert!(l.allows_destination(&at("127.0.0.1"), 8080));
        assert!(!l.allows_destination(&at("127.0.0.1"), 8081));
        assert!(l.allows_destination(&at("10.1.2.3"), 1));
        assert!(
            l.allows_destination(&at("::ffff:10.1.2.3"), 1),
            "a mapped address is its v4"
        );
        assert!(l.allows_destination(&at("fd12::1"), 443));
        assert!(!l.allows_destination(&at("fd12::1"), 80));
        assert!(l.allows_destination(&at("[::1]"), 5));
        assert!(!l.allows_destination(&at("8.8.8.8"), 53));
        assert!(
            !l.allows_destination(&name("localhost"), 8080),
            "names need a name entry"
        );
    }

    #[test]
    fn a_name_that_resolves_inside_is_refused_unless_its_address_is_listed() {
        let l = list(&["*.example.com", "*"]);
        assert!(l.allows_resolved("93.184.216.34".parse().unwrap(), 443));
        for inside in [
            "127.0.0.1",
            "10.0.0.1",
            "192.168.1.1",
            "172.16.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:5",
            "::7f00:1",
            "2002:7f00:1::1",
            "2001:0:4136:e378::1",
            "fec0::1",
            "192.0.0.8",
            "198.18.0.1",
        ] {
            assert!(!l.allows_resolved(inside.parse().unwrap(), 443), "{inside}");
        }
        let with_loopback = list(&["localhost", "127.0.0.0/8:8080"]);
        assert!(with_loopback.allows_resolved("127.0.0.1".parse().unwrap(), 8080));
        assert!(!with_loopback.allows_resolved("127.0.0.1".parse().unwrap(), 8081));
        // `*` allows public literals, never internal ones.
        assert!(l.allows_destination(&Host::parse("1.1.1.1").unwrap(), 443));
        assert!(!l.allows_destination(&Host::parse("127.0.0.1").unwrap(), 443));
    }

    #[test]
    fn a_narrowed_policy_needs_both_lists() {
        let policy = Policy::new(list(&["*.pypi.org:443", "github.com"]))
            .narrowed(list(&["files.pypi.org", "evil.com"]));
        assert!(policy.allows_destination(&name("files.pypi.org"), 443));
        assert!(!policy.allows_destination(&name("files.pypi.org"), 80));
        assert!(!policy.allows_destination(&name("github.com"), 443));
        assert!(
            !policy.allows_destination(&name("evil.com"), 443),
            "never widened"
        );
        assert!(!Policy::default().allows_destination(&name("a.io"), 1));
        let file = policy.to_file();
        assert_eq!(Policy::from_file(&file).unwrap(), policy);
    }

    #[test]
    fn bad_entries_are_clear_errors() {
        for (entry, reason) in [
            ("", "empty"),
            ("pypi.org:0", "a port is 1-65535, or LOW-HIGH"),
            ("pypi.org:99999", "a port is 1-65535, or LOW-HIGH"),
            ("a.io:90-80", "a port is 1-65535, or LOW-HIGH"),
            ("10.0.0.1/8", "the block has bits set past its prefix"),
            ("10.0.0.0/33", "the prefix is longer than the address"),
            ("http://a.io", "a port is 1-65535, or LOW-HIGH"),
            ("a..io", "not a host name, *.name, *, an address or a block"),
            (
                "*.*.io",
                "not a host name, *.name, *, an address or a block",
            ),
            ("[::1", "no closing ]"),
        ] {
            let error = entry.parse::<Entry>().unwrap_err();
            assert_eq!(error.reason, reason, "{entry}");
            assert!(error.to_string().contains(&format!("{entry:?}")));
        }
    }
}
