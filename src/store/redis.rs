//! The Redis store: one Lua script per decision (several one-limit decisions of a thread may
//! share a call: `store::batch`), every call bounded by `redis.timeout_ms` and guarded by a
//! circuit breaker (`store::calls`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::{RedisError, Value};

use super::batch::{Batches, Job, DEFAULT_BATCH_MAX};
use super::breaker::{Breaker, BreakerState};
use super::calls::Calls;
use super::connection::{self, is_cluster_refusal, Conn, ConnectionMode, Connections};
use super::key::PolicyKeys;
use super::scripts::Scripts;
use super::topology::{parse_slots, Topology};
use super::{
    key, memory, new_generation, Change, ChangePage, ErrorClass, Etag, LeasePlan, Plan,
    PolicyWrite, Precondition, Store, StoreError, WriteStatus, Written, MAX_JOINT_LIMITS,
};
use super::{LeasedLedger, MAX_INDEX_READ};
use crate::limiter::concurrency::{LeaseAnswer, LeaseCall, LeaseOp};
use crate::limiter::{Decision, Op, Params, Verdict, MAX_LIMITS};
use crate::metrics as m;
use crate::policy::stored::{self, StoredDoc};
use crate::policy::{LimitKey, Policy, PolicyName};
use crate::telemetry::Summarized;

