//! Batches: one-limit decisions (acquire, report, refund) that a thread asks for while its
//! previous calls are still at Redis go to Redis together, in one call of `lua/batch.lua`.
//!
//! Each calling thread has a lane per Redis master (one on one Redis; on a Cluster, by the slot
//! map of `store::topology`, and the batch is sent to that master with the keys in ARGV, since
//! a call may declare keys of one slot only; a key whose slot has just moved fails its decision
//! in the batch, which is then sent again alone). A decision that finds fewer than two calls of
//! its lane at Redis is sent at once, alone, with its own script, exactly as without batches: a
//! lone request never waits to fill a batch. One that finds two waits in the lane's queue. When
//! a call comes back, the queue (at most `redis.batch_max` of it, oldest first) goes as the next
//! call, from a task of its own so that the caller that finished is not held up, and so on until
//! the queue is empty. Under load a thread therefore keeps two calls at Redis, each carrying
//! whatever arrived while the others were out: entering the script, reading Redis's clock,
//! parsing the command and writing the reply are paid once per batch instead of once per
//! decision, on Redis and here.
//!
//! Each decision in a batch is as exact as alone: the batch script runs them one after the
//! other, in queue order, at one reading of Redis's clock, as one atomic script (see
//! `lua/batch.lua`). A decision's deadline (`redis.timeout_ms`) counts from when it asked: a
//! batch's call has the deadline of its oldest decision, and a decision left with less than a
//! quarter of its deadline when its turn comes (the call before it hung) is answered
//! `Unavailable` without being sent, so that it consumes nothing. A waiting decision whose caller went away is dropped unsent. A failed call fails each decision in it with the
//! same error, so that each goes to its policy's fail mode as it would alone; a decision that
//! raised an error inside the script fails alone.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use redis::{ErrorKind, ServerErrorKind, Value};
use thread_local::ThreadLocal;
use tokio::sync::oneshot;

use super::argv::{script_argv, verdict};
use super::calls::Calls;
use super::scripts::{batch_code, Scripts, BATCHED_OPS};
use super::topology::key_slot;
use crate::limiter::{Op, Verdict};
use crate::metrics as m;
use crate::policy::Algorithm;
use crate::store::{key, Plan, StoreError};

/// `redis.batch_max`'s default: large enough that a queue of 2 workers' requests at a few
/// hundred connections goes in one or two calls, small enough that one call stays well under a
/// millisecond inside Redis.
pub const DEFAULT_BATCH_MAX: usize = 64;

/// One decision of one limit, as its script takes it.
#[derive(Debug, Clone)]
pub struct Job {
    /// The limit's state key.
    key: String,
    op: Op,
    algorithm: Algorithm,
    /// ARGV as `lua/common.lua` lays it out for one limit; `None` is an empty argument.
    args: Vec<Option<u64>>,
}

impl Job {
    /// The decision as a batch takes it; `None` for what goes alone: a peek (read-only, with
    /// `EVALSHA_RO`) and a policy of several limits (its script is composed for them).
    pub fn new(prefix: &str, plan: &Plan<'_>) -> Option<Self> {
        let Plan {
            policy,
            key,
            ask,
            params,
            at_us: now_us,
        } = *plan;
        let (op, cost, marks) = (ask.op(), ask.cost(), plan.marks());
        let [params] = params else {
            return None;
        };
        if !BATCHED_OPS.contains(&op) {
            return None;
        }
        let mut state_key = String::new();
        key::state_key(
            &mut state_key,
            prefix,
            policy.name.as_str(),
            key.as_str(),
            policy.state_name(0),
            params.algorithm(),
        );
        Some(Job {
            key: state_key,
            op,
            algorithm: params.algorithm(),
            args: script_argv(std::slice::from_ref(params), op, cost, marks, now_us).collect(),
        })
    }
}

/// One call of the batch script for these decisions, in order (the script must be loaded:
/// `SCRIPT LOAD` of [`super::scripts::batch_source`]). `cross_slot`: a Cluster's, whose keys go
/// in ARGV (see `lua/batch.lua`).
pub fn command(jobs: &[Job], cross_slot: bool) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(Scripts::batch(cross_slot).get_hash());
    if cross_slot {
        cmd.arg(0).arg(jobs.len());
    } else {
        cmd.arg(jobs.len());
        for job in jobs {
            cmd.arg(job.key.as_str());
        }
        cmd.arg(jobs.len());
    }
    for job in jobs {
        if cross_slot {
            cmd.arg(job.key.as_str());
        }
        cmd.arg(batch_code(job.op, job.algorithm).unwrap_or(0))
            .arg(job.args.len());
        for arg in &job.args {
            match arg {
                Some(n) => cmd.arg(*n),
                None => cmd.arg(""),
            };
        }
    }
    cmd
}

