//! The Redis store's leases: one call of `lua/concurrency.lua` per lease call, the estimate of
//! Redis's clock a take's deadline is put on, and the lease index ([`key::lease_index`]) that
//! tells the sweep which ledgers may hold leases.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use redis::Value;

use super::argv::{read_only, Arg};
use super::RedisStore;
use crate::limiter::concurrency::{LeaseAnswer, LeaseCall, LeaseOp};
use crate::policy::{LimitKey, Policy};
use crate::store::{key, memory, LeasedLedger, StoreError, MAX_INDEX_READ};
use crate::telemetry::Summarized;

/// Takes a lease index entry out unless its score changed since it was read: KEYS[1] the
/// index, ARGV[1] the member, ARGV[2] the score read.
const UNINDEX: &str = "local s = redis.call('ZSCORE', KEYS[1], ARGV[1]) \
    if s and tonumber(s) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end \
    return 0";

static UNINDEX_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(UNINDEX));

// A panic while the index cache is locked leaves it whole (entries are replaced whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How much later than its sender gives up a take is still granted on Redis, in µs: it covers
/// the error of the estimate of Redis's clock (a round trip, and clocks that drift between two
/// answers or differ between a Cluster's masters).
pub const TAKE_DEADLINE_SLACK_US: u64 = 1_000_000;

/// How far past a lease's expiry an index entry is written (µs), so that the takes and
/// renewals of the next minute find it written already: one index write a minute per policy
/// in use and instance, not one per call.
pub const INDEX_AHEAD_US: u64 = 60_000_000;

/// `lua/concurrency.lua`'s reply, `{ok, in_use, expires_in_us, retry_after_us, expired, leases,
/// now}`, as an answer.
fn lease_answer(reply: &Value) -> Result<LeaseAnswer, StoreError> {
    let numbers = match reply {
        Value::Array(items) if items.len() == 7 => items
            .iter()
            .map(|item| match item {
                Value::Int(i) => u64::try_from(*i).ok(),
                _ => None,
            })
            .collect::<Option<Vec<u64>>>(),
        _ => None,
    };
    match numbers.as_deref() {
        Some(&[ok, in_use, expires_in_us, retry_after_us, expired, leases, at_us]) => {
            Ok(LeaseAnswer {
                ok: ok == 1,
                in_use,
                expires_in_us,
                retry_after_us,
                expired,
                leases,
                at_us,
            })
        }
        _ => Err(StoreError::corrupt(format!(
            "concurrency.lua answered {reply:?}"
        ))),
    }
}

impl RedisStore {
    /// One call of `lua/concurrency.lua`: on the subject `key`'s leases and the policy's ledger,
    /// or, for a sweep (`key` `None`), on the ledger alone. A take or a renewal first makes sure
    /// the lease index holds the policy until after the lease's expiry (see
    /// [`RedisStore::index_ledger`]). A take refused for its deadline is
    /// [`StoreError::Unavailable`]: it holds nothing, and its sender has given up on it.
    pub(super) async fn lease_script(
        &self,
        policy: &Policy,
        key: Option<&LimitKey>,
        call: LeaseCall<'_>,
        now_us: Option<u64>,
    ) -> Result<LeaseAnswer, StoreError> {
        if let Some(problem) = call.problem() {
            return Err(StoreError::server(format!("refused lease call: {problem}")));
        }
        if key.is_none() != (call.op == LeaseOp::Sweep) {
            return Err(StoreError::server(
                "refused lease call: a sweep, and only a sweep, names no subject",
            ));
        }
        let (name, incarnation) = (policy.name.as_str(), policy.incarnation());
        let holds = matches!(call.op, LeaseOp::Take | LeaseOp::Renew);
        if holds {
            let until = self.redis_now_us(now_us).saturating_add(call.lease_us);
            self.index_ledger(name, incarnation, until).await;
        }
        let mut ledger = String::new();
        key::lease_ledger(&mut ledger, &self.prefix, name, incarnation);
        let mut subject = String::new();
        if let Some(k) = key {
            key::lease_key(&mut subject, &self.prefix, name, incarnation, k.as_str());
        }
        let both = [ledger, subject];
        let keys = if key.is_some() { &both[..] } else { &both[..1] };
        // ARGV as lua/concurrency.lua lays it out.
        let argv = || {
            [
                Arg::Str(call.op.as_str()),
                Arg::Str(call.member),
                Arg::Num(Some(call.cost)),
                Arg::Num(Some(call.lease_us)),
                Arg::Num(Some(call.limit)),
                Arg::Num(now_us),
                Arg::Num(call.deadline_us),
            ]
        };
        let reply: Value = self
            .with_conn_on(Some(&keys[0]), async |conn| {
                if call.op == LeaseOp::Look {
                    let script = &self.scripts.lease_look;
                    return Ok(read_only(script, keys, argv().into_iter(), conn).await?);
                }
                let mut invoke = self.scripts.lease_change.prepare_invoke();
                for k in keys {
                    invoke.key(k);
                }
                for arg in argv() {
                    invoke.arg(arg);
                }
                Ok(invoke.invoke_async(conn).await?)
            })
            .await?;
        let answer = lease_answer(&reply)?;
        if now_us.is_none() {
            let offset = i128::from(answer.at_us) - i128::from(memory::system_now_us());
            let offset = i64::try_from(offset).unwrap_or(0);
            self.clock_offset_us.store(offset, Ordering::Relaxed);
        }
        if call.op == LeaseOp::Take
            && !answer.ok
            && call.deadline_us.is_some_and(|d| answer.at_us > d)
        {
            return Err(StoreError::unavailable(
                "the take reached Redis after its deadline and was refused: nothing is held",
            ));
        }
        if holds && answer.ok {
            // The estimate of Redis's clock was off by more than the index's margin: write it
            // again from what Redis said.
            let until = answer.at_us.saturating_add(answer.expires_in_us);
            self.index_ledger(name, incarnation, until).await;
        }
        Ok(answer)
    }