/// The shared store.
pub struct RedisStore {
    calls: Calls,
    prefix: String,
    policy_keys: PolicyKeys,
    scripts: Arc<Scripts>,
    /// Where to subscribe to a channel: the server, or each seed node of a Cluster in turn.
    pubsub_urls: Vec<String>,
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

impl From<RedisError> for StoreError {
    /// One classification of every redis-rs error. Errors that mean the command was not run
    /// (refused, wrong password, Redis still loading) are `Unavailable`; a connection that broke
    /// or a reply that did not parse may have come after Redis ran the command, so those are
    /// `OutcomeUnknown` (the store's `call` turns them into `Unavailable` when the connection
    /// proves nothing was sent); a Cluster's refusal of an unrun call for now (`CLUSTERDOWN`,
    /// `TRYAGAIN`, `MASTERDOWN`, or a `MOVED`/`ASK` the client stopped following) is
    /// `ClusterRefused`; any other error Redis answered the command with is `Server`. The
    /// redis-rs error is kept as the source.
    fn from(e: RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        let kind = e.kind();
        let ours = |what: &str| kind == ErrorKind::Client && e.to_string().starts_with(what);
        let error = if ours(connection::CLUSTER_REFUSED)
            || is_cluster_refusal(e.code())
            || matches!(e.code(), Some("MOVED" | "ASK"))
        {
            StoreError::cluster_refused(e.to_string())
        } else if ours(connection::SENT_THEN_FAILED) {
            StoreError::outcome_unknown(format!("connection failed: {e}"))
        } else if kind == ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        {
            StoreError::unavailable(format!("authentication failed: {e}"))
        } else if e.is_connection_refusal() {
            StoreError::unavailable(format!("connection refused: {e}"))
        } else if kind == ErrorKind::Server(ServerErrorKind::BusyLoading) {
            StoreError::unavailable(format!("Redis is loading its data: {e}"))
        } else if e.is_io_error()
            || e.is_unrecoverable_error()
            || kind == ErrorKind::ClusterConnectionNotFound
        {
            StoreError::outcome_unknown(format!("connection failed: {e}"))
        } else {
            StoreError::server(e.to_string())
        };
        error.caused_by(e)
    }
}

/// The URL with any password replaced, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
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
        let conns = Connections::open(url, mode, connections).map_err(|e| {
            StoreError::server(format!("invalid redis.url {}: {e}", redact_url(url))).caused_by(e)
        })?;
        Ok(Self::on(conns, timeout, prefix, vec![url.to_owned()]))
    }

    /// Opens the store on a Redis Cluster, connecting to it through any of `nodes`
    /// (`[user:password@]host:port`).
    pub async fn open_cluster(
        nodes: &[impl AsRef<str>],
        timeout: Duration,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let conns = Connections::open_cluster(&nodes, timeout).await?;
        let urls = nodes.iter().map(|n| format!("redis://{n}")).collect();
        let mut store = Self::on(conns, timeout, prefix, urls);
        store.calls.topology = Some(Arc::new(Topology::default()));
        if let Err(e) = store.refresh_topology().await {
            tracing::warn!(error = %e, "could not read the cluster's slot map; until it is read, one circuit breaker guards every master");
        }
        Ok(store)
    }

    fn on(conns: Connections, timeout: Duration, prefix: &str, pubsub_urls: Vec<String>) -> Self {
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
            batches: Some(Arc::new(Batches::new(DEFAULT_BATCH_MAX))),
            clock_offset_us: AtomicI64::new(0),
            indexed: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the store is a Redis Cluster, where the keys of different subjects are on
    /// different slots and no one script may decide them together.
    pub fn is_cluster(&self) -> bool {
        self.calls.topology.is_some()
    }

    /// Reads a Cluster's slot map again (`CLUSTER SLOTS`), so that each master's calls go
    /// through its own breaker (see [`super::topology`]); nothing on one Redis. Not through a
    /// breaker: it is how a master that came back, or a promoted replica, is found.
    pub async fn refresh_topology(&self) -> Result<(), StoreError> {
        let Some(topology) = &self.calls.topology else {
            return Ok(());
        };
        let read = async {
            let mut conn = self.calls.conns.get().await?;
            let reply: Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await?;
            Ok::<_, StoreError>(reply)
        };
        let reply = tokio::time::timeout(self.calls.timeout.max(Duration::from_secs(1)), read)
            .await
            .map_err(|_| StoreError::unavailable("CLUSTER SLOTS timed out"))??;
        let ranges = parse_slots(&reply)
            .ok_or_else(|| StoreError::corrupt(format!("CLUSTER SLOTS answered {reply:?}")))?;
        topology.update(&ranges, &self.calls.breaker);
        Ok(())
    }

    /// The store's breaker state as readiness and metrics report it: on one Redis, its breaker's;
    /// on a Cluster whose slot map is known, `open` only when every master's breaker is (no key
    /// can be decided), `closed` when every one is closed, and `half_open` in between (some
    /// masters' keys are answered by fail mode).
    pub fn breaker_state(&self) -> BreakerState {
        let masters = self.master_breakers();
        if masters.is_empty() {
            return self.calls.breaker.state();
        }
        let open = masters
            .iter()
            .filter(|(_, s)| *s == BreakerState::Open)
            .count();
        let closed = masters
            .iter()
            .filter(|(_, s)| *s == BreakerState::Closed)
            .count();
        if open == masters.len() {
            BreakerState::Open
        } else if closed == masters.len() {
            self.calls.breaker.state()
        } else {
            BreakerState::HalfOpen
        }
    }

    /// Proves that each Cluster master takes writes, with a flagged script that may write and
    /// writes nothing (Redis refuses it while out of memory, as it would every decision),
    /// sent to each master by address: `(master, what it answered)`; empty on one Redis. A
    /// master whose breaker is open is not asked (its breaker's last failure is reported).
    /// Not through a breaker: this is how readiness sees each master as it is.
    pub async fn probe_masters(&self) -> Vec<(String, Result<(), StoreError>)> {
        let masters = self.master_breakers();
        let probes = masters.into_iter().map(|(master, state)| async move {
            if state == BreakerState::Open {
                let cause = self
                    .calls
                    .topology
                    .as_ref()
                    .and_then(|t| t.breaker_of(&master))
                    .and_then(|b| b.cause())
                    .unwrap_or_default();
                return (
                    master,
                    Err(StoreError::unavailable(format!(
                        "circuit breaker open; last failure: {cause}"
                    ))),
                );
            }
            let answer = self.probe_master(&master).await;
            (master, answer)
        });
        futures_util::future::join_all(probes).await
    }

    async fn probe_master(&self, master: &str) -> Result<(), StoreError> {
        let Some((host, port)) = master
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        else {
            return Err(StoreError::corrupt(format!("master address {master:?}")));
        };
        let probe = async {
            let mut conn = self.calls.conns.get().await?;
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(PROBE_SCRIPT).arg(0);
            conn.query_by_address(cmd, host, port).await?;
            Ok::<_, StoreError>(())
        };
        tokio::time::timeout(self.calls.timeout, probe)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::outcome_unknown(format!(
                    "no answer within {} ms",
                    self.calls.timeout.as_millis()
                )))
            })
    }

    /// Each Cluster master's address and breaker state; empty on one Redis.
    pub fn master_breakers(&self) -> Vec<(String, BreakerState)> {
        self.calls
            .topology
            .as_deref()
            .map_or_else(Vec::new, Topology::states)
    }

    /// Publishes `message` on `channel`, through the breaker and within the timeout like any
    /// call. On a Cluster any node takes it, and the cluster passes it to every node.
    pub async fn publish(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        self.with_conn(async |conn| {
            let _receivers: i64 = redis::cmd("PUBLISH")
                .arg(channel)
                .arg(message)
                .query_async(conn)
                .await?;
            Ok(())
        })
        .await
    }

    /// Subscribes to `channel` on its own connection, at the first of the store's addresses
    /// that accepts within the timeout (a Cluster's messages reach every node): the
    /// subscription, whose messages end when its connection does.
    pub async fn subscribe(&self, channel: &str) -> Result<redis::aio::PubSub, StoreError> {
        let mut last = StoreError::unavailable("no address to subscribe at");
        for url in &self.pubsub_urls {
            let attempt = async {
                let client = redis::Client::open(url.as_str())?;
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, RedisError>(pubsub)
            };
            match tokio::time::timeout(self.calls.timeout.max(Duration::from_secs(1)), attempt)
                .await
            {
                Ok(Ok(pubsub)) => return Ok(pubsub),
                Ok(Err(e)) => last = e.into(),
                Err(_) => last = StoreError::unavailable("subscribing timed out"),
            }
        }
        Err(last)
    }

    /// The channel of the denial cache's invalidations (see `service::denials`).
    /// The ring of ticket keys (see `service::ticket::Keyring`), after making `fresh` its first
    /// key if it has none: one `SET NX GET`, so that instances starting together agree.
    pub async fn ticket_keys(&self, fresh: &str) -> Result<String, StoreError> {
        let name = key::ticket_keys(&self.prefix);
        self.with_conn_on(Some(&name), async |conn| {
            let old: Option<String> = redis::cmd("SET")
                .arg(&name)
                .arg(fresh)
                .arg("NX")
                .arg("GET")
                .query_async(conn)
                .await?;
            Ok(old.unwrap_or_else(|| fresh.to_owned()))
        })
        .await
    }

    /// Rotates the ring of ticket keys in one script call: `fresh` becomes the current key,
    /// with the next id, and the current one the previous; the previous one is dropped. Answers
    /// the new ring. A call sent again (after a broken connection) finds `fresh` current already
    /// and changes nothing, so it never ends the tickets of the key it just retired.
    pub async fn rotate_ticket_keys(
        &self,
        fresh: &[u8; crate::service::ticket::KEY_BYTES],
    ) -> Result<String, StoreError> {
        static ROTATE: LazyLock<redis::Script> = LazyLock::new(|| {
            redis::Script::new(
                "local cur = redis.call('GET', KEYS[1])\n\
                 local id, hex\n\
                 if cur then\n  id, hex = string.match(cur, '^(%d+):(%x+)')\nend\n\
                 if hex == ARGV[1] then\n  return cur\nend\n\
                 local text = '1:' .. ARGV[1]\n\
                 if id then\n  text = string.format('%d', tonumber(id) + 1) .. ':' .. ARGV[1] .. ' ' .. id .. ':' .. hex\nend\n\
                 redis.call('SET', KEYS[1], text)\n\
                 return text\n",
            )
        });
        let name = key::ticket_keys(&self.prefix);
        let hex: String = fresh.iter().map(|b| format!("{b:02x}")).collect();
        self.with_conn_on(Some(&name), async |conn| {
            Ok(ROTATE
                .key(name.as_str())
                .arg(hex.as_str())
                .invoke_async(conn)
                .await?)
        })
        .await
    }

    pub fn denials_channel(&self) -> String {
        format!("{}:denials", self.prefix)
    }

    /// Replaces the default circuit breaker (5 failures, 1 s cooldown), and on a Cluster each
    /// master's with one like it.
    pub fn with_breaker(mut self, breaker: Breaker) -> Self {
        if let Some(topology) = &self.calls.topology {
            topology.reset_breakers(&breaker);
        }
        self.calls.breaker = Arc::new(breaker);
        self
    }

    /// Sets `redis.batch_max`, the most decisions one script call takes (1: no batches). A
    /// Cluster makes no batches whatever the setting.
    pub fn with_batch_max(mut self, max: usize) -> Self {
        self.batches =
            (max > 1 && self.calls.topology.is_none()).then(|| Arc::new(Batches::new(max)));
        self
    }

    pub fn breaker(&self) -> &Breaker {
        &self.calls.breaker
    }

    /// Connections to Redis: `(in use, idle)`; shared connections all count as idle.
    pub fn pool_connections(&self) -> (u32, u32) {
        self.calls.conns.state()
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
}

