//! The Redis store: one Lua script per decision (several one-limit decisions of a thread may
//! share a call: [`batch`]), every call bounded by `redis.timeout_ms` and guarded by a circuit
//! breaker ([`calls`]). Here: the store and its [`Store`] implementation. Beside it: the calling
//! convention of `lua/common.lua` that the direct and the batched call read (`argv.rs`), the
//! policy codec (`codec.rs`), redis-rs errors (`error.rs`), leases (`leases.rs`), the servers'
//! version, scripts, masters and breakers (`server.rs`), what the instances share (`peer.rs`), the
//! top offenders' summaries folded by every instance (`top.rs`), the least privilege it needs
//! on Redis (`acl.rs`).

pub mod acl;
pub mod batch;
pub mod breaker;
pub mod calls;
pub mod connection;
pub mod scripts;
pub mod tls;
pub mod topology;

mod argv;
mod codec;
mod error;
mod leases;
mod peer;
mod server;
mod top;

use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;

use self::argv::{invoke, read_only, reservation, script_argv, verdict, Arg};
use self::batch::{Batches, Job, DEFAULT_BATCH_MAX};
use self::breaker::Breaker;
use self::calls::Calls;
use self::codec::{decode, decode_override, encode, read_reply, ReadReply};
use self::connection::{Conn, ConnectionMode, Connections};
use self::scripts::Scripts;
use self::topology::Topology;
use super::key::{self, PolicyKeys};
use super::overrides::{self, OverrideStatus, OverrideWrite, OverrideWritten};
use super::Entry;
use super::{
    new_generation, Ask, Change, ChangePage, Etag, LeasePlan, LeasedLedger, Plan, PolicyWrite,
    Precondition, Store, StoreError, WriteStatus, Written, MAX_JOINT_LIMITS,
};
use crate::limiter::concurrency::{LeaseAnswer, LeaseCall};
use crate::limiter::{Op, Params, Verdict};
use crate::metrics as m;
use crate::policy::overrides::{Override, OverrideId};
use crate::policy::{LimitKey, Policy, PolicyName};

pub use self::error::redact_url;
pub use self::leases::{INDEX_AHEAD_US, TAKE_DEADLINE_SLACK_US};
pub use self::server::MIN_REDIS_VERSION;

/// The shared store.
pub struct RedisStore {
    calls: Calls,
    prefix: String,
    policy_keys: PolicyKeys,
    scripts: Arc<Scripts>,
    /// Where to subscribe to a channel: the server, or each seed node of a Cluster in turn.
    pubsub_urls: Vec<String>,
    /// `rediss://`: every connection's TLS, the subscriptions' included.
    tls: Option<Arc<tls::Tls>>,
    /// One-limit decisions that wait for their thread's call at Redis (on a Cluster, at the
    /// key's master) go together; `None` when `redis.batch_max` is 1.
    batches: Option<Arc<Batches>>,
    /// Redis's clock less this machine's, in µs, as of the latest lease answer: how a take's
    /// deadline (see [`Store::lease_deadline`]) is put on Redis's clock.
    clock_offset_us: AtomicI64,
    /// The lease index's entries (see [`key::lease_index`]) this instance wrote: member to the
    /// time it holds, so that a take or renewal writes it only when it would outlive it.
    indexed: Mutex<HashMap<String, u64>>,
}

impl RedisStore {
    /// Prepares the connections (see [`ConnectionMode`]). They are made on first use, so this
    /// fails only on a URL it cannot use; call [`Store::ping`] to find out whether Redis answers.
    pub fn open(
        url: &str,
        mode: ConnectionMode,
        connections: u32,
        timeout: Duration,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        Self::open_with_tls(url, mode, connections, timeout, prefix, None)
    }

    /// [`RedisStore::open`], over `tls` when `url` is `rediss://`.
    pub fn open_with_tls(
        url: &str,
        mode: ConnectionMode,
        connections: u32,
        timeout: Duration,
        prefix: &str,
        tls: Option<Arc<tls::Tls>>,
    ) -> Result<Self, StoreError> {
        let tls = tls.filter(|_| url.starts_with("rediss://"));
        let conns = Connections::open(url, mode, connections, tls.clone()).map_err(|e| {
            StoreError::server(format!("invalid redis.url {}: {e}", redact_url(url))).caused_by(e)
        })?;
        let plain = match url.strip_prefix("rediss://") {
            Some(rest) => format!("redis://{rest}"),
            None => url.to_owned(),
        };
        Ok(Self::on(conns, timeout, prefix, vec![plain], tls))
    }

