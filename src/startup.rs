//! Building the application from its settings: the store, the policies, the HTTP server.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Server, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{web, App, HttpServer};
use anyhow::Context;

use crate::access::Tokens;
use crate::api;
use crate::api::span::TrustedProxies;
use crate::config::{GrpcSettings, ServerSettings, Settings};
use crate::grpc;
use crate::service::RateLimiter;
use crate::store::breaker::Breaker;
use crate::store::connection::ConnectionMode;
use crate::store::redis::redact_url;
use crate::store::{AnyStore, MemoryStore, RedisStore, Store};
use crate::tls::spawn_reloader;

/// A built application, bound to its port and ready to run.
pub struct Application {
    port: u16,
    server: Server,
    limiter: Arc<RateLimiter>,
    /// The gRPC server's port and task, when `grpc.bind` is set.
    grpc: Option<(u16, tokio::task::JoinHandle<()>)>,
    shutdown_timeout: Duration,
}

impl Application {
    /// Connects the store, creates the configured policies, loads the policy cache and binds
    /// `server.bind` (port 0 picks a free port; see [`Application::port`]).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let prefix = &settings.redis.key_prefix;
        let store: AnyStore = match &settings.redis.url {
            None if !settings.redis.cluster_nodes.is_empty() => {
                let nodes: Vec<&str> = settings
                    .redis
                    .cluster_nodes
                    .iter()
                    .map(|n| n.expose())
                    .collect();
                // Seeds may carry the cluster's password: only their redacted form is shown,
                // with the scheme they were given (the configuration keeps `host:port`).
                let scheme = if settings.redis.cluster_tls {
                    "rediss"
                } else {
                    "redis"
                };
                let shown: Vec<String> = nodes
                    .iter()
                    .map(|n| redact_url(&format!("{scheme}://{n}")))
                    .collect();
                let shown = shown.join(", ");
                let store = RedisStore::open_cluster_with_tls(
                    &nodes,
                    settings.redis.timeout(),
                    prefix,
                    settings.redis.tls.clone(),
                )
                .await
                .with_context(|| format!("cannot reach the Redis Cluster at {shown}"))?;
                tracing::info!(nodes = %shown, "using Redis Cluster");
                store
                    .with_breaker(breaker(&settings))
                    .with_batch_max(settings.redis.batch_max)
                    .into()
            }
            None => {
                tracing::warn!(
                    "no redis.url set: using the embedded in-process store; limits are per process \
                     and not shared with other instances"
                );
                MemoryStore::new(prefix, settings.limits.max_embedded_subjects).into()
            }
            Some(url) => {
                let shown = redact_url(url.expose());
                let store = RedisStore::open_with_tls(
                    url.expose(),
                    settings.redis.connection_mode(),
                    settings.redis.pool_size,
                    settings.redis.timeout(),
                    prefix,
                    settings.redis.tls.clone(),
                )?
                .with_breaker(breaker(&settings))
                .with_batch_max(settings.redis.batch_max);
                store
                    .ping()
                    .await
                    .with_context(|| format!("cannot reach Redis at {shown}"))?;
                tracing::info!(
                    redis = %shown,
                    mode = ?settings.redis.connection_mode,
                    "using Redis"
                );
                store.into()
            }
        };
        // Both are Redis's alone, and answer at once on the embedded store.
        store
            .require_flagged_scripts()
            .await
            .context("checking the Redis version")?;
        store
            .require_permissions()
            .await
            .context("checking the Redis user's permissions")?;
        if let Err(e) = store.load_scripts().await {
            tracing::warn!(error = %e, "could not load the scripts at start-up; each is loaded on first use");
        }
        let limiter = Arc::new(
            RateLimiter::new(
                store,
                prefix,
                settings.policies.clone(),
                &settings.limits,
                settings.redis.policy_stale_after(),
            )
            .with_top(&settings.top),
        );
        // The first load reads every policy and override, page by page: on a busy Redis one page
        // may miss its deadline (100,000 overrides are hundreds of pages). A transient failure is
        // tried again, four times over about three seconds, so that a Redis that is down still
        // fails the start-up promptly, naming the cause.
        let mut retries = 0;
        loop {
            match limiter.refresh().await {
                Ok(()) => break,
                Err(e) if e.is_transient() && retries < 4 => {
                    retries += 1;
                    tracing::warn!(error = %e, retries, "loading policies failed; trying again");
                    tokio::time::sleep(Duration::from_millis(100 << retries)).await;
                }
                Err(e) => {
                    return Err(e).context("loading policies (and creating the configured ones)")
                }
            }
        }
        limiter
            .load_ticket_keys()
            .await
            .context("reading the keys that sign refund tickets (or creating the first)")?;
        limiter.spawn_background(settings.redis.policy_refresh());

