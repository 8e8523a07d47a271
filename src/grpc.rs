//! Envoy's rate-limit service over gRPC (`envoy.service.ratelimit.v3.RateLimitService`), served
//! beside the HTTP API when `grpc.bind` is set, on the same policies, store and quotas.
//!
//! A `ShouldRateLimit` call names a `domain` and descriptors; each descriptor is matched to the
//! policy that serves it (`policy::descriptor`, through the policy cache's index) and decided
//! under the subject key its values make, so `POST /v1/acquire` with that key shares its quota.
//! The matched descriptors are decided together, all or nothing (`service::joint`). The answer
//! has one status per descriptor, in order (`OK` without a decision for a descriptor no policy
//! serves), and the IETF `RateLimit-Policy` and `RateLimit` fields, plus `Retry-After` on a
//! denial (written by [`crate::fields`], as over HTTP), in `response_headers_to_add`, which Envoy
//! adds to its answer to the client.
//!
//! A descriptor's `limit` (Envoy's `RateLimitOverride { requests_per_unit, unit }`) is ignored
//! unless its policy has `request_limits`; then it is passed down and decided with, clamped to
//! the policy's maximum, where no override applies to the subject (`service::resolve`). A
//! `limit` such a policy cannot take (0 requests, a unit of `UNKNOWN` or `YEAR`, longer than any
//! window) is `INVALID_ARGUMENT`.
//!
//! Failures: a policy with `fail_mode: closed` whose store cannot answer fails the call with
//! `UNAVAILABLE` (Envoy's `failure_mode_deny` then decides); `open` and `local` answer, marked
//! by a `Decided-By: fail_open` or `fail_local` field. An empty domain, no descriptors, a
//! descriptor without entries, or an empty value in a matched descriptor: `INVALID_ARGUMENT`.
//! With `auth.client_tokens` set, a call needs `authorization: Bearer <token>` metadata, or is
//! `UNAUTHENTICATED`.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use metrics::{Counter, Histogram};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::access::{Scope, Tokens};
use crate::config::GrpcSettings;
use crate::fields;
use crate::limiter::{MAX_UNITS, MAX_WAIT_US};
use crate::metrics as m;
use crate::policy::calendar::CalendarUnit;
use crate::policy::request_limits::{Requested, Unit as RequestUnit};
use crate::policy::{LimitKey, Policy, Rate};
use crate::service::{Acquired, Ask, DecidedBy, Hit, RateLimiter, ServiceError};

mod incoming;

/// Streams one connection may have the server reset (refused beyond
/// `max_concurrent_streams`, or malformed) before it is closed with `ENHANCE_YOUR_CALM`.
/// hyper's default: tonic, left alone, passes no limit at all, and a client refused again and
/// again would queue resets without end (RUSTSEC-2024-0003).
pub const MAX_REFUSED_STREAMS: usize = 1_024;

/// Most descriptors in one call.
pub const MAX_DESCRIPTORS: usize = 64;

