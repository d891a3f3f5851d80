//! Which iptables the host uses: `iptables-nft` (nf_tables) or `iptables-legacy` (x_tables).
//!
//! ```text
//! --iptables-mode auto ─► rules in iptables-legacy-save + ip6tables-legacy-save  ─┐
//!                         rules in iptables-nft-save    + ip6tables-nft-save     ─┼─► choose() ─► Variant
//! --iptables-mode nft|legacy ──────────────────────────────────────────────────────┘
//! ```
//!
//! Rules written through one variant are invisible to the other, and the kernel runs both, so an agent
//! that picks the wrong one programs rules the host's other components never see together with theirs
//! (kubernetes#71305). Like kube-proxy's `iptables-wrapper`, `auto` counts the rules each variant shows
//! and uses the one with more: whatever set the host up (kubelet, CNI, firewall) has left its rules there.
//! A tie (a fresh node, or an empty network namespace) or a missing legacy variant means nf_tables, the
//! default of every current distribution.

use std::str::FromStr;

/// `--iptables-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IptablesMode {
    /// Detect what the host uses.
    #[default]
    Auto,
    /// `iptables-nft`.
    Nft,
    /// `iptables-legacy`.
    Legacy,
}

impl FromStr for IptablesMode {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "auto" => Ok(Self::Auto),
            "nft" => Ok(Self::Nft),
            "legacy" => Ok(Self::Legacy),
            other => Err(format!("unknown iptables mode {other:?} (auto, nft or legacy)")),
        }
    }
}

/// A resolved variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// nf_tables.
    Nft,
    /// x_tables.
    Legacy,
}

impl Variant {
    /// The suffix of its binaries (`iptables-nft-restore`).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Nft => "nft",
            Self::Legacy => "legacy",
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

/// kube-proxy's `iptables-wrapper` choice: legacy only when it shows strictly more rules, or when it
/// is the only variant that works. `None` means that variant's save commands are missing or failed.
pub fn choose(legacy_rules: Option<usize>, nft_rules: Option<usize>) -> Variant {
    match (legacy_rules, nft_rules) {
        (Some(legacy), Some(nft)) if legacy > nft => Variant::Legacy,
        (Some(_), None) => Variant::Legacy,
        _ => Variant::Nft,
    }
}

/// Rules in `iptables-save` output (lines starting with `-`).
pub fn count_rules(save: &str) -> usize {
    save.lines().filter(|line| line.starts_with('-')).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variant_with_more_rules_wins_and_nft_wins_ties() {
        let cases = [
            (Some(10), Some(3), Variant::Legacy),
            (Some(3), Some(10), Variant::Nft),
            (Some(0), Some(0), Variant::Nft),
            (Some(5), Some(5), Variant::Nft),
            (None, Some(0), Variant::Nft),
            (Some(4), None, Variant::Legacy),
            (Some(0), None, Variant::Legacy),
            (None, None, Variant::Nft),
        ];
        for (legacy, nft, want) in cases {
            assert_eq!(choose(legacy, nft), want, "{legacy:?} {nft:?}");
        }
    }

    #[test]
    fn rules_are_counted_from_save_output() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j X\n-A X -j RETURN\nCOMMIT\n";
        assert_eq!(count_rules(save), 2);
        assert_eq!("legacy".parse::<IptablesMode>(), Ok(IptablesMode::Legacy));
        assert!("fast".parse::<IptablesMode>().is_err());
    }
}
