//! Which of Envoy's rate-limit descriptors a policy serves (its `descriptor`), and the subject
//! key a matching descriptor is decided under.
//!
//! Envoy's rate-limit filter sends a `domain` and a list of descriptors, each a list of
//! `(key, value)` entries built by its route's actions (`remote_address`, a header, a generic
//! key…). A policy serves the descriptors of its `domain` whose entry keys are its `entries`'
//! keys, in order, and whose values equal the entries' fixed `value`s where it gives one, as in
//! envoyproxy/ratelimit's configuration. When several policies match one descriptor (a fixed
//! `path = /login` beside a `path` of any value), the most specific wins: the one with a fixed
//! value at the first entry where they differ. Two policies may not claim the same shape
//! ([`Descriptor::shape`]) in one domain.
//!
//! The subject key ([`Descriptor::subject`]) is the value of the one entry without a fixed value;
//! with several such entries, their values in order, each with `\` and `|` escaped by a `\`,
//! joined by `|`; with none (every entry fixed), the fixed values the same way. A key over 256
//! bytes becomes `sha256:` and the hex digest of it. So `POST /v1/acquire` with that key
//! decides the same subject, on one shared quota.

use serde_json::{Map, Value};

use super::input::ValidationError;
use super::name::MAX_KEY_BYTES;

/// Longest `domain`, entry `key` or entry `value`, in bytes.
pub const MAX_DESCRIPTOR_TEXT: usize = 256;
/// Most entries in a policy's `descriptor`.
pub const MAX_ENTRIES: usize = 8;

/// A policy's `descriptor`: the domain and the ordered entries it serves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Descriptor {
    pub domain: String,
    pub entries: Vec<Entry>,
}

