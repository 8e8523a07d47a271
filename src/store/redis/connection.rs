//! How the Redis store reaches Redis: its connections, how they are shared by calls
//! (`redis.connection_mode`), how a dead one is found and replaced, and whether a failed call
//! provably never reached Redis.
//!
//! Every connection is multiplexed: any number of calls share it at once, and redis-rs
//! pipelines their commands into fewer writes and reads. No call ever waits for a connection
//! of its own, which is what made the old bb8 pool (an exclusive checkout per call) queue past
//! the deadline under load. The two modes only differ in how many there are:
//! - `multiplexed`: one per thread that calls Redis (each HTTP worker), made on first use; its
//!   I/O task runs on that thread, so no call wakes another thread. On a Cluster, likewise one
//!   cluster connection (itself a connection per node) per calling thread, made in the
//!   background on that thread's first call, which meanwhile takes the connection made at
//!   start-up: making one needs every node, and a call must not wait for a node that is down.
//! - `pool`: `redis.pool_size` connections shared round-robin by every thread, for deployments
//!   that want a fixed number of connections whatever the worker count.
//!
//! Each connection is watched: its I/O task marks it closed when it ends (Redis closed the
//! socket, a read or write failed), and it counts the bytes the socket accepted. A call takes a
//! connection that is not known closed (or makes a new one), notes the count, and if it fails
//! with nothing written since, its command never left this process: it may be sent again on a
//! new connection ([`Conn::never_sent`]). On a Cluster each node's connection is watched the
//! same way ([`NodeConn`]), so that the cluster client resends only what was never sent.
//! Connecting has no retry loop of its own: a refused connection or a wrong password is
//! reported at once, as what it is.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, Pipeline, RedisConnectionInfo, RedisError,
    RedisFuture, Value,
};
use thread_local::ThreadLocal;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::tls::Tls;
use crate::store::StoreError;

/// The TLS of each Cluster node the store was told of, by `host:port`: the cluster client
/// makes node connections through a static [`redis::cluster_async::Connect`], which carries no
/// state of its own. A node the cluster reports later (not a seed) takes the TLS of the
/// latest TLS cluster opened: one process serves one Cluster.
type NodeTls = Vec<(String, Option<Arc<Tls>>)>;
static CLUSTER_TLS: Mutex<NodeTls> = Mutex::new(Vec::new());
/// The TLS of the latest Cluster opened, for the nodes it did not name.
static CLUSTER_TLS_DEFAULT: Mutex<Option<Arc<Tls>>> = Mutex::new(None);

fn cluster_tls(host: &str, port: u16) -> Option<Arc<Tls>> {
    let address = format!("{host}:{port}");
    let known = CLUSTER_TLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, tls)) = known.iter().rev().find(|(a, _)| *a == address) {
        return tls.clone();
    }
    drop(known);
    CLUSTER_TLS_DEFAULT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Records the TLS (or none) of a Cluster's seeds, before any connection to it is made.
fn register_cluster_tls(nodes: &[&str], tls: Option<&Arc<Tls>>) {
    let mut known = CLUSTER_TLS.lock().unwrap_or_else(|e| e.into_inner());
    for node in nodes {
        let address = node.rsplit_once('@').map_or(*node, |(_, a)| a);
        known.retain(|(a, _)| a != address);
        known.push((address.to_owned(), tls.cloned()));
    }
    drop(known);
    *CLUSTER_TLS_DEFAULT
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = tls.cloned();
}

/// `redis.connection_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionMode {
    /// A fixed number of shared connections (`redis.pool_size`), used round-robin.
    Pool,
    /// One shared connection per calling thread.
    Multiplexed,
}

/// The store's connections.
pub enum Connections {
    /// One Redis server.
    Single(Box<Single>),
    /// A Redis Cluster: one multiplexed connection per node, routed by key slot, following
    /// `MOVED`/`ASK` redirects and topology changes; one such per calling thread.
    Cluster(Arc<ClusterLinks>),
}

/// A Cluster's connections (see the module doc).
pub struct ClusterLinks {
    client: ClusterClient,
    /// Made at start-up: every call of a thread whose own connection is not made yet.
    shared: ClusterConn,
    per_thread: ThreadLocal<ThreadLink>,
}

