//! The Redis store: one Lua script call per decision, every call bounded by `redis.timeout_ms`
//! and guarded by a circuit breaker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::{AsyncCommands, RedisError};
use serde_json::{Map, Number, Value};

use super::breaker::Breaker;
use super::connection::{Conn, ConnectionMode, Connections};
use super::scripts::Scripts;
use super::{key, PutOutcome, Store, StoreError};
use crate::limiter::Decision;
use crate::metrics as m;
use crate::policy::{parse_policy, LimitKey, Params, Policy, PolicyName};

/// The shared store.
pub struct RedisStore {
    conns: Connections,
    prefix: String,
    timeout: Duration,
    scripts: Scripts,
    breaker: Breaker,
    /// Registered once: a lookup by name on every call would cost more than recording.
    call_seconds: metrics::Histogram,
}

impl From<RedisError> for StoreError {
    /// One classification of every redis-rs error. Errors that mean the command was not run
    /// (refused, wrong password, Redis still loading) are `Unavailable`; a connection that broke
    /// or a reply that did not parse may have come after Redis ran the command, so those are
    /// `OutcomeUnknown` (the store's `call` turns them into `Unavailable` when the connection
    /// proves nothing was sent); an error Redis answered the command with is `Server`.
    fn from(e: RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        let kind = e.kind();
        if kind == ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        {
            StoreError::Unavailable(format!("authentication failed: {e}"))
        } else if e.is_connection_refusal() {
            StoreError::Unavailable(format!("connection refused: {e}"))
        } else if kind == ErrorKind::Server(ServerErrorKind::BusyLoading) {
            StoreError::Unavailable(format!("Redis is loading its data: {e}"))
        } else if e.is_io_error()
            || e.is_unrecoverable_error()
            || kind == ErrorKind::ClusterConnectionNotFound
        {
            StoreError::OutcomeUnknown(format!("connection failed: {e}"))
        } else {
            StoreError::Server(e.to_string())
        }
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
            StoreError::Server(format!("invalid redis.url {}: {e}", redact_url(url)))
        })?;
        Ok(Self::on(conns, timeout, prefix))
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
        Ok(Self::on(conns, timeout, prefix))
    }

    fn on(conns: Connections, timeout: Duration, prefix: &str) -> Self {
        // The recorder must exist before a handle is taken, or the handle records nothing.
        let _ = m::handle();
        Self {
            conns,
            prefix: prefix.to_owned(),
            timeout,
            scripts: Scripts::new(),
            breaker: Breaker::new(5, Duration::from_secs(1)),
            call_seconds: metrics::histogram!(m::REDIS_SECONDS),
        }
    }

    /// Replaces the default circuit breaker (5 failures, 1 s cooldown).
    pub fn with_breaker(mut self, breaker: Breaker) -> Self {
        self.breaker = breaker;
        self
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Connections to Redis: `(in use, idle)`; shared connections all count as idle.
    pub fn pool_connections(&self) -> (u32, u32) {
        self.conns.state()
    }

    /// Calls through the circuit breaker: while it is open, fails at once without touching Redis.
    ///
    /// `f` may run twice (hence `Clone`; closures that borrow are): again on a new connection
    /// when the first run provably sent nothing (see [`RedisStore::call`]).
    async fn with_conn<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut Conn) -> Result<T, StoreError> + Clone,
    {
        let Some(permit) = self.breaker.permit() else {
            metrics::counter!(m::REDIS_ERRORS, "kind" => "circuit_open").increment(1);
            let cause = self.breaker.cause().unwrap_or_default();
            return Err(StoreError::Unavailable(format!(
                "Redis is unreachable (circuit breaker open; last failure: {cause})"
            )));
        };
        let started = Instant::now();
        let (result, kind) = match self.call(f).await {
            Ok(v) => (Ok(v), None),
            Err((e, kind)) => (Err(e), Some(kind)),
        };
        self.call_seconds.record(started.elapsed().as_secs_f64());
        if let Some(kind) = kind {
            metrics::counter!(m::REDIS_ERRORS, "kind" => kind).increment(1);
        }
        let reached = match &result {
            Err(e) if e.is_transient() => {
                self.breaker.set_cause(e.to_string());
                false
            }
            _ => true,
        };
        self.breaker.record(permit, reached);
        result
    }

    /// One call, bounded by the deadline; errors come with their metric kind.
    ///
    /// After a Redis restart a call usually finds its connection already known closed and makes
    /// a new one before sending anything. When it finds out only by failing (no byte of it
    /// accepted by the socket), it never reached Redis, and is sent once more on a new
    /// connection. A call that may have reached Redis is never sent again: a decision counted
    /// twice is worse than a degraded one.
    async fn call<T, F>(&self, f: F) -> Result<T, (StoreError, &'static str)>
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
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_transient() => Err((e, "connection")),
            Ok(Err(e)) => Err((e, "server")),
            Err(_) if !sending.load(Ordering::Acquire) => Err((
                StoreError::Unavailable(format!(
                    "could not connect to Redis within {} ms",
                    self.timeout.as_millis()
                )),
                "timeout",
            )),
            Err(_) => Err((
                StoreError::OutcomeUnknown(format!(
                    "no answer from Redis within {} ms",
                    self.timeout.as_millis()
                )),
                "timeout",
            )),
        }
    }

    async fn write_policy(
        &self,
        mode: &str,
        name: &PolicyName,
        fields: &[(String, String)],
    ) -> Result<i64, StoreError> {
        let (hash, index, version) = (
            key::policy_key(&self.prefix, name.as_str()),
            key::policy_index_key(&self.prefix),
            key::policy_version_key(&self.prefix),
        );
        self.with_conn(async |conn| {
            let mut call = self.scripts.policy_write.prepare_invoke();
            call.key(&hash)
                .key(&index)
                .key(&version)
                .arg(mode)
                .arg(name.as_str());
            for (f, v) in fields {
                call.arg(f).arg(v);
            }
            Ok(call.invoke_async(conn).await?)
        })
        .await
    }
}