/// A flagged script that declares no `no-writes`: Redis checks memory before running it, as
/// it does for the decision scripts, and it changes nothing.
const PROBE_SCRIPT: &str = "#!lua\nreturn 1";

/// The oldest Redis that runs the decision scripts: they are flagged scripts (see
/// [`super::scripts`]), which Redis before 7.0 reads as a syntax error.
pub const MIN_REDIS_VERSION: (u32, u32) = (7, 0);

impl RedisStore {
    /// Loads every script into Redis (on a Cluster, into every master), so that the first
    /// decisions after start-up do not all meet `NOSCRIPT` and send the script at once. A
    /// script missing later (Redis restarted, a failover) is still loaded on its first
    /// `NOSCRIPT`.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        for source in super::scripts::sources() {
            self.with_conn(async |conn| {
                let _: Value = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(source)
                    .query_async(conn)
                    .await?;
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    /// Fails unless every Redis behind this store (each master of a Cluster) is at least
    /// [`MIN_REDIS_VERSION`]; an older one would fail every decision script, and every acquire
    /// would be answered by fail mode. Run once at start-up. A Redis that refuses `INFO` is let
    /// through with a warning.
    pub async fn require_flagged_scripts(&self) -> Result<(), StoreError> {
        let info: redis::Value = match self
            .with_conn(async |conn| Ok(redis::cmd("INFO").arg("server").query_async(conn).await?))
            .await
        {
            Ok(info) => info,
            // A Redis that does not let us run INFO (an ACL, a renamed command) may well be new
            // enough: say what is needed rather than refuse to start.
            Err(e) if e.class() == ErrorClass::Refused => {
                tracing::warn!(
                    error = %e,
                    "cannot read the Redis version; the decision scripts need Redis {}.{} or later",
                    MIN_REDIS_VERSION.0,
                    MIN_REDIS_VERSION.1
                );
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let mut reports = Vec::new();
        texts(&info, &mut reports);
        let versions: Vec<&str> = reports
            .iter()
            .filter_map(|r| r.lines().find_map(|l| l.strip_prefix("redis_version:")))
            .map(str::trim)
            .collect();
        if versions.is_empty() {
            return Err(StoreError::Server(
                "`INFO server` reported no redis_version".into(),
            ));
        }
        match versions.iter().find(|v| !supports_script_flags(v)) {
            Some(old) => Err(StoreError::server(format!(
                "Redis {old} cannot run the decision scripts: they need Redis {}.{} or later \
                 (script flags)",
                MIN_REDIS_VERSION.0, MIN_REDIS_VERSION.1
            ))),
            None => Ok(()),
        }
    }
}

/// Every text in a reply: `INFO` answers one string, or on a Cluster one per master.
fn texts(value: &redis::Value, out: &mut Vec<String>) {
    match value {
        redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => out.push(s.clone()),
        redis::Value::VerbatimString { text, .. } => out.push(text.clone()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|v| texts(v, out));
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(_, v)| texts(v, out)),
        _ => {}
    }
}

/// Whether a `redis_version` (`7.0.15`, `6.2.14`…) is at least [`MIN_REDIS_VERSION`].
fn supports_script_flags(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= MIN_REDIS_VERSION
}

/// The hash field that holds a policy's document, as JSON.
const DOC_FIELD: &str = "doc";
/// The hash field that holds a policy's incarnation, which `lua/policy_write.lua` keeps: not
/// part of the document.
const BORN_FIELD: &str = "born";
/// The hash fields in which `lua/policy_write.lua` keeps the policy's kind and descriptor shape,
/// which it compares on the next write: derived from the document, not part of it.
const KEPT_FIELDS: [&str; 2] = ["kind", "shape"];

/// A policy as the fields of its hash: its document, as JSON, in one field, so that every value
/// keeps its JSON type.
fn encode(policy: &Policy) -> Vec<(String, String)> {
    let doc = serde_json::to_string(&policy.to_doc()).unwrap_or_default();
    vec![(DOC_FIELD.to_owned(), doc)]
}

/// A policy from the fields of its hash, validated like any input: the JSON document
/// ([`StoredDoc`]), or a hash written by a version before it ([`stored::from_legacy_fields`]).
/// Its incarnation is the `born` field, 0 in a hash written before policies had one.
fn decode(mut fields: Vec<(String, String)>) -> Result<Policy, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::corrupt(format!("policy hash: {e}"));
    let incarnation = match fields.iter().position(|(k, _)| k == BORN_FIELD) {
        Some(i) => {
            let (_, born) = fields.swap_remove(i);
            born.parse::<u64>()
                .map_err(|e| corrupt(&format!("{BORN_FIELD} {born:?}: {e}")))?
        }
        None => 0,
    };
    fields.retain(|(k, _)| !KEPT_FIELDS.contains(&k.as_str()));
    Ok(decode_doc(fields)?.with_incarnation(incarnation))
}

/// The document part of [`decode`]: the fields without `born`.
fn decode_doc(fields: Vec<(String, String)>) -> Result<Policy, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::corrupt(format!("policy hash: {e}"));
    if let Some((_, doc)) = fields.iter().find(|(k, _)| k == DOC_FIELD) {
        let doc = StoredDoc::from_json(doc).map_err(|e| corrupt(&e))?;
        return Policy::try_from(doc).map_err(|e| corrupt(&e));
    }
    stored::from_legacy_fields(fields).map_err(|e| corrupt(&e))
}

/// One `{name, version, fields}` entry of `policy_read.lua`'s reply.
type Entry = (String, u64, Vec<(String, String)>);

/// `policy_read.lua`'s reply: `(generation, version, floor, entries)`.
type ReadReply = (Option<Arc<str>>, u64, u64, Vec<Entry>);

fn read_reply(reply: Value) -> Result<ReadReply, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| {
        StoreError::corrupt(format!("policy_read.lua answered an unexpected shape: {e}"))
    };
    let Value::Array(items) = reply else {
        return Err(corrupt(&"not an array"));
    };
    let mut items = items.into_iter();
    let mut next = || items.next().ok_or_else(|| corrupt(&"too short"));
    let generation: Option<String> = redis::from_redis_value(next()?).map_err(|e| corrupt(&e))?;
    let version: u64 = redis::from_redis_value(next()?).map_err(|e| corrupt(&e))?;
    let floor: u64 = redis::from_redis_value(next()?).map_err(|e| corrupt(&e))?;
    let entries = items
        .map(redis::from_redis_value::<Entry>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| corrupt(&e))?;
    Ok((generation.map(Arc::from), version, floor, entries))
}