/// A cluster connection whose node connections are [`NodeConn`]s.
pub type ClusterConn = ClusterConnection<NodeConn>;

/// One thread's cluster connection, once made.
#[derive(Default)]
struct ThreadLink {
    conn: std::sync::OnceLock<ClusterConn>,
    /// Being made (or given up on, after a failure seen on another thread).
    making: AtomicBool,
}

/// Where one Redis server is, and how to open a connection to it.
struct Target {
    host: String,
    port: u16,
    redis: RedisConnectionInfo,
    config: AsyncConnectionConfig,
    /// Set for `rediss://`.
    tls: Option<Arc<Tls>>,
}

/// The connections to one Redis server.
pub struct Single {
    target: Arc<Target>,
    per_thread: ThreadLocal<Link>,
    /// `pool` mode's connections; empty in `multiplexed` mode.
    shared: Vec<Link>,
    next: AtomicUsize,
    /// `pool` mode's I/O thread, where the shared connections read and write.
    io: Option<tokio::runtime::Runtime>,
}

impl Drop for Single {
    fn drop(&mut self) {
        // Dropping a runtime waits for its tasks, which an async context may not do.
        if let Some(io) = self.io.take() {
            io.shutdown_background();
        }
    }
}

/// One connection slot: the live connection, replaced when it is found dead.
#[derive(Default)]
struct Link {
    live: Mutex<Option<Live>>,
    /// One connection attempt at a time; holds the last attempt's failure, so that the calls
    /// that waited for it share its answer instead of each trying again.
    connecting: tokio::sync::Mutex<Option<RedisError>>,
    attempts: AtomicU64,
}

/// A connection and what its I/O task reports about it.
#[derive(Clone)]
pub struct Live {
    conn: MultiplexedConnection,
    health: Arc<Health>,
}

#[derive(Default)]
struct Health {
    /// Bytes the socket has accepted since the connection was set up.
    written: AtomicU64,
    closed: AtomicBool,
}

/// Marks the connection closed when its I/O task ends, or is dropped with its runtime.
struct ClosedOnDrop(Arc<Health>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
    }
}

