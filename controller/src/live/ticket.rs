//! The write path's two calls into the engine: the writer takes a ticket, does the write without the
//! engine, and hands the ticket back with how it went. Two lock trips per write, and the writer never
//! calls back in between (linkerd's policy-controller writer has the same shape).
//!
//! ```text
//! Engine::next(now) ─► Next::Write(Ticket { object, trigger, work }) ─► writer: leader? budget, PATCH | DELETE
//!   (picks the next pending object, works out what it needs,                        │
//!    records the revision about to be written, so its watch echo is known)          ▼
//! Engine::finish(ticket, Done) ◄── Applied { resourceVersion } | Deleted | Unchanged | NotLeader | Failed { retry_at }
//!   ─► tracker updated (written / deleted) or the object back in the queue, in its old place ─► queue depth
//! Engine::next(now) ─► Next::Idle { retry_at }: nothing due (the earliest backed-off retry, if any)
//! ```

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::engine::{Engine, Work};
use super::object::ObjectRef;

/// One object handed to the writer: which, why (the change that caused it), and what it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Ticket {
    /// The plan or slice.
    pub object: ObjectRef,
    /// When the change that queued it happened (network programming latency), if known.
    pub trigger: Option<Timestamp>,
    /// What it needs; `None` when it is already up to date (or no longer planned).
    pub work: Option<Work>,
}

impl Ticket {
    /// The revision an apply writes.
    pub fn revision(&self) -> Option<&str> {
        match &self.work {
            Some(Work::ApplyPlan(plan)) => Some(&plan.spec.revision),
            Some(Work::ApplySlice(slice)) => Some(&slice.spec.revision),
            Some(Work::DeleteSlice(_)) | None => None,
        }
    }
}

/// What the writer should do now.
// Handed once from the engine to the writer; boxing the ticket would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Write this.
    Write(Ticket),
    /// Nothing is due; the earliest retry of an object backing off, if any.
    Idle {
        /// When to look again at the latest.
        retry_at: Option<Instant>,
    },
}

/// How a ticket's write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// Applied; the resourceVersion the API server gave the result.
    Applied {
        /// `metadata.resourceVersion` of the response.
        resource_version: Option<String>,
    },
    /// Deleted, or it was already gone.
    Deleted,
    /// Nothing was written: it was up to date.
    Unchanged,
    /// Cut short by losing the lease: back in the queue at once, for when this replica leads again.
    NotLeader,
    /// Failed: back in the queue, not before `retry_at`, so what must be written after it keeps waiting.
    Failed {
        /// When it may be tried again.
        retry_at: Instant,
    },
}

impl Engine {
    /// The next object to write (in the order [`Engine::next_pending`] gives), with what it needs; the
    /// revision it will write is recorded now, since its watch echo may come back before the response.
    pub fn next(&mut self, now: Instant) -> Next {
        let Some((object, trigger)) = self.next_pending(now) else {
            return Next::Idle {
                retry_at: self.next_retry(),
            };
        };
        let work = self.work_for(&object, trigger);
        let ticket = Ticket {
            object,
            trigger,
            work,
        };
        if let Some(revision) = ticket.revision() {
            self.intend(&ticket.object, revision);
        }
        Next::Write(ticket)
    }

    /// Takes a ticket back with how its write went. Returns the queue depth after it.
    pub fn finish(&mut self, ticket: &Ticket, done: Done) -> usize {
        match done {
            Done::Applied { resource_version } => {
                if let Some(revision) = ticket.revision() {
                    self.written(&ticket.object, revision, resource_version.as_deref());
                }
            }
            Done::Deleted => self.deleted(&ticket.object),
            Done::Unchanged => {}
            Done::NotLeader => self.requeue(&ticket.object, ticket.trigger, None),
            Done::Failed { retry_at } => self.requeue(&ticket.object, ticket.trigger, Some(retry_at)),
        }
        self.queue_depth()
    }
}
