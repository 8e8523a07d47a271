//! The servers behind the Redis store, as start-up, readiness, metrics and the background loop
//! ask about them: their version and the scripts loaded into them, whether they are a Cluster
//! and its slot map (read again by [`RedisStore::refresh_topology`]), the circuit breakers (the
//! store's, and each master's) and whether each master takes writes.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::breaker::{Breaker, BreakerState};
use super::topology::{parse_slots, Topology};
use super::RedisStore;
use crate::store::{ErrorClass, StoreError};

impl RedisStore {
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

    /// Replaces the default circuit breaker (5 failures, 1 s cooldown), and on a Cluster each
    /// master's with one like it.
    pub fn with_breaker(mut self, breaker: Breaker) -> Self {
        if let Some(topology) = &self.calls.topology {
            topology.reset_breakers(&breaker);
        }
        self.calls.breaker = Arc::new(breaker);
        self
    }

    pub fn breaker(&self) -> &Breaker {
        &self.calls.breaker
    }

    /// Connections to Redis: `(in use, idle)`; shared connections all count as idle.
    pub fn pool_connections(&self) -> (u32, u32) {
        self.calls.conns.state()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_flags_need_redis_7() {
        for old in ["6.2.14", "6.0.0", "5.0.7", "garbage", ""] {
            assert!(!supports_script_flags(old), "{old}");
        }
        for new in ["7.0.0", "7.0.15", "7.2.4", "8.0.1", "10.0"] {
            assert!(supports_script_flags(new), "{new}");
        }
    }
}