/// One entry of a policy's `descriptor`: a key, and the value it must have, if fixed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Entry {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl Descriptor {
    /// Reads a policy's `descriptor` field, naming the field at fault.
    pub fn parse(value: &Value) -> Result<Self, ValidationError> {
        let doc = value
            .as_object()
            .ok_or_else(|| ValidationError::WrongType {
                field: "descriptor".into(),
                expected: "an object with `domain` and `entries`",
            })?;
        refuse_unknown(doc, &["domain", "entries"], "descriptor")?;
        let domain =
            text(doc, "domain", "descriptor.domain")?.ok_or_else(|| ValidationError::Missing {
                field: "descriptor.domain".into(),
                context: String::new(),
            })?;
        let entries = match doc.get("entries") {
            Some(Value::Array(entries)) => entries,
            None | Some(Value::Null) => {
                return Err(ValidationError::Missing {
                    field: "descriptor.entries".into(),
                    context: String::new(),
                })
            }
            Some(_) => {
                return Err(ValidationError::WrongType {
                    field: "descriptor.entries".into(),
                    expected: "an array of entries",
                })
            }
        };
        if entries.is_empty() || entries.len() > MAX_ENTRIES {
            return Err(ValidationError::invalid(
                "descriptor.entries",
                format!("must hold 1 to {MAX_ENTRIES} entries"),
            ));
        }
        let mut parsed = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("descriptor.entries[{i}]");
            let fields = entry
                .as_object()
                .ok_or_else(|| ValidationError::WrongType {
                    field: at.clone(),
                    expected: "an object with `key` and, optionally, `value`",
                })?;
            refuse_unknown(fields, &["key", "value"], &at)?;
            let key = text(fields, "key", &format!("{at}.key"))?.ok_or_else(|| {
                ValidationError::Missing {
                    field: format!("{at}.key"),
                    context: String::new(),
                }
            })?;
            let value = text(fields, "value", &format!("{at}.value"))?;
            parsed.push(Entry { key, value });
        }
        Ok(Descriptor {
            domain,
            entries: parsed,
        })
    }

    /// The descriptor's entry keys in order, joined by `\0` (which no key holds): what the
    /// policy cache indexes policies by, with the domain ([`index_key`]).
    pub fn index_key(&self) -> String {
        index_key(&self.domain, self.entries.iter().map(|e| e.key.as_str()))
    }

    /// What two policies of one domain may not share: the keys and the fixed values, in order.
    pub fn shape(&self) -> String {
        let mut s = self.index_key();
        for e in &self.entries {
            s.push('\0');
            if let Some(v) = &e.value {
                s.push('=');
                s.push_str(v);
            }
        }
        s
    }

    /// Whether a descriptor with these values, in the order of this descriptor's keys (the caller
    /// has matched the keys), has every fixed value.
    pub fn matches<'a>(&self, values: impl IntoIterator<Item = &'a str>) -> bool {
        self.entries
            .iter()
            .zip(values)
            .all(|(e, v)| e.value.as_deref().is_none_or(|fixed| fixed == v))
    }

    /// Whether this descriptor is more specific than `other` (same keys): a fixed value at the
    /// first entry where the two differ in having one.
    pub fn more_specific_than(&self, other: &Descriptor) -> bool {
        self.entries
            .iter()
            .zip(&other.entries)
            .find(|(a, b)| a.value.is_some() != b.value.is_some())
            .is_some_and(|(a, _)| a.value.is_some())
    }

    /// The subject key of a matching descriptor whose entries have `values`, in order (see the
    /// module documentation), or why there is none: a value that is empty.
    pub fn subject<'a>(
        &self,
        values: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<String, &'static str> {
        if values.clone().into_iter().any(str::is_empty) {
            return Err("an entry's value is empty");
        }
        let variable = self.entries.iter().filter(|e| e.value.is_none()).count();
        let chosen = self
            .entries
            .iter()
            .zip(values)
            .filter(|(e, _)| variable == 0 || e.value.is_none())
            .map(|(_, v)| v);
        let count = if variable == 0 {
            self.entries.len()
        } else {
            variable
        };
        let key = match count {
            1 => chosen.into_iter().next().unwrap_or_default().to_owned(),
            _ => {
                let mut key = String::new();
                for (i, v) in chosen.enumerate() {
                    if i > 0 {
                        key.push('|');
                    }
                    for c in v.chars() {
                        if matches!(c, '\\' | '|') {
                            key.push('\\');
                        }
                        key.push(c);
                    }
                }
                key
            }
        };
        if key.len() <= MAX_KEY_BYTES {
            return Ok(key);
        }
        use sha2::Digest;
        let digest = sha2::Sha256::digest(key.as_bytes());
        let mut hashed = String::with_capacity(7 + 64);
        hashed.push_str("sha256:");
        for b in digest {
            use std::fmt::Write;
            let _ = write!(hashed, "{b:02x}");
        }
        Ok(hashed)
    }
}

/// A domain and entry keys as the policy cache indexes them.
pub fn index_key<'a>(domain: &str, keys: impl IntoIterator<Item = &'a str>) -> String {
    let mut s = String::with_capacity(domain.len() + 32);
    s.push_str(domain);
    for k in keys {
        s.push('\0');
        s.push_str(k);
    }
    s
}

/// A string field of 1 to [`MAX_DESCRIPTOR_TEXT`] bytes without control characters, when present.
fn text(doc: &Map<String, Value>, name: &str, at: &str) -> Result<Option<String>, ValidationError> {
    match doc.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            if s.is_empty() || s.len() > MAX_DESCRIPTOR_TEXT {
                Err(ValidationError::invalid(
                    at,
                    format!("must be 1 to {MAX_DESCRIPTOR_TEXT} bytes"),
                ))
            } else if s.chars().any(char::is_control) {
                Err(ValidationError::invalid(
                    at,
                    "must not hold control characters",
                ))
            } else {
                Ok(Some(s.clone()))
            }
        }
        Some(_) => Err(ValidationError::WrongType {
            field: at.to_owned(),
            expected: "a string",
        }),
    }
}

