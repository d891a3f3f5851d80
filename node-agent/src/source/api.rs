//! `run --node-name N`: the node's plan and its views' ForwardingSlices from the API server.
//!
//! ```text
//! watcher(NodeForwardingPlans, labelSelector switchyard.io/node=N)     (kube-runtime: list, then watch;
//! watcher(ForwardingSlices, labelSelector switchyard.io/view in (…))    relists and retries with backoff;
//!     │          restarted with a new selector when the plan's views change)
//!     ▼
//! Store::observe_* ─► decide ─► Ready ──────────────► PlanUpdate::Objects   (unless nothing changed: our own
//!                            ├► Incomplete ─ settled? ─► PlanUpdate::Objects   status writes come back here)
//!                            ├► WrongNode | Unreadable ► PlanUpdate::Invalid
//!                            ├► Wait (first lists) ────► nothing: the rules (or the cache's) stay
//!                            └► Missing ─► GET N ─ 404 ─► PlanUpdate::Deleted
//!                                              ├ found ─► a relist glitch: the object is kept
//!                                              └ error ─► asked again later (backoff); rules stay
//! ```
//!
//! An incomplete view is common for a moment (the controller rewrites a view's slices when it grows),
//! so it is passed on only after it stayed incomplete for the settle time; the syncer then reports
//! `IncompleteView` and keeps the current rules. API errors are logged and never reach the loop: the
//! rules stay as they are. Both watches decode tolerantly ([`super::store::Delivered`]): a plan or
//! slice that does not decode never fails its watch (which would retry with backoff, holding back every
//! other change); the store keeps its last good copy and the status says why (`InvalidPlan`,
//! `InvalidSlice`). The agent reads only its own plan and its views' slices: a change to
//! another zone's slices never reaches it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use switchyard_api::names::{LABEL_NODE, views_selector};
use switchyard_api::{ForwardingSlice, NodeForwardingPlan};
use tokio::time::Instant;

use super::store::{Decision, Delivered, Store};
use super::{PlanSource, PlanUpdate, UpdateSender};
use crate::sync::backoff::Backoff;

/// Watches one node's plan objects.
#[derive(Clone)]
pub struct ApiSource {
    /// The client.
    pub client: Client,
    /// The node.
    pub node: String,
    /// How long an incomplete view may stay so before it is reported.
    pub settle: Duration,
}

impl ApiSource {
    /// A source for `node` with the default settle time (3 s).
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_string(),
            settle: Duration::from_secs(3),
        }
    }
}

impl std::fmt::Debug for ApiSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiSource")
            .field("node", &self.node)
            .field("settle", &self.settle)
            .finish_non_exhaustive()
    }
}

impl PlanSource for ApiSource {
    fn spawn(self: Box<Self>, tx: UpdateSender) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(tx))
    }

    fn describe(&self) -> String {
        format!(
            "NodeForwardingPlan {} (labelled {LABEL_NODE}={}) and the ForwardingSlices of its views",
            self.node, self.node
        )
    }
}

/// What was last sent, so unchanged sets (our own status writes come back as events) are not resent.
#[derive(Debug, Default, PartialEq)]
enum Sent {
    #[default]
    Nothing,
    Objects(Vec<(String, Option<String>, String)>),
    Invalid(String),
    Deleted,
}

struct State {
    store: Store,
    sent: Sent,
    incomplete_since: Option<Instant>,
    /// The incomplete set was passed on: nothing to wait for until the decision changes.
    incomplete_sent: bool,
    confirm_at: Option<Instant>,
    confirm_backoff: Backoff,
    settle: Duration,
    tx: UpdateSender,
}

impl State {
    fn send(&mut self, sent: Sent, update: PlanUpdate) -> bool {
        if self.sent == sent {
            return true;
        }
        self.sent = sent;
        self.tx.send(Some(Arc::new(update))).is_ok()
    }