        // The certificates first: a bad file fails the start-up naming its setting.
        let http_tls = load_tls(crate::tls::TlsFiles::new(
            "server",
            settings.server.tls_cert_file.as_deref(),
            settings.server.tls_key_file.as_deref(),
            settings.server.tls_client_ca_file.as_deref(),
        ))?;
        let grpc_tls = match settings.grpc.bind {
            Some(_) => load_tls(crate::tls::TlsFiles::new(
                "grpc",
                settings.grpc.tls_cert_file.as_deref(),
                settings.grpc.tls_key_file.as_deref(),
                settings.grpc.tls_client_ca_file.as_deref(),
            ))?,
            None => None,
        };
        // The gauge and `/readyz` watch the client certificate shown to Redis beside them.
        let redis_client = settings
            .redis
            .tls
            .as_ref()
            .and_then(|t| t.client_certificate_not_after());
        let certs = Arc::new(crate::tls::Certificates::new(
            http_tls.iter().chain(grpc_tls.iter()).cloned().collect(),
            redis_client,
        ));
        spawn_reloader(&certs);
        let http_config = http_tls
            .as_ref()
            .map(|t| t.server_config(&[b"http/1.1"]))
            .transpose()?;
        let grpc_acceptor = grpc_tls
            .as_ref()
            .map(|t| t.server_config(&[b"h2"]))
            .transpose()?
            .map(|c| tokio_rustls::TlsAcceptor::from(Arc::new(c)));

        let listener = TcpListener::bind(settings.server.bind)
            .with_context(|| format!("cannot listen on {}", settings.server.bind))?;
        let address = listener.local_addr()?;
        let tokens = Tokens::from_settings(&settings.auth);
        warn_if_open(&address, &tokens);

        let data = web::Data::from(limiter.clone());
        let server_settings = &settings.server;
        let edge = api::Edge {
            tokens: web::Data::new(tokens),
            trusted_proxies: web::Data::new(TrustedProxies(
                server_settings.trusted_proxies.clone(),
            )),
            request_timeout: server_settings.request_timeout(),
        };
        let workers = worker_count(server_settings);
        // Redis connections need descriptors too: `pool_size` of them in pool mode, one per
        // worker thread in multiplexed mode.
        let redis_files = match (limiter.store().is_shared(), settings.redis.connection_mode) {
            (false, _) => 0,
            (true, ConnectionMode::Pool) => u64::from(settings.redis.pool_size),
            (true, ConnectionMode::Multiplexed) => workers as u64,
        };
        // gRPC connections come out of the same descriptors, before the HTTP workers' share:
        // its cap, and the one connection its listener may hold while finding it a slot.
        let grpc_connections = settings.grpc.bind.map(|_| {
            grpc_connections_that_fit(
                settings.grpc.max_connections,
                server_settings.max_connections.saturating_mul(workers),
                redis_files,
            )
        });
        let grpc_files = grpc_connections.map_or(0, |n| n as u64 + 1);
        let certs = web::Data::from(certs);
        let server = http_server(
            move || api::app(data.clone(), edge.clone()).app_data(certs.clone()),
            listener,
            server_settings,
            workers,
            redis_files + grpc_files,
            http_config,
        )?;
        let scheme = if http_tls.is_some() { "https" } else { "http" };
        tracing::info!(%address, docs = %format!("{scheme}://{address}/docs/"), "serving");
        let grpc = match (settings.grpc.bind, grpc_connections) {
            (Some(bind), Some(max_connections)) => Some(
                serve_grpc(
                    bind,
                    limiter.clone(),
                    Tokens::from_settings(&settings.auth),
                    settings.grpc.clone(),
                    max_connections,
                    grpc_acceptor,
                )
                .await?,
            ),
            _ => None,
        };
        Ok(Self {
            port: address.port(),
            server,
            limiter,
            grpc,
            shutdown_timeout: Duration::from_secs(server_settings.shutdown_timeout_s),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The service, for tests that drive its clock ([`RateLimiter::clock`]) to decide at chosen
    /// instants (a day of a DST change) through the real edges and stores.
    pub fn limiter(&self) -> Arc<RateLimiter> {
        self.limiter.clone()
    }

    /// The port Envoy's rate-limit service listens on, when `grpc.bind` is set.
    pub fn grpc_port(&self) -> Option<u16> {
        self.grpc.as_ref().map(|(port, _)| *port)
    }

    /// Serves until SIGINT or SIGTERM, then stops accepting, lets in-flight requests finish (up
    /// to `server.shutdown_timeout_s`, gRPC calls too) and closes the store's connections.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        if let Some((_, grpc)) = self.grpc {
            // The gRPC server saw the same signal; its calls in flight get the same time.
            if tokio::time::timeout(self.shutdown_timeout, grpc)
                .await
                .is_err()
            {
                tracing::warn!("gRPC calls still in flight at the shutdown timeout were dropped");
            }
        }
        tracing::info!("stopped");
        drop(self.limiter);
        result
    }
}