/// The batch script's reply as each decision's answer, in order.
pub fn answers(reply: Value, jobs: &[Job]) -> Vec<Answer> {
    match reply {
        Value::Array(items) if items.len() == jobs.len() => jobs
            .iter()
            .zip(items)
            .map(|(job, item)| match item {
                Value::BulkString(error) => Err(StoreError::server(format!(
                    "a decision script failed: {}",
                    String::from_utf8_lossy(&error)
                ))),
                reply => verdict(&reply, 1, job.op),
            })
            .collect(),
        other => jobs
            .iter()
            .map(|_| {
                Err(StoreError::corrupt(format!(
                    "the batch script answered {other:?} for {} decisions",
                    jobs.len()
                )))
            })
            .collect(),
    }
}

/// A decision's verdict, or why there is none.
pub type Answer = Result<Verdict, StoreError>;

/// A decision waiting in its lane.
struct Waiting {
    job: Job,
    since: Instant,
    answer: oneshot::Sender<Answer>,
}

/// One thread's lane: whether a call is in flight, and what waits for it to come back.
#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    /// Calls of this lane at Redis.
    in_flight: usize,
    queue: VecDeque<Waiting>,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState> {
        // Nothing panics while holding the lock; a poisoned one still holds a consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next batch for the call that just came back to carry, or `None` (and the lane idle)
    /// when nothing waits.
    fn next(&self, max: usize) -> Option<Vec<Waiting>> {
        let mut state = self.lock();
        if state.queue.is_empty() {
            state.in_flight = state.in_flight.saturating_sub(1);
            return None;
        }
        let n = state.queue.len().min(max);
        Some(state.queue.drain(..n).collect())
    }

    /// Makes the lane idle and drops what waits (its callers get no answer), when the task
    /// that would send it is gone with its runtime: the thread's next decision starts afresh.
    fn reset(&self) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.queue.clear();
    }
}

/// The task sending a lane's batches. Dropped before it is done (its runtime stopped), it
/// resets the lane.
struct Sending {
    lane: Arc<Lane>,
    done: bool,
}

impl Sending {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.done {
            self.lane.reset();
        }
    }
}

/// Calls a lane may have at Redis before decisions wait for them. Two, not one: with one, every
/// decision waits for the call in flight and then its own, and a call held up once (a thread
/// busy writing answers) held up all that came behind it; side by side at 50 connections, one
/// had p99s of 9 to 12 ms where two kept those of decisions sent alone (about 2 ms), at the same
/// Redis time per decision and a few per cent more throughput.
const DEPTH: usize = 2;

/// Lanes per thread: one per Redis master (one on one Redis); the keys of a Cluster master
/// beyond the first [`LANES`] go alone.
const LANES: usize = 16;

/// The lanes of every thread that decides on this store.
pub struct Batches {
    lanes: ThreadLocal<[Arc<Lane>; LANES]>,
    max: usize,
    batches: metrics::Counter,
    batched: metrics::Counter,
}

impl Batches {
    pub fn new(max: usize) -> Self {
        Self {
            lanes: ThreadLocal::new(),
            max: max.max(1),
            batches: metrics::counter!(m::REDIS_BATCHES),
            batched: metrics::counter!(m::REDIS_BATCHED_DECISIONS),
        }
    }

    /// Decides `job`: at once if this thread's lane has fewer than [`DEPTH`] calls at Redis, or
    /// in the batch after one of them.
    pub async fn decide(
        self: &Arc<Self>,
        calls: &Calls,
        scripts: &Arc<Scripts>,
        job: Job,
    ) -> Answer {
        let master = match &calls.topology {
            None => Some(0),
            Some(topology) => topology.master_index(&job.key),
        };
        let Some(lane) = master.and_then(|i| self.lanes.get_or(Default::default).get(i)) else {
            return one(calls, scripts, &job, Instant::now() + calls.timeout).await;
        };
        // The one decision that may rewrite hundreds of members (a sliding log's refund, up to
        // `sliding_window_log::REACH`) goes at once and alone, so that no batch waits inside
        // Redis for one, or for many of them in one call.
        if job.op == Op::Refund && job.algorithm == Algorithm::SlidingWindowLog {
            return one(calls, scripts, &job, Instant::now() + calls.timeout).await;
        }
        let waiting = {
            let mut state = lane.lock();
            if state.in_flight >= DEPTH {
                let (answer, receiver) = oneshot::channel();
                state.queue.push_back(Waiting {
                    job,
                    since: Instant::now(),
                    answer,
                });
                Err(receiver)
            } else {
                state.in_flight += 1;
                Ok(job)
            }
        };
        match waiting {
            Ok(job) => {
                // Hands the lane on however this call ends, its caller gone included.
                let _turn = Turn {
                    batches: self,
                    lane,
                    calls,
                    scripts,
                };
                one(calls, scripts, &job, Instant::now() + calls.timeout).await
            }
            Err(receiver) => receiver.await.unwrap_or_else(|_| {
                Err(StoreError::outcome_unknown(
                    "the batch of this decision ended without an answer (the service is stopping)",
                ))
            }),
        }
    }

