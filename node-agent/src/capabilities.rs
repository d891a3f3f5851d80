//! The capabilities the agent needs, checked at start: `/proc/self/status` CapEff ─► the missing
//! ones, named ─► one error line at start, and every failed sync's status message says it first.
//!
//! Without NET_ADMIN every iptables, nftables, IPVS and conntrack call is refused with a bare
//! "Permission denied (you must be root)" (the agent *is* root, in a container that dropped the
//! capability), which tells an operator nothing about the manifest they changed.

/// A capability the agent needs: its number (linux/capability.h), name, and what it is for.
const NEEDED: [(u32, &str, &str); 2] = [
    (
        12,
        "NET_ADMIN",
        "programming iptables, nftables, IPVS and conntrack",
    ),
    (13, "NET_RAW", "the raw sockets iptables uses"),
];

/// The names of the needed capabilities missing from `cap_eff` (the hexadecimal CapEff mask).
pub fn missing(cap_eff: u64) -> Vec<&'static str> {
    NEEDED
        .iter()
        .filter(|(bit, _, _)| cap_eff & (1u64 << bit) == 0)
        .map(|(_, name, _)| *name)
        .collect()
}

/// The CapEff mask of this process, if `/proc/self/status` says it.
pub fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_cap_eff(&status)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

/// The sentence put before every sync failure while capabilities are missing.
pub fn explain(missing: &[&str]) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    let what: Vec<String> = NEEDED
        .iter()
        .filter(|(_, name, _)| missing.contains(name))
        .map(|(_, name, purpose)| format!("{name} ({purpose})"))
        .collect();
    Some(format!(
        "the agent lacks the capabilit{} {}: add {} to the agent container's \
         securityContext.capabilities.add (config/agent/daemonset.yaml)",
        if missing.len() == 1 { "y" } else { "ies" },
        what.join(" and "),
        missing.join(" and "),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_capabilities_are_named_with_what_they_are_for() {
        let table: [(u64, &[&str]); 4] = [
            (0x0000_01ff_ffff_ffff, &[]),
            (1 << 13, &["NET_ADMIN"]),
            (1 << 12, &["NET_RAW"]),
            (0, &["NET_ADMIN", "NET_RAW"]),
        ];
        for (mask, want) in table {
            assert_eq!(missing(mask), want, "mask {mask:x}");
        }
        let sentence = explain(&["NET_ADMIN"]).unwrap();
        assert!(
            sentence.contains("lacks the capability NET_ADMIN (programming iptables"),
            "{sentence}"
        );
        assert!(
            sentence.contains("securityContext.capabilities.add"),
            "{sentence}"
        );
        assert_eq!(explain(&[]), None);
    }

    #[test]
    fn cap_eff_is_read_from_proc_status_text() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000003000\n";
        assert_eq!(parse_cap_eff(status), Some(0x3000));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
        assert!(effective().is_some(), "this process has a CapEff line");
    }
}
