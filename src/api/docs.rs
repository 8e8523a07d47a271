//! The OpenAPI document and the Swagger UI that shows it, both served from the binary.

use actix_web::{web, HttpResponse};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The parts of the spec that are not derived from a handler.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "ratelimiter",
        description = "A rate-limit service any program calls over HTTP/JSON. Create policies with \
            the `/v1/policies` API, then ask `POST /v1/acquire` before each unit of work: the answer \
            is allowed or denied, atomically, with how much is left and when to retry. `POST \
            /v1/peek` looks without spending; `POST /v1/report` and `POST /v1/refund` settle costs \
            known only afterwards (reserve with acquire, then report the extra or refund the \
            surplus with the acquire's ticket); `POST /v1/reset` starts a subject afresh. \
            Concurrency policies bound how many at once instead: take a lease with `POST \
            /v1/leases`, renew it while working, release it when done (a lease that is neither \
            renewed nor released expires). Errors are RFC 9457 `application/problem+json` \
            documents naming the field at fault.",
        license(name = "MIT OR Apache-2.0")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "decisions", description = "Decisions: acquire units, peek, report and refund them, reset a subject"),
        (name = "leases", description = "Leases of concurrency policies: take, renew, release"),
        (name = "policies", description = "Create, read, replace and delete policies at run time"),
        (name = "overrides", description = "Per-subject limits: a policy's tiers given to subjects, their own limits, unlimited, blocked; and what applies to a subject, explained"),
        (name = "operations", description = "Health, readiness and metrics"),
    )
)]
pub struct ApiDoc;

/// The `bearer` scheme: tokens from `auth.admin_tokens` (policies, reset, key rotation),
/// `auth.settle_tokens` (settlements and decisions) or `auth.client_tokens` (decisions), required
/// only when those settings are set.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut scheme = Http::new(HttpAuthScheme::Bearer);
        scheme.description = Some(
            "Needed for the policy API, reset and the ticket key rotation when \
             `auth.admin_tokens` is set; for report and refund when `auth.settle_tokens` is set \
             (otherwise a client token); for acquire, peek and the lease endpoints (a client or \
             a settle token) when either is set; reset takes a settle or else a client token \
             when no admin token is set."
                .into(),
        );
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// `/docs` without its slash: send browsers to the UI.
pub async fn redirect_to_docs() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header(("Location", "/docs/"))
        .finish()
}

pub fn configure_redirect(cfg: &mut web::ServiceConfig) {
    cfg.route("/docs", web::get().to(redirect_to_docs));
}
