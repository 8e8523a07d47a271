//! HTTP only: routes, request and response shapes, headers, and the one error mapping
//! (`errors`). Handlers validate input into policy types and call the service; they never touch
//! a store or build a Redis key. Around every request: its log span (`span`) and the guard that
//! keeps a body from holding a connection (`guard`). Bodies are read by `body`, decision answers
//! written by `reply`; both are on every decision's path, so they avoid allocations and passes
//! that a successful request does not need.

pub mod auth;
pub mod body;
pub mod decisions;
pub mod docs;
pub mod errors;
pub mod guard;
pub mod health;
pub mod leases;
pub mod overrides;
pub mod policies;
pub mod reply;
pub mod schema;
pub mod span;
pub mod top;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{web, App, Error, HttpRequest};
use std::time::Duration;
use utoipa::OpenApi;
use utoipa_actix_web::AppExt;
use utoipa_swagger_ui::SwaggerUi;

use crate::service::RateLimiter;
use errors::ApiError;

/// The OpenAPI document generated from the handlers, as served at `/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut spec) = routes(App::new()).split_for_parts();
    decisions::document_headers(&mut spec);
    spec
}

fn routes<T>(app: App<T>) -> utoipa_actix_web::UtoipaApp<T>
where
    T: ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse,
        Error = Error,
        InitError = (),
    >,
{
    // actix tries the routes in this order, one after the other, and matches a path with
    // parameters by regular expression, far dearer than comparing a fixed path (behind five of
    // them, /healthz spent 8 % of its time there): fixed paths first, the busiest first. No two
    // routes match the same path and method, so the order changes nothing else.
    app.into_utoipa_app()
        .openapi(docs::ApiDoc::openapi())
        .service(decisions::acquire)
        .service(decisions::peek)
        .service(decisions::report)
        .service(decisions::refund)
        .service(leases::take)
        .service(health::healthz)
        .service(health::readyz)
        .service(health::metrics)
        .service(decisions::reset)
        .service(decisions::rotate_ticket_keys)
        .service(policies::list)
        .service(policies::create)
        .service(leases::renew)
        .service(leases::release)
        .service(policies::read)
        .service(policies::replace)
        .service(policies::remove)
        .service(overrides::list)
        .service(overrides::create)
        .service(overrides::resolve)
        .service(top::top)
        .service(overrides::read)
        .service(overrides::replace)
        .service(overrides::remove)
}

/// The methods a known path takes, for the `Allow` header of a 405.
fn allowed_methods(path: &str) -> Option<&'static str> {
    match path {
        "/v1/acquire" | "/v1/peek" | "/v1/report" | "/v1/refund" | "/v1/reset" | "/v1/leases"
        | "/v1/tickets/rotate" => Some("POST"),
        "/v1/policies" => Some("GET, POST"),
        "/healthz" | "/readyz" | "/metrics" | "/openapi.json" => Some("GET"),
        _ => {
            let segment = |rest: &str| !rest.is_empty() && !rest.contains('/');
            if let Some(rest) = path.strip_prefix("/v1/policies/") {
                if segment(rest) {
                    return Some("GET, PUT, DELETE");
                }
                let (name, tail) = rest.split_once('/')?;
                if !segment(name) {
                    return None;
                }
                return match tail {
                    "overrides" => Some("GET, POST"),
                    "resolve" | "top" => Some("GET"),
                    _ => tail
                        .strip_prefix("overrides/")
                        .filter(|id| segment(id))
                        .map(|_| "GET, PUT, DELETE"),
                };
            }
            let id = path.strip_prefix("/v1/leases/")?;
            match id.strip_suffix("/renew") {
                Some(id) if segment(id) => Some("POST"),
                _ => segment(id).then_some("DELETE"),
            }
        }
    }
}

/// What the HTTP edge needs beyond the service: tokens, proxies, the body deadline.
#[derive(Clone)]
pub struct Edge {
    pub tokens: web::Data<crate::access::Tokens>,
    pub trusted_proxies: web::Data<span::TrustedProxies>,
    /// `server.request_timeout_ms`: how long a request's body may take to arrive.
    pub request_timeout: Duration,
}

/// The whole application: API, spec, Swagger UI, problem+json for unknown routes, the guard on
/// request bodies, and a tracing span with a request id around every request (every log line of
/// a request carries it).
pub fn app(
    limiter: web::Data<RateLimiter>,
    edge: Edge,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = Error,
        InitError = (),
    >,
> {
    let app = App::new()
        .app_data(limiter)
        .app_data(edge.tokens)
        .app_data(edge.trusted_proxies);
    let (app, mut spec) = routes(app).split_for_parts();
    decisions::document_headers(&mut spec);
    app.service(SwaggerUi::new("/docs/{_:.*}").url("/openapi.json", spec))
        .configure(docs::configure_redirect)
        .default_service(web::to(|req: HttpRequest| async move {
            let route = format!("{} {}", req.method(), req.path());
            Err::<actix_web::HttpResponse, _>(match allowed_methods(req.path()) {
                Some(allow) => ApiError::MethodNotAllowed { route, allow },
                None => ApiError::NoRoute(route),
            })
        }))
        .wrap(guard::Guard::new(edge.request_timeout))
        .wrap(span::RequestSpan)
}
