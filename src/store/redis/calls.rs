//! How one call reaches Redis: through the circuit breaker (on a Cluster, the breaker of the
//! master that owns the call's key), within its deadline, sent once more on a new connection
//! only when the first attempt provably sent nothing, and with its error's metric kind.
//! [`Calls`] is cheap to clone, so that a batch (`store::batch`) can make its call from a task
//! of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::breaker::Breaker;
use super::connection::{Conn, Connections};
use super::topology::Topology;
use crate::metrics as m;
use crate::store::{ErrorClass, StoreError};

/// What a call to Redis goes through (see the module doc).
#[derive(Clone)]
pub struct Calls {
    pub conns: Arc<Connections>,
    pub breaker: Arc<Breaker>,
    /// A Cluster's slot map, and a breaker per master; `None` on one Redis.
    pub topology: Option<Arc<Topology>>,
    /// `redis.timeout_ms`.
    pub timeout: Duration,
    /// Registered once: a lookup by name on every call would cost more than recording.
    pub call_seconds: metrics::Histogram,
}

impl Calls {
    /// Calls through the circuit breaker, within `redis.timeout_ms` from now: while the breaker
    /// is open, fails at once without touching Redis. For a call on `key`, on a Cluster, through
    /// the breaker of the master that owns its slot, so that a failed master stops only its own
    /// keys' calls.
    ///
    /// `f` may run twice (hence `Clone`; closures that borrow are): again on a new connection
    /// when the first run provably sent nothing (see [`Calls::call`]).
    pub async fn with_conn_on<T, F>(&self, key: Option<&str>, f: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut Conn) -> Result<T, StoreError> + Clone,
    {
        self.with_conn_until(key, Instant::now() + self.timeout, f)
            .await
    }

    /// [`Calls::with_conn_on`] within a deadline of the caller's: a batch's is that of the
    /// decision in it that has waited longest.
    pub async fn with_conn_until<T, F>(
        &self,
        key: Option<&str>,
        deadline: Instant,
        f: F,
    ) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut Conn) -> Result<T, StoreError> + Clone,
    {
        let master = key.and_then(|k| self.topology.as_ref()?.breaker_for(k));
        let breaker = master.as_deref().unwrap_or(&self.breaker);
        let Some(permit) = breaker.permit() else {
            metrics::counter!(m::REDIS_ERRORS, "kind" => "circuit_open").increment(1);
            let cause = breaker.cause().unwrap_or_default();
            let what = if master.is_some() {
                "The Redis master of this key"
            } else {
                "Redis"
            };
            return Err(StoreError::unavailable(format!(
                "{what} is unreachable (circuit breaker open; last failure: {cause})"
            )));
        };
        // A caller that goes away mid-call (its client hung up) drops this future: the permit
        // goes back unused, or the breaker would wait forever for its probe's answer.
        let permit = PermitGuard {
            breaker,
            permit: Some(permit),
        };
        let started = Instant::now();
        let (result, kind) = match self.call(deadline, f).await {
            Ok(v) => (Ok(v), None),
            Err((e, kind)) => (Err(e), Some(kind)),
        };
        self.call_seconds.record(started.elapsed().as_secs_f64());
        if let Some(kind) = kind {
            metrics::counter!(m::REDIS_ERRORS, "kind" => kind).increment(1);
        }
        let reached = match &result {
            Err(e) if e.class().counts_against_breaker() => {
                breaker.set_cause(e.to_string());
                false
            }
            _ => true,
        };
        permit.record(reached);
        result
    }

    /// One call, bounded by the deadline; errors come with their metric kind.
    ///
    /// After a Redis restart a call usually finds its connection already known closed and makes
    /// a new one before sending anything. When it finds out only by failing (no byte of it
    /// accepted by the socket), it never reached Redis, and is sent once more on a new
    /// connection. A call that may have reached Redis is never sent again: a decision counted
    /// twice is worse than a degraded one.
    async fn call<T, F>(&self, deadline: Instant, f: F) -> Result<T, (StoreError, &'static str)>
    where
        F: AsyncFnOnce(&mut Conn) -> Result<T, StoreError> + Clone,
    {
        // Whether the call got as far as sending: a deadline that passes before that is a
        // connection that could not be made, not an unknown outcome.
        let sending = AtomicBool::new(false);
        let call = async {
            let mut conn = self.conns.get().await?;
            sending.store(true, Ordering::Release);
            match f.clone()(&mut conn).await {
                Err(e) if e.is_transient() && conn.never_sent() => {
                    conn.discard();
                    sending.store(false, Ordering::Release);
                    let mut conn = self.conns.get().await?;
                    sending.store(true, Ordering::Release);
                    f(&mut conn).await.map_err(|e| unsent(e, &conn))
                }
                result => result,
            }
        };
        match tokio::time::timeout_at(deadline.into(), call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.class() == ErrorClass::ClusterRefused => Err((e, "cluster_refused")),
            Ok(Err(e)) if e.is_transient() => Err((e, "connection")),
            Ok(Err(e)) => Err((e, "server")),
            Err(_) if !sending.load(Ordering::Acquire) => Err((
                StoreError::unavailable(format!(
                    "could not connect to Redis within {} ms",
                    self.timeout.as_millis()
                )),
                "timeout",
            )),
            Err(_) => Err((
                StoreError::outcome_unknown(format!(
                    "no answer from Redis within {} ms",
                    self.timeout.as_millis()
                )),
                "timeout",
            )),
        }
    }
}

/// A transient error of a call its connection proves was never sent is `Unavailable`.
fn unsent(e: StoreError, conn: &Conn) -> StoreError {
    if conn.never_sent() {
        e.outcome_known()
    } else {
        e
    }
}

/// A breaker permit that is handed back unused if the call holding it is cancelled.
struct PermitGuard<'a> {
    breaker: &'a Breaker,
    permit: Option<super::breaker::Permit>,
}

impl PermitGuard<'_> {
    fn record(mut self, reached: bool) {
        if let Some(permit) = self.permit.take() {
            self.breaker.record(permit, reached);
        }
    }
}

impl Drop for PermitGuard<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.breaker.abandon(permit);
        }
    }
}