/// The socket (plain or TLS, chosen at connect time: no branch per call), counting what it
/// writes.
struct Counted<S> {
    inner: S,
    health: Arc<Health>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.health.written.fetch_add(*n as u64, Ordering::AcqRel);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            self.health.written.fetch_add(*n as u64, Ordering::AcqRel);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One call's connection.
pub enum Conn {
    /// A connection to one Redis, and its write count when the call took it.
    Single {
        live: Live,
        written_before: u64,
    },
    Cluster(ClusterConn),
}

impl Connections {
    /// Prepares the connections to the Redis at `url`: `size` shared ones in `pool` mode, one
    /// per calling thread in `multiplexed` mode. Nothing connects yet (connections are made on
    /// first use), so this fails only on a URL it cannot use.
    pub fn open(
        url: &str,
        mode: ConnectionMode,
        size: u32,
        tls: Option<Arc<Tls>>,
    ) -> Result<Self, RedisError> {
        // TLS is this module's (see `tls.rs`): the URL only says where and who.
        let plain = match url.strip_prefix("rediss://") {
            Some(rest) => format!("redis://{rest}"),
            None => url.to_owned(),
        };
        let tls = if url.starts_with("rediss://") {
            Some(tls.ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "rediss:// needs the TLS settings",
                ))
            })?)
        } else {
            None
        };
        let client = Client::open(plain.as_str())?;
        let info = client.get_connection_info();
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "only redis://host:port addresses are supported",
            )));
        };
        let (shared, io) = match mode {
            ConnectionMode::Pool => {
                let io = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("redis-io")
                    .enable_all()
                    .build()
                    .map_err(RedisError::from)?;
                (
                    (0..size.max(1)).map(|_| Link::default()).collect(),
                    Some(io),
                )
            }
            ConnectionMode::Multiplexed => (Vec::new(), None),
        };
        Ok(Connections::Single(Box::new(Single {
            target: Arc::new(Target {
                host: host.clone(),
                port: *port,
                redis: info.redis_settings().clone(),
                // The store bounds every call with its own deadline.
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(None)
                    .set_response_timeout(None),
                tls,
            }),
            per_thread: ThreadLocal::new(),
            shared,
            next: AtomicUsize::new(0),
            io,
        })))
    }

    /// Connects to a Redis Cluster through any of its `nodes` (`[user:password@]host:port`).
    pub async fn open_cluster(
        nodes: &[&str],
        timeout: Duration,
        tls: Option<Arc<Tls>>,
    ) -> Result<Self, RedisError> {
        register_cluster_tls(nodes, tls.as_ref());
        let urls: Vec<String> = nodes.iter().map(|n| format!("redis://{n}")).collect();
        // The client resends by itself what Redis refused unrun (`MOVED`, `ASK`) and what a
        // node's connection proves it never sent ([`NodeConn`]); a call that may have run is
        // never resent, and a cluster-wide refusal is answered at once, not waited out.
        let client = ClusterClient::builder(urls)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .build()?;
        let shared = client.get_async_generic_connection::<NodeConn>().await?;
        Ok(Connections::Cluster(Arc::new(ClusterLinks {
            client,
            shared,
            per_thread: ThreadLocal::new(),
        })))
    }

    /// A connection for one call: a live one, or a new one if the last was found dead.
    pub async fn get(&self) -> Result<Conn, StoreError> {
        match self {
            Connections::Single(s) => {
                let link = if s.shared.is_empty() {
                    // Made on this thread, so its I/O task is spawned on this thread's runtime.
                    s.per_thread.get_or_default()
                } else {
                    &s.shared[s.next.fetch_add(1, Ordering::Relaxed) % s.shared.len()]
                };
                let io = s.io.as_ref().map(|io| io.handle());
                let live = link.get(&s.target, io).await?;
                let written_before = live.health.written.load(Ordering::Acquire);
                Ok(Conn::Single {
                    live,
                    written_before,
                })
            }
            Connections::Cluster(links) => {
                let link = links.per_thread.get_or_default();
                if let Some(conn) = link.conn.get() {
                    return Ok(Conn::Cluster(conn.clone()));
                }
                if !link.making.swap(true, Ordering::AcqRel) {
                    // On an HTTP worker (a single-threaded runtime) the task runs on this
                    // thread, and so will the connection's I/O.
                    let links = links.clone();
                    tokio::spawn(async move {
                        let made = links
                            .client
                            .get_async_generic_connection::<NodeConn>()
                            .await;
                        let link = links.per_thread.get_or_default();
                        match made {
                            Ok(conn) => {
                                let _ = link.conn.set(conn);
                            }
                            // Tried again on this thread's next call.
                            Err(_) => link.making.store(false, Ordering::Release),
                        }
                    });
                }
                Ok(Conn::Cluster(links.shared.clone()))
            }
        }
    }

    /// Connections: `(in use, idle)`. Shared connections are never checked out: all count as
    /// idle.
    pub fn state(&self) -> (u32, u32) {
        match self {
            Connections::Single(s) => {
                let links = s.per_thread.iter().chain(s.shared.iter());
                let live = links.filter(|l| l.current().is_some()).count();
                (0, u32::try_from(live).unwrap_or(u32::MAX))
            }
            Connections::Cluster(links) => {
                let made = links
                    .per_thread
                    .iter()
                    .filter(|l| l.conn.get().is_some())
                    .count();
                (0, u32::try_from(made + 1).unwrap_or(u32::MAX))
            }
        }
    }
}

impl Link {
    /// The live connection, if there is one not known closed.
    fn current(&self) -> Option<Live> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live
            .as_ref()
            .is_some_and(|l| l.health.closed.load(Ordering::Acquire))
        {
            *live = None;
        }
        live.clone()
    }

    /// The live connection, or a new one, made on `io` when given (else on this thread).
    async fn get(
        &self,
        target: &Arc<Target>,
        io: Option<&tokio::runtime::Handle>,
    ) -> Result<Live, StoreError> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let seen = self.attempts.load(Ordering::Acquire);
        let mut last_failure = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if self.attempts.load(Ordering::Acquire) != seen {
            if let Some(failure) = last_failure.as_ref() {
                return Err(connect_error(failure.clone()));
            }
        }
        let result = match io {
            Some(io) => {
                let target = target.clone();
                let task = io.spawn(async move { target.connect().await });
                // The caller's deadline drops this future: the connect must stop with it, or a
                // hung Redis would collect one detached task and socket per attempt.
                let _abort = AbortOnDrop(task.abort_handle());
                task.await
                    .unwrap_or_else(|e| Err(RedisError::from(io::Error::other(e))))
            }
            None => target.connect().await,
        };
        self.attempts.fetch_add(1, Ordering::AcqRel);
        match result {
            Ok(live) => {
                *last_failure = None;
                *self.live.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
                Ok(live)
            }
            Err(e) => {
                *last_failure = Some(e.clone());
                Err(connect_error(e))
            }
        }
    }
}