    /// Opens the store on a Redis Cluster, connecting to it through any of `nodes`
    /// (`[user:password@]host:port`).
    pub async fn open_cluster(
        nodes: &[impl AsRef<str>],
        timeout: Duration,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        Self::open_cluster_with_tls(nodes, timeout, prefix, None).await
    }

    /// [`RedisStore::open_cluster`], every node over `tls` when given.
    pub async fn open_cluster_with_tls(
        nodes: &[impl AsRef<str>],
        timeout: Duration,
        prefix: &str,
        tls: Option<Arc<tls::Tls>>,
    ) -> Result<Self, StoreError> {
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let conns = Connections::open_cluster(&nodes, timeout, tls.clone()).await?;
        let urls = nodes.iter().map(|n| format!("redis://{n}")).collect();
        let mut store = Self::on(conns, timeout, prefix, urls, tls);
        store.calls.topology = Some(Arc::new(Topology::default()));
        if let Err(e) = store.refresh_topology().await {
            tracing::warn!(error = %e, "could not read the cluster's slot map; until it is read, one circuit breaker guards every master");
        }
        Ok(store)
    }

    fn on(
        conns: Connections,
        timeout: Duration,
        prefix: &str,
        pubsub_urls: Vec<String>,
        tls: Option<Arc<tls::Tls>>,
    ) -> Self {
        // The recorder must exist before a handle is taken, or the handle records nothing.
        let _ = m::handle();
        Self {
            calls: Calls {
                conns: Arc::new(conns),
                breaker: Arc::new(Breaker::new(5, Duration::from_secs(1))),
                topology: None,
                timeout,
                call_seconds: metrics::histogram!(m::REDIS_SECONDS),
            },
            prefix: prefix.to_owned(),
            policy_keys: PolicyKeys::new(prefix),
            scripts: Arc::new(Scripts::new()),
            pubsub_urls,
            tls,
            batches: Some(Arc::new(Batches::new(DEFAULT_BATCH_MAX))),
            clock_offset_us: AtomicI64::new(0),
            indexed: Mutex::new(HashMap::new()),
        }
    }

    /// Sets `redis.batch_max`, the most decisions one script call takes (1: no batches). A
    /// Cluster makes no batches whatever the setting.
    pub fn with_batch_max(mut self, max: usize) -> Self {
        self.batches =
            (max > 1 && self.calls.topology.is_none()).then(|| Arc::new(Batches::new(max)));
        self
    }

    /// Calls through the circuit breaker, within the deadline (see [`Calls`]).
    async fn with_conn<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut Conn) -> Result<T, StoreError> + Clone,
    {
        self.calls.with_conn_on(None, f).await
    }

    /// [`RedisStore::with_conn`] for a call on `key` (see [`Calls::with_conn_on`]).
    async fn with_conn_on<T, F>(&self, key: Option<&str>, f: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut Conn) -> Result<T, StoreError> + Clone,
    {
        self.calls.with_conn_on(key, f).await
    }

    /// One call of `policy_read.lua` with `args`.
    async fn policy_read(&self, args: &[&str]) -> Result<ReadReply, StoreError> {
        let keys = &self.policy_keys;
        let reply: Value = self
            .with_conn_on(Some(&keys.meta), async |conn| {
                let mut call = self.scripts.policy_read.prepare_invoke();
                call.key(&keys.meta).key(&keys.names).key(&keys.deleted);
                for arg in args {
                    call.arg(*arg);
                }
                Ok(call.invoke_async(conn).await?)
            })
            .await?;
        read_reply(reply)
    }
}

