//! How the Redis store holds its connections: a bb8 pool, or multiplexed connections shared by
//! every call (`redis.connection_mode`).
//!
//! With the pool, each call has a connection to itself for its duration, so Redis sees one
//! command per connection at a time. In multiplexed mode each thread that calls Redis (each HTTP
//! worker) has one connection of its own, shared by all its concurrent calls: redis-rs pipelines
//! their commands into fewer writes and reads, and the connection's I/O task runs on the same
//! thread as the calls, so no call wakes another thread. Each reconnects by itself after an
//! error. `bench/run.py --connection-mode` measures both.

use std::time::Duration;

use bb8::{ManageConnection, Pool, PooledConnection};
use bb8_redis::RedisConnectionManager;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, Value};
use thread_local::ThreadLocal;

use super::StoreError;

/// `redis.connection_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionMode {
    Pool,
    Multiplexed,
}

/// bb8-redis's connection manager, plus a flag it lacks: it never reports a multiplexed
/// connection as broken, so after Redis restarts the pool would hand out dead connections
/// forever. A call that fails to reach Redis, or is cut off by the deadline, marks its
/// connection, and bb8 drops it instead of reusing it.
pub struct Manager(RedisConnectionManager);

/// A pooled connection and whether its last call left it unusable.
pub struct Pooled {
    inner: MultiplexedConnection,
    broken: bool,
}

impl ManageConnection for Manager {
    type Connection = Pooled;
    type Error = RedisError;

    async fn connect(&self) -> Result<Pooled, RedisError> {
        Ok(Pooled {
            inner: self.0.connect().await?,
            broken: false,
        })
    }

    async fn is_valid(&self, conn: &mut Pooled) -> Result<(), RedisError> {
        self.0.is_valid(&mut conn.inner).await
    }

    fn has_broken(&self, conn: &mut Pooled) -> bool {
        conn.broken
    }
}

/// The store's connections.
pub enum Connections {
    Pool(Pool<Manager>),
    Multiplexed(Box<Multiplexed>),
    /// A Redis Cluster: one multiplexed connection per node, routed by key slot, following
    /// `MOVED`/`ASK` redirects and topology changes.
    Cluster(ClusterConnection),
}

/// Multiplexed connections, one per calling thread, made on first use.
pub struct Multiplexed {
    client: Client,
    config: ConnectionManagerConfig,
    per_thread: ThreadLocal<ConnectionManager>,
}

/// One call's connection: a pooled one (held until the call ends) or a shared one.
pub enum Conn {
    Pooled(PooledConnection<'static, Manager>),
    Shared(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connections {
    /// Opens a pool of `size` connections, or prepares multiplexed ones (one per calling thread,
    /// `size` unused). Nothing connects yet: connections are made on first use, so this fails
    /// only on a malformed URL.
    pub fn open(
        url: &str,
        mode: ConnectionMode,
        size: u32,
        timeout: Duration,
    ) -> Result<Self, RedisError> {
        Ok(match mode {
            ConnectionMode::Pool => Connections::Pool(
                Pool::builder()
                    .max_size(size)
                    .connection_timeout(timeout)
                    .test_on_check_out(false)
                    .build_unchecked(Manager(RedisConnectionManager::new(url)?)),
            ),
            ConnectionMode::Multiplexed => Connections::Multiplexed(Box::new(Multiplexed {
                client: Client::open(url)?,
                config: ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(100)),
                per_thread: ThreadLocal::new(),
            })),
        })
    }

    /// Connects to a Redis Cluster through any of its `nodes` (`host:port`).
    pub async fn open_cluster(nodes: &[String], timeout: Duration) -> Result<Self, RedisError> {
        let urls: Vec<String> = nodes.iter().map(|n| format!("redis://{n}")).collect();
        let client = ClusterClient::builder(urls)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .build()?;
        Ok(Connections::Cluster(client.get_async_connection().await?))
    }

    /// A connection for one call.
    pub async fn get(&self) -> Result<Conn, StoreError> {
        match self {
            Connections::Pool(pool) => {
                let mut conn = pool.get_owned().await?;
                // Marked until the call succeeds (see `done`): if the deadline drops the call
                // mid-way, the connection goes back marked, and is discarded.
                conn.broken = true;
                Ok(Conn::Pooled(conn))
            }
            Connections::Multiplexed(m) => {
                // Created on this thread, so its I/O task is spawned on this thread's runtime.
                let conn = m.per_thread.get_or_try(|| {
                    ConnectionManager::new_lazy_with_config(m.client.clone(), m.config.clone())
                })?;
                Ok(Conn::Shared(conn.clone()))
            }
            Connections::Cluster(c) => Ok(Conn::Cluster(c.clone())),
        }
    }

    /// Connections: `(in use, idle)` for the pool; shared connections count as idle.
    pub fn state(&self) -> (u32, u32) {
        match self {
            Connections::Pool(pool) => {
                let state = pool.state();
                (
                    state.connections.saturating_sub(state.idle_connections),
                    state.idle_connections,
                )
            }
            Connections::Multiplexed(m) => (
                0,
                u32::try_from(m.per_thread.iter().count()).unwrap_or(u32::MAX),
            ),
            Connections::Cluster(_) => (0, 1),
        }
    }
}

impl Conn {
    /// Reports how the call went: a pooled connection that could not reach Redis is dropped.
    pub fn done<T>(&mut self, result: &Result<T, StoreError>) {
        if let Conn::Pooled(conn) = self {
            conn.broken = matches!(result, Err(e) if e.is_transient());
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Pooled(c) => c.inner.req_packed_command(cmd),
            Conn::Shared(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Pooled(c) => c.inner.req_packed_commands(pipeline, offset, count),
            Conn::Shared(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Pooled(c) => c.inner.get_db(),
            Conn::Shared(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