/// A decision script's reply (see `lua/common.lua`: `{allowed, then per limit: units,
/// remaining, reset_after_us, retry_after_us; then now}`) as a verdict: for a report or a refund
/// each limit's units are those it recorded or gave back, and the limit counts as admitting.
/// Read straight from the reply, without collecting it into a second vector on the acquire path.
pub(super) fn verdict(reply: &Value, limits: usize, op: Op) -> Result<Verdict, StoreError> {
    let items = match reply {
        Value::Array(items) if items.len() == 2 + 4 * limits => items,
        other => {
            return Err(StoreError::corrupt(format!(
                "a decision script answered {other:?} for {limits} limits"
            )))
        }
    };
    let mut numbers = [0u64; 2 + 4 * MAX_LIMITS];
    for (n, item) in numbers.iter_mut().zip(items) {
        *n = match item {
            Value::Int(i) => u64::try_from(*i).unwrap_or(0),
            other => {
                return Err(StoreError::corrupt(format!(
                    "a decision script answered {other:?} where a number belongs"
                )))
            }
        };
    }
    let mut verdict = Verdict::at(numbers[1 + 4 * limits]);
    let moves = matches!(op, Op::Report | Op::Refund);
    for d in numbers[1..1 + 4 * limits].chunks_exact(4) {
        let decision = Decision {
            allowed: moves || d[0] == 1,
            remaining: d[1],
            reset_after_us: d[2],
            retry_after_us: d[3],
        };
        verdict.push_units(decision, if moves { d[0] } else { 0 });
    }
    // The script's own verdict; it equals every limit admitting.
    verdict.allowed = numbers[0] == 1;
    Ok(verdict)
}