/// Serves the rate-limit service on `listener` until `shutdown` completes, then lets calls in
/// flight finish. `max_connections` is `settings.max_connections` lowered to fit the open-file
/// limit (`startup`).
///
/// What bounds a client: at most `max_connections` connections (`incoming`), each closed unless
/// its HTTP/2 handshake arrives within `handshake_timeout_ms`; at most `max_concurrent_streams`
/// calls open per connection (advertised in SETTINGS; a stream beyond it is refused, and
/// [`MAX_REFUSED_STREAMS`] refusals close the connection) and `max_pending_resets` streams
/// reset by the client before being served; each call answered or cancelled
/// within `call_timeout_ms`, its body included; an idle connection pinged every
/// `keepalive_interval_ms` and closed when a ping goes unanswered for `keepalive_timeout_ms`;
/// and the bearer token checked on the call's headers, before its body is read.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limiter: Arc<RateLimiter>,
    tokens: Tokens,
    settings: &GrpcSettings,
    max_connections: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let grpc = Grpc::new(limiter);
    let unauthenticated = metrics::counter!(m::GRPC_REQUESTS, "code" => "unauthenticated");
    // On the headers alone: a call with a bad token is refused before its body is read.
    let authorize = move |mut request: Request<()>| {
        let values = || {
            request
                .metadata()
                .get_all("authorization")
                .into_iter()
                .map(|v| v.as_bytes())
        };
        match tokens.check(Scope::Decide, values()) {
            Ok(()) => {
                // Negative hits are settlements: whether this call's token may settle rides
                // with the call to [`Grpc::answer`].
                let settle = tokens
                    .check(Scope::Settle, values())
                    .map_err(|e| e.to_owned());
                request.extensions_mut().insert(MaySettle(settle));
                Ok(request)
            }
            Err(reason) => {
                unauthenticated.increment(1);
                Err(Status::unauthenticated(reason))
            }
        }
    };
    let service = RateLimitServiceServer::with_interceptor(grpc, authorize);
    let incoming = incoming::bounded(listener, max_connections, settings.handshake_timeout(), tls);
    tonic::transport::Server::builder()
        .timeout(settings.call_timeout())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(settings.max_pending_resets))
        .http2_max_local_error_reset_streams(Some(MAX_REFUSED_STREAMS))
        .http2_keepalive_interval(Some(settings.keepalive_interval()))
        .http2_keepalive_timeout(Some(settings.keepalive_timeout()))
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Whether a call's token may settle (`auth.settle_tokens`), or why not: found by the interceptor
/// on the call's headers, read by [`Grpc::answer`] for negative hits.
#[derive(Debug, Clone)]
struct MaySettle(Result<(), String>);

/// The `RateLimitService` implementation.
pub struct Grpc {
    limiter: Arc<RateLimiter>,
    ok: Counter,
    over_limit: Counter,
    unmatched: Counter,
    seconds: Histogram,
}

impl Grpc {
    pub fn new(limiter: Arc<RateLimiter>) -> Self {
        let _ = m::handle();
        Self {
            limiter,
            ok: metrics::counter!(m::GRPC_REQUESTS, "code" => "ok"),
            over_limit: metrics::counter!(m::GRPC_REQUESTS, "code" => "over_limit"),
            unmatched: metrics::counter!(m::GRPC_UNMATCHED),
            seconds: metrics::histogram!(m::GRPC_SECONDS),
        }
    }