    /// When an incomplete set will have settled (`None`: none is waiting).
    fn settle_at(&self) -> Option<Instant> {
        self.incomplete_since
            .filter(|_| !self.incomplete_sent)
            .map(|since| since + self.settle)
    }

    /// Acts on the store's decision; false when the loop has gone.
    fn evaluate(&mut self, now: Instant) -> bool {
        let decision = self.store.decide();
        if !matches!(decision, Decision::Incomplete(..)) {
            self.incomplete_since = None;
            self.incomplete_sent = false;
        }
        match decision {
            Decision::Wait => true,
            Decision::Missing => {
                if self.sent != Sent::Deleted && self.confirm_at.is_none() {
                    self.confirm_at = Some(now);
                }
                true
            }
            Decision::WrongNode(why) | Decision::Unreadable(why) => {
                self.confirm_at = None;
                tracing::warn!(%why, "plan refused");
                self.send(Sent::Invalid(why.clone()), PlanUpdate::Invalid(why))
            }
            Decision::Ready(set) => {
                self.confirm_at = None;
                let key = Sent::Objects(self.store.key());
                self.send(key, PlanUpdate::Objects(set))
            }
            Decision::Incomplete(set, why) => {
                self.confirm_at = None;
                let since = *self.incomplete_since.get_or_insert(now);
                if now < since + self.settle {
                    tracing::debug!(%why, "views incomplete; waiting for them to settle");
                    return true;
                }
                self.incomplete_sent = true;
                let key = Sent::Objects(self.store.key());
                self.send(key, PlanUpdate::Objects(set))
            }
        }
    }
}

/// Whether a watch is failing, to say it once per outage.
struct WatchHealth {
    what: &'static str,
    failing: bool,
}

impl WatchHealth {
    fn new(what: &'static str) -> Self {
        Self { what, failing: false }
    }

    fn ok(&mut self) {
        if self.failing {
            tracing::info!(watch = self.what, "watching again");
            self.failing = false;
        }
    }

