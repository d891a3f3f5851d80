//! Traffic checks: a named probe and what must come of it, evaluated on real packets in the lab.
//!
//! ```text
//! Check { from, proto, destination, count, expect } ─► Lab::probe_many ─► ProbeTally ─► Verdict (pass / why not)
//! ```
//!
//! Used by `make demo` (a readable report over the example cluster) and by the scenario suites.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use crate::{Lab, Place, ProbeTally, Proto, error::Result};

/// What a check expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Every probe answered by one of these pods (prefix match), and each of them answers at least once
    /// when `all` is set; when `source` is set, every answer saw that source IP.
    Answered {
        pods: Vec<String>,
        all: bool,
        source: Option<IpAddr>,
    },
    /// Every probe answered, all by the same pod (session affinity).
    Sticky { pods: Vec<String> },
    /// Every probe actively refused (REJECT: fails fast).
    Refused,
    /// Every probe timed out (DROP).
    Dropped,
}

/// One check.
#[derive(Debug, Clone)]
pub struct Check {
    /// What it shows, in words.
    pub name: String,
    /// Where the probes start.
    pub from: Place,
    /// Transport.
    pub proto: Proto,
    /// Where they go.
    pub to: SocketAddr,
    /// How many probes.
    pub count: usize,
    /// What must come of them.
    pub expect: Expect,
}

impl Check {
    /// A TCP check of `count` probes.
    pub fn tcp(name: &str, from: Place, to: &str, count: usize, expect: Expect) -> Self {
        Self::new(name, from, Proto::Tcp, to, count, expect)
    }

    /// A UDP check of `count` probes.
    pub fn udp(name: &str, from: Place, to: &str, count: usize, expect: Expect) -> Self {
        Self::new(name, from, Proto::Udp, to, count, expect)
    }

    fn new(name: &str, from: Place, proto: Proto, to: &str, count: usize, expect: Expect) -> Self {
        let to = to.parse().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        Self {
            name: name.to_string(),
            from,
            proto,
            to,
            count,
            expect,
        }
    }
}

/// Answered by any of `pods` (prefixes).
pub fn answered(pods: &[&str]) -> Expect {
    Expect::Answered {
        pods: pods.iter().map(|p| p.to_string()).collect(),
        all: false,
        source: None,
    }
}

/// Answered by `pods`, each at least once.
pub fn spread(pods: &[&str]) -> Expect {
    Expect::Answered {
        pods: pods.iter().map(|p| p.to_string()).collect(),
        all: true,
        source: None,
    }
}

/// Answered by `pods`, every answer seeing `source`.
pub fn answered_from(pods: &[&str], source: &str) -> Expect {
    Expect::Answered {
        pods: pods.iter().map(|p| p.to_string()).collect(),
        all: false,
        source: source.parse().ok(),
    }
}

/// All answers from one of `pods`, always the same one.
pub fn sticky(pods: &[&str]) -> Expect {
    Expect::Sticky {
        pods: pods.iter().map(|p| p.to_string()).collect(),
    }
}

/// The outcome of a check.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The check.
    pub check: Check,
    /// What the probes saw.
    pub tally: ProbeTally,
    /// `None` when it passed, else why not.
    pub failure: Option<String>,
}

