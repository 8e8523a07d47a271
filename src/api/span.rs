//! The root span of every request, as its log lines carry it: method, route, path (never the
//! query string, which may hold a token), the client's address, the User-Agent, the request id,
//! and the status; and [`RequestSpan`], the middleware that runs each request inside it.
//!
//! A request pays for its span only when the span is enabled (`info`, the default level): every
//! field is computed inside the span macro, and the request id is a counter, not a random draw
//! (see [`RequestId`]). Below `info` a request costs one level check here.
//!
//! When traces are exported (`trace`), this span is the request's OpenTelemetry span, a child of
//! the caller's `traceparent` when it sends one.
//!
//! The client's address is the peer's, unless the peer is one of `server.trusted_proxies`; only
//! then does `X-Forwarded-For` name the client (anyone else can write that header). Every field a
//! client controls is recorded with `Debug` formatting, so quotes, backslashes and control
//! characters come out escaped and a client cannot forge a field or a log line.

use std::fmt;
use std::future::{ready, Future, Ready};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};

use actix_web::body::MessageBody;
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, Error};
use tracing::Span;

use crate::config::ProxyNet;

/// `server.trusted_proxies`, as the application's data.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(pub Vec<ProxyNet>);

impl TrustedProxies {
    fn trusts(&self, ip: &IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(ip))
    }

    /// The client's address: the peer's own, or, when the peer is a trusted proxy, the last
    /// address in `X-Forwarded-For` that is not itself a trusted proxy (each proxy appends the
    /// address it received the request from, so addresses left of an untrusted one are only
    /// what the client claimed).
    pub fn client_ip<'a>(
        &self,
        peer: Option<IpAddr>,
        forwarded_for: impl DoubleEndedIterator<Item = &'a [u8]>,
    ) -> Option<IpAddr> {
        let mut client = peer?;
        if !self.trusts(&client) {
            return Some(client);
        }
        let hops = forwarded_for
            .rev()
            .flat_map(|value| value.rsplit(|b| *b == b','));
        for hop in hops {
            let Some(ip) = std::str::from_utf8(hop)
                .ok()
                .and_then(|h| h.trim().parse::<IpAddr>().ok())
            else {
                break;
            };
            client = ip;
            if !self.trusts(&ip) {
                break;
            }
        }
        Some(client)
    }
}

/// The middleware that runs every request inside its span; see the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestSpan;

impl<S, B> Transform<S, ServiceRequest> for RequestSpan
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
    B: MessageBody,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Transform = RequestSpanService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RequestSpanService { service }))
    }
}

pub struct RequestSpanService<S> {
    service: S,
}

impl<S, B> Service<ServiceRequest> for RequestSpanService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
    B: MessageBody,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Future = InSpan<S::Future>;

    forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let span = root_span(&request);
        // Before the span is first entered: its OpenTelemetry parent can be set only until then.
        crate::trace::continue_trace(&span, &crate::trace::HttpHeaders(request.headers()));
        let answer = span.in_scope(|| self.service.call(request));
        InSpan { answer, span }
    }
}

/// The request's span. Every field is computed inside the span macro, which evaluates them only
/// when the span is enabled: below `info` a request costs no allocation and no formatting here.
fn root_span(request: &ServiceRequest) -> Span {
    tracing::info_span!(
        "HTTP request",
        http.method = %request.method(),
        http.route = ?Route(request),
        http.target = ?loggable_path(request.path()),
        http.host = ?Escaped(request.headers().get(header::HOST)),
        http.client_ip = %ClientIp(request),
        http.user_agent = ?Escaped(request.headers().get(header::USER_AGENT)),
        http.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        request_id = %RequestId::next(),
        exception.message = tracing::field::Empty,
    )
}

/// Records the outcome of the request in its span.
fn record_end<B>(span: &Span, outcome: &Result<ServiceResponse<B>, Error>) {
    if span.is_disabled() {
        return;
    }
    let (status, error) = match outcome {
        Ok(response) => (
            response.status(),
            response.response().error().map(ToString::to_string),
        ),
        Err(error) => (
            error.as_response_error().status_code(),
            Some(error.to_string()),
        ),
    };
    span.record("http.status_code", status.as_u16());
    span.record(
        "otel.status_code",
        if status.is_server_error() {
            "ERROR"
        } else {
            "OK"
        },
    );
    if let Some(message) = error {
        // Error messages quote client input (field names), so they are escaped too.
        span.record("exception.message", tracing::field::debug(message));
    }
}

