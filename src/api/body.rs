//! The JSON body extractor: at most 64 KiB, and errors that name the field at fault.
//!
//! actix-web's own `Json` reports type errors without the field's name and oversized bodies
//! outside problem+json; this one reports both through [`ApiError`]. It does not insist on a
//! `Content-Type`, since a forgotten `-H 'Content-Type: application/json'` in curl is no reason to
//! refuse well-formed JSON.

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::web::BytesMut;
use actix_web::{FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::errors::ApiError;
use crate::policy::ValidationError;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A JSON request body of type `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let mut payload = payload.take();
        Box::pin(async move {
            let too_large = ApiError::BodyTooLarge {
                limit: MAX_BODY_BYTES,
            };
            if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
                return Err(too_large);
            }
            let mut body = BytesMut::with_capacity(declared.unwrap_or(256).min(MAX_BODY_BYTES));
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|e| ApiError::MalformedBody {
                    detail: format!("the request body could not be read: {e}"),
                    field: None,
                })?;
                if body.len() + chunk.len() > MAX_BODY_BYTES {
                    return Err(too_large);
                }
                body.extend_from_slice(&chunk);
            }
            parse(&body).map(JsonBody)
        })
    }
}

/// Parses JSON, naming the field at fault in the error.
///
/// Every body this API takes is a JSON object: anything else is a 400 saying so. A field of the
/// wrong type is a 400 naming it; a missing or unknown field is a 422 naming it, as for policies.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let not_json = |e: serde_json::Error| ApiError::MalformedBody {
        detail: format!("the body is not valid JSON: {e}"),
        field: None,
    };
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(not_json)?;
        return Err(ValidationError::NotAnObject.into());
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        if !inner.is_data() {
            not_json(inner)
        } else if let Some(field) = named_field(&message, "missing field `") {
            ValidationError::Missing {
                field,
                context: String::new(),
            }
            .into()
        } else if let Some(field) = named_field(&message, "unknown field `") {
            ValidationError::Unknown { field }.into()
        } else {
            ApiError::MalformedBody {
                detail: format!("`{path}`: {message}"),
                field: Some(path),
            }
        }
    })?;
    de.end().map_err(not_json)?;
    Ok(value)
}

/// The field named by serde's "missing field `x`" or "unknown field `x`, expected …" messages.
fn named_field(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?;
    rest.split_once('`').map(|(f, _)| f.to_owned())
}