impl Outcome {
    /// Passed.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

pub(crate) fn matches(pod: &str, wanted: &[String]) -> bool {
    wanted.iter().any(|w| pod.starts_with(w.as_str()))
}

/// Judges a tally against an expectation.
pub fn judge(expect: &Expect, count: usize, tally: &ProbeTally) -> Option<String> {
    let answered: usize = tally.answered.values().sum();
    let others = || -> String {
        format!(
            "answered {:?}, refused {}, timed out {}, errors {}",
            tally.answered, tally.refused, tally.timed_out, tally.errors
        )
    };
    match expect {
        Expect::Answered { pods, all, source } => {
            if answered != count {
                return Some(format!("not every probe was answered: {}", others()));
            }
            if let Some(pod) = tally.answered.keys().find(|p| !matches(p, pods)) {
                return Some(format!("{pod} answered, want one of {pods:?}"));
            }
            if *all
                && let Some(missing) = pods
                    .iter()
                    .find(|w| !tally.answered.keys().any(|p| p.starts_with(w.as_str())))
            {
                return Some(format!("{missing} never answered: {:?}", tally.answered));
            }
            if let Some(source) = source
                && tally.seen_sources.keys().any(|s| s != source)
            {
                return Some(format!(
                    "backends saw sources {:?}, want only {source}",
                    tally.seen_sources
                ));
            }
            None
        }
        Expect::Sticky { pods } => {
            if answered != count || tally.answered.len() != 1 {
                return Some(format!("want every probe answered by one pod: {}", others()));
            }
            tally
                .answered
                .keys()
                .find(|p| !matches(p, pods))
                .map(|pod| format!("{pod} answered, want one of {pods:?}"))
        }
        Expect::Refused => {
            (tally.refused != count).then(|| format!("want every probe refused: {}", others()))
        }
        Expect::Dropped => {
            (tally.timed_out != count).then(|| format!("want every probe dropped (timed out): {}", others()))
        }
    }
}

/// Runs a check. DROP expectations use a short timeout; others a generous one.
pub fn run(lab: &Lab, check: &Check) -> Result<Outcome> {
    let timeout = match check.expect {
        Expect::Dropped => Duration::from_millis(700),
        _ => Duration::from_secs(3),
    };
    let tally = lab.probe_many(&check.from, check.proto, check.to, check.count, timeout)?;
    let failure = judge(&check.expect, check.count, &tally);
    Ok(Outcome {
        check: check.clone(),
        tally,
        failure,
    })
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.passed() { "PASS" } else { "FAIL" };
        let seen = match &self.check.expect {
            Expect::Refused => "refused (connection refused at once)".to_string(),
            Expect::Dropped => "dropped (no answer)".to_string(),
            _ => {
                let pods: Vec<String> = self
                    .tally
                    .answered
                    .iter()
                    .map(|(p, n)| format!("{p}×{n}"))
                    .collect();
                let sources: Vec<String> = self.tally.seen_sources.keys().map(ToString::to_string).collect();
                format!("{} (backend saw {})", pods.join(" "), sources.join(", "))
            }
        };
        let proto = match self.check.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        write!(
            f,
            "{mark}  {:<58} {proto} {} from {}: {seen}",
            self.check.name, self.check.to, self.check.from
        )?;
        if let Some(why) = &self.failure {
            write!(f, "\n      {why}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn tally(pods: &[(&str, usize)], source: &str) -> ProbeTally {
        let answered: BTreeMap<String, usize> = pods.iter().map(|(p, n)| (p.to_string(), *n)).collect();
        let total = answered.values().sum();
        ProbeTally {
            answered,
            seen_sources: BTreeMap::from([(source.parse().unwrap(), total)]),
            ..ProbeTally::default()
        }
    }

    #[test]
    fn judging() {
        let t = tally(&[("web-1", 3), ("web-2", 2)], "10.0.0.1");
        assert_eq!(judge(&answered(&["web"]), 5, &t), None);
        assert!(judge(&answered(&["web-1"]), 5, &t).is_some());
        assert_eq!(judge(&spread(&["web-1", "web-2"]), 5, &t), None);
        assert!(judge(&spread(&["web-1", "web-3"]), 5, &t).is_some());
        assert!(
            judge(&answered(&["web"]), 6, &t).is_some(),
            "a missing answer fails"
        );
        assert!(judge(&answered_from(&["web"], "10.0.0.2"), 5, &t).is_some());
        assert!(judge(&sticky(&["web"]), 5, &t).is_some());
        assert_eq!(
            judge(&sticky(&["web"]), 3, &tally(&[("web-1", 3)], "10.0.0.1")),
            None
        );
        let refused = ProbeTally {
            refused: 2,
            ..ProbeTally::default()
        };
        assert_eq!(judge(&Expect::Refused, 2, &refused), None);
        assert!(judge(&Expect::Dropped, 2, &refused).is_some());
    }
}
