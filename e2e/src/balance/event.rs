//! What the balancer tells: one JSON object per line on its stdout, and the reading of that log. Pure.
//!
//! ```text
//! balancer ─► {"event":"ready","at_ms":…}                       listening, every node checked once
//!          ─► {"event":"health","node":…,"healthy":false,"answer":"HTTP 503",…}   a node's health changed
//!          ─► {"event":"picked","id":7,"client":…,"frontend":…,"node":…,…}     a new connection's node
//!          ─► {"event":"failed","id":7,"error":…}                  no node, or the node did not accept
//!          ─► {"event":"closed","id":7,"to_node":…,"to_client":…}   a connection ended (bytes each way)
//! stdout log ─► BalancerLog::parse ─► health_of(node), picks_to(node), open_to(node), node_of(client)
//! ```
//!
//! Times are milliseconds since the Unix epoch on the machine's clock, so a test compares them with
//! the moments it wrote a plan or saw an answer ([`epoch_ms`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};

/// One line of the balancer's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Listening on every frontend, every node checked once.
    Ready {
        /// When.
        at_ms: u64,
    },
    /// A node's health changed (its first check counts as a change).
    Health {
        /// When the check that saw it was answered.
        at_ms: u64,
        /// The node.
        node: Ipv4Addr,
        /// Whether it now gets new connections.
        healthy: bool,
        /// What the check got (`HTTP 503`, or why it got nothing).
        answer: String,
    },
    /// A new connection and the node it goes to.
    Picked {
        /// When it was accepted.
        at_ms: u64,
        /// The connection's number.
        id: u64,
        /// The client's address as the balancer saw it.
        client: SocketAddr,
        /// The balancer's address it came in on.
        frontend: SocketAddr,
        /// The node it is forwarded to (at the frontend's NodePort).
        node: Ipv4Addr,
    },
    /// A new connection could not be forwarded (no healthy node, or the node did not accept it); the
    /// client's connection is closed unanswered.
    Failed {
        /// When.
        at_ms: u64,
        /// The connection's number.
        id: u64,
        /// The client's address.
        client: SocketAddr,
        /// Why.
        error: String,
    },
    /// A forwarded connection ended.
    Closed {
        /// When.
        at_ms: u64,
        /// The connection's number.
        id: u64,
        /// Bytes the client sent to the node.
        to_node: u64,
        /// Bytes the node sent to the client.
        to_client: u64,
        /// What broke it, if it did not end with both sides closing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

impl Event {
    /// When it happened (ms since the Unix epoch).
    pub fn at_ms(&self) -> u64 {
        match self {
            Event::Ready { at_ms }
            | Event::Health { at_ms, .. }
            | Event::Picked { at_ms, .. }
            | Event::Failed { at_ms, .. }
            | Event::Closed { at_ms, .. } => *at_ms,
        }
    }

    /// The JSON line.
    pub fn line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"unprintable\":\"{error}\"}}"))
    }
}

/// `at` in milliseconds since the Unix epoch (0 before it).
pub fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A health change of one node: when, and to what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// Healthy from then on.
    pub healthy: bool,
}

/// A connection's node: when it was picked, and where it went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// The connection's number.
    pub id: u64,
    /// The client's address.
    pub client: SocketAddr,
    /// The node.
    pub node: Ipv4Addr,
}

/// The balancer's log, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BalancerLog {
    /// Every event, in the order written.
    pub events: Vec<Event>,
}

