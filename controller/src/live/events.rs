//! Service problems, objects the watches cannot decode and the steps of rollouts as Kubernetes Events,
//! deduplicated and rate-limited so that a broken Service — or ten thousand of them, or one rewritten
//! every second — cannot flood the API server.
//!
//! ```text
//! engine.problems()    ─(every second, leader only)─► EventGate::due(now) ─► publisher task ─► Recorder
//! engine.undecodable() ─(its own gate)──────────────►  │ new (object, reason): now          (events.k8s.io/v1:
//!                                                      │ still there: again after REPEAT     create, then patch
//!                                                      └ at most BURST at once, RATE per s   of the series)
//! rollout steps ─► a queue ─(their own gate: EventGate::take, no deduplication)─► publisher task
//! ```
//!
//! The gate is pure (the caller passes the time); the publisher is the only part that talks to the API
//! server, and a failed publish is counted and logged, never retried in a loop.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc;
use tokio::time::Instant;

use switchyard_api::tolerant::Undecodable;

use super::metrics::{Metrics, OutcomeLabel};
use crate::planner::{ServiceProblem, service_cidrs::CidrProblem};
use crate::rollout::RolloutEvent;

/// The reason of an Event about an object a watch cannot decode.
pub const UNDECODABLE: &str = "Undecodable";

/// Longest Event note the API server accepts (events.k8s.io/v1: 1 kB).
const MAX_NOTE: usize = 1024;

/// Something an Event is published about: which object, and why.
pub trait Notice {
    /// The object, as the logs name it.
    fn object(&self) -> String;
    /// The Event's reason.
    fn reason(&self) -> &'static str;
}

impl Notice for ServiceProblem {
    fn object(&self) -> String {
        self.service.clone()
    }

    fn reason(&self) -> &'static str {
        self.reason
    }
}

impl Notice for CidrProblem {
    fn object(&self) -> String {
        format!("ServiceCIDR {}", self.name)
    }

    fn reason(&self) -> &'static str {
        self.reason
    }
}

impl Notice for Undecodable {
    fn object(&self) -> String {
        format!("{} {}", self.kind, Undecodable::object(self))
    }

    fn reason(&self) -> &'static str {
        UNDECODABLE
    }
}

/// The same problem of the same Service is published again at most this often while it lasts (the
/// Recorder turns repeats into one Event's series), and not again this soon after it went and came back.
pub const REPEAT: Duration = Duration::from_secs(600);
/// Events published at once at most (a burst after a start or a bad rollout).
pub const BURST: u32 = 20;
/// Events per second at most after a burst.
pub const RATE_PER_SECOND: f64 = 0.5;

/// Which problems to publish now.
#[derive(Debug)]
pub struct EventGate {
    /// When each (object, reason) was last published.
    sent: HashMap<(String, &'static str), Instant>,
    tokens: f64,
    refilled: Instant,
}

impl EventGate {
    /// A gate with a full burst.
    pub fn new(now: Instant) -> Self {
        Self {
            sent: HashMap::new(),
            tokens: f64::from(BURST),
            refilled: now,
        }
    }

    /// Whether one Event may be published at `now` (it takes the token when so). For Events that are
    /// said once and never repeated (a rollout's steps), which need the rate limit but no deduplication.
    pub fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * RATE_PER_SECOND).min(f64::from(BURST));
        self.refilled = now;
    }

    /// The problems of `current` to publish at `now`; the others are deduplicated (published within
    /// [`REPEAT`]) or rate-limited (no token left: they come again on a later call). Returns how many
    /// were held back by the rate limit too.
    pub fn due<'a, T: Notice>(&mut self, now: Instant, current: &'a [T]) -> (Vec<&'a T>, usize) {
        self.refill(now);
        // Forget what has not been published for longer than REPEAT: it may be published again.
        self.sent
            .retain(|_, at| now.saturating_duration_since(*at) < REPEAT);
        let mut due = Vec::new();
        let mut limited = 0;
        for problem in current {
            let key = (problem.object(), problem.reason());
            if self.sent.contains_key(&key) {
                continue;
            }
            if self.tokens < 1.0 {
                limited += 1;
                continue;
            }
            self.tokens -= 1.0;
            self.sent.insert(key, now);
            due.push(problem);
        }
        (due, limited)
    }
}

/// What an Event is about, which decides the counter of its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum About {
    /// A Service problem (`service_problem_events`).
    ServiceProblem,
    /// An object a watch cannot decode (`undecodable_object_events`).
    Undecodable,
    /// A rollout's step or failure (`rollout_events`).
    Rollout,
    /// An ignored ServiceCIDR (`service_cidr_events`).
    ServiceCidr,
}

impl About {
    /// The counter of the outcomes of Events about this (metrics know no Events, so the map lives here).
    pub fn counter(self, metrics: &Metrics) -> &Family<OutcomeLabel, Counter> {
        match self {
            About::ServiceProblem => &metrics.service_events,
            About::Undecodable => &metrics.undecodable_events,
            About::Rollout => &metrics.rollout_events,
            About::ServiceCidr => &metrics.service_cidr_events,
        }
    }
}