    /// kube-runtime retries with backoff; say it once per outage, then quietly. Always true: the loop
    /// goes on.
    fn failed(&mut self, error: &watcher::Error) -> bool {
        if self.failing {
            tracing::debug!(watch = self.what, %error, "watch still failing");
        } else {
            tracing::warn!(watch = self.what, %error, "watch failed; the current rules stay, retrying");
            self.failing = true;
        }
        true
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

type SliceStream = BoxStream<'static, Result<watcher::Event<Delivered<ForwardingSlice>>, watcher::Error>>;

impl ApiSource {
    fn slice_stream(&self, views: &[String]) -> SliceStream {
        let api: Api<Delivered<ForwardingSlice>> = Api::all(self.client.clone());
        let selector = views_selector(views.iter().map(String::as_str));
        tracing::info!(%selector, "watching the slices of this node's views");
        watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .boxed()
    }

    async fn run(self: Box<Self>, tx: UpdateSender) {
        let api: Api<Delivered<NodeForwardingPlan>> = Api::all(self.client.clone());
        let config = watcher::Config::default().labels(&format!("{LABEL_NODE}={}", self.node));
        let mut stream = watcher(api.clone(), config).default_backoff().boxed();
        let mut slices: Option<SliceStream> = None;
        let mut state = State {
            store: Store::new(&self.node),
            sent: Sent::Nothing,
            incomplete_since: None,
            incomplete_sent: false,
            confirm_at: None,
            confirm_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
            settle: self.settle,
            tx,
        };
        let mut plan_watch = WatchHealth::new("plan");
        let mut slice_watch = WatchHealth::new("slice");
        loop {
            // A plan with other views than the slice watch follows: watch those views instead.
            let wanted = state
                .store
                .plan_views()
                .filter(|v| !v.is_empty())
                .map(<[String]>::to_vec);
            if wanted.is_some() && wanted.as_deref() != state.store.watched_views() {
                let views = wanted.unwrap_or_default();
                slices = Some(self.slice_stream(&views));
                state.store.watch_slices(views);
            }
            let settle_at = state.settle_at();
            let next_slice = async {
                match slices.as_mut() {
                    Some(stream) => stream.next().await,
                    None => std::future::pending().await,
                }
            };
            let alive = tokio::select! {
                item = stream.next() => match item {
                    None => return,
                    Some(Ok(event)) => {
                        plan_watch.ok();
                        !state.store.observe_plan(event) || state.evaluate(Instant::now())
                    }
                    Some(Err(error)) => plan_watch.failed(&error),
                },
                item = next_slice => match item {
                    None => return,
                    Some(Ok(event)) => {
                        slice_watch.ok();
                        !state.store.observe_slice(event) || state.evaluate(Instant::now())
                    }
                    Some(Err(error)) => slice_watch.failed(&error),
                },
                () = sleep_until(settle_at) => state.evaluate(Instant::now()),
                () = sleep_until(state.confirm_at) => self.confirm(&api, &mut state).await,
            };
            if !alive {
                return;
            }
        }
    }

    /// The watch says the plan is gone: ask the API server directly before calling it deleted.
    async fn confirm(&self, api: &Api<Delivered<NodeForwardingPlan>>, state: &mut State) -> bool {
        state.confirm_at = None;
        if state.store.decide() != Decision::Missing {
            return true;
        }
        match switchyard_process::bounded(
            switchyard_process::bounded::API_CALL_TIMEOUT,
            api.get_opt(&self.node),
        )
        .await
        {
            Ok(None) => {
                state.confirm_backoff.reset();
                tracing::warn!(plan = %self.node, "this node's plan is gone (confirmed: the API server answers 404)");
                state.send(Sent::Deleted, PlanUpdate::Deleted)
            }
            Ok(Some(object)) => {
                state.confirm_backoff.reset();
                tracing::info!(plan = %self.node, "the watch lost this node's plan but it exists; keeping it");
                state.store.insert(object);
                state.evaluate(Instant::now())
            }
            Err(error) => {
                let delay = state.confirm_backoff.next_delay();
                tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "cannot confirm that the plan is gone; the rules stay");
                state.confirm_at = Some(Instant::now() + delay);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{live_plan, slice};

    #[tokio::test]
    async fn a_settled_incomplete_view_is_sent_once_and_then_nothing_is_waited_for() {
        let (tx, mut rx) = tokio::sync::watch::channel(None);
        let mut state = State {
            store: Store::new("node-a"),
            sent: Sent::Nothing,
            incomplete_since: None,
            incomplete_sent: false,
            confirm_at: None,
            confirm_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
            settle: Duration::from_millis(200),
            tx,
        };
        state.store.observe_plan(watcher::Event::Init);
        state.store.observe_plan(watcher::Event::InitApply(
            NodeForwardingPlan::new("node-a", live_plan("node-a", &["all"], vec![])).into(),
        ));
        state.store.observe_plan(watcher::Event::InitDone);
        state.store.watch_slices(vec!["all".into()]);
        state.store.observe_slice(watcher::Event::Init);
        let (name, spec) = slice("all", 0, 2, vec![]);
        state.store.observe_slice(watcher::Event::InitApply(
            ForwardingSlice::new(&name, spec).into(),
        ));
        state.store.observe_slice(watcher::Event::InitDone);

        let start = Instant::now();
        assert!(state.evaluate(start));
        assert_eq!(
            state.settle_at(),
            Some(start + Duration::from_millis(200)),
            "settling"
        );
        assert!(rx.borrow_and_update().is_none(), "not before it settled");
        let later = start + Duration::from_millis(250);
        assert!(state.evaluate(later));
        assert!(matches!(
            rx.borrow_and_update().as_deref(),
            Some(PlanUpdate::Objects(_))
        ));
        // Sent: the loop must not wake for it again (it used to spin on a settle time in the past).
        assert_eq!(state.settle_at(), None);
        assert!(state.evaluate(later + Duration::from_secs(1)));
        assert!(!rx.has_changed().unwrap_or(true), "sent once");
    }
}