pin_project_lite::pin_project! {
    /// The answer of a request, polled inside its span, which records the outcome.
    pub struct InSpan<F> {
        #[pin]
        answer: F,
        span: Span,
    }
}

impl<F, B> Future for InSpan<F>
where
    F: Future<Output = Result<ServiceResponse<B>, Error>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let outcome = ready!(this.answer.poll(cx));
        record_end(this.span, &outcome);
        Poll::Ready(outcome)
    }
}

/// The route template the request matched (`/v1/policies/{name}`), or `default`; looked up
/// only when the span is written.
struct Route<'a>(&'a ServiceRequest);

impl fmt::Debug for Route<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.match_pattern() {
            Some(route) => fmt::Debug::fmt(&route, f),
            None => fmt::Debug::fmt("default", f),
        }
    }
}

/// A header's value as a `Debug`-escaped string, invalid UTF-8 replaced; `""` when absent.
struct Escaped<'a>(Option<&'a HeaderValue>);

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0.map_or(&b""[..], |v| v.as_bytes());
        fmt::Debug::fmt(&*String::from_utf8_lossy(bytes), f)
    }
}

/// The client's address as [`TrustedProxies::client_ip`] finds it; empty when unknown.
struct ClientIp<'a>(&'a ServiceRequest);

impl fmt::Display for ClientIp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let request = self.0;
        let peer = request.peer_addr().map(|a| a.ip());
        let client_ip = match request.app_data::<web::Data<TrustedProxies>>() {
            Some(trusted) => trusted.client_ip(
                peer,
                request
                    .headers()
                    .get_all("x-forwarded-for")
                    .map(|v| v.as_bytes()),
            ),
            None => peer,
        };
        match client_ip {
            Some(ip) => fmt::Display::fmt(&ip, f),
            None => Ok(()),
        }
    }
}

/// A request's id, unique within the process and, by its random part, across processes: shaped
/// as a version 4 UUID (`8-4-4-4-12` lower-case hex, version and variant bits set), as the log
/// field always was. 60 random bits drawn once per process, then a counter (started at a
/// random point) in the low 62 bits: one atomic add per request instead of a `getrandom` system
/// call. Ids are not secrets: nothing is authorised by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId(u128);

impl RequestId {
    /// The next id of this process.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let (high, start) = *process_random();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self::from_parts(high, start.wrapping_add(n))
    }

    fn from_parts(high: u64, low: u64) -> Self {
        // Version 4 in the high half's 13th hex digit, variant `10` in the low half's top bits.
        let high = (high & !0xf000) | 0x4000;
        let low = (low & (u64::MAX >> 2)) | (1 << 63);
        Self((u128::from(high) << 64) | u128::from(low))
    }
}

/// Two random words drawn once per process: the ids' fixed part and the counter's start.
fn process_random() -> &'static (u64, u64) {
    static RANDOM: OnceLock<(u64, u64)> = OnceLock::new();
    RANDOM.get_or_init(|| {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            // Without the system's generator, the time and the process id still set processes
            // apart.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            bytes = (nanos ^ (u128::from(std::process::id()) << 96)).to_le_bytes();
        }
        let (a, b) = bytes.split_at(8);
        let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
        (word(a), word(b))
    })
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 36];
        let mut digit = 0;
        for (i, slot) in out.iter_mut().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                *slot = b'-';
            } else {
                let shift = 124 - 4 * digit;
                *slot = HEX[((self.0 >> shift) & 0xf) as usize];
                digit += 1;
            }
        }
        // Only ASCII hex digits and hyphens were written.
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

