//! One override of a policy: what it matches, what it sets, when it ends and why. Read from
//! client input ([`parse_override`], checked against its policy) and from a store
//! ([`Override::from_stored`], kept as written: the policy may have changed since, and what no
//! longer fits it is passed over when the override is applied, see [`Changes::apply`]).

use serde::ser::SerializeMap;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Match;
use crate::policy::input::ValidationError;
use crate::policy::tiers::StoredChanges;
use crate::policy::{Changes, Kind, Policy, PolicyName};

/// Longest `reason`, in bytes.
pub const MAX_REASON_BYTES: usize = 1_024;
/// Furthest `expires_at` from now: a year (of 366 days).
pub const MAX_EXPIRY_US: u64 = 366 * 86_400 * 1_000_000;

/// The fields of an override document; of them, exactly one of [`SETS`].
const FIELDS: [&str; 9] = [
    "id",
    "match",
    "tier",
    "limits",
    "unlimited",
    "block",
    "expires_at",
    "reason",
    "created_at",
];
/// What an override may set: exactly one.
const SETS: [&str; 4] = ["tier", "limits", "unlimited", "block"];

/// An override's id: 16 lowercase hex digits, chosen by the service when it is created. Held
/// inline (no allocation): a decision writes it into its answer, and at 100,000 overrides a
/// pointer to follow is a likely cache miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OverrideId([u8; 16]);

impl OverrideId {
    pub fn parse(s: &str) -> Option<Self> {
        let bytes: [u8; 16] = s.as_bytes().try_into().ok()?;
        bytes
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            .then_some(Self(bytes))
    }

    /// A fresh random id.
    pub fn random() -> Self {
        let mut bytes = [0u8; 8];
        if getrandom::fill(&mut bytes).is_err() {
            // No entropy source: time and a counter still make ids distinct within a process;
            // the store refuses a duplicate all the same.
            static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes = (t ^ COUNT
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .rotate_left(40))
            .to_be_bytes();
        }
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut id = [0u8; 16];
        for (i, b) in bytes.iter().enumerate() {
            id[2 * i] = HEX[usize::from(b >> 4)];
            id[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        Self(id)
    }

    pub fn as_str(&self) -> &str {
        // Always ASCII: `parse` and `random` make nothing else.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for OverrideId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an override sets for the subjects it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sets {
    /// The policy's tier of that name.
    Tier(PolicyName),
    /// These fields of these limits.
    Limits(Changes),
    /// Allowed, without consulting the store.
    Unlimited,
    /// Denied, without consulting the store.
    Block,
}

impl Sets {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Sets::Tier(_) => "tier",
            Sets::Limits(_) => "limits",
            Sets::Unlimited => "unlimited",
            Sets::Block => "block",
        }
    }
}

/// An override, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub id: OverrideId,
    pub matches: Match,
    pub sets: Sets,
    /// When it ends (µs since the Unix epoch), if it does.
    pub expires_at_us: Option<u64>,
    pub reason: Option<String>,
    /// When it was first created (µs since the Unix epoch); kept by replacements.
    pub created_at_us: u64,
}

/// What a client writes of an override (the rest is the service's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub matches: Match,
    pub sets: Sets,
    pub expires_at_us: Option<u64>,
    pub reason: Option<String>,
}

impl Written {
    /// The override of this document, `id`, created at `created_at_us`.
    pub fn into_override(self, id: OverrideId, created_at_us: u64) -> Override {
        Override {
            id,
            matches: self.matches,
            sets: self.sets,
            expires_at_us: self.expires_at_us,
            reason: self.reason,
            created_at_us,
        }
    }
}

impl Override {
    /// Whether it is in force at `now_us`: it has not expired.
    pub fn is_live(&self, now_us: u64) -> bool {
        self.expires_at_us.is_none_or(|e| now_us < e)
    }

    /// The document the stores keep (times in µs).
    pub fn to_stored(&self) -> String {
        let mut doc = Map::new();
        doc.insert("id".into(), Value::from(self.id.as_str()));
        doc.insert(
            "match".into(),
            serde_json::to_value(&self.matches).unwrap_or(Value::Null),
        );
        doc.insert(self.sets.as_str().into(), sets_value(&self.sets));
        if let Some(e) = self.expires_at_us {
            doc.insert("expires_at_us".into(), Value::from(e));
        }
        if let Some(r) = &self.reason {
            doc.insert("reason".into(), Value::from(r.as_str()));
        }
        doc.insert("created_at_us".into(), Value::from(self.created_at_us));
        Value::Object(doc).to_string()
    }