impl BalancerLog {
    /// Reads the log's text; a line that is not an event is an error naming it (a last line still
    /// being written is left for the next read).
    pub fn parse(text: &str) -> Result<BalancerLog> {
        let complete = match text.rfind('\n') {
            Some(end) => &text[..end],
            None => "",
        };
        let mut events = Vec::new();
        for (index, line) in complete.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let event = serde_json::from_str(line).map_err(|error| LabError::BalancerLog {
                line: index + 1,
                reason: format!("{error}: {line}"),
            })?;
            events.push(event);
        }
        Ok(BalancerLog { events })
    }

    /// The health changes of `node`, in order.
    pub fn health_of(&self, node: Ipv4Addr) -> Vec<Transition> {
        self.events
            .iter()
            .filter_map(|event| match event {
                Event::Health {
                    at_ms,
                    node: seen,
                    healthy,
                    ..
                } if *seen == node => Some(Transition {
                    at_ms: *at_ms,
                    healthy: *healthy,
                }),
                _ => None,
            })
            .collect()
    }

    /// Every pick, in order.
    pub fn picks(&self) -> Vec<Pick> {
        self.events
            .iter()
            .filter_map(|event| match event {
                Event::Picked {
                    at_ms,
                    id,
                    client,
                    node,
                    ..
                } => Some(Pick {
                    at_ms: *at_ms,
                    id: *id,
                    client: *client,
                    node: *node,
                }),
                _ => None,
            })
            .collect()
    }

    /// The connections sent to `node`, in order.
    pub fn picks_to(&self, node: Ipv4Addr) -> Vec<Pick> {
        self.picks().into_iter().filter(|p| p.node == node).collect()
    }

    /// The connections sent to `node` that have not ended yet (no `closed` or `failed` event).
    pub fn open_to(&self, node: Ipv4Addr) -> Vec<Pick> {
        let ended: std::collections::HashSet<u64> = self
            .events
            .iter()
            .filter_map(|event| match event {
                Event::Closed { id, .. } | Event::Failed { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        self.picks_to(node)
            .into_iter()
            .filter(|p| !ended.contains(&p.id))
            .collect()
    }

    /// The node the connection from `client` went to (its last one, should the port be reused).
    pub fn node_of(&self, client: SocketAddr) -> Option<Ipv4Addr> {
        self.picks()
            .into_iter()
            .rev()
            .find(|p| p.client == client)
            .map(|p| p.node)
    }

    /// Connections that could not be forwarded.
    pub fn failures(&self) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|event| matches!(event, Event::Failed { .. }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_round_trips_and_answers_who_went_where() {
        let b = Ipv4Addr::new(192, 168, 10, 12);
        let c = Ipv4Addr::new(192, 168, 10, 13);
        let client: SocketAddr = "192.168.10.200:40000".parse().unwrap();
        let frontend: SocketAddr = "192.168.10.250:80".parse().unwrap();
        let events = [
            Event::Ready { at_ms: 1 },
            Event::Picked {
                at_ms: 2,
                id: 1,
                client,
                frontend,
                node: b,
            },
            Event::Health {
                at_ms: 3,
                node: b,
                healthy: false,
                answer: "HTTP 503".into(),
            },
            Event::Picked {
                at_ms: 4,
                id: 2,
                client: "192.168.10.200:40001".parse().unwrap(),
                frontend,
                node: c,
            },
            Event::Failed {
                at_ms: 5,
                id: 3,
                client,
                error: "no healthy node".into(),
            },
            Event::Closed {
                at_ms: 6,
                id: 1,
                to_node: 10,
                to_client: 20,
                error: None,
            },
        ];
        let mut text: String = events.iter().map(|e| format!("{}\n", e.line())).collect();
        assert!(text.starts_with("{\"event\":\"ready\",\"at_ms\":1}\n"), "{text}");
        text.push_str("{\"event\":\"pick"); // a line still being written
        let log = BalancerLog::parse(&text).unwrap();
        assert_eq!(log.events, events);
        assert_eq!(
            log.health_of(b),
            [Transition {
                at_ms: 3,
                healthy: false
            }]
        );
        assert_eq!(log.picks_to(b).len(), 1);
        assert!(log.open_to(b).is_empty(), "connection 1 closed");
        assert_eq!(log.open_to(c).len(), 1, "connection 2 is open");
        assert_eq!(log.node_of(client), Some(b));
        assert_eq!(log.node_of("10.0.0.1:1".parse().unwrap()), None);
        assert_eq!(log.failures().len(), 1);
        assert_eq!(events[3].at_ms(), 4);

        let error = BalancerLog::parse("{\"event\":\"ready\",\"at_ms\":1}\nnonsense\n").unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
    }
}
