//! Writing a decision's answer: its header values and its JSON body go into one buffer and are
//! handed out as slices of it, so the answer costs one allocation for all of them, numbers are
//! written with `itoa`, and no value passes through a `String` first.

use std::io;

use actix_web::error::JsonPayloadError;
use actix_web::http::header::{ContentType, HeaderName, HeaderValue};
use actix_web::web::{Bytes, BytesMut};
use actix_web::{HttpResponse, HttpResponseBuilder};
use serde::Serialize;

use crate::fields;
use crate::store::Etag;

/// The decision answers' own headers, named once (the parse of a name, for each answer, showed
/// in the profile).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const POLICY_ETAG: HeaderName = HeaderName::from_static("policy-etag");
pub const DECIDED_BY: HeaderName = HeaderName::from_static("decided-by");
/// The override that applied: `id=<id>;match=<exact|prefix|cidr>[;tier=<tier>]`.
pub const RATELIMIT_OVERRIDE: HeaderName = HeaderName::from_static("ratelimit-override");

/// A response's values being written; see the module documentation.
pub struct Reply {
    buf: BytesMut,
    num: itoa::Buffer,
}

impl Reply {
    /// Room for about `capacity` bytes of header values and body before the buffer grows.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: BytesMut::with_capacity(capacity),
            num: itoa::Buffer::new(),
        }
    }

    /// Appends text to the value being written.
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.buf.extend_from_slice(text.as_bytes());
        self
    }

    /// Appends a number to the value being written.
    pub fn push_u64(&mut self, n: u64) -> &mut Self {
        self.buf.extend_from_slice(self.num.format(n).as_bytes());
        self
    }

    /// Appends a policy's ETag as its header value, quoted: `"<generation>.<version>"` (the
    /// form of `Etag`'s `Display`).
    pub fn push_etag(&mut self, etag: &Etag) -> &mut Self {
        self.push("\"")
            .push(&etag.generation)
            .push(".")
            .push_u64(etag.version)
            .push("\"")
    }

    /// Ends the value being written and sets it as header `name`.
    pub fn header(&mut self, response: &mut HttpResponseBuilder, name: HeaderName) {
        set(response, name, self.buf.split().freeze());
    }

    /// Ends the answer with `body` as its JSON body, as `HttpResponseBuilder::json` would (a
    /// body that cannot be serialised is answered as actix-web answers it).
    pub fn json(
        mut self,
        mut response: HttpResponseBuilder,
        body: &impl Serialize,
    ) -> HttpResponse {
        match serde_json::to_writer(Writer(&mut self.buf), body) {
            Ok(()) => response
                .insert_header(ContentType::json())
                .body(self.buf.split().freeze()),
            Err(e) => HttpResponse::from_error(JsonPayloadError::Serialize(e)),
        }
    }
}

/// The `RateLimit` fields (`crate::fields`) are written straight into the answer's buffer.
impl fields::Sink for Reply {
    fn text(&mut self, text: &str) {
        self.push(text);
    }

    fn number(&mut self, n: u64) {
        self.push_u64(n);
    }
}

/// Sets header `name` to a fixed value, without copying it.
pub fn fixed_header(response: &mut HttpResponseBuilder, name: HeaderName, value: &'static str) {
    set(response, name, Bytes::from_static(value.as_bytes()));
}

fn set(response: &mut HttpResponseBuilder, name: HeaderName, value: Bytes) {
    // Policy names and lease ids are restricted to header-safe characters and the rest are
    // digits, so a value is always valid; should that ever change, the header is left out
    // rather than the request failed.
    if let Ok(v) = HeaderValue::from_maybe_shared(value) {
        response.insert_header((name, v));
    }
}

/// `io::Write` into the buffer, for serde_json.
struct Writer<'a>(&'a mut BytesMut);

impl io::Write for Writer<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::MessageBody;

    #[test]
    fn values_and_body_come_out_as_written() {
        let mut response = HttpResponse::Ok();
        let mut reply = Reply::with_capacity(8);
        reply.push("\"p\";q=").push_u64(42).push(";w=").push_u64(0);
        reply.header(&mut response, RATELIMIT_POLICY);
        reply.push("bad\nvalue");
        reply.header(&mut response, RATELIMIT);
        fixed_header(&mut response, DECIDED_BY, "embedded");
        let response = reply.json(response, &serde_json::json!({"allowed": true}));
        let header = |name: &str| {
            let value = response.headers().get(name)?;
            Some(value.to_str().ok()?.to_owned())
        };
        assert_eq!(
            header("ratelimit-policy").as_deref(),
            Some("\"p\";q=42;w=0")
        );
        assert_eq!(header("ratelimit"), None, "an invalid value is left out");
        assert_eq!(header("decided-by").as_deref(), Some("embedded"));
        assert_eq!(header("content-type").as_deref(), Some("application/json"));
        let body = response.into_body().try_into_bytes().ok();
        assert_eq!(body.as_deref(), Some(&br#"{"allowed":true}"#[..]));
    }
}