/// The path as logs may show it: a lease id is its holder's bearer secret (whoever has it can
/// renew or release the lease), so `/v1/leases/<id>…` is logged with the id's random part
/// replaced.
fn loggable_path(path: &str) -> std::borrow::Cow<'_, str> {
    const LEASES: &str = "/v1/leases/";
    let Some(rest) = path.strip_prefix(LEASES) else {
        return path.into();
    };
    let (id, tail) = rest.split_once('/').map_or((rest, ""), |(id, t)| (id, t));
    // `l1~<policy>~<key>~<random>~<cost>`: keep the subject, hide the random part.
    let mut parts: Vec<&str> = id.split('~').collect();
    if let Some(random) = parts.get_mut(3) {
        *random = "…";
    } else if !id.is_empty() {
        return format!("{LEASES}…").into();
    }
    let id = parts.join("~");
    if tail.is_empty() {
        format!("{LEASES}{id}").into()
    } else {
        format!("{LEASES}{id}/{tail}").into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(nets: &[&str]) -> TrustedProxies {
        TrustedProxies(
            nets.iter()
                .map(|n| ProxyNet::try_from(n.to_string()).expect("net"))
                .collect(),
        )
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    fn client(t: &TrustedProxies, peer: &str, headers: &[&str]) -> IpAddr {
        t.client_ip(Some(ip(peer)), headers.iter().map(|h| h.as_bytes()))
            .expect("an address")
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let t = trusted(&[]);
        assert_eq!(client(&t, "203.0.113.9", &["6.6.6.6"]), ip("203.0.113.9"));
        let t = trusted(&["10.0.0.0/8"]);
        assert_eq!(client(&t, "203.0.113.9", &["6.6.6.6"]), ip("203.0.113.9"));
    }

    #[test]
    fn a_trusted_proxy_names_the_client_it_received_the_request_from() {
        let t = trusted(&["10.0.0.0/8"]);
        assert_eq!(
            client(&t, "10.0.0.1", &["6.6.6.6, 198.51.100.4"]),
            ip("198.51.100.4")
        );
        // Proxies in a chain are skipped; what the client claimed left of them is not read.
        assert_eq!(
            client(&t, "10.0.0.1", &["6.6.6.6, 198.51.100.4", "10.0.0.2"]),
            ip("198.51.100.4")
        );
        assert_eq!(client(&t, "10.0.0.1", &[]), ip("10.0.0.1"));
        assert_eq!(client(&t, "10.0.0.1", &["garbage"]), ip("10.0.0.1"));
    }

    #[test]
    fn request_ids_are_distinct_version_4_uuids() {
        let ids: Vec<String> = (0..1_000).map(|_| RequestId::next().to_string()).collect();
        for id in &ids {
            let groups: Vec<&str> = id.split('-').collect();
            let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
            assert_eq!(lengths, [8, 4, 4, 4, 12], "{id}");
            assert!(
                id.bytes()
                    .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{id}"
            );
            assert!(groups[2].starts_with('4'), "version 4: {id}");
            assert!(
                matches!(groups[3].as_bytes()[0], b'8'..=b'9' | b'a'..=b'b'),
                "variant: {id}"
            );
        }
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        assert_eq!(
            RequestId::from_parts(u64::MAX, u64::MAX).to_string(),
            "ffffffff-ffff-4fff-bfff-ffffffffffff"
        );
        assert_eq!(
            RequestId::from_parts(0, 0).to_string(),
            "00000000-0000-4000-8000-000000000000"
        );
    }

    #[test]
    fn a_lease_id_is_logged_without_its_secret() {
        let id = "l1~exports~dXNlci00Mg~0123456789abcdef0123456789abcdef~1";
        assert_eq!(
            loggable_path(&format!("/v1/leases/{id}/renew")),
            "/v1/leases/l1~exports~dXNlci00Mg~…~1/renew"
        );
        assert_eq!(
            loggable_path(&format!("/v1/leases/{id}")),
            "/v1/leases/l1~exports~dXNlci00Mg~…~1"
        );
        assert_eq!(loggable_path("/v1/leases/whatever"), "/v1/leases/…");
        assert_eq!(loggable_path("/v1/leases"), "/v1/leases");
        assert_eq!(loggable_path("/v1/acquire"), "/v1/acquire");
    }
}