/// Binds `bind` and serves Envoy's rate-limit service on it, on the runtime this is called on,
/// until SIGINT or SIGTERM (the HTTP server's signals). Answers the bound port and the server's
/// task.
async fn serve_grpc(
    bind: SocketAddr,
    limiter: Arc<RateLimiter>,
    tokens: Tokens,
    settings: GrpcSettings,
    max_connections: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let tls_on = tls.is_some();
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("cannot listen on {bind} (grpc.bind)"))?;
    let address = listener.local_addr()?;
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                match term.as_mut() {
                    Some(t) => { t.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    };
    let task = tokio::spawn(async move {
        let served = grpc::serve(
            listener,
            limiter,
            tokens,
            &settings,
            max_connections,
            tls,
            shutdown,
        );
        if let Err(e) = served.await {
            tracing::error!(error = %e, "the gRPC server failed");
        }
    });
    tracing::info!(%address, max_connections, tls = tls_on, "serving Envoy's rate-limit service (gRPC)");
    Ok((address.port(), task))
}

/// HTTP worker threads for `server.workers`: 0 means one per core.
pub fn worker_count(server: &ServerSettings) -> usize {
    match server.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// Serves the apps `factory` makes on `listener`, as `server` sets it up: `workers` threads,
/// each with at most `server.max_connections` connections (fewer when they would not fit the
/// open-file limit beside `redis_files`), and the service's timeouts. The benchmark's bare
/// handler (`bench/bare_http.rs`) is served by this too, so that the two differ only in what
/// runs inside. With `tls`, HTTPS: the TLS handshake must finish within
/// `server.client_request_timeout_ms` too, and counts against the connection cap.
pub fn http_server<F, T, B>(
    factory: F,
    listener: TcpListener,
    server: &ServerSettings,
    workers: usize,
    redis_files: u64,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<Server>
where
    F: Fn() -> App<T> + Send + Clone + 'static,
    T: ServiceFactory<
            ServiceRequest,
            Config = (),
            Response = ServiceResponse<B>,
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
    B: MessageBody + 'static,
{
    let max_connections = connections_that_fit(server.max_connections, workers, redis_files);
    let timeout = Duration::from_millis(server.client_request_timeout_ms);
    let builder = HttpServer::new(factory)
        .workers(workers)
        .tls_handshake_timeout(timeout);
    let builder = match tls {
        None => builder.listen(listener)?,
        Some(config) => builder.listen_rustls_0_23(listener, config)?,
    };
    Ok(builder
        .max_connections(max_connections)
        .client_request_timeout(Duration::from_millis(server.client_request_timeout_ms))
        .client_disconnect_timeout(Duration::from_secs(1))
        .keep_alive(Duration::from_secs(server.keep_alive_s))
        .shutdown_timeout(server.shutdown_timeout_s)
        .run())
}

/// A listener's certificates, loaded, when its files are set.
fn load_tls(
    files: Option<crate::tls::TlsFiles>,
) -> anyhow::Result<Option<Arc<crate::tls::Reloadable>>> {
    let Some(files) = files else { return Ok(None) };
    Ok(Some(crate::tls::Reloadable::load(files)?))
}

/// The circuit breaker the settings ask for.
fn breaker(settings: &Settings) -> Breaker {
    Breaker::new(
        settings.redis.breaker_failures,
        settings.redis.breaker_cooldown(),
    )
}

fn warn_if_open(address: &SocketAddr, tokens: &Tokens) {
    if !tokens.admin_required() && !address.ip().is_loopback() {
        tracing::warn!(
            %address,
            "the policy API is open to anyone who can reach this address: set auth.admin_tokens"
        );
    }
}

/// File descriptors kept out of the HTTP connections' share besides the Redis connections: the
/// listener, log output, the runtime's own, a cluster's node connections.
const RESERVED_FILES: u64 = 256;

/// Raises the soft limit on open files to the hard one, then lowers `wanted` connections per
/// worker so that every worker's connections, `redis_files` and [`RESERVED_FILES`] fit under it:
/// a process out
/// of descriptors answers nothing, `/healthz` included, while one at its connection cap leaves
/// the excess waiting in the listen queue.
fn connections_that_fit(wanted: usize, workers: usize, redis_files: u64) -> usize {
    let soft = open_file_limit();
    let fit = fit_connections(wanted, workers, soft.saturating_sub(redis_files));
    if fit < wanted {
        tracing::warn!(
            max_connections = wanted,
            lowered_to = fit,
            workers,
            open_file_limit = soft,
            "server.max_connections lowered so that every worker's connections fit in the \
             open-file limit; raise the limit (ulimit -n, LimitNOFILE) to accept more"
        );
    }
    fit
}

/// The soft limit on open files, raised to the hard one first.
fn open_file_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => soft,
        Err(error) => {
            let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
            tracing::warn!(%error, soft, "could not raise the open-file limit");
            soft
        }
    }
}

