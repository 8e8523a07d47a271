//! Building the application from its settings: the store, the policies, the HTTP server.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{web, HttpServer};
use anyhow::Context;

use crate::api;
use crate::api::auth::Tokens;
use crate::config::Settings;
use crate::service::RateLimiter;
use crate::store::breaker::Breaker;
use crate::store::redis::redact_url;
use crate::store::{AnyStore, MemoryStore, RedisStore, Store};

/// A built application, bound to its port and ready to run.
pub struct Application {
    port: u16,
    server: Server,
    limiter: Arc<RateLimiter>,
}

impl Application {
    /// Connects the store, creates the configured policies, loads the policy cache and binds
    /// `server.bind` (port 0 picks a free port; see [`Application::port`]).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let prefix = &settings.redis.key_prefix;
        let store = match &settings.redis.url {
            None if !settings.redis.cluster_nodes.is_empty() => {
                let nodes: Vec<&str> = settings
                    .redis
                    .cluster_nodes
                    .iter()
                    .map(|n| n.expose())
                    .collect();
                // Seeds may carry the cluster's password: only their redacted form is shown.
                let shown: Vec<String> = nodes
                    .iter()
                    .map(|n| redact_url(&format!("redis://{n}")))
                    .collect();
                let shown = shown.join(", ");
                let store = RedisStore::open_cluster(&nodes, settings.redis.timeout(), prefix)
                    .await
                    .with_context(|| format!("cannot reach the Redis Cluster at {shown}"))?;
                tracing::info!(nodes = %shown, "using Redis Cluster");
                AnyStore::Redis(store.with_breaker(breaker(&settings)))
            }
            None => {
                tracing::warn!(
                    "no redis.url set: using the embedded in-process store; limits are per process \
                     and not shared with other instances"
                );
                AnyStore::Memory(MemoryStore::new(prefix))
            }
            Some(url) => {
                let shown = redact_url(url.expose());
                let store = RedisStore::open(
                    url.expose(),
                    settings.redis.connection_mode(),
                    settings.redis.pool_size,
                    settings.redis.timeout(),
                    prefix,
                )?
                .with_breaker(breaker(&settings));
                store
                    .ping()
                    .await
                    .with_context(|| format!("cannot reach Redis at {shown}"))?;
                tracing::info!(
                    redis = %shown,
                    mode = %settings.redis.connection_mode,
                    "using Redis"
                );
                AnyStore::Redis(store)
            }
        };
        let limiter = Arc::new(RateLimiter::new(store, prefix));
        limiter
            .ensure_policies(&settings.policies)
            .await
            .context("creating the configured policies")?;
        limiter.refresh().await.context("loading policies")?;
        limiter.spawn_background(settings.redis.policy_refresh());

        let listener = TcpListener::bind(&settings.server.bind)
            .with_context(|| format!("cannot listen on {}", settings.server.bind))?;
        let address = listener.local_addr()?;
        let tokens = Tokens::from_settings(&settings.auth);
        warn_if_open(&address, &tokens);

        let data = web::Data::from(limiter.clone());
        let tokens = web::Data::new(tokens);
        let server_settings = &settings.server;
        let mut server = HttpServer::new(move || api::app(data.clone(), tokens.clone()))
            .listen(listener)?
            .max_connections(server_settings.max_connections)
            .client_request_timeout(Duration::from_millis(
                server_settings.client_request_timeout_ms,
            ))
            .client_disconnect_timeout(Duration::from_secs(1))
            .keep_alive(Duration::from_secs(server_settings.keep_alive_s))
            .shutdown_timeout(server_settings.shutdown_timeout_s);
        if server_settings.workers > 0 {
            server = server.workers(server_settings.workers);
        }
        tracing::info!(%address, docs = %format!("http://{address}/docs/"), "serving");
        Ok(Self {
            port: address.port(),
            server: server.run(),
            limiter,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves until SIGINT or SIGTERM, then stops accepting, lets in-flight requests finish (up
    /// to `server.shutdown_timeout_s`) and closes the store's connections.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        tracing::info!("stopped");
        drop(self.limiter);
        result
    }
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