impl Target {
    async fn connect(&self) -> Result<Live, RedisError> {
        connect_counted(
            &self.host,
            self.port,
            &self.redis,
            self.config.clone(),
            self.tls.as_deref(),
        )
        .await
    }
}

/// A multiplexed connection over a socket that counts what it writes, its I/O task spawned on
/// this thread's runtime.
async fn connect_counted(
    host: &str,
    port: u16,
    redis: &RedisConnectionInfo,
    config: AsyncConnectionConfig,
    tls: Option<&Tls>,
) -> Result<Live, RedisError> {
    let socket = TcpStream::connect((host, port)).await?;
    socket.set_nodelay(true)?;
    match tls {
        None => multiplexed(socket, redis, config).await,
        Some(tls) => {
            let stream = tls.handshake(host, port, socket).await?;
            multiplexed(stream, redis, config).await
        }
    }
}

/// [`connect_counted`] over a connected (and, for TLS, handshaken) stream.
async fn multiplexed<S>(
    socket: S,
    redis: &RedisConnectionInfo,
    config: AsyncConnectionConfig,
) -> Result<Live, RedisError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let health = Arc::new(Health::default());
    let stream = Counted {
        inner: socket,
        health: health.clone(),
    };
    // Sends AUTH and SELECT as the URL asks, and fails here if Redis refuses them.
    let (conn, driver) = MultiplexedConnection::new_with_config(redis, stream, config).await?;
    let closed = ClosedOnDrop(health.clone());
    tokio::spawn(async move {
        let _closed = closed;
        driver.await;
    });
    Ok(Live { conn, health })
}

/// One Cluster node's connection, as the cluster client holds it: a [`Live`] connection that
/// vets each failure before the client sees it, since the client resends every call that
/// fails on a broken connection (and waits out `CLUSTERDOWN`, `TRYAGAIN`), whether or not
/// the node ran it. What this passes on as is: a failure after which the socket accepted no
/// byte of the call (never sent: the client may resend it, and reconnects), and an answer
/// Redis gave (including `MOVED` and `ASK`, which Redis gives instead of running the call).
/// What it changes into an error the client never resends: a failure after some byte left
/// ([`SENT_THEN_FAILED`]: the call may have run), and a cluster-wide refusal
/// ([`CLUSTER_REFUSED`]: answered by fail mode at once; the next call tries again).
#[derive(Clone)]
pub struct NodeConn(Live);

/// What a [`NodeConn`] says when a call failed after some of it was sent.
pub const SENT_THEN_FAILED: &str = "the connection failed after the call was sent";
/// What a [`NodeConn`] says when the cluster refused the call unrun, for now.
pub const CLUSTER_REFUSED: &str = "the cluster refused the call for now";

impl redis::cluster_async::Connect for NodeConn {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: redis::IntoConnectionInfo + Send + 'a,
    {
        Box::pin(async move {
            let info = info.into_connection_info()?;
            let ConnectionAddr::Tcp(host, port) = info.addr() else {
                return Err(RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "only host:port cluster nodes are supported",
                )));
            };
            let tls = cluster_tls(host, *port);
            let live =
                connect_counted(host, *port, info.redis_settings(), config, tls.as_deref()).await?;
            Ok(NodeConn(live))
        })
    }
}

impl NodeConn {
    /// A failed call's error as the cluster client may see it (see [`NodeConn`]).
    fn vet(&self, e: RedisError, written_before: u64) -> RedisError {
        if is_cluster_refusal(e.code()) {
            RedisError::from((redis::ErrorKind::Client, CLUSTER_REFUSED, e.to_string()))
        } else if matches!(e.kind(), redis::ErrorKind::Server(_)) {
            // Redis answered: the client acts on it (follows `MOVED`, `ASK`) or passes it on.
            e
        } else if self.0.health.written.load(Ordering::Acquire) != written_before {
            RedisError::from((redis::ErrorKind::Client, SENT_THEN_FAILED, e.to_string()))
        } else {
            e
        }
    }

