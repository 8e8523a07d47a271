//! Building the application from its settings: the store, the policies, the HTTP server.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{web, HttpServer};
use anyhow::Context;

use crate::api;
use crate::config::Settings;
use crate::service::RateLimiter;
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
                    settings.redis.pool_size,
                    settings.redis.timeout(),
                    prefix,
                )?;
                store
                    .ping()
                    .await
                    .with_context(|| format!("cannot reach Redis at {shown}"))?;
                tracing::info!(redis = %shown, "using Redis");
                AnyStore::Redis(store)
            }
        };
        let limiter = Arc::new(RateLimiter::new(store));
        limiter
            .ensure_policies(&settings.policies)
            .await
            .context("creating the configured policies")?;
        limiter.refresh().await.context("loading policies")?;
        limiter.spawn_background(settings.redis.policy_refresh());

        let listener = TcpListener::bind(&settings.server.bind)
            .with_context(|| format!("cannot listen on {}", settings.server.bind))?;
        let address = listener.local_addr()?;
        let data = web::Data::from(limiter.clone());
        let mut server = HttpServer::new(move || api::app(data.clone()))
            .listen(listener)?
            .shutdown_timeout(10);
        if settings.server.workers > 0 {
            server = server.workers(settings.server.workers);
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

    pub fn limiter(&self) -> Arc<RateLimiter> {
        self.limiter.clone()
    }

    /// Serves until SIGINT or SIGTERM, then finishes in-flight requests (up to 10 s).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}