/// One Event to publish.
#[derive(Debug, Clone)]
pub struct Pending {
    /// What it is about.
    pub about: About,
    /// A Warning (something failed or was refused); otherwise Normal.
    pub warning: bool,
    /// The object, as the logs name it.
    pub object: String,
    /// The Event's reason.
    pub reason: &'static str,
    /// What is wrong, in words.
    pub note: String,
    /// The object (apiVersion, kind, namespace, name, uid).
    pub regarding: ObjectReference,
    /// A second object it concerns (a rollout's Node). The Recorder folds Events of one reason on one
    /// object into a series unless this differs, so it keeps Events about different nodes apart.
    pub related: Option<ObjectReference>,
}

impl Pending {
    /// An Event about a Service problem.
    pub fn service_problem(problem: &ServiceProblem, regarding: ObjectReference) -> Self {
        Self {
            about: About::ServiceProblem,
            warning: true,
            object: problem.service.clone(),
            reason: problem.reason,
            note: problem.message.clone(),
            regarding,
            related: None,
        }
    }

    /// An Event about an ignored ServiceCIDR, on it (`None` for a problem of no one object).
    pub fn service_cidr(problem: &CidrProblem) -> Option<Self> {
        (!problem.name.is_empty()).then(|| Self {
            about: About::ServiceCidr,
            warning: true,
            object: Notice::object(problem),
            reason: problem.reason,
            note: problem.message.clone(),
            regarding: ObjectReference {
                api_version: Some("networking.k8s.io/v1".into()),
                kind: Some("ServiceCIDR".into()),
                name: Some(problem.name.clone()),
                uid: problem.uid.clone(),
                ..ObjectReference::default()
            },
            related: None,
        })
    }

    /// An Event about an object a watch cannot decode, on that object.
    pub fn undecodable(undecodable: &Undecodable) -> Self {
        let meta = &undecodable.metadata;
        let note = clip(format!(
            "switchyard-controller cannot read {}: {}; until it can, the last version it could read (if \
             any) is what it plans from",
            undecodable.path, undecodable.message
        ));
        Self {
            about: About::Undecodable,
            warning: true,
            object: Notice::object(undecodable),
            reason: UNDECODABLE,
            note,
            regarding: ObjectReference {
                api_version: Some(undecodable.api_version.clone()),
                kind: Some(undecodable.kind.clone()),
                namespace: meta.namespace.clone(),
                name: meta.name.clone(),
                uid: meta.uid.clone(),
                ..ObjectReference::default()
            },
            related: None,
        }
    }
}

impl Pending {
    /// An Event on a ForwardingRollout (`regarding` names it) about one of its steps.
    pub fn rollout(event: &RolloutEvent, regarding: ObjectReference) -> Self {
        Self {
            about: About::Rollout,
            warning: event.warning,
            object: format!("ForwardingRollout {}", regarding.name.as_deref().unwrap_or("?")),
            reason: event.reason,
            note: clip(event.note.clone()),
            regarding,
            related: event.node.as_ref().map(|node| ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                ..ObjectReference::default()
            }),
        }
    }
}

