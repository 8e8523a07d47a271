//! The JSON body extractors: at most 64 KiB, no key twice in one object, and errors that name
//! the field at fault; [`OptionalJsonBody`] for a body that may be left out.
//!
//! actix-web's own `Json` reports type errors without the field's name and oversized bodies
//! outside problem+json; this one reports both through [`ApiError`]. It does not insist on a
//! `Content-Type`, since a forgotten `-H 'Content-Type: application/json'` in curl is no reason to
//! refuse well-formed JSON.
//!
//! A key repeated in one object (`{"limit": 1, "limit": 1000000}`) is refused at any depth:
//! serde_json's `Value` would silently keep the last one, and a proxy or a client library in
//! between may keep the first, so the two would disagree on what was asked.
//!
//! A well-formed body costs two passes and no allocation of our own: the duplicate-key walk
//! borrows the keys and builds a key's path only when it repeats, and the typed parse is plain
//! serde_json. Only a body that fails to parse is parsed again, with `serde_path_to_error`, to
//! name the field at fault.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::web::BytesMut;
use actix_web::{FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;

use super::errors::ApiError;
use super::guard::BodyDeadline;
use crate::policy::ValidationError;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A JSON request body of type `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let body = read(req, payload);
        Box::pin(async move { parse(&body.await?).map(JsonBody) })
    }
}

/// A JSON request body of type `T` that may be left out: no body at all (zero bytes), or a JSON
/// `null` (as a field's `null` stands for the field left out), reads as `T::default()`;
/// anything else is read as [`JsonBody`] reads it.
pub struct OptionalJsonBody<T>(pub T);

impl<T: DeserializeOwned + Default + 'static> FromRequest for OptionalJsonBody<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let body = read(req, payload);
        Box::pin(async move {
            let body = body.await?;
            if body.is_empty() || body.trim_ascii() == b"null" {
                return Ok(OptionalJsonBody(T::default()));
            }
            parse(&body).map(OptionalJsonBody)
        })
    }
}

/// The whole body, at most [`MAX_BODY_BYTES`], within the request's body deadline.
fn read(
    req: &HttpRequest,
    payload: &mut Payload,
) -> LocalBoxFuture<'static, Result<BytesMut, ApiError>> {
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
            let chunk = chunk.map_err(|e| match BodyDeadline::of(&e) {
                Some(BodyDeadline { limit_ms }) => ApiError::RequestTimeout { limit_ms },
                None => ApiError::MalformedBody {
                    detail: format!("the request body could not be read: {e}"),
                    field: None,
                },
            })?;
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    })
}

/// Parses JSON, naming the field at fault in the error.
///
/// Every body this API takes is a JSON object: anything else is a 400 saying so. A field of the
/// wrong type is a 400 naming it; a missing or unknown field is a 422 naming it, as for policies.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(not_json)?;
        return Err(ValidationError::NotAnObject.into());
    }
    refuse_duplicate_keys(body)?;
    // The same parse as `serde_json::from_slice`, trailing characters refused as well.
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(_) => parse_naming_the_field(body),
    }
}

fn not_json(e: serde_json::Error) -> ApiError {
    ApiError::MalformedBody {
        detail: format!("the body is not valid JSON: {e}"),
        field: None,
    }
}

/// The typed parse again, tracking the path to each value, so that its error names the field
/// at fault.
fn parse_naming_the_field<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
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

/// Refuses a body in which one object holds a key twice, naming the key with its path
/// (`limit`, `metadata.owner`, `items[2].name`). Malformed JSON passes: the parse that follows
/// reports it with serde_json's message.
fn refuse_duplicate_keys(body: &[u8]) -> Result<(), ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let duplicate = RefCell::new(None);
    let walk = UniqueKeys {
        place: Place::Root,
        duplicate: &duplicate,
    };
    if walk.deserialize(&mut de).is_ok() {
        return Ok(());
    }
    // A body cut short after a repeated key is reported as what it is: not JSON.
    let well_formed = serde_json::from_slice::<de::IgnoredAny>(body).is_ok();
    match duplicate.into_inner() {
        Some(field) if well_formed => Err(ApiError::MalformedBody {
            detail: format!(
                "`{field}` appears more than once in one object; each key may appear once"
            ),
            field: Some(field),
        }),
        _ => Ok(()),
    }
}

/// Where a value sits in the body, written out (`items[2].name`) only for an error.
#[derive(Clone, Copy)]
enum Place<'a> {
    Root,
    Key(&'a Place<'a>, &'a str),
    Index(&'a Place<'a>, usize),
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Root => Ok(()),
            Place::Key(Place::Root, key) => f.write_str(key),
            Place::Key(parent, key) => write!(f, "{parent}.{key}"),
            Place::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Walks any JSON value, failing at the first key repeated in one object after writing its path
/// to `duplicate`.
struct UniqueKeys<'p> {
    place: Place<'p>,
    duplicate: &'p RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        loop {
            let element = UniqueKeys {
                place: Place::Index(&self.place, i),
                duplicate: self.duplicate,
            };
            if seq.next_element_seed(element)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = Seen::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if seen.contains(&key) {
                *self.duplicate.borrow_mut() = Some(Place::Key(&self.place, &key).to_string());
                return Err(de::Error::custom("duplicate key"));
            }
            map.next_value_seed(UniqueKeys {
                place: Place::Key(&self.place, &key),
                duplicate: self.duplicate,
            })?;
            seen.insert(key);
        }
        Ok(())
    }
}

/// The keys of one object read so far: compared one by one while they are few (no allocation
/// for up to 8), hashed beyond 16.
#[derive(Default)]
struct Seen<'de> {
    few: SmallVec<[Cow<'de, str>; 8]>,
    many: Option<HashSet<Cow<'de, str>>>,
}

impl<'de> Seen<'de> {
    fn contains(&self, key: &str) -> bool {
        match &self.many {
            Some(many) => many.contains(key),
            None => self.few.iter().any(|k| k == key),
        }
    }

    fn insert(&mut self, key: Cow<'de, str>) {
        match &mut self.many {
            Some(many) => {
                many.insert(key);
            }
            None if self.few.len() < 16 => self.few.push(key),
            None => {
                let mut many: HashSet<_> = self.few.drain(..).collect();
                many.insert(key);
                self.many = Some(many);
            }
        }
    }
}

/// An object's key, borrowed from the body unless it holds escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(key))
    }
    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(key.to_owned()))
    }
    fn visit_string<E>(self, key: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn duplicate(body: &str) -> Option<String> {
        match parse::<Value>(body.as_bytes()) {
            Err(ApiError::MalformedBody { field, detail }) if detail.contains("more than once") => {
                field
            }
            _ => None,
        }
    }

    #[test]
    fn a_key_repeated_at_any_depth_is_named_with_its_path() {
        assert_eq!(
            duplicate(r#"{"limit": 1, "limit": 1000000}"#).as_deref(),
            Some("limit")
        );
        assert_eq!(
            duplicate(r#"{"a": {"b": 1, "c": {"d": 1, "d": 2}}}"#).as_deref(),
            Some("a.c.d")
        );
        assert_eq!(
            duplicate(r#"{"a": [{"x": 1}, {"y": 1, "y": 1}]}"#).as_deref(),
            Some("a[1].y")
        );
    }

    #[test]
    fn equal_keys_in_different_objects_are_fine() {
        let v: Value = parse(br#"{"a": {"k": 1}, "b": {"k": 2}, "k": [{"k": 3}, {"k": 4}]}"#)
            .expect("no key repeats within one object");
        assert_eq!(v["k"][1]["k"], 4);
    }

    #[test]
    fn typed_bodies_refuse_repeated_keys_too() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Small {
            cost: u64,
        }
        let e = parse::<Small>(br#"{"cost": 1, "cost": 2}"#).expect_err("repeated");
        assert!(
            matches!(&e, ApiError::MalformedBody { field: Some(f), .. } if f == "cost"),
            "{e:?}"
        );
    }

    #[test]
    fn repeated_keys_are_found_escaped_and_in_large_objects() {
        assert_eq!(
            duplicate(r#"{"a\u0062": 1, "ab": 2}"#).as_deref(),
            Some("ab")
        );
        let many: Vec<String> = (0..40).map(|i| format!("\"k{i}\": {i}")).collect();
        let body = format!("{{{}, \"k3\": 0}}", many.join(", "));
        assert_eq!(duplicate(&body).as_deref(), Some("k3"));
        let body = format!("{{{}}}", many.join(", "));
        assert!(parse::<Value>(body.as_bytes()).is_ok());
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Outer {
            inner: Small,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Small {
            cost: u64,
        }
        let e = parse::<Outer>(br#"{"inner": {"cost": "x"}}"#).expect_err("a string");
        assert!(
            matches!(&e, ApiError::MalformedBody { field: Some(f), detail } if f == "inner.cost" && detail.starts_with("`inner.cost`: invalid type")),
            "{e:?}"
        );
        let e = parse::<Small>(br#"{"cost": 1} trailing"#).expect_err("trailing");
        assert!(
            matches!(&e, ApiError::MalformedBody { field: None, detail } if detail.contains("not valid JSON")),
            "{e:?}"
        );
    }

    #[test]
    fn malformed_json_is_still_reported_as_such() {
        let e = parse::<Value>(br#"{"a": 1, "a": "#).expect_err("truncated");
        assert!(
            matches!(&e, ApiError::MalformedBody { field: None, detail } if detail.contains("not valid JSON")),
            "{e:?}"
        );
    }
}