    /// An override from the document a store kept. Its match is checked as input is (a stored
    /// match is an index key); what it sets is kept as written.
    pub fn from_stored(json: &str) -> Result<Self, ValidationError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Stored {
            id: String,
            #[serde(rename = "match")]
            matches: Value,
            tier: Option<String>,
            /// Limit → field → value, and a calendar limit's `time_zone` beside its fields
            /// (absent from what earlier versions wrote).
            limits: Option<StoredChanges>,
            unlimited: Option<bool>,
            block: Option<bool>,
            expires_at_us: Option<u64>,
            reason: Option<String>,
            created_at_us: u64,
        }
        let s: Stored = serde_json::from_str(json)
            .map_err(|e| ValidationError::invalid("override", e.to_string()))?;
        let id = OverrideId::parse(&s.id)
            .ok_or_else(|| ValidationError::invalid("id", "is not an override id"))?;
        let sets = match (s.tier, s.limits, s.unlimited, s.block) {
            (Some(t), None, None, None) => {
                Sets::Tier(PolicyName::parse(&t).map_err(|r| ValidationError::invalid("tier", r))?)
            }
            (None, Some(l), None, None) => Sets::Limits(Changes::kept(l)),
            (None, None, Some(true), None) => Sets::Unlimited,
            (None, None, None, Some(true)) => Sets::Block,
            _ => {
                return Err(ValidationError::invalid(
                    "override",
                    "sets nothing, or several",
                ))
            }
        };
        Ok(Self {
            id,
            matches: Match::parse(&s.matches)?,
            sets,
            expires_at_us: s.expires_at_us,
            reason: s.reason,
            created_at_us: s.created_at_us,
        })
    }

    /// The override as the API shows it.
    pub fn to_doc(&self) -> OverrideDoc<'_> {
        OverrideDoc(self)
    }
}

fn sets_value(sets: &Sets) -> Value {
    match sets {
        Sets::Tier(t) => Value::from(t.as_str()),
        Sets::Limits(c) => serde_json::to_value(c).unwrap_or(Value::Null),
        Sets::Unlimited | Sets::Block => Value::Bool(true),
    }
}

/// An override as the API shows it: `{"id", "match", <what it sets>, "expires_at"?, "reason"?,
/// "created_at"}`, times in RFC 3339 (UTC).
pub struct OverrideDoc<'a>(&'a Override);

impl serde::Serialize for OverrideDoc<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let o = self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("id", o.id.as_str())?;
        map.serialize_entry("match", &o.matches)?;
        map.serialize_entry(o.sets.as_str(), &sets_value(&o.sets))?;
        if let Some(e) = o.expires_at_us {
            map.serialize_entry("expires_at", &rfc3339(e))?;
        }
        if let Some(r) = &o.reason {
            map.serialize_entry("reason", r)?;
        }
        map.serialize_entry("created_at", &rfc3339(o.created_at_us))?;
        map.end()
    }
}

/// A time (µs since the Unix epoch) in RFC 3339, UTC.
pub fn rfc3339(us: u64) -> String {
    i64::try_from(us)
        .ok()
        .and_then(|us| jiff::Timestamp::from_microsecond(us).ok())
        .map_or_else(|| us.to_string(), |t| t.to_string())
}