    /// Sends one batch and answers each of its decisions.
    async fn run(&self, calls: &Calls, scripts: &Scripts, mut batch: Vec<Waiting>) {
        // A caller that went away needs no answer, and a decision left with less than a quarter
        // of its deadline could hardly get one in time (the call before it hung, most likely):
        // neither is sent, so that each outcome is known and nothing is consumed.
        batch.retain(|w| !w.answer.is_closed());
        let cutoff = Instant::now() + calls.timeout / 4;
        let late = |w: &Waiting| w.since + calls.timeout < cutoff;
        if batch.iter().any(late) {
            let (late, on_time): (Vec<Waiting>, Vec<Waiting>) = batch.into_iter().partition(late);
            metrics::counter!(m::REDIS_ERRORS, "kind" => "timeout").increment(late.len() as u64);
            for w in late {
                let _ = w.answer.send(Err(StoreError::unavailable(format!(
                    "not sent: the call before it held Redis past most of this decision's {} ms",
                    calls.timeout.as_millis()
                ))));
            }
            batch = on_time;
        }
        let Some(oldest) = batch.first() else {
            return;
        };
        let deadline = oldest.since + calls.timeout;
        let (jobs, senders): (Vec<Job>, Vec<_>) =
            batch.into_iter().map(|w| (w.job, w.answer)).unzip();
        if let [job] = &jobs[..] {
            let answer = one(calls, scripts, job, deadline).await;
            if let Some(sender) = senders.into_iter().next() {
                let _ = sender.send(answer);
            }
            return;
        }
        self.batches.increment(1);
        self.batched.increment(jobs.len() as u64);
        // On a Cluster the batch goes to the master of its first key's slot, which owns every
        // key of the lane as the slot map last read says.
        let cross_slot = calls.topology.is_some();
        let slot = key_slot(&jobs[0].key);
        let reply: Result<Value, StoreError> = calls
            .with_conn_until(Some(&jobs[0].key), deadline, async |conn| {
                match conn.query_at(command(&jobs, cross_slot), slot).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        Scripts::batch(cross_slot).load_async(conn).await?;
                        Ok(conn.query_at(command(&jobs, cross_slot), slot).await?)
                    }
                    other => Ok(other?),
                }
            })
            .await;
        match reply {
            Ok(reply) => {
                let mut answers = answers(reply, &jobs);
                // A key whose slot moved away from that master (a failover, a resharding, not
                // yet in the map): its decision, refused whole, goes again alone, routed by key.
                for (job, answer) in jobs.iter().zip(answers.iter_mut()) {
                    if matches!(answer, Err(e) if e.to_string().contains(NON_LOCAL)) {
                        *answer = one(calls, scripts, job, deadline).await;
                    }
                }
                for (sender, answer) in senders.into_iter().zip(answers) {
                    let _ = sender.send(answer);
                }
            }
            Err(e) => {
                for sender in senders {
                    let _ = sender.send(Err(e.duplicate()));
                }
            }
        }
    }
}

/// Redis's error for a key that the Cluster node running the script does not serve.
const NON_LOCAL: &str = "non local key";

/// One decision alone, with its own script.
async fn one(calls: &Calls, scripts: &Scripts, job: &Job, deadline: Instant) -> Answer {
    let script = scripts.single(job.op, job.algorithm);
    let reply: Value = calls
        .with_conn_until(Some(&job.key), deadline, async |conn| {
            let mut call = script.prepare_invoke();
            call.key(job.key.as_str());
            push_args(&mut call, &job.args);
            Ok(call.invoke_async(conn).await?)
        })
        .await?;
    verdict(&reply, 1, job.op)
}

fn push_args(call: &mut redis::ScriptInvocation<'_>, args: &[Option<u64>]) {
    for arg in args {
        match arg {
            Some(n) => call.arg(*n),
            None => call.arg(""),
        };
    }
}

/// The lane's turn at Redis, held by the call in flight; when it ends, the queue goes next.
struct Turn<'a> {
    batches: &'a Arc<Batches>,
    lane: &'a Arc<Lane>,
    calls: &'a Calls,
    scripts: &'a Arc<Scripts>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let Some(batch) = self.lane.next(self.batches.max) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to send from (it is stopping).
            self.lane.reset();
            return;
        };
        let batches = self.batches.clone();
        let sending = Sending {
            lane: self.lane.clone(),
            done: false,
        };
        let (calls, scripts) = (self.calls.clone(), self.scripts.clone());
        runtime.spawn(async move {
            let mut batch = batch;
            loop {
                batches.run(&calls, &scripts, batch).await;
                match sending.lane.next(batches.max) {
                    Some(next) => batch = next,
                    None => return sending.finish(),
                }
            }
        });
    }
}
