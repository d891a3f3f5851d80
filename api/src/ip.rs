//! IP and CIDR parsing that accepts what the Kubernetes API has historically accepted.
//!
//! Older API servers allowed IPv4 octets with leading zeros (`010.001.002.003`), which Go's legacy
//! parser read as decimal. kube-proxy normalises them with `ParseIPSloppy`; so do we, so the plan only
//! ever carries canonical text. Rust's own parser rejects leading zeros, hence this module.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Parses an IP address, accepting IPv4 octets with leading zeros (read as decimal).
pub fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    parse_ipv4_leading_zeros(text).map(IpAddr::V4)
}

fn parse_ipv4_leading_zeros(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

/// Parses a CIDR the same lenient way and returns the network (host bits cleared), as kube-proxy does.
pub fn parse_cidr_sloppy(text: &str) -> Option<IpNet> {
    let text = text.trim();
    let (addr, prefix) = text.split_once('/')?;
    let ip = parse_ip_sloppy(addr)?;
    let prefix: u8 = prefix.parse().ok()?;
    IpNet::new(ip, prefix).ok().map(|net| net.trunc())
}

/// Parses an IP in canonical form only (what a plan must carry).
pub fn parse_ip_strict(text: &str) -> Option<IpAddr> {
    let ip: IpAddr = text.parse().ok()?;
    match ip {
        // The standard parser accepts IPv4 only in canonical form (no leading zeros, four octets).
        IpAddr::V4(_) => Some(ip),
        // IPv6 has many spellings of one address; compare with the canonical one without allocating
        // (this runs for every address of every plan, on every sync).
        IpAddr::V6(_) => {
            let mut canonical = StackText::default();
            std::fmt::Write::write_fmt(&mut canonical, format_args!("{ip}")).ok()?;
            (canonical.as_bytes() == text.as_bytes()).then_some(ip)
        }
    }
}

/// Text formatted into a fixed buffer (an IPv6 address is at most 45 characters).
struct StackText {
    bytes: [u8; 64],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        Self {
            bytes: [0; 64],
            len: 0,
        }
    }
}

impl StackText {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Parses a CIDR in canonical form only (network address, no host bits).
pub fn parse_cidr_strict(text: &str) -> Option<IpNet> {
    let net: IpNet = text.parse().ok()?;
    (net.trunc() == net && net.to_string() == text).then_some(net)
}

/// True for `0.0.0.0/0` and `::/0`.
pub fn is_zero_cidr(net: &IpNet) -> bool {
    net.prefix_len() == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parsing_accepts_only_canonical_text() {
        let cases = [
            ("10.96.0.10", true),
            ("010.96.0.10", false),
            ("10.96.0", false),
            (" 10.96.0.10", false),
            ("2001:db8::1", true),
            ("2001:DB8::1", false),
            ("2001:db8:0::1", false),
            ("2001:0db8::1", false),
            ("::ffff:192.0.2.1", true),
            ("::", true),
            ("fe80::1%eth0", false),
        ];
        for (text, canonical) in cases {
            assert_eq!(parse_ip_strict(text).is_some(), canonical, "{text}");
        }
    }

    #[test]
    fn leading_zero_ipv4_is_read_as_decimal() {
        let cases = [
            ("010.001.002.003", Some("10.1.2.3")),
            ("10.96.0.10", Some("10.96.0.10")),
            (" 10.0.0.1 ", Some("10.0.0.1")),
            ("2001:db8::0001", Some("2001:db8::1")),
            ("256.1.1.1", None),
            ("1.2.3", None),
            ("1.2.3.4.5", None),
            ("0001.2.3.4", None),
            ("", None),
            ("abc", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_ip_sloppy(input).map(|ip| ip.to_string()).as_deref(),
                want,
                "{input}"
            );
        }
    }

    #[test]
    fn cidrs_are_normalised_to_the_network() {
        let cases = [
            ("010.000.0.0/8", Some("10.0.0.0/8")),
            ("10.1.2.3/16", Some("10.1.0.0/16")),
            ("0.0.0.0/0", Some("0.0.0.0/0")),
            ("2001:db8::1/64", Some("2001:db8::/64")),
            ("10.0.0.0/33", None),
            ("10.0.0.0", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_cidr_sloppy(input).map(|n| n.to_string()).as_deref(),
                want,
                "{input}"
            );
        }
    }

    #[test]
    fn strict_parsing_rejects_non_canonical_text() {
        assert!(parse_ip_strict("10.0.0.1").is_some());
        assert!(parse_ip_strict("010.0.0.1").is_none());
        assert!(parse_ip_strict("2001:DB8::1").is_none());
        assert!(parse_cidr_strict("10.0.0.0/8").is_some());
        assert!(parse_cidr_strict("10.0.0.1/8").is_none());
    }
}
