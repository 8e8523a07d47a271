//! The root span of every request, as its log lines carry it: method, route, path (never the
//! query string, which may hold a token), the client's address, the User-Agent, the request id,
//! and the status.
//!
//! The client's address is the peer's, unless the peer is one of `server.trusted_proxies`; only
//! then does `X-Forwarded-For` name the client (anyone else can write that header). Every field a
//! client controls is recorded with `Debug` formatting, so quotes, backslashes and control
//! characters come out escaped and a client cannot forge a field or a log line.

use std::net::IpAddr;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::{web, Error, HttpMessage};
use tracing::Span;
use tracing_actix_web::{RequestId, RootSpanBuilder};

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

/// The [`RootSpanBuilder`] of this service; see the module documentation.
pub struct EdgeRootSpan;

impl RootSpanBuilder for EdgeRootSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
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
        let client_ip = client_ip.map(|ip| ip.to_string()).unwrap_or_default();
        let escaped = |name: header::HeaderName| {
            request
                .headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default()
        };
        let route = request.match_pattern().unwrap_or_else(|| "default".into());
        let request_id = request
            .extensions()
            .get::<RequestId>()
            .map(ToString::to_string)
            .unwrap_or_default();
        tracing::info_span!(
            "HTTP request",
            http.method = %request.method(),
            http.route = ?route,
            http.target = ?loggable_path(request.path()),
            http.host = ?escaped(header::HOST),
            http.client_ip = %client_ip,
            http.user_agent = ?escaped(header::USER_AGENT),
            http.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            request_id = %request_id,
            exception.message = tracing::field::Empty,
        )
    }

    fn on_request_end<B: MessageBody>(span: Span, outcome: &Result<ServiceResponse<B>, Error>) {
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