    /// Answers one call, or the status it fails with.
    async fn answer(
        &self,
        request: &Request<RateLimitRequest>,
    ) -> Result<RateLimitResponse, Status> {
        // The token was checked on the call's headers, before its body was read (`serve`).
        let req = request.get_ref();
        if req.domain.is_empty() {
            return Err(Status::invalid_argument("`domain` must not be empty"));
        }
        if req.descriptors.is_empty() || req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(Status::invalid_argument(format!(
                "`descriptors` must hold 1 to {MAX_DESCRIPTORS} descriptors"
            )));
        }
        // Envoy leaves the request's `hits_addend` 0 to mean 1.
        let default_cost = u64::from(req.hits_addend.max(1));
        let cache = self.limiter.cache();
        let mut asks: Vec<Hit> = Vec::with_capacity(req.descriptors.len());
        // For each descriptor, its ask's index (`None`: no policy serves it), and whether its
        // hits are to be given back rather than taken.
        let mut slots: Vec<Option<usize>> = Vec::with_capacity(req.descriptors.len());
        let mut negative: Vec<bool> = Vec::new();
        for (i, d) in req.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "`descriptors[{i}]` has no entries"
                )));
            }
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let Some(found) = cache.for_descriptor(&req.domain, &entries) else {
                self.unmatched.increment(1);
                slots.push(None);
                continue;
            };
            let policy = &found.policy;
            let served = policy.descriptor();
            let key = served
                .map(|s| s.subject(entries.iter().map(|e| e.1)))
                .unwrap_or(Err("the policy no longer serves descriptors"))
                .and_then(LimitKey::parse)
                .map_err(|reason| {
                    Status::invalid_argument(format!(
                        "`descriptors[{i}]` (served by policy `{}`): {reason}",
                        policy.name
                    ))
                })?;
            // The descriptor's own limit, for a policy that lets requests give one; else ignored.
            let limit = match (&d.limit, policy.rate().and_then(Rate::request_limits)) {
                (Some(given), Some(_)) => Some(requested(given).map_err(|reason| {
                    Status::invalid_argument(format!(
                        "`descriptors[{i}]` (served by policy `{}`): {reason}",
                        policy.name
                    ))
                })?),
                _ => None,
            };
            let cost = d
                .hits_addend
                .map_or(default_cost, |h| h.value)
                .min(MAX_UNITS + 1);
            // Negative hits are refunds without a ticket: refused, as over HTTP, unless
            // `limits.ticketless_refunds` allows them (a negative 0 is a look); before anything is decided.
            if d.is_negative_hits && cost > 0 && !self.limiter.allows_ticketless_refunds() {
                return Err(Status::invalid_argument(format!(
                    "`descriptors[{i}]`: is_negative_hits gives units back without a ticket, \
                     which limits.ticketless_refunds does not allow"
                )));
            }
            // And they are settlements: with `auth.settle_tokens` set, a client token may not.
            if d.is_negative_hits && cost > 0 {
                let settle = match request.extensions().get::<MaySettle>() {
                    Some(MaySettle(settle)) => settle.as_ref().map_err(String::as_str),
                    None => Err("the call was not authorized"),
                };
                settle.map_err(|e| {
                    Status::permission_denied(format!(
                        "`descriptors[{i}]`: is_negative_hits needs a settle token: {e}"
                    ))
                })?;
            }
            negative.push(d.is_negative_hits);
            slots.push(Some(asks.len()));
            asks.push(Hit {
                found,
                key,
                cost,
                limit,
            });
        }
        // Negative hits give units back (a refund without a ticket) and take part in nothing
        // else (a negative 0 is a look, as a 0 is); the rest are decided together.
        let mut answers: Vec<Option<Acquired>> = asks.iter().map(|_| None).collect();
        let mut together: Vec<usize> = Vec::with_capacity(asks.len());
        for (i, ask) in asks.iter().enumerate() {
            if !negative[i] || ask.cost == 0 {
                together.push(i);
                continue;
            }
            let cost = ask.cost.min(MAX_UNITS);
            let refund = Ask::Refund { cost, ticket: None };
            let given = self.limiter.decide_hit(ask, refund).await.map_err(status)?;
            answers[i] = Some(given);
        }
        let decided = if together.len() == asks.len() {
            self.limiter.acquire_together(&asks).await
        } else {
            let picked: Vec<Hit> = together.iter().map(|&i| asks[i].clone()).collect();
            self.limiter.acquire_together(&picked).await
        }
        .map_err(status)?;
        for (&i, a) in together.iter().zip(decided) {
            answers[i] = Some(a);
        }
        let response = respond(&slots, &answers);
        if crate::trace::enabled() {
            // On the call's span (`should_rate_limit`).
            let decisions: Vec<_> = asks
                .iter()
                .zip(&answers)
                .filter_map(|(h, a)| Some((a.as_ref()?, &h.key, h.cost)))
                .collect();
            crate::trace::record_decisions(&tracing::Span::current(), &decisions);
        }
        for (slot, status) in slots.iter().zip(&response.statuses) {
            if let Some(a) = slot.and_then(|i| answers.get(i)?.as_ref()) {
                let code = if status.code == Code::OverLimit as i32 {
                    "over_limit"
                } else {
                    "ok"
                };
                metrics::counter!(m::GRPC_DESCRIPTORS, "policy" => a.policy.name.to_string(), "code" => code)
                    .increment(1);
            }
        }
        Ok(response)
    }
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        // The root span of the call, as the HTTP side's (`api::span`): every log line of the
        // decision (a fail mode answering, a refund that failed) says it came over gRPC, and
        // from where. Client-controlled text is recorded with `Debug`, escaped.
        let span = tracing::info_span!(
            "grpc",
            rpc = "ShouldRateLimit",
            peer = tracing::field::Empty,
            domain = ?request.get_ref().domain,
            descriptors = request.get_ref().descriptors.len(),
        );
        if let Some(peer) = request.remote_addr() {
            span.record("peer", tracing::field::display(peer));
        }
        crate::trace::continue_trace(&span, &crate::trace::GrpcMetadata(request.metadata()));
        let answer = self.answer(&request).instrument(span).await;
        self.seconds.record(started.elapsed().as_secs_f64());
        match &answer {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => self.over_limit.increment(1),
            Ok(_) => self.ok.increment(1),
            Err(s) => {
                let code = match s.code() {
                    tonic::Code::InvalidArgument => "invalid_argument",
                    tonic::Code::Unauthenticated => "unauthenticated",
                    tonic::Code::Unavailable => "unavailable",
                    _ => "internal",
                };
                metrics::counter!(m::GRPC_REQUESTS, "code" => code).increment(1);
                tracing::debug!(domain = %request.get_ref().domain, code, message = s.message(), "gRPC rate-limit call failed");
            }
        }
        answer.map(Response::new)
    }
}

