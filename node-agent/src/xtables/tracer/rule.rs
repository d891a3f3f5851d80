//! One rule of the model: its arguments parsed into matches and a target, exactly the matches and
//! targets the render emits (and iptables-save's spelling of them); anything else is refused.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

#[derive(Debug, Clone)]
pub(super) struct Rule {
    /// The text after `-A CHAIN `.
    pub(super) raw: String,
    pub(super) matches: Vec<Match>,
    pub(super) target: Target,
}

#[derive(Debug, Clone)]
pub(super) enum Match {
    Source {
        negated: bool,
        net: IpNet,
    },
    /// `-i NAME` (`NAME+`: a prefix), the local-traffic detector's interface modes.
    InInterface {
        negated: bool,
        name: String,
    },
    Dest {
        negated: bool,
        net: IpNet,
    },
    Protocol {
        negated: bool,
        name: String,
    },
    DestPort {
        negated: bool,
        port: u16,
    },
    SrcLocal {
        negated: bool,
    },
    DstLocal {
        negated: bool,
    },
    Probability(f64),
    /// `-m recent --rcheck`: a first packet has no entry yet.
    RecentCheck,
    Mark {
        negated: bool,
        value: u32,
        mask: u32,
    },
    CtState {
        negated: bool,
        states: Vec<String>,
    },
    /// `-m set --match-set NAME FLAGS` (the IPVS glue): the model holds no ipsets, so the packet is a
    /// member of none; the rule is kept for restores, saves and comparisons.
    Set {
        negated: bool,
        name: String,
        flags: String,
    },
}

#[derive(Debug, Clone)]
pub(super) enum Target {
    /// No `-j`: the rule only counts.
    None,
    Chain(String),
    Accept,
    Drop,
    Reject,
    Return,
    Dnat(SocketAddr),
    Masquerade,
    MarkOr(u32),
    MarkXor(u32),
}

impl Rule {
    /// The normal form [`Tracer::chain_rules`] compares: the matches (probabilities to six places, as
    /// iptables-save prints them with more digits than the render), sorted, then the target.
    pub(super) fn meaning(&self) -> String {
        let mut parts: Vec<String> = self
            .matches
            .iter()
            .map(|m| match m {
                Match::Probability(p) => format!("Probability({p:.6})"),
                Match::Set { negated, name, flags } => {
                    format!("Set({}{name} {flags})", if *negated { "! " } else { "" })
                }
                other => format!("{other:?}"),
            })
            .collect();
        parts.sort();
        parts.push(format!("{:?}", self.target));
        parts.join(" ")
    }

    pub(super) fn probability(&self) -> Option<f64> {
        self.matches.iter().find_map(|m| match m {
            Match::Probability(p) => Some(*p),
            _ => None,
        })
    }