/// `grpc.max_connections` lowered, when it and the HTTP workers' `http_wanted` connections do
/// not both fit under the open-file limit beside `redis_files` and [`RESERVED_FILES`], to its
/// proportional share of what does.
fn grpc_connections_that_fit(wanted: usize, http_wanted: usize, redis_files: u64) -> usize {
    let soft = open_file_limit();
    let fit = fit_grpc_connections(wanted, http_wanted, soft.saturating_sub(redis_files));
    if fit < wanted {
        tracing::warn!(
            max_connections = wanted,
            lowered_to = fit,
            open_file_limit = soft,
            "grpc.max_connections lowered so that gRPC and HTTP connections fit in the \
             open-file limit; raise the limit (ulimit -n, LimitNOFILE) to accept more"
        );
    }
    fit
}

/// gRPC connections that fit under `limit` open files beside [`RESERVED_FILES`]: all `wanted`
/// when the HTTP side's `http_wanted` fit too, else a share in proportion (at least 1). The
/// HTTP side then fits its workers into what is left ([`fit_connections`]).
fn fit_grpc_connections(wanted: usize, http_wanted: usize, limit: u64) -> usize {
    let share = limit.saturating_sub(RESERVED_FILES);
    let total = wanted as u128 + http_wanted as u128;
    if total <= u128::from(share) {
        return wanted;
    }
    let part = u128::from(share) * wanted as u128 / total.max(1);
    usize::try_from(part)
        .unwrap_or(usize::MAX)
        .clamp(1, wanted.max(1))
}

/// Connections per worker that fit under `limit` open files with [`RESERVED_FILES`] aside (at
/// least 1, so that a tiny limit still serves).
fn fit_connections(wanted: usize, workers: usize, limit: u64) -> usize {
    let share = limit.saturating_sub(RESERVED_FILES) / (workers.max(1) as u64);
    wanted
        .min(usize::try_from(share).unwrap_or(usize::MAX))
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_lowered_to_fit_the_file_limit() {
        assert_eq!(fit_connections(4_096, 2, 1_024), 384);
        assert_eq!(fit_connections(100, 2, 1_024), 100);
        assert_eq!(fit_connections(4_096, 4, 1_048_576), 4_096);
        assert_eq!(fit_connections(4_096, 2, 100), 1);
    }

    #[test]
    fn grpc_connections_take_their_share_of_the_file_limit() {
        // Both fit: nothing lowered.
        assert_eq!(fit_grpc_connections(1_024, 8_192, 1_048_576), 1_024);
        // Under 1,024 files, 2 workers of 4,096 and 1,024 gRPC: 768 to share, 85 for gRPC; the
        // HTTP workers get (768 - 86) / 2 = 341 each, so that every descriptor is accounted for.
        let grpc = fit_grpc_connections(1_024, 8_192, 1_024);
        assert_eq!(grpc, 85);
        let http = fit_connections(4_096, 2, 1_024 - (grpc as u64 + 1));
        assert_eq!(http, 341);
        assert!((2 * http + grpc + 1) as u64 + RESERVED_FILES <= 1_024);
        // A tiny limit still serves one.
        assert_eq!(fit_grpc_connections(1_024, 8_192, 100), 1);
    }
}
