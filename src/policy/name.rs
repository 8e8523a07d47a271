//! Validated names: a [`PolicyName`] and the caller's [`LimitKey`].

use std::fmt;
use std::sync::Arc;

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
const MAX_NAME_BYTES: usize = 64;

/// What [`PolicyName::check`] accepts, as the OpenAPI schema states it.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$";

/// A policy name matching [`NAME_PATTERN`]: safe in URLs, in Redis keys
/// (no `{`, `}` or `:`) and inside the quoted strings of the `RateLimit` headers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyName(Arc<str>);

impl PolicyName {
    /// Accepts a name, or says why it is not one.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        Self::check(s)?;
        Ok(Self(Arc::from(s)))
    }

    /// Whether `s` is a valid name, without allocating one (the acquire path looks policies up
    /// by `&str`).
    pub fn check(s: &str) -> Result<(), &'static str> {
        let bytes = s.as_bytes();
        match bytes.first() {
            None => return Err("must not be empty"),
            Some(b) if !b.is_ascii_alphanumeric() => {
                return Err("must start with a letter or a digit")
            }
            _ => {}
        }
        if bytes.len() > MAX_NAME_BYTES {
            return Err("must be at most 64 characters");
        }
        if !bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err("may only hold letters, digits, '_', '.' and '-'");
        }
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// Names compare as their text (the derived `Eq`, `Ord` and `Hash` are the `str`'s), so maps keyed
// by name can be searched with a `&str`.
impl std::borrow::Borrow<str> for PolicyName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The subject a limit applies to: any non-empty UTF-8 string of at most 256 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimitKey(String);

impl LimitKey {
    pub fn parse(s: String) -> Result<Self, &'static str> {
        if s.is_empty() {
            Err("must not be empty")
        } else if s.len() > MAX_KEY_BYTES {
            Err("must be at most 256 bytes")
        } else {
            Ok(Self(s))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_follow_the_pattern() {
        for good in ["a", "A9", "api-per-user", "x.y_z", &"a".repeat(64)] {
            assert!(PolicyName::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "_a", "a b", "a:b", "a{b}", "é", &"a".repeat(65)] {
            assert!(PolicyName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_bounded_in_bytes_not_characters() {
        assert!(LimitKey::parse("é".repeat(128)).is_ok());
        assert!(LimitKey::parse("é".repeat(129)).is_err());
        assert!(LimitKey::parse(String::new()).is_err());
    }
}
