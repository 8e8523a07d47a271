//! Undoing lease calls the shared store may have run after it failed on them: a bounded queue
//! of releases, sent until the store answers them.
//!
//! A take whose outcome is unknown (sent, and no answer within `redis.timeout_ms`; or its
//! connection broke after sending) may still be run by Redis when it answers again, granting a
//! lease to nobody: the client was answered by the fail mode (`open`: a degraded grant that
//! nothing stores; `local`: this instance's own lease; `closed`: 503). Such a take is queued
//! here, by its lease id (drawn before the take was sent), and released on the shared store
//! once it answers. Every take carries a deadline on Redis's clock
//! ([`crate::store::Store::lease_deadline`]), after which Redis grants it nothing; so a release
//! answered before that deadline without finding the lease may have overtaken the take (on
//! another connection), and is sent again after the deadline. A release answered by the fail
//! mode (`open`, and `local` for a lease its own store does not know) is queued the same way,
//! so that the slot its holder gave back is freed on the shared store too.
//!
//! The queue holds at most `limits.lease_undo_queue` entries; when it is full, a new entry is
//! dropped and counted (`dropped`): its lease is held until its own expiry, as before this
//! queue. An entry that the store does not answer before its lease would have expired anyway
//! is `abandoned`. While the circuit breaker is open, each release fails at once without
//! touching Redis and is tried again later (50 ms, doubling to 1 s): the queue drains as soon as
//! the breaker lets calls through. Counted in `ratelimiter_lease_undos_total{outcome}`, with
//! `ratelimiter_lease_undos_waiting`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge};
use tokio::sync::Notify;

use super::RateLimiter;
use crate::limiter::concurrency::{LeaseCall, LeaseOp};
use crate::metrics as m;
use crate::policy::{LimitKey, Policy};
use crate::store::{LeasePlan, Store};
use crate::telemetry::Summarized;

/// Most entries tried in one pass; the rest wait for the next.
const PASS: usize = 256;
/// First wait before a release the store did not answer is sent again; it doubles up to
/// [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(50);
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// One lease to release on the shared store.
#[derive(Debug, Clone)]
pub struct Undo {
    pub policy: Arc<Policy>,
    pub key: LimitKey,
    /// The lease's member string.
    pub member: String,
    pub cost: u64,
    /// The take's deadline on the store's clock, if it had one: a release answered at or
    /// before it without finding the lease may have overtaken the take.
    pub deadline_us: Option<u64>,
    /// When the lease would have expired anyway: nothing to undo after it.
    pub give_up: Instant,
    next_try: Instant,
    wait: Duration,
}

impl Undo {
    pub fn new(policy: Arc<Policy>, key: LimitKey, call: &LeaseCall<'_>, lease: Duration) -> Self {
        let now = Instant::now();
        Self {
            policy,
            key,
            member: call.member.to_owned(),
            cost: call.cost,
            deadline_us: call.deadline_us,
            give_up: now + lease + LONGEST_WAIT,
            next_try: now,
            wait: FIRST_WAIT,
        }
    }
}

struct UndoCounters {
    queued: Counter,
    undone: Counter,
    absent: Counter,
    dropped: Counter,
    abandoned: Counter,
    waiting: Gauge,
}

/// The queue (see the module doc).
pub struct UndoQueue {
    waiting: Mutex<VecDeque<Undo>>,
    capacity: usize,
    wake: Notify,
    counters: UndoCounters,
}

// A panic while the queue is locked leaves it whole (entries are moved whole).
fn lock(m: &Mutex<VecDeque<Undo>>) -> MutexGuard<'_, VecDeque<Undo>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl UndoQueue {
    pub fn new(capacity: usize) -> Self {
        let outcome = |o: &'static str| metrics::counter!(m::LEASE_UNDOS, "outcome" => o);
        Self {
            waiting: Mutex::new(VecDeque::new()),
            capacity,
            wake: Notify::new(),
            counters: UndoCounters {
                queued: outcome("queued"),
                undone: outcome("undone"),
                absent: outcome("absent"),
                dropped: outcome("dropped"),
                abandoned: outcome("abandoned"),
                waiting: metrics::gauge!(m::LEASE_UNDOS_WAITING),
            },
        }
    }

    /// Queues `undo`, or drops it when the queue is full.
    pub fn push(&self, undo: Undo) {
        let mut waiting = lock(&self.waiting);
        if waiting.len() >= self.capacity {
            drop(waiting);
            self.counters.dropped.increment(1);
            static FULL: Summarized = Summarized::per_second();
            if let Some(count) = FULL.hit() {
                tracing::warn!(capacity = self.capacity, count, "the lease undo queue is full (limits.lease_undo_queue): a lease whose take had no answer is held until its expiry");
            }
            return;
        }
        waiting.push_back(undo);
        self.counters.waiting.set(waiting.len() as f64);
        drop(waiting);
        self.counters.queued.increment(1);
        self.wake.notify_one();
    }

    /// Entries waiting.
    pub fn len(&self) -> usize {
        lock(&self.waiting).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to [`PASS`] entries due by `now`, taken out.
    fn due(&self, now: Instant) -> Vec<Undo> {
        let mut waiting = lock(&self.waiting);
        let mut due = Vec::new();
        let mut kept = VecDeque::with_capacity(waiting.len());
        while let Some(undo) = waiting.pop_front() {
            if due.len() < PASS && undo.next_try <= now {
                due.push(undo);
            } else {
                kept.push_back(undo);
            }
        }
        *waiting = kept;
        due
    }

    /// Puts entries back for a later pass.
    fn put_back(&self, undos: impl IntoIterator<Item = Undo>) {
        let mut waiting = lock(&self.waiting);
        waiting.extend(undos);
        self.counters.waiting.set(waiting.len() as f64);
    }

    /// The time until the earliest entry is due, if any waits.
    fn until_due(&self, now: Instant) -> Option<Duration> {
        lock(&self.waiting)
            .iter()
            .map(|u| u.next_try.saturating_duration_since(now))
            .min()
    }
}