/// `note` cut to what the API server accepts ([`MAX_NOTE`] bytes, `...` marking the cut).
fn clip(mut note: String) -> String {
    if note.len() > MAX_NOTE {
        let mut end = MAX_NOTE - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

/// Publishes what it receives, one at a time, with kube's [`Recorder`] (a repeat of the same reason for
/// the same object within its cache time patches the first Event's series instead of creating one).
pub async fn publish(
    recorder: Recorder,
    mut queue: mpsc::Receiver<Pending>,
    metrics: std::sync::Arc<Metrics>,
) {
    while let Some(pending) = queue.recv().await {
        let event = Event {
            type_: if pending.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: pending.reason.to_string(),
            note: Some(pending.note),
            action: match pending.about {
                About::ServiceProblem => "Proxy",
                About::Undecodable => "Watch",
                About::Rollout => "Rollout",
                About::ServiceCidr => "Plan",
            }
            .to_string(),
            secondary: pending.related,
        };
        let outcome = match recorder.publish(&event, &pending.regarding).await {
            Ok(()) => "published",
            Err(error) => {
                tracing::warn!(object = %pending.object, reason = pending.reason, %error, "publishing an Event failed");
                "failed"
            }
        };
        pending
            .about
            .counter(&metrics)
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }
}

/// The Recorder of this controller (`reportingController: switchyard.io/controller`, the instance from
/// `POD_NAME` or the host name).
pub fn recorder(client: kube::Client) -> Recorder {
    let instance = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok());
    Recorder::new(
        client,
        Reporter {
            controller: "switchyard.io/controller".into(),
            instance,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::problems::reasons;

    fn problem(service: &str, reason: &'static str) -> ServiceProblem {
        ServiceProblem {
            service: service.into(),
            reason,
            message: "m".into(),
        }
    }

    #[test]
    fn a_problem_is_published_once_then_again_only_after_repeat() {
        let start = Instant::now();
        let mut gate = EventGate::new(start);
        let current = [problem("ns/a", reasons::NO_ENDPOINTS)];
        assert_eq!(gate.due(start, &current).0.len(), 1);
        for seconds in [1, 60, 599] {
            let (due, _) = gate.due(start + Duration::from_secs(seconds), &current);
            assert!(due.is_empty(), "published again after {seconds} s");
        }
        assert_eq!(gate.due(start + REPEAT, &current).0.len(), 1);
        // Another reason of the same Service is its own Event.
        let two = [
            problem("ns/a", reasons::NO_ENDPOINTS),
            problem("ns/a", reasons::NO_NODE_FOR_LOCAL_POLICY),
        ];
        assert_eq!(gate.due(start + REPEAT, &two).0.len(), 1);
    }

    #[test]
    fn a_flapping_problem_is_not_published_on_every_return() {
        let start = Instant::now();
        let mut gate = EventGate::new(start);
        let broken = [problem("ns/a", reasons::NO_READY_ENDPOINTS)];
        assert_eq!(gate.due(start, &broken).0.len(), 1);
        for i in 1..100u64 {
            let now = start + Duration::from_secs(i);
            let current: &[ServiceProblem] = if i % 2 == 0 { &broken } else { &[] };
            assert!(gate.due(now, current).0.is_empty(), "published again at {i} s");
        }
    }

    #[test]
    fn an_object_rewritten_every_second_gets_one_event_per_repeat() {
        let start = Instant::now();
        let mut gate = EventGate::new(start);
        let broken = [Undecodable {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            kind: "Service".into(),
            api_version: "v1".into(),
            path: "spec.ports[0].port".into(),
            message: "m".into(),
        }];
        let published: usize = (0..REPEAT.as_secs() * 2)
            .map(|second| gate.due(start + Duration::from_secs(second), &broken).0.len())
            .sum();
        assert_eq!(published, 2, "once, and again after {REPEAT:?}");
        let pending = Pending::undecodable(&broken[0]);
        assert_eq!(pending.object, "Service shop/web");
        assert_eq!(pending.regarding.kind.as_deref(), Some("Service"));
        assert!(pending.note.contains("spec.ports[0].port: m"), "{}", pending.note);
        let long = Undecodable {
            message: "é".repeat(2000),
            ..broken[0].clone()
        };
        assert!(Pending::undecodable(&long).note.len() <= MAX_NOTE);
    }

    #[test]
    fn a_rollout_event_names_its_rollout_and_relates_its_node() {
        let regarding = ObjectReference {
            kind: Some("ForwardingRollout".into()),
            name: Some("to-nft".into()),
            ..ObjectReference::default()
        };
        let step = RolloutEvent {
            warning: true,
            reason: "GateFailed",
            node: Some("node-a".into()),
            note: "x".repeat(3000),
        };
        let pending = Pending::rollout(&step, regarding.clone());
        assert!(pending.warning && pending.about == About::Rollout);
        assert_eq!(pending.object, "ForwardingRollout to-nft");
        assert_eq!(pending.regarding, regarding);
        let related = pending.related.expect("the node");
        assert_eq!(
            (related.kind.as_deref(), related.name.as_deref()),
            (Some("Node"), Some("node-a"))
        );
        assert!(pending.note.len() <= MAX_NOTE && pending.note.ends_with("..."));
        let whole = Pending::rollout(
            &RolloutEvent {
                warning: false,
                node: None,
                note: "complete".into(),
                ..step
            },
            regarding,
        );
        assert!(!whole.warning && whole.related.is_none());
    }

    #[test]
    fn take_spends_the_same_tokens_as_due() {
        let start = Instant::now();
        let mut gate = EventGate::new(start);
        let taken = (0..BURST + 5).filter(|_| gate.take(start)).count();
        assert_eq!(taken, BURST as usize);
        assert!(!gate.take(start + Duration::from_secs(1)));
        assert!(gate.take(start + Duration::from_secs(2)));
    }

    #[test]
    fn many_broken_services_are_published_at_the_rate_limit() {
        let start = Instant::now();
        let mut gate = EventGate::new(start);
        let many: Vec<ServiceProblem> = (0..1000)
            .map(|i| problem(&format!("ns/s{i}"), reasons::NO_ENDPOINTS))
            .collect();
        let (due, limited) = gate.due(start, &many);
        assert_eq!((due.len(), limited), (BURST as usize, 1000 - BURST as usize));
        // A minute later: RATE_PER_SECOND × 60 more, and none twice.
        let mut published = due.len();
        for second in 1..=60 {
            published += gate.due(start + Duration::from_secs(second), &many).0.len();
        }
        assert_eq!(published, BURST as usize + (60.0 * RATE_PER_SECOND) as usize);
    }
}
