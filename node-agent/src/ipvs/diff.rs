//! What to change in the kernel for one virtual server (pure): desired state, the kernel's state and
//! the draining real servers ─► the operations, in the order to run them.
//!
//! ```text
//! desired VirtualServer? ─┐
//! kernel Service + dests? ┼─► reconcile() ─► [Op]   (add/update the service, add/re-weight real servers,
//! draining deadlines ─────┘        │                  weight 0 or delete the ones that went)
//!                                  └─► draining deadlines updated
//! ```
//!
//! Graceful removal follows kube-proxy's IPVS mode: a TCP real server that leaves the plan keeps its
//! connections — it gets weight 0, so it takes no new ones — and is deleted once it has no active
//! connection or its grace period is over, whichever comes first (re-checked on every sync and drift
//! check). UDP and SCTP real servers are deleted at once, as kube-proxy does (with
//! `expire_nodest_conn` their flows move on at the next packet). Unlike kube-proxy, a TCP real server
//! whose endpoint the Service no longer lists at all (removed, not terminating nor unready) is deleted
//! at once too: it cannot drain, and its clients would hang (issue 23); `keep-connections` Services
//! drain as before. A real server that comes back while draining gets its weight back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use switchyard_api::Protocol;

use super::kernel::{Destination, FWD_MASQUERADE, RealKey, Service, VirtualKey};
use super::render::VirtualServer;

/// One change to the kernel's IPVS table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Add the virtual service.
    AddService(Service),
    /// Change its scheduler or persistence.
    UpdateService(Service),
    /// Delete it (and its real servers).
    DeleteService,
    /// Add a real server.
    AddDest(Destination),
    /// Change a real server (its planned weight back, or 0 to drain it).
    UpdateDest(Destination),
    /// Delete a real server.
    DeleteDest(RealKey),
}

/// The kernel's state of one virtual server.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    /// The service.
    pub service: &'a Service,
    /// Its real servers.
    pub dests: &'a [Destination],
}

/// Real servers being drained, with the time they must be gone by.
pub type Draining = BTreeMap<RealKey, Instant>;

/// True when the kernel's service has the settings `desired` asks for.
fn same_service(service: &Service, want: &Service) -> bool {
    service.scheduler == want.scheduler
        && service.flags == want.flags
        && service.timeout == want.timeout
        && service.netmask == want.netmask
}

fn serving(dest: &Destination, weight: u32) -> bool {
    dest.weight == weight
        && dest.forward == FWD_MASQUERADE
        && dest.upper_threshold == 0
        && dest.lower_threshold == 0
}

/// The operations that make the kernel's `current` state of `key` what `desired` asks for.
pub fn reconcile(
    key: &VirtualKey,
    desired: Option<&VirtualServer>,
    current: Option<Current<'_>>,
    draining: &mut Draining,
    now: Instant,
    grace: Duration,
) -> Vec<Op> {
    let Some(desired) = desired else {
        draining.clear();
        return current.map(|_| vec![Op::DeleteService]).unwrap_or_default();
    };
    let want = Service::new(*key, &desired.scheduler, desired.persistence);
    let Some(current) = current else {
        draining.clear();
        let mut ops = vec![Op::AddService(want)];
        ops.extend(
            desired
                .reals
                .iter()
                .map(|(real, weight)| Op::AddDest(Destination::new(*real, *weight))),
        );
        return ops;
    };
    let mut ops = Vec::new();
    if !same_service(current.service, &want) {
        ops.push(Op::UpdateService(want));
    }
    for (real, weight) in &desired.reals {
        match current.dests.iter().find(|d| d.real == *real) {
            None => ops.push(Op::AddDest(Destination::new(*real, *weight))),
            Some(dest) if !serving(dest, *weight) => {
                ops.push(Op::UpdateDest(Destination::new(*real, *weight)))
            }
            Some(_) => {}
        }
        draining.remove(real);
    }
    for dest in current
        .dests
        .iter()
        .filter(|d| !desired.reals.contains_key(&d.real))
    {
        let gone = desired
            .listed
            .as_ref()
            .is_some_and(|listed| !listed.contains(&dest.real.addr));
        if key.protocol != Protocol::TCP || gone {
            draining.remove(&dest.real);
            ops.push(Op::DeleteDest(dest.real));
            continue;
        }
        let deadline = *draining.entry(dest.real).or_insert(now + grace);
        if dest.active_conns == 0 || now >= deadline {
            draining.remove(&dest.real);
            ops.push(Op::DeleteDest(dest.real));
        } else if dest.weight != 0 {
            ops.push(Op::UpdateDest(Destination::new(dest.real, 0)));
        }
    }
    // Deadlines of real servers the kernel no longer has are moot.
    draining.retain(|real, _| current.dests.iter().any(|d| d.real == *real));
    ops
}

