//! How a policy is kept in its Redis hash and read back: its document as JSON in one field
//! ([`encode`], [`decode`]; hashes written field by field by earlier versions still decode),
//! and the reply of `lua/policy_read.lua` ([`read_reply`]).

use std::sync::Arc;

use redis::Value;

use crate::policy::overrides::Override;
use crate::policy::stored::{self, StoredDoc};
use crate::policy::Policy;
use crate::store::StoreError;

/// The hash field that holds a policy's document, as JSON.
const DOC_FIELD: &str = "doc";
/// The hash field that holds a policy's incarnation, which `lua/policy_write.lua` keeps: not
/// part of the document.
const BORN_FIELD: &str = "born";
/// The hash fields in which `lua/policy_write.lua` keeps the policy's kind and descriptor shape,
/// which it compares on the next write: derived from the document, not part of it.
const KEPT_FIELDS: [&str; 2] = ["kind", "shape"];

/// A policy as the fields of its hash: its document, as JSON, in one field, so that every value
/// keeps its JSON type.
pub(super) fn encode(policy: &Policy) -> Vec<(String, String)> {
    let doc = serde_json::to_string(&policy.to_doc()).unwrap_or_default();
    vec![(DOC_FIELD.to_owned(), doc)]
}

/// A policy from the fields of its hash, validated like any input: the JSON document
/// ([`StoredDoc`]), or a hash written by a version before it ([`stored::from_legacy_fields`]).
/// Its incarnation is the `born` field, 0 in a hash written before policies had one.
pub(super) fn decode(mut fields: Vec<(String, String)>) -> Result<Policy, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::corrupt(format!("policy hash: {e}"));
    let incarnation = match fields.iter().position(|(k, _)| k == BORN_FIELD) {
        Some(i) => {
            let (_, born) = fields.swap_remove(i);
            born.parse::<u64>()
                .map_err(|e| corrupt(&format!("{BORN_FIELD} {born:?}: {e}")))?
        }
        None => 0,
    };
    fields.retain(|(k, _)| !KEPT_FIELDS.contains(&k.as_str()));
    Ok(decode_doc(fields)?.with_incarnation(incarnation))
}

/// An override from its hash: its document in `doc`.
pub(super) fn decode_override(fields: Vec<(String, String)>) -> Result<Override, StoreError> {
    let doc = fields
        .iter()
        .find(|(k, _)| k == DOC_FIELD)
        .ok_or_else(|| StoreError::corrupt("override hash without `doc`"))?;
    Override::from_stored(&doc.1).map_err(|e| StoreError::corrupt(format!("override hash: {e}")))
}

/// The document part of [`decode`]: the fields without `born`.
fn decode_doc(fields: Vec<(String, String)>) -> Result<Policy, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::corrupt(format!("policy hash: {e}"));
    if let Some((_, doc)) = fields.iter().find(|(k, _)| k == DOC_FIELD) {
        let doc = StoredDoc::from_json(doc).map_err(|e| corrupt(&e))?;
        return Policy::try_from(doc).map_err(|e| corrupt(&e));
    }
    stored::from_legacy_fields(fields).map_err(|e| corrupt(&e))
}

/// One `{name, version, fields}` entry of `policy_read.lua`'s reply.
pub(super) type Entry = (String, u64, Vec<(String, String)>);

/// `policy_read.lua`'s reply: `(generation, version, floor, entries)`.
pub(super) type ReadReply = (Option<Arc<str>>, u64, u64, Vec<Entry>);

pub(super) fn read_reply(reply: Value) -> Result<ReadReply, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| {
        StoreError::corrupt(format!("policy_read.lua answered an unexpected shape: {e}"))
    };
    let Value::Array(items) = reply else {
        return Err(corrupt(&"not an array"));
    };
    let mut items = items.into_iter();
    let mut next = || items.next().ok_or_else(|| corrupt(&"too short"));
    let generation: Option<String> = redis::from_redis_value(next()?).map_err(|e| corrupt(&e))?;
    let version: u64 = redis::from_redis_value(next()?).map_err(|e| corrupt(&e))?;
    let floor: u64 = redis::from_redis_value(next()?).map_err(|e| corrupt(&e))?;
    let entries = items
        .map(redis::from_redis_value::<Entry>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| corrupt(&e))?;
    Ok((generation.map(Arc::from), version, floor, entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, FailMode, PolicyName};

    #[test]
    fn a_policy_is_stored_as_its_json_document_and_read_back_unchanged() {
        let name = PolicyName::parse("007").expect("valid");
        // A name and a description that look like numbers stay strings.
        let policy = Policy::single(
            name,
            Algorithm::TokenBucket,
            &[20, 10, 1_000],
            Some("42".into()),
            FailMode::Closed,
        );
        let fields = encode(&policy);
        assert_eq!(fields.len(), 1);
        assert_eq!(decode(fields).expect("decodes"), policy);
    }

    #[test]
    fn a_stored_document_out_of_bounds_is_corrupt_as_input_would_be_refused() {
        for doc in [
            r#"{"name":"p","algorithm":"fixed_window","limit":0,"window_ms":1000}"#,
            r#"{"name":"p","algorithm":"fixed_window","limit":5,"window_ms":1000,"colour":1}"#,
            r#"{"name":"p","algorithm":"concurrency","limit":5,"lease_ms":1000,"mode":"shadow"}"#,
            r#"{"name":"p","limits":[]}"#,
            r#"not json"#,
        ] {
            let fields = vec![(DOC_FIELD.to_owned(), doc.to_owned())];
            assert!(
                matches!(decode(fields), Err(StoreError::Corrupt(_))),
                "{doc}"
            );
        }
    }

    #[test]
    fn hashes_written_field_by_field_by_earlier_versions_still_decode() {
        let fields = [
            ("name", "login"),
            ("algorithm", "fixed_window"),
            ("limit", "5"),
            ("window_ms", "60000"),
            ("description", "5 a minute"),
            ("fail_mode", "open"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec();
        let policy = decode(fields).expect("decodes");
        assert_eq!(policy.params()[0].quota(), 5);
        assert_eq!(policy.description.as_deref(), Some("5 a minute"));
    }

    #[test]
    fn the_incarnation_is_read_from_its_own_field_in_either_layout() {
        let name = PolicyName::parse("p").expect("valid");
        let policy = Policy::single(
            name,
            Algorithm::FixedWindow,
            &[5, 1_000],
            None,
            FailMode::Open,
        );
        let mut fields = encode(&policy);
        assert_eq!(decode(fields.clone()).expect("decodes").incarnation(), 0);
        fields.push((BORN_FIELD.to_owned(), "42".to_owned()));
        let read = decode(fields).expect("decodes");
        assert_eq!((read.incarnation(), read.to_doc()), (42, policy.to_doc()));

        // A hash of the earlier layout, one field per policy field, never hands `born` to the
        // validation, which would refuse it as an unknown field.
        let legacy = [
            ("name", "p"),
            ("algorithm", "fixed_window"),
            ("limit", "5"),
            ("window_ms", "1000"),
            ("fail_mode", "open"),
            ("born", "9"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec();
        let read = decode(legacy).expect("decodes");
        assert_eq!((read.incarnation(), read.to_doc()), (9, policy.to_doc()));

        let bad = vec![(BORN_FIELD.to_owned(), "x".to_owned())];
        assert!(matches!(decode(bad), Err(StoreError::Corrupt(_))));
    }
}
