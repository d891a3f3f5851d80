//! Which node gets the next new connection: health answers in, round-robin picks out. Pure.
//!
//! ```text
//! health check of node N ─► Answer { Status(code) | Unreachable(why) } ─► Pool::checked(N, answer, at)
//!     healthy = the last answer was 200 ─► changed? ─► Event::Health (the first answer counts as a change)
//! new connection ─► Pool::pick() ─► the next healthy node after the last one picked, or None
//! ```
//!
//! A node is healthy while its last check answered 200, as a cloud load balancer with a threshold of
//! one check reads kube-proxy's `/healthz`. With no healthy node a new connection gets none: real
//! cloud load balancers fail open instead, but the lab wants to see such a moment as failed
//! connections rather than hide it.

use std::net::Ipv4Addr;

use super::event::Event;

/// What one health check got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP answer with this status code.
    Status(u16),
    /// No HTTP answer (refused, timed out, garbled), and why.
    Unreachable(String),
}

impl Answer {
    /// Only 200 is healthy (kube-proxy answers 503 while the node leaves or its rules are stale).
    pub fn is_healthy(&self) -> bool {
        *self == Answer::Status(200)
    }

    /// `HTTP 503`, or the reason it could not be checked.
    pub fn describe(&self) -> String {
        match self {
            Answer::Status(code) => format!("HTTP {code}"),
            Answer::Unreachable(why) => why.clone(),
        }
    }
}

#[derive(Clone, Debug)]
struct Member {
    node: Ipv4Addr,
    /// `None` until its first check.
    healthy: Option<bool>,
}

/// The nodes behind the balancer and what their last checks said.
#[derive(Clone, Debug)]
pub struct Pool {
    members: Vec<Member>,
    /// Where the round robin looks first.
    next: usize,
}

impl Pool {
    /// `nodes`, none checked yet (so none healthy).
    pub fn new(nodes: &[Ipv4Addr]) -> Self {
        Pool {
            members: nodes.iter().map(|&node| Member { node, healthy: None }).collect(),
            next: 0,
        }
    }

    /// Records a check of `node` answered at `at_ms`; the event when its health changed.
    pub fn checked(&mut self, node: Ipv4Addr, answer: &Answer, at_ms: u64) -> Option<Event> {
        let member = self.members.iter_mut().find(|m| m.node == node)?;
        let healthy = answer.is_healthy();
        if member.healthy == Some(healthy) {
            return None;
        }
        member.healthy = Some(healthy);
        Some(Event::Health {
            at_ms,
            node,
            healthy,
            answer: answer.describe(),
        })
    }

    /// The node for a new connection: the first healthy one after the last pick, in the nodes' order.
    pub fn pick(&mut self) -> Option<Ipv4Addr> {
        let count = self.members.len();
        let found = (0..count)
            .map(|offset| (self.next + offset) % count)
            .find(|&index| self.members[index].healthy == Some(true))?;
        self.next = (found + 1) % count;
        Some(self.members[found].node)
    }

    /// The nodes whose last check answered 200.
    pub fn healthy(&self) -> Vec<Ipv4Addr> {
        self.members
            .iter()
            .filter(|m| m.healthy == Some(true))
            .map(|m| m.node)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> [Ipv4Addr; 3] {
        [
            Ipv4Addr::new(192, 168, 10, 11),
            Ipv4Addr::new(192, 168, 10, 12),
            Ipv4Addr::new(192, 168, 10, 13),
        ]
    }

    #[test]
    fn new_connections_go_round_robin_over_the_nodes_whose_last_check_answered_200() {
        let [a, b, c] = nodes();
        let mut pool = Pool::new(&nodes());
        assert_eq!(pool.pick(), None, "nothing is healthy before the first checks");
        for node in nodes() {
            assert!(pool.checked(node, &Answer::Status(200), 1).is_some());
        }
        let picks: Vec<_> = (0..6).map(|_| pool.pick().unwrap()).collect();
        assert_eq!(picks, [a, b, c, a, b, c]);

        // b fails its check: skipped from the next pick on; the order of the others goes on.
        let event = pool.checked(b, &Answer::Status(503), 2);
        assert_eq!(
            event,
            Some(Event::Health {
                at_ms: 2,
                node: b,
                healthy: false,
                answer: "HTTP 503".into()
            })
        );
        assert_eq!(
            pool.checked(b, &Answer::Status(503), 3),
            None,
            "no change, no event"
        );
        let picks: Vec<_> = (0..4).map(|_| pool.pick().unwrap()).collect();
        assert_eq!(picks, [a, c, a, c]);
        assert_eq!(pool.healthy(), [a, c]);

        // Unreachable is unhealthy too; and b back serves again.
        pool.checked(a, &Answer::Unreachable("connection refused".into()), 4);
        assert!(pool.checked(b, &Answer::Status(200), 4).is_some());
        let picks: Vec<_> = (0..4).map(|_| pool.pick().unwrap()).collect();
        assert_eq!(picks, [b, c, b, c]);

        for node in nodes() {
            pool.checked(node, &Answer::Status(500), 5);
        }
        assert_eq!(
            pool.pick(),
            None,
            "no healthy node: no pick (the lab does not fail open)"
        );
        assert_eq!(
            pool.checked(Ipv4Addr::new(10, 0, 0, 1), &Answer::Status(200), 6),
            None
        );
    }
}