impl RedisStore {
    /// A reservation ([`Ask::Reserve`]): one call of `lua/reserve.lua` over the plan's limits
    /// and the subject's queue, never batched (its script is its own).
    async fn reserve(&self, plan: &Plan<'_>, max_wait_us: u64) -> Result<Verdict, StoreError> {
        let Plan {
            policy,
            key,
            params,
            at_us: now_us,
            ..
        } = *plan;
        let (names, n) = key::state_keys(&self.prefix, policy, key);
        let mut queue = String::new();
        key::queue_key(&mut queue, &self.prefix, policy.name.as_str(), key.as_str());
        let argv = || {
            script_argv(&params[..n], Op::Acquire, plan.cost(), &[], now_us)
                .chain(std::iter::once(Some(max_wait_us)))
        };
        let script = self.scripts.reserve(&params[..n]);
        let reply: Value = self
            .with_conn_on(Some(&names[0]), async |conn| {
                let keys = names[..n].iter().map(String::as_str);
                let keys = keys.chain(std::iter::once(queue.as_str()));
                Ok(invoke(&script, keys, argv(), conn).await?)
            })
            .await?;
        reservation(&reply, n)
    }
}

impl Store for RedisStore {
    async fn decide(&self, plan: &Plan<'_>) -> Result<Verdict, StoreError> {
        let Plan {
            policy,
            key,
            ask,
            params,
            at_us: now_us,
        } = *plan;
        let (op, cost, marks, ticket) = (ask.op(), ask.cost(), plan.marks(), plan.claim());
        if let Ask::Reserve { max_wait_us, .. } = ask {
            return self.reserve(plan, max_wait_us).await;
        }
        // A refund with a ticket goes alone: its script also keeps the ticket's record.
        if let (Some(batches), None) = (&self.batches, ticket) {
            if let Some(job) = Job::new(&self.prefix, plan) {
                return batches.decide(&self.calls, &self.scripts, job).await;
            }
        }
        let (names, n) = key::state_keys(&self.prefix, policy, key);
        // A ticket's record is one more key, on the subject's hash tag, and its units and end
        // two more arguments, after the marks (see `lua/common.lua`).
        let mut record = String::new();
        if let Some(t) = ticket {
            key::ticket_record(
                &mut record,
                &self.prefix,
                policy.name.as_str(),
                key.as_str(),
                t.id,
            );
        }
        let claim = ticket.map(|t| [Some(t.units), Some(t.ends_at_us)]);
        let argv = || {
            script_argv(&params[..n], op, cost, marks, now_us).chain(claim.into_iter().flatten())
        };
        let script = self.scripts.decision(params, op);
        let reply: Value = self
            .with_conn_on(Some(&names[0]), async |conn| {
                if op == Op::Peek {
                    let argv = argv().map(Arg::from);
                    return Ok(read_only(&script, &names[..n], argv, conn).await?);
                }
                let keys = names[..n].iter().map(String::as_str);
                let keys = keys.chain(ticket.map(|_| record.as_str()));
                Ok(invoke(&script, keys, argv(), conn).await?)
            })
            .await?;
        verdict(&reply, n, op)
    }

