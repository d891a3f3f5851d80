//! Leader election on a `coordination.k8s.io/v1` Lease, client-go style: only the leader writes plans;
//! followers keep their caches and planner warm for a fast takeover; the lease is released on shutdown.
//!
//! ```text
//! every retryPeriod: GET lease ─► decide(lease, me, now) ─► Renew | Acquire | Follow ─► PUT/POST (resourceVersion
//!   guards against two replicas racing) ─► leader flag (tokio watch) ─► the writer checks it before each write
//! no successful renew within renewDeadline ─► step down, even while a lease call still hangs
//! ```

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{Api, api::PostParams};
use tokio::{sync::watch, time::Instant};

/// Lease timing, client-go's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before stepping down.
    pub renew_deadline: Duration,
    /// Between attempts.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What to do with the lease as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it (transitions counter to write).
    Acquire { transitions: i32 },
    /// Someone else holds a valid lease.
    Follow { holder: String },
}

/// Pure decision from the observed lease.
pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return Decision::Acquire { transitions: 0 };
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    if holder == identity {
        return Decision::Renew;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let expired = spec.renew_time.as_ref().is_none_or(|t| t.0 + duration < now);
    if holder.is_empty() || expired {
        Decision::Acquire {
            transitions: transitions + 1,
        }
    } else {
        Decision::Follow { holder }
    }
}

fn spec_for(
    identity: &str,
    timing: Timing,
    now: Timestamp,
    acquire: Option<i32>,
    old: Option<&LeaseSpec>,
) -> LeaseSpec {
    let mut spec = old.cloned().unwrap_or_default();
    spec.holder_identity = Some(identity.to_string());
    spec.lease_duration_seconds = Some(timing.lease_duration.as_secs() as i32);
    spec.renew_time = Some(MicroTime(now));
    if let Some(transitions) = acquire {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(transitions);
    }
    spec
}

/// Runs the election until `shutdown` turns true; publishes leadership on `leader`. Releases the lease
/// on the way out when held.
///
/// kube's client has no read timeout (the watches need none), so every round is bounded here: a leader's
/// round may last only until its renew deadline, and the leader steps down once the deadline has passed
/// since its last successful renew, whatever is still in flight. Otherwise a hung renew would keep this
/// replica writing after another one took the expired lease over.
pub async fn run(
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    leader: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    // When the round of the last successful renew started: the lease's renewTime is no earlier, so the
    // deadline measured from here never outlives the lease as other replicas see it.
    let mut last_renew: Option<Instant> = None;
    loop {
        let deadline = last_renew.map(|t| t + timing.renew_deadline);
        let started = Instant::now();
        if *leader.borrow() && deadline.is_none_or(|d| started >= d) {
            step_down(&leader, &identity);
        }
        let limit = match deadline {
            Some(d) if *leader.borrow() => d.saturating_duration_since(started),
            _ => timing.renew_deadline,
        };
        let round = tokio::time::timeout(limit, try_acquire_or_renew(&api, &name, &identity, timing));
        let outcome = tokio::select! {
            outcome = round => outcome,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let still_within = || *leader.borrow() && deadline.is_some_and(|d| Instant::now() < d);
        let held = match outcome {
            Ok(Ok(held)) => {
                if held {
                    last_renew = Some(started);
                }
                held
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "reading or updating the leader lease failed");
                still_within()
            }
            Err(_) => {
                tracing::warn!(timeout = ?limit, "the leader lease call did not answer in time");
                still_within()
            }
        };
        if held {
            leader.send_if_modified(|leading| !std::mem::replace(leading, true));
        } else {
            step_down(&leader, &identity);
        }
        // A leader wakes at its renew deadline at the latest, to step down on time.
        let mut wake = Instant::now() + timing.retry_period;
        if held && let Some(t) = last_renew {
            wake = wake.min(t + timing.renew_deadline);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        // Bounded like a round: a hung API server must not hold up the shutdown.
        if tokio::time::timeout(timing.renew_deadline, release(&api, &name, &identity))
            .await
            .is_err()
        {
            tracing::warn!("releasing the leader lease timed out; it expires on its own");
        }
    }
}

fn step_down(leader: &watch::Sender<bool>, identity: &str) {
    if leader.send_if_modified(|leading| std::mem::replace(leading, false)) {
        tracing::warn!(%identity, "lost the leader lease; plan writes stop");
    }
}

/// One round: read the lease and renew or take it when we may. `Ok(true)` when we hold it afterwards.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    timing: Timing,
) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let lease = api.get_opt(name).await?;
    let transitions = match decide(lease.as_ref(), identity, now) {
        Decision::Follow { holder } => {
            tracing::debug!(%holder, "following the leader");
            return Ok(false);
        }
        Decision::Acquire { transitions } => Some(transitions),
        Decision::Renew => None,
    };
    let spec = spec_for(
        identity,
        timing,
        now,
        transitions,
        lease.as_ref().and_then(|l| l.spec.as_ref()),
    );
    match lease {
        Some(mut lease) => {
            lease.spec = Some(spec);
            api.replace(name, &PostParams::default(), &lease).await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    if transitions.is_some() {
        tracing::info!(%identity, "acquired the leader lease");
    }
    Ok(true)
}

/// Gives the lease up so another replica takes over at once instead of waiting for it to expire.
async fn release(api: &Api<Lease>, name: &str, identity: &str) {
    let Ok(Some(mut lease)) = api.get_opt(name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else { return };
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!("released the leader lease"),
        Err(error) => tracing::warn!(%error, "releasing the leader lease failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_secs_ago: i64, transitions: i32) -> Lease {
        let now = Timestamp::now();
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::now();
        let cases = [
            (None, Decision::Acquire { transitions: 0 }),
            (Some(lease(Some("me"), 1, 3)), Decision::Renew),
            (
                Some(lease(Some("other"), 1, 3)),
                Decision::Follow {
                    holder: "other".into(),
                },
            ),
            (
                Some(lease(Some("other"), 60, 3)),
                Decision::Acquire { transitions: 4 },
            ),
            (Some(lease(None, 1, 3)), Decision::Acquire { transitions: 4 }),
        ];
        for (observed, want) in cases {
            assert_eq!(decide(observed.as_ref(), "me", now), want, "{observed:?}");
        }
    }
}