#[cfg(test)]
mod tests {

    use super::*;

    fn key(protocol: Protocol) -> VirtualKey {
        VirtualKey {
            addr: "10.96.0.10".parse().unwrap(),
            protocol,
            port: 80,
        }
    }

    fn real(last: u8) -> RealKey {
        RealKey {
            addr: format!("10.244.1.{last}").parse().unwrap(),
            port: 8080,
        }
    }

    fn desired(reals: &[RealKey]) -> VirtualServer {
        VirtualServer {
            entry: 0,
            scheduler: "rr".into(),
            persistence: None,
            reals: reals.iter().map(|r| (*r, 1)).collect(),
            listed: None,
        }
    }

    fn dest(real: RealKey, weight: u32, active: u32) -> Destination {
        Destination {
            active_conns: active,
            ..Destination::new(real, weight)
        }
    }

    const GRACE: Duration = Duration::from_secs(30);

    #[test]
    fn a_new_virtual_server_is_added_with_its_real_servers() {
        let now = Instant::now();
        let ops = reconcile(
            &key(Protocol::TCP),
            Some(&desired(&[real(1), real(2)])),
            None,
            &mut Draining::new(),
            now,
            GRACE,
        );
        assert_eq!(ops.len(), 3);
        assert!(matches!(&ops[0], Op::AddService(s) if s.scheduler == "rr"));
        assert_eq!(ops[1], Op::AddDest(Destination::new(real(1), 1)));
    }

    #[test]
    fn only_differences_become_operations() {
        let now = Instant::now();
        let k = key(Protocol::TCP);
        let service = Service::new(k, "rr", None);
        let dests = [dest(real(1), 1, 0), dest(real(2), 5, 0)];
        let current = Current {
            service: &service,
            dests: &dests,
        };
        let mut want = desired(&[real(1), real(2), real(3)]);
        let ops = reconcile(&k, Some(&want), Some(current), &mut Draining::new(), now, GRACE);
        assert_eq!(
            ops,
            [
                Op::UpdateDest(Destination::new(real(2), 1)),
                Op::AddDest(Destination::new(real(3), 1))
            ]
        );
        want.persistence = Some(10800);
        want.reals = [(real(1), 1), (real(2), 1)].into();
        let dests = [dest(real(1), 1, 0), dest(real(2), 1, 0)];
        let current = Current {
            service: &service,
            dests: &dests,
        };
        let ops = reconcile(&k, Some(&want), Some(current), &mut Draining::new(), now, GRACE);
        assert!(matches!(&ops[..], [Op::UpdateService(s)] if s.timeout == 10800 && s.flags == 1));
        assert_eq!(
            reconcile(&k, None, Some(current), &mut Draining::new(), now, GRACE),
            [Op::DeleteService]
        );
        assert!(reconcile(&k, None, None, &mut Draining::new(), now, GRACE).is_empty());
    }

    #[test]
    fn planned_weights_are_programmed_and_restored() {
        let now = Instant::now();
        let k = key(Protocol::TCP);
        let mut want = desired(&[real(1), real(2)]);
        want.reals.insert(real(1), 3);
        let ops = reconcile(&k, Some(&want), None, &mut Draining::new(), now, GRACE);
        assert_eq!(ops[1], Op::AddDest(Destination::new(real(1), 3)));
        assert_eq!(ops[2], Op::AddDest(Destination::new(real(2), 1)));
        let service = Service::new(k, "rr", None);
        // Someone set real(1) back to 1: the planned 3 is restored, real(2) is left alone.
        let dests = [dest(real(1), 1, 0), dest(real(2), 1, 0)];
        let current = Current {
            service: &service,
            dests: &dests,
        };
        let ops = reconcile(&k, Some(&want), Some(current), &mut Draining::new(), now, GRACE);
        assert_eq!(ops, [Op::UpdateDest(Destination::new(real(1), 3))]);
    }