/// The gRPC status of a call that got no answer.
fn status(e: ServiceError) -> Status {
    match e {
        ServiceError::Store(e) => Status::unavailable(format!(
            "the rate-limit store could not decide and a policy's fail_mode is closed: {e}"
        )),
        // Deleted between the match and the decision: a retry finds what serves it now.
        ServiceError::UnknownPolicy(name) => {
            Status::unavailable(format!("policy `{name}` changed during the call; retry"))
        }
        other => Status::internal(other.to_string()),
    }
}

/// The answer: per descriptor, its status; overall, `OVER_LIMIT` when any is; and the
/// `RateLimit` fields of every policy that decided.
fn respond(slots: &[Option<usize>], answers: &[Option<Acquired>]) -> RateLimitResponse {
    let mut statuses = Vec::with_capacity(slots.len());
    let mut over = false;
    let mut retry_after_us = 0;
    let mut degraded: Option<DecidedBy> = None;
    for slot in slots {
        let Some(a) = slot.and_then(|i| answers.get(i)?.as_ref()) else {
            statuses.push(DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            });
            continue;
        };
        let denies = !a.shadow && a.verdict.limits().iter().any(|d| !d.allowed);
        if denies {
            over = true;
            let wait = a
                .verdict
                .limits()
                .iter()
                .filter(|d| !d.allowed)
                .map(|d| d.retry_after_us)
                .max()
                .unwrap_or(0);
            // A block without an expiry has no time to wait for, as over HTTP.
            let wait = if a.decided_by == DecidedBy::Override && wait == 0 {
                MAX_WAIT_US
            } else {
                wait
            };
            retry_after_us = retry_after_us.max(wait);
        }
        if a.degraded {
            degraded = Some(a.decided_by);
        }
        statuses.push(descriptor_status(a, denies));
    }
    let mut headers = Vec::with_capacity(4);
    let decided: Vec<&Acquired> = dedup(answers);
    if !decided.is_empty() {
        let mut policy = String::new();
        fields::ratelimit_policy(&mut policy, decided.iter().copied());
        headers.push(header("RateLimit-Policy", policy));
        let mut remaining = String::new();
        if fields::ratelimit(&mut remaining, decided.iter().copied()) {
            headers.push(header("RateLimit", remaining));
        }
    }
    // A cost above a limit's quota is never allowed: no time to wait for.
    if over && retry_after_us < MAX_WAIT_US {
        let mut seconds = String::new();
        fields::retry_after(&mut seconds, retry_after_us);
        headers.push(header("Retry-After", seconds));
    }
    if let Some(d) = degraded {
        headers.push(header("Decided-By", d.as_str().to_owned()));
    }
    // Which override applied, for support staff ("why was this customer limited?"): the first
    // answer an override applied to, as the HTTP API's `Ratelimit-Override` names it.
    if let Some(a) = decided.iter().find(|a| a.applied.is_some()) {
        let mut text = String::new();
        fields::override_field(&mut text, a);
        headers.push(header("Ratelimit-Override", text));
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

/// One descriptor's status, from its binding limit (the one that denies, or the one with the
/// least left).
fn descriptor_status(a: &Acquired, denies: bool) -> DescriptorStatus {
    let binding = a.verdict.binding();
    let d = a.verdict.decision();
    let limit = a.limits().get(binding);
    let current_limit = limit.map(|l| RateLimit {
        name: item_name(&a.policy, binding),
        requests_per_unit: u32::try_from(l.params.quota()).unwrap_or(u32::MAX),
        unit: match l.calendar_of() {
            Some(c) => calendar_unit(c.unit()),
            None => unit(l.params.window_us()),
        } as i32,
    });
    DescriptorStatus {
        code: if denies { Code::OverLimit } else { Code::Ok } as i32,
        current_limit,
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(d.reset_after_us)),
        ..DescriptorStatus::default()
    }
}