/// A decision script's ARGV as `lua/common.lua` lays it out for these limits; `None` is an empty
/// argument.
pub(super) fn script_argv<'a>(
    params: &'a [Params],
    op: Op,
    cost: u64,
    marks: &'a [u64],
    now_us: Option<u64>,
) -> impl Iterator<Item = Option<u64>> + 'a {
    let n = params.len();
    let params = params.iter().flat_map(|p| p.script_args()).map(Some);
    // A refund's marks: one per limit, or all empty (no ticket).
    let marks = (op == Op::Refund)
        .then(|| (0..n).map(move |i| marks.get(i).copied().filter(|_| marks.len() == n)))
        .into_iter()
        .flatten();
    [Some(cost), now_us].into_iter().chain(params).chain(marks)
}

/// Runs a prepared call of a `no-writes` script with `EVALSHA_RO`, which Redis refuses for any
/// script that could write, loading the script first when Redis does not have it (as
/// `invoke_async` does for `EVALSHA`).
async fn read_only(
    script: &redis::Script,
    keys: &[String],
    argv: impl Iterator<Item = impl redis::ToRedisArgs>,
    conn: &mut Conn,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVALSHA_RO");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    for arg in argv {
        cmd.arg(arg);
    }
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// One script argument: a number, a string, or (for `None`) the empty string.
enum Arg<'a> {
    Num(Option<u64>),
    Str(&'a str),
}

