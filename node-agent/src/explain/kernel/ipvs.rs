//! `explain --kernel` on the IPVS backend: the virtual server for the packet's frontend and its real
//! servers as the kernel holds them, against the plan's; the outcome becomes the kernel's weights.
//!
//! ```text
//! kernel (Service, [Destination]) ─┬─► scheduler, persistence, real servers and weights ─► drift
//! render(plan).virtuals[key] ──────┘   kernel's real servers by weight ─► the outcome
//! ```

use crate::explain::words::{Candidate, Explanation, Outcome};

/// `--kernel` with the IPVS backend: the virtual server for this packet's frontend as the kernel holds
/// it (`kernel`: the service and its real servers) against the one the plan renders (`planned`). The
/// outcome becomes the kernel's real servers with their weights; without a virtual server nothing of
/// IPVS takes the packet.
pub fn compare_kernel(
    explanation: &mut Explanation,
    planned: Option<&crate::ipvs::render::VirtualServer>,
    kernel: Option<(&crate::ipvs::kernel::Service, &[crate::ipvs::kernel::Destination])>,
) {
    let drift = drift(planned, kernel);
    if planned.is_some() && kernel.is_none() {
        explanation.outcome = Outcome::NotAService;
    }
    if let Some((_, reals)) = kernel {
        let total: u32 = reals.iter().map(|d| d.weight).sum();
        let endpoints: Vec<Candidate> = reals
            .iter()
            .filter(|d| d.weight > 0)
            .map(|d| Candidate {
                endpoint: d.real.to_string(),
                probability: f64::from(d.weight) / f64::from(total.max(1)),
                weight: u16::try_from(d.weight).ok(),
                masquerade: matches!(&explanation.outcome, Outcome::Forwarded { endpoints }
                    if endpoints.iter().all(|c| c.masquerade)),
                connections: None,
            })
            .collect();
        if !endpoints.is_empty() {
            explanation.outcome = Outcome::Forwarded { endpoints };
        }
    }
    explanation.drift = Some(drift);
}

/// Where the kernel's virtual server for a frontend (`kernel`: the service and its real servers)
/// differs from the one the plan renders (`planned`): its presence, scheduler, persistence, real servers
/// and weights (a real server at weight 0 that the plan no longer has is draining, not drift).
pub fn drift(
    planned: Option<&crate::ipvs::render::VirtualServer>,
    kernel: Option<(&crate::ipvs::kernel::Service, &[crate::ipvs::kernel::Destination])>,
) -> Vec<String> {
    let mut drift = Vec::new();
    match (planned, kernel) {
        (None, None) => {}
        (Some(_), None) => drift.push("the kernel has no virtual server for this frontend".to_string()),
        (None, Some(_)) => drift.push("the kernel has a virtual server the plan does not".to_string()),
        (Some(plan), Some((service, _))) => {
            if plan.scheduler != service.scheduler {
                drift.push(format!(
                    "scheduler: kernel {}, plan {}",
                    service.scheduler, plan.scheduler
                ));
            }
            if plan.persistence != service.persistence() {
                drift.push(format!(
                    "persistence: kernel {:?}, plan {:?}",
                    service.persistence(),
                    plan.persistence
                ));
            }
        }
    }
    if let (Some(plan), Some((_, reals))) = (planned, kernel) {
        for (real, weight) in &plan.reals {
            match reals.iter().find(|d| d.real == *real) {
                None => drift.push(format!(
                    "the kernel lacks the real server {real} (weight {weight})"
                )),
                Some(d) if d.weight != *weight => drift.push(format!(
                    "real server {real}: kernel weight {}, plan {weight}",
                    d.weight
                )),
                Some(_) => {}
            }
        }
        for d in reals
            .iter()
            .filter(|d| !plan.reals.contains_key(&d.real) && d.weight > 0)
        {
            drift.push(format!(
                "the kernel has an extra real server {} (weight {})",
                d.real, d.weight
            ));
        }
    }
    drift
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::Protocol;

    #[test]
    fn ipvs_drift_names_the_scheduler_weights_and_real_servers_and_the_outcome_is_the_kernels() {
        use crate::ipvs::kernel::{Destination as Real, RealKey, Service, VirtualKey};
        use crate::ipvs::render::VirtualServer;
        let real = |ip: &str| RealKey {
            addr: ip.parse().unwrap(),
            port: 8080,
        };
        let key = VirtualKey {
            addr: "10.96.0.11".parse().unwrap(),
            protocol: Protocol::TCP,
            port: 80,
        };
        let planned = VirtualServer {
            entry: 0,
            scheduler: "wrr".into(),
            persistence: None,
            reals: [(real("10.244.0.2"), 3), (real("10.244.0.3"), 1)].into(),
            listed: None,
        };
        let fresh = || Explanation {
            node: "n".into(),
            backend: "ipvs".into(),
            service: Some("default/b:http".into()),
            steps: Vec::new(),
            outcome: Outcome::Rejected,
            drift: None,
        };
        let service = Service::new(key, "wrr", None);
        let agreeing = [Real::new(real("10.244.0.2"), 3), Real::new(real("10.244.0.3"), 1)];
        let mut explanation = fresh();
        compare_kernel(&mut explanation, Some(&planned), Some((&service, &agreeing)));
        assert_eq!(explanation.drift, Some(vec![]));
        let Outcome::Forwarded { endpoints } = &explanation.outcome else {
            panic!("{explanation:?}")
        };
        assert_eq!(endpoints[0].probability, 0.75);

        let rr = Service::new(key, "rr", None);
        let edited = [Real::new(real("10.244.0.2"), 1), Real::new(real("10.244.0.9"), 1)];
        let mut explanation = fresh();
        compare_kernel(&mut explanation, Some(&planned), Some((&rr, &edited)));
        assert_eq!(
            explanation.drift.unwrap(),
            [
                "scheduler: kernel rr, plan wrr",
                "real server 10.244.0.2:8080: kernel weight 1, plan 3",
                "the kernel lacks the real server 10.244.0.3:8080 (weight 1)",
                "the kernel has an extra real server 10.244.0.9:8080 (weight 1)",
            ]
        );
        let mut explanation = fresh();
        compare_kernel(&mut explanation, Some(&planned), None);
        assert_eq!(explanation.outcome, Outcome::NotAService);
    }
}