/// Reads an override document written by a client for `policy`, at `now_us`: `match`, exactly one
/// of `tier` (one of the policy's), `limits` (changes of its limits' fields, checked as a tier's),
/// `unlimited: true` or `block: true`; `expires_at` (RFC 3339, after now and at most
/// [`MAX_EXPIRY_US`] ahead) and `reason` (at most [`MAX_REASON_BYTES`]). `id` and `created_at`,
/// as an override reads back, are accepted (the id only when it is `path_id`) and ignored.
///
/// `limits` may give a calendar limit the subject's own time zone, beside or instead of its
/// fields: `{"daily": {"time_zone": "Asia/Tokyo"}}` (an unknown zone, or one for a limit that is
/// not a calendar limit, is a 422 naming `limits.daily.time_zone`). The rule for the subject's
/// count when its zone changes (the override is written, replaced or deleted): it carries until
/// the end of the period it was counted in, in the zone it was counted in, and the periods after
/// that are the new zone's (see [`crate::policy::tiers`]).
pub fn parse_override(
    value: &Value,
    policy: &Policy,
    path_id: Option<&OverrideId>,
    now_us: u64,
) -> Result<Written, ValidationError> {
    let doc = value.as_object().ok_or(ValidationError::NotAnObject)?;
    let rate = match &policy.kind {
        Kind::Rate(rate) => rate,
        Kind::Concurrency(_) => {
            return Err(ValidationError::invalid(
                "policy",
                format!(
                    "`{}` is a concurrency policy: overrides are for rate policies",
                    policy.name
                ),
            ))
        }
    };
    let mut keys: Vec<&String> = doc.keys().collect();
    keys.sort();
    if let Some(k) = keys.iter().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ValidationError::Unknown {
            field: (*k).clone(),
        });
    }
    let present = |f: &str| doc.get(f).is_some_and(|v| !v.is_null());
    match (doc.get("id").filter(|v| !v.is_null()), path_id) {
        (None, _) => {}
        (Some(Value::String(s)), Some(id)) if s == id.as_str() => {}
        (Some(Value::String(s)), Some(id)) => {
            return Err(ValidationError::invalid(
                "id",
                format!("`{s}` does not match the id in the path, `{id}`"),
            ))
        }
        (Some(Value::String(_)), None) => {
            return Err(ValidationError::invalid(
                "id",
                "is chosen by the service: leave it out when creating an override",
            ))
        }
        (Some(_), _) => return Err(wrong_type("id", "a string")),
    }
    if let Some(c) = doc.get("created_at").filter(|v| !v.is_null()) {
        if !c.is_string() {
            return Err(wrong_type("created_at", "a string"));
        }
    }
    let matches = match doc.get("match") {
        None | Some(Value::Null) => {
            return Err(ValidationError::Missing {
                field: "match".into(),
                context: String::new(),
            })
        }
        Some(m) => Match::parse(m)?,
    };
    let set: Vec<&str> = SETS.into_iter().filter(|f| present(f)).collect();
    let sets = match set.as_slice() {
        [] => {
            return Err(ValidationError::Missing {
                field: "tier".into(),
                context: " (or `limits`, `unlimited` or `block`: what the override sets)".into(),
            })
        }
        [one] => match (*one, &doc[*one]) {
            ("tier", Value::String(t)) => match rate.tiers().get(t) {
                Some(_) => Sets::Tier(
                    PolicyName::parse(t).map_err(|r| ValidationError::invalid("tier", r))?,
                ),
                None => {
                    let names: Vec<&str> = rate.tiers().names().map(|n| n.as_str()).collect();
                    return Err(ValidationError::invalid(
                        "tier",
                        if names.is_empty() {
                            format!("`{t}` is not a tier of the policy, which names none")
                        } else {
                            format!(
                                "`{t}` is not a tier of the policy (its tiers: {})",
                                names.join(", ")
                            )
                        },
                    ));
                }
            },
            ("tier", _) => return Err(wrong_type("tier", "a string")),
            ("limits", v) => Sets::Limits(Changes::parse(v, rate.limits(), "limits")?),
            ("unlimited", Value::Bool(true)) => Sets::Unlimited,
            ("block", Value::Bool(true)) => Sets::Block,
            (flag, Value::Bool(false)) => {
                return Err(ValidationError::invalid(
                    flag,
                    "must be `true` when given (leave it out otherwise)",
                ))
            }
            (flag, _) => return Err(wrong_type(flag, "`true`")),
        },
        [first, second, ..] => {
            return Err(ValidationError::invalid(
                second,
                format!("cannot be set beside `{first}`: an override sets exactly one of tier, limits, unlimited, block"),
            ))
        }
    };
    let expires_at_us = match doc.get("expires_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(expiry(s, now_us)?),
        Some(_) => return Err(wrong_type("expires_at", "an RFC 3339 time")),
    };
    let reason = match doc.get("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if r.len() > MAX_REASON_BYTES => {
            return Err(ValidationError::invalid(
                "reason",
                format!("must be at most {MAX_REASON_BYTES} bytes"),
            ))
        }
        Some(Value::String(r)) => Some(r.clone()),
        Some(_) => return Err(wrong_type("reason", "a string")),
    };
    Ok(Written {
        matches,
        sets,
        expires_at_us,
        reason,
    })
}