    /// Parses the arguments of one rule; `raw` is kept for dumps and traces.
    pub(super) fn parse(tokens: &[String], raw: String) -> Result<Self, String> {
        let mut matches = Vec::new();
        let mut target = Target::None;
        let mut modules: Vec<&str> = Vec::new();
        let mut negated = false;
        let mut iter = tokens.iter().map(String::as_str);
        while let Some(token) = iter.next() {
            let mut value = |what: &str| iter.next().ok_or_else(|| format!("{what} needs a value"));
            let need = |module: &[&str], option: &str| {
                if module.iter().any(|m| modules.contains(m)) {
                    Ok(())
                } else {
                    Err(format!("{option} without -m {}", module.join("|")))
                }
            };
            let negatable = matches!(
                token,
                "-s" | "-d" | "-i" | "-p" | "--dport" | "--src-type" | "--dst-type"
            ) || matches!(token, "--mark" | "--ctstate" | "--match-set");
            if negated && !negatable {
                return Err(format!("{token} cannot be negated"));
            }
            match token {
                "!" => {
                    negated = true;
                    continue;
                }
                "-m" => {
                    let module = value("-m")?;
                    let known = [
                        "comment",
                        "tcp",
                        "udp",
                        "sctp",
                        "addrtype",
                        "statistic",
                        "recent",
                        "mark",
                        "conntrack",
                        "set",
                    ];
                    if !known.contains(&module) {
                        return Err(format!("unsupported match module {module}"));
                    }
                    modules.push(module);
                }
                "--comment" => {
                    need(&["comment"], token)?;
                    value(token)?;
                }
                "-p" => matches.push(Match::Protocol {
                    negated,
                    name: value(token)?.to_string(),
                }),
                "-s" => matches.push(Match::Source {
                    negated,
                    net: parse_net(value(token)?)?,
                }),
                "-i" => matches.push(Match::InInterface {
                    negated,
                    name: value(token)?.to_string(),
                }),
                "-d" => matches.push(Match::Dest {
                    negated,
                    net: parse_net(value(token)?)?,
                }),
                "--dport" => {
                    need(&["tcp", "udp", "sctp"], token)?;
                    let port = value(token)?.parse().map_err(|_| "bad --dport".to_string())?;
                    matches.push(Match::DestPort { negated, port });
                }
                "--src-type" | "--dst-type" => {
                    need(&["addrtype"], token)?;
                    if value(token)? != "LOCAL" {
                        return Err(format!("{token} supports only LOCAL"));
                    }
                    matches.push(if token == "--src-type" {
                        Match::SrcLocal { negated }
                    } else {
                        Match::DstLocal { negated }
                    });
                }
                "--mode" => {
                    need(&["statistic"], token)?;
                    if value(token)? != "random" {
                        return Err("--mode supports only random".into());
                    }
                }
                "--probability" => {
                    need(&["statistic"], token)?;
                    let p: f64 = value(token)?
                        .parse()
                        .map_err(|_| "bad --probability".to_string())?;
                    if !(0.0..=1.0).contains(&p) {
                        return Err(format!("--probability {p} is not in 0..1"));
                    }
                    matches.push(Match::Probability(p));
                }
                "--name" | "--seconds" | "--mask" => {
                    need(&["recent"], token)?;
                    value(token)?;
                }
                // `--rsource` is the default iptables-save spells out.
                "--reap" | "--set" | "--rsource" => need(&["recent"], token)?,
                "--rcheck" => {
                    need(&["recent"], token)?;
                    matches.push(Match::RecentCheck);
                }
                "--mark" => {
                    need(&["mark"], token)?;
                    let (value, mask) = parse_mark(value(token)?)?;
                    matches.push(Match::Mark { negated, value, mask });
                }
                "--match-set" => {
                    need(&["set"], token)?;
                    let name = value(token)?.to_string();
                    let flags = value(token)?.to_string();
                    matches.push(Match::Set { negated, name, flags });
                }
                "--ctstate" => {
                    need(&["conntrack"], token)?;
                    let states = value(token)?.split(',').map(str::to_string).collect();
                    matches.push(Match::CtState { negated, states });
                }
                "-j" => {
                    target = match value(token)? {
                        "ACCEPT" => Target::Accept,
                        "DROP" => Target::Drop,
                        "REJECT" => Target::Reject,
                        "RETURN" => Target::Return,
                        "MASQUERADE" => Target::Masquerade,
                        // Completed by their options below.
                        "DNAT" => Target::Dnat(SocketAddr::from(([0, 0, 0, 0], 0))),
                        "MARK" => Target::MarkOr(0),
                        chain => Target::Chain(chain.to_string()),
                    };
                }
                "--to-destination" => {
                    let Target::Dnat(_) = target else {
                        return Err("--to-destination without DNAT".into());
                    };
                    let to = value(token)?;
                    target = Target::Dnat(to.parse().map_err(|_| format!("bad --to-destination {to}"))?);
                }
                "--or-mark" | "--xor-mark" => {
                    let Target::MarkOr(0) = target else {
                        return Err(format!("{token} without MARK"));
                    };
                    let bits = parse_hex(value(token)?)?;
                    target = if token == "--or-mark" {
                        Target::MarkOr(bits)
                    } else {
                        Target::MarkXor(bits)
                    };
                }
                // iptables-save's spelling of MARK: mark = (mark & !mask) ^ value. The render's
                // --or-mark V is V/V and --xor-mark V is V/0; nothing else is ours.
                "--set-xmark" => {
                    let Target::MarkOr(0) = target else {
                        return Err("--set-xmark without MARK".into());
                    };
                    target = match parse_mark(value(token)?)? {
                        (bits, mask) if bits == mask => Target::MarkOr(bits),
                        (bits, 0) => Target::MarkXor(bits),
                        (bits, mask) => return Err(format!("--set-xmark {bits:#x}/{mask:#x} is not ours")),
                    };
                }
                "--reject-with" => {
                    let Target::Reject = target else {
                        return Err("--reject-with without REJECT".into());
                    };
                    // The render's REJECT is the default, port unreachable, which iptables-save names.
                    let with = value(token)?;
                    if !with.ends_with("port-unreachable") {
                        return Err(format!("--reject-with {with} is not ours"));
                    }
                }
                "--random-fully" => {
                    let Target::Masquerade = target else {
                        return Err("--random-fully without MASQUERADE".into());
                    };
                }
                other => return Err(format!("unsupported option {other:?}")),
            }
            negated = false;
        }
        if negated {
            return Err("dangling !".into());
        }
        if let Target::Dnat(to) = &target
            && to.port() == 0
        {
            return Err("DNAT without --to-destination".into());
        }
        Ok(Self { raw, matches, target })
    }
}

fn parse_net(text: &str) -> Result<IpNet, String> {
    if text.contains('/') {
        text.parse::<IpNet>().map_err(|_| format!("bad CIDR {text}"))
    } else {
        text.parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| format!("bad address {text}"))
    }
}

fn parse_hex(text: &str) -> Result<u32, String> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .map_err(|_| format!("bad mark {text}"))
}

fn parse_mark(text: &str) -> Result<(u32, u32), String> {
    match text.split_once('/') {
        Some((value, mask)) => Ok((parse_hex(value)?, parse_hex(mask)?)),
        None => Ok((parse_hex(text)?, u32::MAX)),
    }
}
