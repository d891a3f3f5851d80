//! A verdict as the switch gate compares it: where a frontend's first packet goes, and each endpoint's
//! share of new connections; masquerade and affinity are left out (every backend does them the same way
//! or the plan says nothing about them).
//!
//! ```text
//! explain::Outcome (iptables trace) ──────┐
//! IPVS virtual server (weights) ──────────┼─► Verdict { Forward(endpoint ─► ‰), Reject, Drop, Pass, Unknown }
//! nftables elements and chains (uniform) ─┘         ─► agrees(other)? ─► Display: in words for the status
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::explain::Outcome;

/// How many endpoints a verdict names in words.
const SAID: usize = 4;

/// What a backend's rules do with a frontend's first packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// DNAT to these endpoints, each with its share of new connections in per mille (rounded).
    Forward(BTreeMap<SocketAddr, u32>),
    /// Refused at once.
    Reject,
    /// Dropped.
    Drop,
    /// No rule of ours takes the packet.
    Pass,
    /// A rule the model cannot follow (named): never agrees with anything, so a switch is refused
    /// rather than guessed.
    Unknown(String),
}

impl Verdict {
    /// Forwarded to `endpoints`, each weighing its weight.
    pub fn weighted(endpoints: impl IntoIterator<Item = (SocketAddr, u32)>) -> Self {
        let mut weights: BTreeMap<SocketAddr, u64> = BTreeMap::new();
        for (endpoint, weight) in endpoints {
            *weights.entry(endpoint).or_default() += u64::from(weight);
        }
        let total: u64 = weights.values().sum();
        if weights.is_empty() || total == 0 {
            return Self::Pass;
        }
        Self::Forward(
            weights
                .into_iter()
                .map(|(endpoint, weight)| {
                    let share = (weight * 2000 + total) / (2 * total);
                    (endpoint, u32::try_from(share).unwrap_or(1000))
                })
                .collect(),
        )
    }

    /// Forwarded to each of `endpoints` alike.
    pub fn uniform(endpoints: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self::weighted(endpoints.into_iter().map(|e| (e, 1)))
    }

    /// The verdict of `explain`'s outcome.
    pub fn of_outcome(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Forwarded { endpoints } => {
                let mut shares = BTreeMap::new();
                for candidate in endpoints {
                    let Ok(endpoint) = candidate.endpoint.parse::<SocketAddr>() else {
                        return Self::Unknown(format!("endpoint {:?}", candidate.endpoint));
                    };
                    // Shares as probabilities: round to per mille as `weighted` does.
                    let share = (candidate.probability * 1000.0).round().clamp(0.0, 1000.0) as u32;
                    *shares.entry(endpoint).or_default() += share;
                }
                Self::Forward(shares)
            }
            Outcome::Rejected => Self::Reject,
            Outcome::Dropped => Self::Drop,
            Outcome::NotAService => Self::Pass,
        }
    }

    /// Both verdicts send new connections the same way: the same endpoints, each share within 1 ‰
    /// (a traced probability and a weight round apart at the half); an unknown one agrees with nothing.
    pub fn agrees(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Forward(mine), Self::Forward(theirs)) => {
                mine.len() == theirs.len()
                    && mine
                        .iter()
                        .zip(theirs)
                        .all(|((a, x), (b, y))| a == b && x.abs_diff(*y) <= 1)
            }
            (Self::Unknown(_), _) | (_, Self::Unknown(_)) => false,
            _ => self == other,
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forward(shares) => {
                let list: Vec<String> = shares
                    .iter()
                    .take(SAID)
                    .map(|(endpoint, share)| format!("{endpoint} {:.1}%", f64::from(*share) / 10.0))
                    .collect();
                write!(f, "forwards to {}", list.join(", "))?;
                match shares.len().saturating_sub(SAID) {
                    0 => Ok(()),
                    more => write!(f, " and {more} more"),
                }
            }
            Self::Reject => f.write_str("rejects"),
            Self::Drop => f.write_str("drops"),
            Self::Pass => f.write_str("does not forward"),
            Self::Unknown(what) => write!(f, "cannot be modelled ({what})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::Candidate;

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn shares_compare_across_probabilities_and_weights() {
        let (a, b, c) = (at("10.0.0.1:80"), at("10.0.0.2:80"), at("10.0.0.3:80"));
        let traced = Outcome::Forwarded {
            endpoints: [(a, 1.0 / 3.0), (b, 0.5 * (2.0 / 3.0)), (c, 1.0 / 3.0)]
                .into_iter()
                .map(|(endpoint, probability)| Candidate {
                    endpoint: endpoint.to_string(),
                    probability,
                    weight: None,
                    masquerade: true,
                    connections: None,
                })
                .collect(),
        };
        let cases = [
            (Verdict::uniform([a, b, c]), true),
            (Verdict::weighted([(a, 2), (b, 2), (c, 2)]), true),
            (Verdict::weighted([(a, 3), (b, 1), (c, 1)]), false),
            (Verdict::Forward([(a, 334), (b, 333), (c, 332)].into()), true),
            (Verdict::uniform([a, b]), false),
            (Verdict::Reject, false),
        ];
        for (verdict, agrees) in cases {
            assert_eq!(Verdict::of_outcome(&traced).agrees(&verdict), agrees, "{verdict}");
        }
        assert_eq!(
            Verdict::weighted([(a, 3), (b, 1)]).to_string(),
            "forwards to 10.0.0.1:80 75.0%, 10.0.0.2:80 25.0%"
        );
        let unknown = Verdict::Unknown("rule x".into());
        assert!(!unknown.agrees(&unknown.clone()));
        assert_eq!(Verdict::uniform([]), Verdict::Pass);
        assert_eq!(Verdict::of_outcome(&Outcome::Dropped), Verdict::Drop);
    }
}