    /// A reply as the cluster client may see it: a cluster-wide refusal is an error it will
    /// not wait out.
    fn vet_reply(value: Value) -> redis::RedisResult<Value> {
        match value {
            Value::ServerError(e) if is_cluster_refusal(Some(e.code())) => {
                let detail = format!("{}: {}", e.code(), e.details().unwrap_or_default());
                Err(RedisError::from((
                    redis::ErrorKind::Client,
                    CLUSTER_REFUSED,
                    detail,
                )))
            }
            other => Ok(other),
        }
    }
}

/// Redis's codes for a call the cluster refused unrun because it cannot serve the slot right
/// now (a failover, a slot being migrated): not a sign that the node is unreachable.
pub fn is_cluster_refusal(code: Option<&str>) -> bool {
    matches!(code, Some("CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN"))
}

impl ConnectionLike for NodeConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let written_before = self.0.health.written.load(Ordering::Acquire);
        Box::pin(async move {
            match self.0.conn.req_packed_command(cmd).await {
                Ok(value) => NodeConn::vet_reply(value),
                Err(e) => Err(self.vet(e, written_before)),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let written_before = self.0.health.written.load(Ordering::Acquire);
        Box::pin(async move {
            match self
                .0
                .conn
                .req_packed_commands(pipeline, offset, count)
                .await
            {
                Ok(values) => values.into_iter().map(NodeConn::vet_reply).collect(),
                Err(e) => Err(self.vet(e, written_before)),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.0.conn.get_db()
    }
}

/// Aborts a spawned task when dropped (a finished task is unaffected).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a connection could not be made, in words an operator acts on.
fn connect_error(e: RedisError) -> StoreError {
    let message = if e.kind() == redis::ErrorKind::AuthenticationFailed {
        format!("authentication failed (check the password in redis.url): {e}")
    } else if e.is_connection_refusal() {
        format!("connection refused: {e}")
    } else {
        format!("cannot connect: {e}")
    };
    StoreError::unavailable(message).caused_by(e)
}

impl Conn {
    /// Whether nothing of this call can have reached Redis: its connection accepted no byte
    /// since the call took it. Only then may the call be sent again. A cluster connection
    /// answers false: its client already resent what its node connections proved unsent
    /// ([`NodeConn`]), and nothing else may be.
    pub fn never_sent(&self) -> bool {
        match self {
            Conn::Single {
                live,
                written_before,
            } => live.health.written.load(Ordering::Acquire) == *written_before,
            Conn::Cluster(_) => false,
        }
    }

    /// Marks the connection dead, so the next call makes a new one.
    pub fn discard(&self) {
        if let Conn::Single { live, .. } = self {
            live.health.closed.store(true, Ordering::Release);
        }
    }
}

impl Conn {
    /// Runs `cmd` on one Redis, or on a Cluster on the master of `slot`: a command that declares
    /// no key (the Cluster's batch script) would otherwise go to any node.
    pub async fn query_at(&mut self, cmd: Cmd, slot: u16) -> redis::RedisResult<Value> {
        match self {
            Conn::Single { .. } => cmd.query_async(self).await,
            Conn::Cluster(c) => {
                let route = Route::new(slot, SlotAddr::Master);
                // A routed command answers Redis's error as a value: made an error here, as
                // `query_async` makes it, so that `NOSCRIPT` or `OOM` reads as what it is.
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
                .and_then(Value::extract_error)
            }
        }
    }

    /// Runs `cmd` on the Cluster node at `host:port`; on one Redis, on it.
    pub async fn query_by_address(
        &mut self,
        cmd: Cmd,
        host: String,
        port: u16,
    ) -> redis::RedisResult<Value> {
        match self {
            Conn::Single { .. } => cmd.query_async(self).await,
            Conn::Cluster(c) => c
                .route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port }),
                )
                .await
                .and_then(Value::extract_error),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single { live, .. } => live.conn.req_packed_command(cmd),
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
            Conn::Single { live, .. } => live.conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single { live, .. } => live.conn.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