    async fn acquire_joint(&self, plans: &[Plan<'_>]) -> Result<Vec<Verdict>, StoreError> {
        let now_us = plans.first().and_then(|p| p.at_us);
        let mut names: Vec<String> = Vec::with_capacity(MAX_JOINT_LIMITS);
        let mut params: Vec<Params> = Vec::with_capacity(MAX_JOINT_LIMITS);
        // ARGV as `lua/common.lua` lays out a joint acquire: 0, the time, then each limit's cost
        // and parameters.
        let mut argv: Vec<Option<u64>> = vec![Some(0), now_us];
        for plan in plans {
            let (keys, n) = key::state_keys(&self.prefix, plan.policy, plan.key);
            for (name, p) in keys.into_iter().zip(plan.params).take(n) {
                names.push(name);
                params.push(*p);
                argv.push(Some(plan.cost()));
                argv.extend(p.script_args().as_slice().iter().copied().map(Some));
            }
        }
        if names.is_empty() || names.len() > MAX_JOINT_LIMITS {
            return Err(StoreError::server(format!(
                "a joint acquire decides 1 to {MAX_JOINT_LIMITS} limits, not {}",
                names.len()
            )));
        }
        let script = self.scripts.joint(&params);
        let reply: Value = self
            .with_conn_on(Some(&names[0]), async |conn| {
                let keys = names.iter().map(String::as_str);
                Ok(invoke(&script, keys, argv.iter().copied(), conn).await?)
            })
            .await?;
        let whole = verdict(&reply, names.len(), Op::Acquire)?;
        let mut decisions = whole.limits().iter();
        Ok(plans
            .iter()
            .map(|plan| {
                let mut v = Verdict::at(whole.at_us);
                for d in decisions.by_ref().take(plan.params.len()) {
                    v.push(*d);
                }
                v.allowed = whole.allowed;
                v
            })
            .collect())
    }

    async fn lease(&self, plan: &LeasePlan<'_>) -> Result<LeaseAnswer, StoreError> {
        self.lease_script(plan.policy, Some(plan.key), plan.call, plan.at_us)
            .await
    }

    async fn sweep_leases(
        &self,
        policy: &Policy,
        now_us: Option<u64>,
    ) -> Result<LeaseAnswer, StoreError> {
        self.lease_script(policy, None, LeaseCall::SWEEP, now_us)
            .await
    }

    async fn leased_ledgers(&self) -> Result<Vec<LeasedLedger>, StoreError> {
        self.read_lease_index().await
    }

    async fn unindex_ledger(&self, entry: &LeasedLedger) -> Result<(), StoreError> {
        self.unindex(entry).await
    }

    fn lease_deadline(&self, now_us: Option<u64>) -> Option<u64> {
        self.take_deadline(now_us)
    }

    async fn reset(&self, policy: &Policy, key: &LimitKey) -> Result<(), StoreError> {
        let (names, n) = key::state_keys(&self.prefix, policy, key);
        let mut queue = String::new();
        key::queue_key(&mut queue, &self.prefix, policy.name.as_str(), key.as_str());
        // One UNLINK of keys that share a hash tag: atomic, and one slot on a Cluster. UNLINK
        // rather than DEL: a log of thousands of members is freed outside Redis's main thread
        // (DEL took a millisecond for 10,000), so a reset costs Redis O(1) whatever it removes.
        self.with_conn_on(Some(&names[0]), async |conn| {
            let mut del = redis::cmd("UNLINK");
            for name in &names[..n] {
                del.arg(name.as_str());
            }
            del.arg(queue.as_str());
            let _: i64 = del.query_async(conn).await?;
            Ok(())
        })
        .await
    }

    async fn write_policy(&self, w: PolicyWrite<'_>) -> Result<Written, StoreError> {
        let keys = &self.policy_keys;
        let hash = keys.hash(w.name.as_str());
        let overrides = keys.overrides_of(w.name.as_str());
        let precondition = match w.precondition {
            Precondition::None => "",
            Precondition::Absent => "*",
            Precondition::Exists => "+",
            Precondition::Matches(etag) => etag.as_str(),
        };
        let fields = w.policy.map(encode).unwrap_or_default();
        let generation = new_generation();
        let shape = w.policy.and_then(Policy::shape).unwrap_or_default();
        let kind = w.policy.map_or("", Policy::kind_name);
        let seen_shape = w.seen.and_then(Policy::shape).unwrap_or_default();
        let seen_kind = w.seen.map_or("", Policy::kind_name);
        let (status, generation, version, incarnation, owner): (String, String, u64, u64, String) =
            self.with_conn_on(Some(&keys.meta), async |conn| {
                let mut call = self.scripts.policy_write.prepare_invoke();
                call.key(&keys.meta)
                    .key(&keys.names)
                    .key(&keys.deleted)
                    .key(&keys.seeded)
                    .key(&hash)
                    .key(&keys.legacy_index)
                    .key(&keys.legacy_version)
                    .key(&keys.shapes)
                    .key(&overrides[0])
                    .key(&overrides[1])
                    .key(&overrides[2])
                    .arg(w.kind.as_str())
                    .arg(w.name.as_str())
                    .arg(precondition)
                    .arg(w.max_policies)
                    .arg(&generation)
                    .arg(&shape)
                    .arg(kind)
                    .arg(&seen_shape)
                    .arg(seen_kind);
                for (f, v) in &fields {
                    call.arg(f).arg(v);
                }
                Ok(call.invoke_async(conn).await?)
            })
            .await?;
        let status = WriteStatus::parse(&status)
            .ok_or_else(|| StoreError::corrupt(format!("policy_write.lua answered {status:?}")))?;
        Ok(Written {
            status,
            etag: Etag {
                generation: generation.into(),
                version,
            },
            incarnation,
            claimed_by: (status == WriteStatus::Claimed).then_some(owner),
        })
    }

    async fn policy_changes(&self, since: u64, max: usize) -> Result<ChangePage, StoreError> {
        let (since, max) = (since.to_string(), max.to_string());
        let (generation, version, floor, entries) = self
            .policy_read(&["changes", &since, &max, &self.policy_keys.hash_prefix])
            .await?;
        let changes = entries
            .into_iter()
            .map(|(name, version, fields)| {
                let entry = if fields.is_empty() {
                    None
                } else if overrides::parse_member(&name).is_some() {
                    match decode_override(fields) {
                        Ok(o) => Some(Entry::Override(o)),
                        Err(e) => {
                            tracing::error!(r#override = %name, error = %e, "ignoring a stored override that does not decode");
                            None
                        }
                    }
                } else {
                    match decode(fields) {
                        Ok(p) => Some(Entry::Policy(p)),
                        Err(e) => {
                            // One bad hash must not stop every other change from loading.
                            tracing::error!(policy = %name, error = %e, "ignoring a stored policy that does not decode");
                            None
                        }
                    }
                };
                Change {
                    name,
                    version,
                    entry,
                }
            })
            .collect();
        Ok(ChangePage {
            generation,
            version,
            floor,
            changes,
        })
    }

    async fn read_policy(&self, name: &PolicyName) -> Result<Option<(Policy, Etag)>, StoreError> {
        let hash = self.policy_keys.hash(name.as_str());
        let (generation, _, _, entries) = self.policy_read(&["one", name.as_str(), &hash]).await?;
        match (generation, entries.into_iter().next()) {
            (Some(generation), Some((_, version, fields))) if !fields.is_empty() => Ok(Some((
                decode(fields)?,
                Etag {
                    generation,
                    version,
                },
            ))),
            _ => Ok(None),
        }
    }

    async fn write_override(&self, w: OverrideWrite<'_>) -> Result<OverrideWritten, StoreError> {
        let keys = &self.policy_keys;
        let [ids, exact, pattern] = keys.overrides_of(w.policy.as_str());
        let doc_key = keys.override_hash(w.policy.as_str(), w.id.as_str());
        let policy_hash = keys.hash(w.policy.as_str());
        let precondition = match w.precondition {
            Precondition::None => "",
            Precondition::Absent => "*",
            Precondition::Exists => "+",
            Precondition::Matches(etag) => etag.as_str(),
        };
        let (canonical, class, cap, doc) = match w.doc {
            Some(o) => (
                overrides::canonical(&o.matches),
                overrides::class(&o.matches),
                w.caps.of(&o.matches),
                o.to_stored(),
            ),
            None => (String::new(), "", 0, String::new()),
        };
        let (status, generation, version, other): (String, String, u64, String) = self
            .with_conn_on(Some(&keys.meta), async |conn| {
                let mut call = self.scripts.override_write.prepare_invoke();
                call.key(&keys.meta)
                    .key(&keys.names)
                    .key(&keys.deleted)
                    .key(&ids)
                    .key(&exact)
                    .key(&pattern)
                    .key(&doc_key)
                    .key(&policy_hash)
                    .arg(w.op.as_str())
                    .arg(w.policy.as_str())
                    .arg(w.id.as_str())
                    .arg(w.policy_version)
                    .arg(precondition)
                    .arg(&canonical)
                    .arg(class)
                    .arg(cap)
                    .arg(&doc);
                Ok(call.invoke_async(conn).await?)
            })
            .await?;
        let status = OverrideStatus::parse(&status).ok_or_else(|| {
            StoreError::corrupt(format!("override_write.lua answered {status:?}"))
        })?;
        Ok(OverrideWritten {
            status,
            etag: Etag {
                generation: generation.into(),
                version,
            },
            other: (status == OverrideStatus::Conflict).then_some(other),
        })
    }

    async fn read_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
    ) -> Result<Option<(Override, Etag)>, StoreError> {
        let member = overrides::member(policy.as_str(), id.as_str());
        let hash = self.policy_keys.override_hash(policy.as_str(), id.as_str());
        let (generation, _, _, entries) = self.policy_read(&["one", &member, &hash]).await?;
        match (generation, entries.into_iter().next()) {
            (Some(generation), Some((_, version, fields))) if !fields.is_empty() => Ok(Some((
                decode_override(fields)?,
                Etag {
                    generation,
                    version,
                },
            ))),
            _ => Ok(None),
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_conn(async |conn| {
            let _: String = redis::cmd("PING").query_async(conn).await?;
            Ok(())
        })
        .await
    }
}
