//! The benchmark's ceiling of actix-web alone: one route, `GET /healthz`, answering the
//! body the service's `/healthz` answers on the embedded store, with no middleware, no other
//! route, no logging and no metrics. `bench/run.py` starts it beside the services and reports
//! the service's `/healthz` against it: what the service's own layers cost per request.
//!
//! It reads the same settings as the service (`RATELIMITER__SERVER__*`, `--config`) and is
//! served by the same [`ratelimiter::startup::http_server`] (workers, connection cap, timeouts,
//! keep-alive) with the same allocator, so that only the layers differ.
//!
//!     cargo build --release --example bare_http
//!     RATELIMITER__SERVER__BIND=127.0.0.1:8081 target/release/examples/bare_http

use std::net::TcpListener;

use actix_web::{web, App, HttpResponse};
use anyhow::Context;
use ratelimiter::api::health::{Health, COMMIT, VERSION};
use ratelimiter::config::Settings;
use ratelimiter::startup;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok",
        version: VERSION,
        commit: COMMIT,
        store: "embedded",
        policies: None,
        degraded: None,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = match std::env::args().nth(1).as_deref() {
        Some("--config") => std::env::args().nth(2).map(std::path::PathBuf::from),
        _ => None,
    };
    let settings = Settings::load(config.as_deref())?;
    let server = &settings.server;
    let listener = TcpListener::bind(server.bind)
        .with_context(|| format!("cannot listen on {}", server.bind))?;
    let workers = startup::worker_count(server);
    let factory = || App::new().route("/healthz", web::get().to(healthz));
    startup::http_server(factory, listener, server, workers, 0, None)?.await?;
    Ok(())
}