    #[test]
    fn tcp_real_servers_drain_until_idle_or_the_grace_period_ends() {
        let start = Instant::now();
        let k = key(Protocol::TCP);
        let service = Service::new(k, "rr", None);
        let want = desired(&[real(1)]);
        let mut draining = Draining::new();
        let run = |dests: &[Destination], draining: &mut Draining, at: Instant| {
            reconcile(
                &k,
                Some(&want),
                Some(Current {
                    service: &service,
                    dests,
                }),
                draining,
                at,
                GRACE,
            )
        };
        // Busy: weight 0, kept.
        let ops = run(&[dest(real(1), 1, 0), dest(real(2), 1, 3)], &mut draining, start);
        assert_eq!(ops, [Op::UpdateDest(Destination::new(real(2), 0))]);
        assert_eq!(draining.get(&real(2)), Some(&(start + GRACE)));
        // Still busy before the deadline: nothing to do.
        let later = start + Duration::from_secs(10);
        assert!(run(&[dest(real(1), 1, 0), dest(real(2), 0, 1)], &mut draining, later).is_empty());
        // Idle: deleted.
        let ops = run(&[dest(real(1), 1, 0), dest(real(2), 0, 0)], &mut draining, later);
        assert_eq!(ops, [Op::DeleteDest(real(2))]);
        assert!(draining.is_empty());
        // Busy past the deadline: deleted anyway.
        let mut draining = Draining::from([(real(2), start + GRACE)]);
        let ops = run(&[dest(real(2), 0, 7)], &mut draining, start + GRACE);
        assert_eq!(
            ops,
            [Op::AddDest(Destination::new(real(1), 1)), Op::DeleteDest(real(2))]
        );
        // Idle at once: deleted without draining.
        let ops = run(
            &[dest(real(1), 1, 0), dest(real(3), 1, 0)],
            &mut Draining::new(),
            start,
        );
        assert_eq!(ops, [Op::DeleteDest(real(3))]);
    }

    #[test]
    fn a_busy_tcp_real_server_drains_only_while_its_service_still_lists_its_address() {
        let now = Instant::now();
        let k = key(Protocol::TCP);
        let service = Service::new(k, "rr", None);
        // real(2) busy and no longer a real server; real(3) busy and gone from the Service.
        let dests = [dest(real(1), 1, 0), dest(real(2), 1, 4), dest(real(3), 1, 4)];
        let current = Current {
            service: &service,
            dests: &dests,
        };
        let mut want = desired(&[real(1)]);
        want.listed = Some(std::sync::Arc::new(
            [real(1).addr, real(2).addr].into_iter().collect(),
        ));
        let mut draining = Draining::new();
        let ops = reconcile(&k, Some(&want), Some(current), &mut draining, now, GRACE);
        assert_eq!(
            ops,
            [
                Op::UpdateDest(Destination::new(real(2), 0)),
                Op::DeleteDest(real(3))
            ]
        );
        assert_eq!(draining.keys().collect::<Vec<_>>(), [&real(2)]);
        // keep-connections (no list): both drain.
        want.listed = None;
        let ops = reconcile(&k, Some(&want), Some(current), &mut Draining::new(), now, GRACE);
        assert_eq!(
            ops,
            [
                Op::UpdateDest(Destination::new(real(2), 0)),
                Op::UpdateDest(Destination::new(real(3), 0))
            ]
        );
    }

    #[test]
    fn a_draining_server_that_comes_back_serves_again_and_udp_never_drains() {
        let now = Instant::now();
        let k = key(Protocol::TCP);
        let service = Service::new(k, "rr", None);
        let dests = [dest(real(1), 0, 4)];
        let mut draining = Draining::from([(real(1), now + GRACE)]);
        let ops = reconcile(
            &k,
            Some(&desired(&[real(1)])),
            Some(Current {
                service: &service,
                dests: &dests,
            }),
            &mut draining,
            now,
            GRACE,
        );
        assert_eq!(ops, [Op::UpdateDest(Destination::new(real(1), 1))]);
        assert!(draining.is_empty());

        let udp = key(Protocol::UDP);
        let service = Service::new(udp, "rr", None);
        let dests = [dest(real(2), 1, 9)];
        let ops = reconcile(
            &udp,
            Some(&desired(&[])),
            Some(Current {
                service: &service,
                dests: &dests,
            }),
            &mut Draining::new(),
            now,
            GRACE,
        );
        assert_eq!(ops, [Op::DeleteDest(real(2))]);
    }
}