    /// The time on Redis's clock: `now_us` when the caller drives time, else this machine's
    /// clock corrected by the latest offset seen.
    fn redis_now_us(&self, now_us: Option<u64>) -> u64 {
        now_us.unwrap_or_else(|| {
            let offset = self.clock_offset_us.load(Ordering::Relaxed);
            memory::system_now_us().saturating_add_signed(offset)
        })
    }

    /// Makes sure the lease index (see [`key::lease_index`]) holds the policy's ledger until
    /// `until` (µs, Redis's clock) at least: unless this instance wrote it to hold longer
    /// already, one `ZADD GT` of `until` + [`INDEX_AHEAD_US`]. Written before the take or
    /// renewal it covers, so that a lease is never in a ledger the index does not hold while
    /// the write succeeds; one that fails is logged and written again by the next call (the
    /// sweep meanwhile misses the ledger, and its expiries are counted by the policy's next
    /// lease call instead).
    async fn index_ledger(&self, name: &str, incarnation: u64, until: u64) {
        let member = key::lease_index_member(name, incarnation);
        let held = lock(&self.indexed).get(&member).copied().unwrap_or(0);
        if held >= until {
            return;
        }
        let score = until.saturating_add(INDEX_AHEAD_US);
        let index = key::lease_index(&self.prefix);
        let written = self
            .with_conn_on(Some(&index), async |conn| {
                let _: i64 = redis::cmd("ZADD")
                    .arg(&index)
                    .arg("GT")
                    .arg(score)
                    .arg(&member)
                    .query_async(conn)
                    .await?;
                Ok(())
            })
            .await;
        match written {
            Ok(()) => {
                let mut indexed = lock(&self.indexed);
                let entry = indexed.entry(member).or_default();
                *entry = (*entry).max(score);
            }
            Err(e) => {
                static UNINDEXED: Summarized = Summarized::per_second();
                if let Some(count) = UNINDEXED.hit() {
                    tracing::warn!(policy = name, error = %e, count, "could not index a concurrency policy's ledger for the lease sweep; its next lease call tries again");
                }
            }
        }
    }

    /// The lease index's entries, at most [`MAX_INDEX_READ`] (see [`crate::store::Store::leased_ledgers`]).
    pub(super) async fn read_lease_index(&self) -> Result<Vec<LeasedLedger>, StoreError> {
        let index = key::lease_index(&self.prefix);
        let entries: Vec<(String, u64)> = self
            .with_conn_on(Some(&index), async |conn| {
                Ok(redis::cmd("ZRANGE")
                    .arg(&index)
                    .arg(0)
                    .arg(MAX_INDEX_READ - 1)
                    .arg("WITHSCORES")
                    .query_async(conn)
                    .await?)
            })
            .await?;
        // What this instance wrote and has passed is forgotten: its next take writes it again.
        let now = self.redis_now_us(None);
        lock(&self.indexed).retain(|_, until| *until > now);
        Ok(entries
            .into_iter()
            .filter_map(|(member, until_us)| {
                let (policy, incarnation) = key::parse_lease_index_member(&member)?;
                Some(LeasedLedger {
                    policy: policy.to_owned(),
                    incarnation,
                    until_us,
                })
            })
            .collect())
    }

    /// Takes an entry out of the lease index (see [`crate::store::Store::unindex_ledger`]).
    pub(super) async fn unindex(&self, entry: &LeasedLedger) -> Result<(), StoreError> {
        let index = key::lease_index(&self.prefix);
        let member = key::lease_index_member(&entry.policy, entry.incarnation);
        self.with_conn_on(Some(&index), async |conn| {
            let _: i64 = UNINDEX_SCRIPT
                .key(&index)
                .arg(&member)
                .arg(entry.until_us)
                .invoke_async(conn)
                .await?;
            Ok(())
        })
        .await?;
        lock(&self.indexed).remove(&member);
        Ok(())
    }

    /// When a take sent now is refused by Redis (see [`crate::store::Store::lease_deadline`]).
    pub(super) fn take_deadline(&self, now_us: Option<u64>) -> Option<u64> {
        let timeout = u64::try_from(self.calls.timeout.as_micros()).unwrap_or(u64::MAX);
        Some(
            self.redis_now_us(now_us)
                .saturating_add(timeout)
                .saturating_add(TAKE_DEADLINE_SLACK_US),
        )
    }
}