/// A transient error of a call its connection proves was never sent is `Unavailable`.
fn unsent(e: StoreError, conn: &Conn) -> StoreError {
    match e {
        StoreError::OutcomeUnknown(m) if conn.never_sent() => StoreError::Unavailable(m),
        e => e,
    }
}

/// A policy as the fields of its hash.
fn encode(policy: &Policy) -> Vec<(String, String)> {
    let doc = serde_json::to_value(policy.to_doc()).unwrap_or(Value::Null);
    let Value::Object(map) = doc else {
        return Vec::new();
    };
    map.into_iter()
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k, s)),
            Value::Number(n) => Some((k, n.to_string())),
            _ => None,
        })
        .collect()
}

/// A policy from the fields of its hash, validated like any input.
fn decode(fields: Vec<(String, String)>) -> Result<Policy, StoreError> {
    let map: Map<String, Value> = fields
        .into_iter()
        .map(|(k, v)| {
            let value = match v.parse::<u64>() {
                Ok(n) if k != "name" && k != "description" => Value::Number(Number::from(n)),
                _ => Value::String(v),
            };
            (k, value)
        })
        .collect();
    parse_policy(&Value::Object(map), None)
        .map_err(|e| StoreError::Corrupt(format!("policy hash: {e}")))
}

impl Store for RedisStore {
    async fn acquire(
        &self,
        policy: &Policy,
        key: &LimitKey,
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let mut name = String::new();
        key::state_key(
            &mut name,
            &self.prefix,
            policy.name.as_str(),
            key.as_str(),
            policy.algorithm(),
        );
        let script = self.scripts.decision(policy.algorithm());
        let (allowed, remaining, reset_after_us, retry_after_us): (u8, u64, u64, u64) = self
            .with_conn(async |conn| {
                let mut call = script.prepare_invoke();
                call.key(&name);
                match &policy.params {
                    Params::FixedWindow(p) => call.arg(p.limit).arg(p.window_us),
                    Params::SlidingWindowLog(p) => call.arg(p.limit).arg(p.window_us),
                    Params::SlidingWindowCounter(p) => call.arg(p.limit).arg(p.window_us),
                    Params::TokenBucket(p) => call
                        .arg(p.capacity)
                        .arg(p.refill_tokens)
                        .arg(p.refill_period_us),
                };
                call.arg(cost);
                // The time is always the last argument; empty means Redis's clock.
                match now_us {
                    Some(now) => call.arg(now),
                    None => call.arg(""),
                };
                Ok(call.invoke_async(conn).await?)
            })
            .await?;
        Ok(Decision {
            allowed: allowed == 1,
            remaining,
            reset_after_us,
            retry_after_us,
        })
    }

    async fn load_policies(&self) -> Result<(Vec<Policy>, u64), StoreError> {
        let (index, version) = (
            key::policy_index_key(&self.prefix),
            key::policy_version_key(&self.prefix),
        );
        self.with_conn(async |conn| {
            // The version first: a write racing this read leaves the cache newer than its version,
            // so the next poll reloads; never the other way round.
            let (version, names): (Option<u64>, Vec<String>) = redis::pipe()
                .get(&version)
                .smembers(&index)
                .query_async(conn)
                .await?;
            if names.is_empty() {
                return Ok((Vec::new(), version.unwrap_or(0)));
            }
            let mut pipe = redis::pipe();
            for name in &names {
                pipe.hgetall(key::policy_key(&self.prefix, name));
            }
            let hashes: Vec<Vec<(String, String)>> = pipe.query_async(conn).await?;
            let mut policies = Vec::with_capacity(hashes.len());
            for fields in hashes.into_iter().filter(|f| !f.is_empty()) {
                policies.push(decode(fields)?);
            }
            Ok((policies, version.unwrap_or(0)))
        })
        .await
    }

    async fn load_policy(&self, name: &PolicyName) -> Result<Option<Policy>, StoreError> {
        let hash = key::policy_key(&self.prefix, name.as_str());
        self.with_conn(async |conn| {
            let fields: Vec<(String, String)> = conn.hgetall(&hash).await?;
            if fields.is_empty() {
                Ok(None)
            } else {
                decode(fields).map(Some)
            }
        })
        .await
    }

    async fn create_policy(&self, policy: &Policy) -> Result<bool, StoreError> {
        Ok(self
            .write_policy("create", &policy.name, &encode(policy))
            .await?
            == 1)
    }

    async fn put_policy(&self, policy: &Policy) -> Result<PutOutcome, StoreError> {
        Ok(
            match self
                .write_policy("put", &policy.name, &encode(policy))
                .await?
            {
                1 => PutOutcome::Created,
                _ => PutOutcome::Replaced,
            },
        )
    }

    async fn delete_policy(&self, name: &PolicyName) -> Result<bool, StoreError> {
        Ok(self.write_policy("delete", name, &[]).await? == 1)
    }

    async fn policy_version(&self) -> Result<u64, StoreError> {
        let version = key::policy_version_key(&self.prefix);
        self.with_conn(async |conn| {
            let v: Option<u64> = conn.get(&version).await?;
            Ok(v.unwrap_or(0))
        })
        .await
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
