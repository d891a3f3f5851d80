//! The sysctls IPVS mode needs, as kube-proxy's IPVS mode sets them (written through the agent's one
//! sysctl edge, [`crate::sysctl::Sysctls`]).
//!
//! ```text
//! kernel release ─► wanted(release) ─► [(net/ipv4/vs/conntrack, 1), ...] ─► Sysctls::set each
//! ```
//!
//! - `net/ipv4/vs/conntrack=1`: IPVS connections go through conntrack, so the glue's MASQUERADE (and
//!   hairpin) apply to them.
//! - `net/ipv4/vs/expire_nodest_conn=1`: packets of a connection whose real server was deleted drop
//!   the connection at once instead of being black-holed until it times out.
//! - `net/ipv4/vs/expire_quiescent_template=1`: persistence templates of a weight-0 real server expire,
//!   so ClientIP affinity moves off a server being drained.
//! - `net/ipv4/vs/conn_reuse_mode=0` only on kernels before 5.9 (kubernetes#93297: the kernel bug it
//!   worked around is fixed since, and 0 there breaks removal of real servers).
//! - `net/ipv4/ip_forward=1`: traffic to pods on other nodes is forwarded.
//!
//! In a DaemonSet /proc/sys is often read-only to the agent (an init container sets them), so a write
//! that fails is logged by the caller, not fatal.

/// Where the kernel release is read.
pub const OSRELEASE: &str = "/proc/sys/kernel/osrelease";

/// `(major, minor)` of a release string such as `6.1.0-57-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The sysctls to set on a kernel of `release` (paths relative to /proc/sys), in order.
pub fn wanted(release: &str) -> Vec<(&'static str, &'static str)> {
    let mut list = vec![
        ("net/ipv4/vs/conntrack", "1"),
        ("net/ipv4/vs/expire_nodest_conn", "1"),
        ("net/ipv4/vs/expire_quiescent_template", "1"),
        ("net/ipv4/ip_forward", "1"),
    ];
    if kernel_version(release).is_some_and(|v| v < (5, 9)) {
        list.push(("net/ipv4/vs/conn_reuse_mode", "0"));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_reuse_mode_is_set_only_before_5_9() {
        assert_eq!(kernel_version("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("garbage"), None);
        let has_reuse = |release| {
            wanted(release)
                .iter()
                .any(|(p, _)| p.ends_with("conn_reuse_mode"))
        };
        assert!(!has_reuse("6.1.0-57-amd64"));
        assert!(!has_reuse("5.9.0"));
        assert!(has_reuse("5.4.0-100-generic"));
        assert!(!has_reuse("weird"));
        assert_eq!(wanted("6.1.0")[0], ("net/ipv4/vs/conntrack", "1"));
    }
}
