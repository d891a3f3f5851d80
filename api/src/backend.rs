//! Which kernel mechanism programs a plan: a leaf module, so the plan and its status (which reports the
//! backend in use) both name it without depending on each other.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which kernel mechanism programs the plan.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `iptables-restore` (default).
    Iptables,
    /// IPVS virtual servers plus iptables/ipset glue.
    Ipvs,
    /// One nftables table owned by the agent.
    Nftables,
}

impl Backend {
    /// The lowercase name used in the API, flags and node labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Ipvs => "ipvs",
            Self::Nftables => "nftables",
        }
    }

    /// Parses the lowercase name.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "iptables" => Some(Self::Iptables),
            "ipvs" => Some(Self::Ipvs),
            "nftables" => Some(Self::Nftables),
            _ => None,
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