/// A descriptor's `limit` as the service takes it, or why it cannot be one.
fn requested(given: &RateLimitOverride) -> Result<Requested, &'static str> {
    // `envoy.type.v3.RateLimitUnit` has no WEEK yet; the response's unit has, as 7: taken too.
    const WEEK: i32 = 7;
    let unit = match RateLimitUnit::try_from(given.unit) {
        Ok(RateLimitUnit::Second) => RequestUnit::Second,
        Ok(RateLimitUnit::Minute) => RequestUnit::Minute,
        Ok(RateLimitUnit::Hour) => RequestUnit::Hour,
        Ok(RateLimitUnit::Day) => RequestUnit::Day,
        Ok(RateLimitUnit::Month) => RequestUnit::Month,
        Err(_) if given.unit == WEEK => RequestUnit::Week,
        Ok(RateLimitUnit::Year) => {
            return Err("its limit's unit, YEAR, is longer than any window (at most 31 days)")
        }
        Ok(RateLimitUnit::Unknown) | Err(_) => return Err("its limit's unit is not known"),
    };
    Requested::new(u64::from(given.requests_per_unit), unit)
}

/// The unit a window maps onto exactly; `UNKNOWN` for any other window (a 90-second window, a
/// bucket that refills in 2.5 s): the exact window is in `RateLimit-Policy`'s `w`.
fn unit(window_us: u64) -> Unit {
    const S: u64 = 1_000_000;
    match window_us {
        S => Unit::Second,
        w if w == 60 * S => Unit::Minute,
        w if w == 3_600 * S => Unit::Hour,
        w if w == 86_400 * S => Unit::Day,
        w if w == 7 * 86_400 * S => Unit::Week,
        // As envoyproxy/ratelimit counts a month, and a request-given `limit` of MONTH is kept.
        w if w == 30 * 86_400 * S => Unit::Month,
        _ => Unit::Unknown,
    }
}

/// A calendar limit's unit: a quarter has none in Envoy's protocol (its `w` says 89 to 92 days).
fn calendar_unit(u: CalendarUnit) -> Unit {
    match u {
        CalendarUnit::Day => Unit::Day,
        CalendarUnit::Week => Unit::Week,
        CalendarUnit::Month => Unit::Month,
        CalendarUnit::Quarter => Unit::Unknown,
        CalendarUnit::Year => Unit::Year,
    }
}

fn duration(us: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(us % 1_000_000 * 1_000).unwrap_or(0),
    }
}

/// A limit's name in the `RateLimit` fields and in `current_limit`: `<policy>` for a policy of
/// one limit, `<policy>/<limit>` for each of several, as the HTTP API names them.
fn item_name(policy: &Policy, limit: usize) -> String {
    match policy.rate() {
        Some(rate) if rate.is_composite() => match rate.limits().get(limit) {
            Some(l) => format!("{}/{}", policy.name, l.name),
            None => policy.name.to_string(),
        },
        _ => policy.name.to_string(),
    }
}

/// The answers of distinct policies, in order of first appearance: the `RateLimit` fields name
/// their items by policy (and limit), so a policy's second subject in one call (two descriptors
/// of different values) would repeat a name with other numbers; the first one's stand.
fn dedup(answers: &[Option<Acquired>]) -> Vec<&Acquired> {
    let mut seen: Vec<&Acquired> = Vec::new();
    for a in answers.iter().flatten() {
        if !seen.iter().any(|s| s.policy.name == a.policy.name) {
            seen.push(a);
        }
    }
    seen
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_map_onto_units_only_exactly() {
        assert_eq!(unit(1_000_000), Unit::Second);
        assert_eq!(unit(60_000_000), Unit::Minute);
        assert_eq!(unit(3_600_000_000), Unit::Hour);
        assert_eq!(unit(86_400_000_000), Unit::Day);
        assert_eq!(unit(604_800_000_000), Unit::Week);
        assert_eq!(unit(2_592_000_000_000), Unit::Month);
        assert_eq!(unit(90_000_000), Unit::Unknown);
        assert_eq!(unit(2_500_000), Unit::Unknown);
    }

    #[test]
    fn durations_split_into_seconds_and_nanos() {
        let d = duration(2_500_001);
        assert_eq!((d.seconds, d.nanos), (2, 500_001_000));
    }
}