/// Refuses fields of `doc` other than `known`, the first in a stable order.
fn refuse_unknown(
    doc: &Map<String, Value>,
    known: &[&str],
    at: &str,
) -> Result<(), ValidationError> {
    let mut keys: Vec<&String> = doc
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .collect();
    keys.sort();
    match keys.first() {
        Some(k) => Err(ValidationError::Unknown {
            field: format!("{at}.{k}"),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn descriptor(v: Value) -> Descriptor {
        Descriptor::parse(&v).expect("valid")
    }

    #[test]
    fn one_variable_entry_is_the_key_verbatim() {
        let d = descriptor(json!({"domain": "edge", "entries": [{"key": "remote_address"}]}));
        assert_eq!(d.subject(["10.0.0.1"]).as_deref(), Ok("10.0.0.1"));
        assert_eq!(d.subject(["a|b\\c"]).as_deref(), Ok("a|b\\c"));
        let d = descriptor(json!({"domain": "edge", "entries": [
            {"key": "path", "value": "/login"}, {"key": "remote_address"}]}));
        assert_eq!(d.subject(["/login", "10.0.0.1"]).as_deref(), Ok("10.0.0.1"));
    }

    #[test]
    fn several_values_are_escaped_and_joined_so_that_no_two_meet() {
        let d = descriptor(json!({"domain": "edge", "entries": [{"key": "a"}, {"key": "b"}]}));
        assert_eq!(d.subject(["x", "y"]).as_deref(), Ok("x|y"));
        let one = d.subject(["x|", "y"]);
        let two = d.subject(["x", "|y"]);
        assert_eq!(one.as_deref(), Ok("x\\||y"));
        assert_eq!(two.as_deref(), Ok("x|\\|y"));
        assert_ne!(d.subject(["x\\", "y"]), d.subject(["x", "\\y"]));
        // Every entry fixed: one subject, named by the fixed values.
        let d =
            descriptor(json!({"domain": "edge", "entries": [{"key": "path", "value": "/login"}]}));
        assert_eq!(d.subject(["/login"]).as_deref(), Ok("/login"));
        assert!(d.subject([""]).is_err());
    }

    #[test]
    fn a_key_over_256_bytes_is_its_digest() {
        let d = descriptor(json!({"domain": "edge", "entries": [{"key": "path"}]}));
        let long = "p".repeat(300);
        let key = d.subject([long.as_str()]).expect("a key");
        assert!(key.starts_with("sha256:") && key.len() == 71, "{key}");
        assert_eq!(
            d.subject(["p".repeat(256).as_str()]).map(|k| k.len()),
            Ok(256)
        );
    }

    #[test]
    fn fixed_values_match_and_the_more_specific_shape_wins() {
        let any = descriptor(json!({"domain": "e", "entries": [{"key": "path"}, {"key": "ip"}]}));
        let login = descriptor(json!({"domain": "e", "entries": [
            {"key": "path", "value": "/login"}, {"key": "ip"}]}));
        assert!(login.matches(["/login", "1"]) && !login.matches(["/", "1"]));
        assert!(any.matches(["/", "1"]));
        assert!(login.more_specific_than(&any) && !any.more_specific_than(&login));
        assert_eq!(any.index_key(), login.index_key());
        assert_ne!(any.shape(), login.shape());
    }

    #[test]
    fn bad_descriptors_name_their_field() {
        let cases = [
            (json!("edge"), "descriptor"),
            (json!({"entries": [{"key": "a"}]}), "descriptor.domain"),
            (
                json!({"domain": "", "entries": [{"key": "a"}]}),
                "descriptor.domain",
            ),
            (json!({"domain": "e"}), "descriptor.entries"),
            (json!({"domain": "e", "entries": []}), "descriptor.entries"),
            (
                json!({"domain": "e", "entries": [{"value": "a"}]}),
                "descriptor.entries[0].key",
            ),
            (
                json!({"domain": "e", "entries": [{"key": "a", "value": 3}]}),
                "descriptor.entries[0].value",
            ),
            (
                json!({"domain": "e", "entries": [{"key": "a", "extra": 1}]}),
                "descriptor.entries[0].extra",
            ),
            (
                json!({"domain": "e", "entries": [{"key": "a\n"}]}),
                "descriptor.entries[0].key",
            ),
            (
                json!({"domain": "e", "entries": [{"key": "a"}], "x": 1}),
                "descriptor.x",
            ),
        ];
        for (doc, field) in cases {
            let e = Descriptor::parse(&doc).expect_err("refused");
            assert_eq!(e.field(), Some(field), "{doc}: {e}");
        }
    }
}