impl RateLimiter {
    /// Tries every due undo once (see the module doc); returns how many still wait.
    pub async fn drain_undos(&self) -> usize {
        let due = self.undos.due(Instant::now());
        if due.is_empty() {
            return self.undos.len();
        }
        let tried = futures_util::future::join_all(due.into_iter().map(|u| self.undo(u))).await;
        self.undos.put_back(tried.into_iter().flatten());
        self.undos.len()
    }

    /// Sends one release: `None` when the entry is settled (counted), or the entry to try again.
    async fn undo(&self, mut undo: Undo) -> Option<Undo> {
        let c = &self.undos.counters;
        let now = Instant::now();
        if now > undo.give_up {
            c.abandoned.increment(1);
            return None;
        }
        let call = LeaseCall {
            op: LeaseOp::Release,
            member: &undo.member,
            cost: undo.cost,
            lease_us: 0,
            limit: undo.policy.concurrency().map_or(0, |p| p.limit),
            deadline_us: None,
        };
        let plan = LeasePlan {
            policy: &undo.policy,
            key: &undo.key,
            call,
            at_us: None,
        };
        match self.store.lease(&plan).await {
            Ok(answer) if answer.ok => {
                tracing::debug!(policy = %undo.policy.name, "released a lease granted to nobody");
                c.undone.increment(1);
                None
            }
            Ok(answer) => match undo.deadline_us {
                // Answered before the take's deadline: the take may be still on its way.
                Some(deadline) if answer.at_us <= deadline => {
                    let wait_us = deadline - answer.at_us;
                    undo.next_try = now + Duration::from_micros(wait_us) + FIRST_WAIT;
                    Some(undo)
                }
                _ => {
                    c.absent.increment(1);
                    None
                }
            },
            Err(e) => {
                tracing::trace!(policy = %undo.policy.name, error = %e, "a lease undo waits for the store");
                undo.next_try = now + undo.wait;
                undo.wait = (undo.wait * 2).min(LONGEST_WAIT);
                Some(undo)
            }
        }
    }
}

/// The shortest time between two passes: each walks the whole queue, and takes that fail in a
/// flood each wake the drain.
const BETWEEN_PASSES: Duration = Duration::from_millis(20);

/// Drains the limiter's undo queue whenever an entry is due, until the limiter is gone.
pub(super) async fn drain_forever(limiter: Weak<RateLimiter>, queue: Arc<UndoQueue>) {
    loop {
        tokio::time::sleep(BETWEEN_PASSES).await;
        let pause = queue
            .until_due(Instant::now())
            .unwrap_or(LONGEST_WAIT)
            .min(LONGEST_WAIT);
        tokio::select! {
            () = queue.wake.notified() => {}
            () = tokio::time::sleep(pause) => {}
        }
        let Some(this) = limiter.upgrade() else {
            return;
        };
        this.drain_undos().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::concurrency::Params;
    use crate::policy::{FailMode, PolicyName};

    fn undo(n: u8) -> Undo {
        let params = Params {
            limit: 2,
            lease_us: 1_000_000,
            max_lease_us: 1_000_000,
        };
        let policy = Policy::concurrent(
            PolicyName::parse("p").expect("valid"),
            params,
            None,
            FailMode::Open,
        );
        let member = format!("{n:032x}:1");
        let call = LeaseCall {
            op: LeaseOp::Take,
            member: &member,
            cost: 1,
            lease_us: 1_000_000,
            limit: 2,
            deadline_us: None,
        };
        Undo::new(
            Arc::new(policy),
            LimitKey::parse("k".into()).expect("valid"),
            &call,
            Duration::from_secs(1),
        )
    }

    #[test]
    fn the_queue_is_bounded_and_hands_out_only_what_is_due() {
        let queue = UndoQueue::new(2);
        for n in 0..3 {
            queue.push(undo(n));
        }
        assert_eq!(queue.len(), 2, "the third is dropped");
        let now = Instant::now();
        let due = queue.due(now);
        assert_eq!(due.len(), 2);
        assert!(queue.is_empty());
        let later: Vec<Undo> = due
            .into_iter()
            .map(|mut u| {
                u.next_try = now + Duration::from_secs(5);
                u
            })
            .collect();
        queue.put_back(later);
        assert!(queue.due(now).is_empty(), "nothing is due yet");
        let wait = queue.until_due(now).expect("entries wait");
        assert!(wait <= Duration::from_secs(5) && wait > Duration::from_secs(4));
        assert_eq!(queue.due(now + Duration::from_secs(5)).len(), 2);
    }
}