impl From<Option<u64>> for Arg<'_> {
    fn from(n: Option<u64>) -> Self {
        Arg::Num(n)
    }
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            Arg::Num(Some(n)) => n.write_redis_args(out),
            Arg::Num(None) => out.write_arg(b""),
            Arg::Str(s) => s.write_redis_args(out),
        }
    }
}

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
    async fn lease_script(
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
                let mut call = script.prepare_invoke();
                for name in &names[..n] {
                    call.key(name.as_str());
                }
                if ticket.is_some() {
                    call.key(record.as_str());
                }
                for arg in argv() {
                    match arg {
                        Some(v) => call.arg(v),
                        None => call.arg(""),
                    };
                }
                Ok(call.invoke_async(conn).await?)
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
                let mut call = script.prepare_invoke();
                for name in &names {
                    call.key(name.as_str());
                }
                for arg in &argv {
                    match arg {
                        Some(v) => call.arg(*v),
                        None => call.arg(""),
                    };
                }
                Ok(call.invoke_async(conn).await?)
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

    async fn unindex_ledger(&self, entry: &LeasedLedger) -> Result<(), StoreError> {
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

    fn lease_deadline(&self, now_us: Option<u64>) -> Option<u64> {
        let timeout = u64::try_from(self.calls.timeout.as_micros()).unwrap_or(u64::MAX);
        Some(
            self.redis_now_us(now_us)
                .saturating_add(timeout)
                .saturating_add(TAKE_DEADLINE_SLACK_US),
        )
    }

    async fn reset(&self, policy: &Policy, key: &LimitKey) -> Result<(), StoreError> {
        let (names, n) = key::state_keys(&self.prefix, policy, key);
        // One UNLINK of keys that share a hash tag: atomic, and one slot on a Cluster. UNLINK
        // rather than DEL: a log of thousands of members is freed outside Redis's main thread
        // (DEL took a millisecond for 10,000), so a reset costs Redis O(1) whatever it removes.
        self.with_conn_on(Some(&names[0]), async |conn| {
            let mut del = redis::cmd("UNLINK");
            for name in &names[..n] {
                del.arg(name.as_str());
            }
            let _: i64 = del.query_async(conn).await?;
            Ok(())
        })
        .await
    }

    async fn write_policy(&self, w: PolicyWrite<'_>) -> Result<Written, StoreError> {
        let keys = &self.policy_keys;
        let hash = keys.hash(w.name.as_str());
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
                let policy = if fields.is_empty() {
                    None
                } else {
                    match decode(fields) {
                        Ok(p) => Some(p),
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
                    policy,
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

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_conn(async |conn| {
            let _: String = redis::cmd("PING").query_async(conn).await?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, FailMode};

    #[test]
    fn a_policy_is_stored_as_its_json_document_and_read_back_unchanged() {
        let name = PolicyName::parse("007").expect("valid");
        // A name and a description that look like numbers stay strings.
        let policy = Policy::single(
            name,
            Algorithm::TokenBucket,
            &[20, 10, 1_000],
            Some("42".into()),
            FailMode::Closed,
        );
        let fields = encode(&policy);
        assert_eq!(fields.len(), 1);
        assert_eq!(decode(fields).expect("decodes"), policy);
    }

    #[test]
    fn hashes_written_field_by_field_by_earlier_versions_still_decode() {
        let fields = [
            ("name", "login"),
            ("algorithm", "fixed_window"),
            ("limit", "5"),
            ("window_ms", "60000"),
            ("description", "5 a minute"),
            ("fail_mode", "open"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec();
        let policy = decode(fields).expect("decodes");
        assert_eq!(policy.params()[0].quota(), 5);
        assert_eq!(policy.description.as_deref(), Some("5 a minute"));
    }

    #[test]
    fn the_incarnation_is_read_from_its_own_field_in_either_layout() {
        let name = PolicyName::parse("p").expect("valid");
        let policy = Policy::single(
            name,
            Algorithm::FixedWindow,
            &[5, 1_000],
            None,
            FailMode::Open,
        );
        let mut fields = encode(&policy);
        assert_eq!(decode(fields.clone()).expect("decodes").incarnation(), 0);
        fields.push((BORN_FIELD.to_owned(), "42".to_owned()));
        let read = decode(fields).expect("decodes");
        assert_eq!((read.incarnation(), read.to_doc()), (42, policy.to_doc()));

        // A hash of the earlier layout, one field per policy field, never hands `born` to the
        // validation, which would refuse it as an unknown field.
        let legacy = [
            ("name", "p"),
            ("algorithm", "fixed_window"),
            ("limit", "5"),
            ("window_ms", "1000"),
            ("fail_mode", "open"),
            ("born", "9"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec();
        let read = decode(legacy).expect("decodes");
        assert_eq!((read.incarnation(), read.to_doc()), (9, policy.to_doc()));

        let bad = vec![(BORN_FIELD.to_owned(), "x".to_owned())];
        assert!(matches!(decode(bad), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn a_stored_document_out_of_bounds_is_corrupt_as_input_would_be_refused() {
        for doc in [
            r#"{"name":"p","algorithm":"fixed_window","limit":0,"window_ms":1000}"#,
            r#"{"name":"p","algorithm":"fixed_window","limit":5,"window_ms":1000,"colour":1}"#,
            r#"{"name":"p","algorithm":"concurrency","limit":5,"lease_ms":1000,"mode":"shadow"}"#,
            r#"{"name":"p","limits":[]}"#,
            r#"not json"#,
        ] {
            let fields = vec![(DOC_FIELD.to_owned(), doc.to_owned())];
            assert!(
                matches!(decode(fields), Err(StoreError::Corrupt(_))),
                "{doc}"
            );
        }
    }

    #[test]
    fn script_flags_need_redis_7() {
        for old in ["6.2.14", "6.0.0", "5.0.7", "garbage", ""] {
            assert!(!supports_script_flags(old), "{old}");
        }
        for new in ["7.0.0", "7.0.15", "7.2.4", "8.0.1", "10.0"] {
            assert!(supports_script_flags(new), "{new}");
        }
    }

    #[test]
    fn passwords_never_reach_the_logs() {
        assert_eq!(
            redact_url("redis://:s3cret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redact_url("redis://user:s3cret@host"),
            "redis://user:***@host"
        );
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
    }
}