/// An `expires_at` after `now_us` and at most [`MAX_EXPIRY_US`] later, in µs.
fn expiry(text: &str, now_us: u64) -> Result<u64, ValidationError> {
    let t: jiff::Timestamp = text.parse().map_err(|_| {
        ValidationError::invalid(
            "expires_at",
            format!(
                "`{text}` is not an RFC 3339 time with an offset, such as 2027-01-31T00:00:00Z"
            ),
        )
    })?;
    let us = u64::try_from(t.as_microsecond()).unwrap_or(0);
    if us <= now_us {
        return Err(ValidationError::invalid(
            "expires_at",
            "must be in the future",
        ));
    }
    if us - now_us > MAX_EXPIRY_US {
        return Err(ValidationError::invalid(
            "expires_at",
            "must be at most a year (366 days) ahead",
        ));
    }
    Ok(us)
}

fn wrong_type(field: &str, expected: &'static str) -> ValidationError {
    ValidationError::WrongType {
        field: field.to_owned(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse_policy;
    use serde_json::json;

    const NOW: u64 = 1_796_083_200_000_000; // 2026-12-01T00:00:00Z

    fn api() -> Policy {
        parse_policy(
            &json!({"name": "api", "limits": [
                {"name": "minute", "algorithm": "gcra", "rate": 100, "period_ms": 60000, "burst": 20},
                {"name": "daily", "algorithm": "fixed_window", "limit": 10000, "window_ms": 86400000}],
              "tiers": {"pro": {"minute": {"rate": 1000, "burst": 200}}}}),
            None,
        )
        .expect("valid")
    }

    fn parse(v: Value) -> Result<Written, ValidationError> {
        parse_override(&v, &api(), None, NOW)
    }

    #[test]
    fn each_kind_of_override_reads_back_as_written() {
        for v in [
            json!({"match": {"key": "acme"}, "tier": "pro", "reason": "enterprise plan"}),
            json!({"match": {"prefix": "acme-"}, "limits": {"daily": {"limit": 1000000}}, "expires_at": "2027-01-31T00:00:00Z"}),
            json!({"match": {"cidr": "203.0.113.0/24"}, "block": true}),
            json!({"match": {"key": "health"}, "unlimited": true}),
        ] {
            let w = parse(v.clone()).expect("valid");
            let o = w.into_override(OverrideId::random(), NOW);
            let stored = Override::from_stored(&o.to_stored()).expect("reads back");
            assert_eq!(stored, o, "{v}");
            let mut shown = serde_json::to_value(o.to_doc()).expect("serializes");
            assert_eq!(shown["created_at"], "2026-12-01T00:00:00Z");
            assert_eq!(shown["id"], o.id.as_str());
            for f in ["id", "created_at"] {
                shown.as_object_mut().map(|m| m.remove(f));
            }
            assert_eq!(shown, v);
            // What it reads back as is accepted for a replacement.
            let again = serde_json::to_value(o.to_doc()).expect("serializes");
            assert!(parse_override(&again, &api(), Some(&o.id), NOW).is_ok());
        }
    }

    #[test]
    fn errors_name_the_field() {
        for (v, field) in [
            (json!({"tier": "pro"}), "match"),
            (json!({"match": {"key": "a"}}), "tier"),
            (json!({"match": {"key": "a"}, "tier": "gold"}), "tier"),
            (json!({"match": {"key": "a"}, "tier": 5}), "tier"),
            (
                json!({"match": {"key": "a"}, "tier": "pro", "block": true}),
                "block",
            ),
            (
                json!({"match": {"key": "a"}, "unlimited": false}),
                "unlimited",
            ),
            (json!({"match": {"key": "a"}, "block": "yes"}), "block"),
            (
                json!({"match": {"key": "a"}, "limits": {"hourly": {"limit": 5}}}),
                "limits.hourly",
            ),
            (
                json!({"match": {"key": "a"}, "limits": {"daily": {"limit": 0}}}),
                "limits.daily.limit",
            ),
            (
                json!({"match": {"key": "a"}, "block": true, "expires_at": "tomorrow"}),
                "expires_at",
            ),
            (
                json!({"match": {"key": "a"}, "block": true, "expires_at": "2026-11-30T00:00:00Z"}),
                "expires_at",
            ),
            (
                json!({"match": {"key": "a"}, "block": true, "expires_at": "2028-01-01T00:00:00Z"}),
                "expires_at",
            ),
            (
                json!({"match": {"key": "a"}, "block": true, "reason": "x".repeat(1025)}),
                "reason",
            ),
            (
                json!({"match": {"key": "a"}, "block": true, "colour": 1}),
                "colour",
            ),
            (
                json!({"match": {"key": "a"}, "block": true, "id": "0123456789abcdef"}),
                "id",
            ),
            (
                json!({"match": {"cidr": "203.0.113.7/24"}, "block": true}),
                "match.cidr",
            ),
        ] {
            let e = parse(v.clone()).expect_err("refused");
            let named = e.field().map(|f| f.starts_with(field)).unwrap_or(false);
            assert!(named, "{v}: {e} names {:?}, not {field}", e.field());
        }
    }

    #[test]
    fn a_time_zone_reads_back_and_is_stored_beside_the_fields() {
        let policy = parse_policy(
            &json!({"name": "daily", "algorithm": "fixed_window", "limit": 5,
                    "calendar": {"unit": "day", "time_zone": "Europe/Berlin"}}),
            None,
        )
        .expect("valid");
        let v = json!({"match": {"key": "acme"}, "limits": {"daily": {"limit": 9, "time_zone": "Asia/Tokyo"}}});
        let o = parse_override(&v, &policy, None, NOW)
            .expect("valid")
            .into_override(OverrideId::random(), NOW);
        let stored = o.to_stored();
        let doc: Value = serde_json::from_str(&stored).expect("JSON");
        assert_eq!(
            doc["limits"],
            json!({"daily": {"limit": 9, "time_zone": "Asia/Tokyo"}})
        );
        assert_eq!(Override::from_stored(&stored).expect("reads back"), o);
        let shown = serde_json::to_value(o.to_doc()).expect("serializes");
        assert_eq!(shown["limits"], v["limits"]);
        // A document as earlier versions stored it, integers only, still reads.
        let old = r#"{"id":"0123456789abcdef","match":{"key":"acme"},"limits":{"daily":{"limit":9}},"created_at_us":1796083200000000}"#;
        let o = Override::from_stored(old).expect("reads back");
        assert_eq!(
            serde_json::to_value(o.to_doc()).expect("serializes")["limits"],
            json!({"daily": {"limit": 9}})
        );
        // A zone beside a limit without a calendar is refused naming it.
        let e = parse_override(
            &json!({"match": {"key": "a"}, "limits": {"daily": {"time_zone": "Asia/Tokyo"}}}),
            &api(),
            None,
            NOW,
        )
        .expect_err("refused");
        assert_eq!(e.field(), Some("limits.daily.time_zone"));
    }

    #[test]
    fn a_concurrency_policy_has_no_overrides() {
        let c = parse_policy(
            &json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000}),
            None,
        )
        .expect("valid");
        let e = parse_override(
            &json!({"match": {"key": "a"}, "block": true}),
            &c,
            None,
            NOW,
        )
        .expect_err("refused");
        assert_eq!(e.field(), Some("policy"));
    }

    #[test]
    fn ids_are_sixteen_lowercase_hex_digits() {
        let id = OverrideId::random();
        assert_eq!(OverrideId::parse(id.as_str()), Some(id));
        assert_ne!(OverrideId::random(), id);
        for bad in [
            "",
            "0123456789ABCDEF",
            "0123456789abcde",
            "0123456789abcdefg",
            "../../etc",
        ] {
            assert_eq!(OverrideId::parse(bad), None, "{bad}");
        }
    }
}
