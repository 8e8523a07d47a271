//! Why a store call failed ([`StoreError`], with its [`Cause`]) and what that means to the code
//! that meets it ([`ErrorClass`], the one table the breaker, the fail modes, the cache and the
//! HTTP answer read). Re-exported from [`crate::store`].

use std::fmt;

/// Why a store call failed.
///
/// Each error carries what went wrong in words (its `Display`) and, where another error
/// reported it, that error as its [`source`](std::error::Error::source) (the redis-rs
/// `RedisError`, say), so that a log can show the chain. What an error means to its
/// reader (retry, breaker, fail mode, cache, HTTP) is its [`class`](StoreError::class), never
/// its variant.
#[derive(Debug)]
pub enum StoreError {
    /// The store could not be reached, and the call was provably not executed (refused, no
    /// connection, circuit breaker open). [`ErrorClass::Unreachable`].
    Unavailable(Cause),
    /// The call may have been executed, but no answer came (the deadline passed, or the
    /// connection broke after the command was sent): a write must be read back before it is
    /// retried. [`ErrorClass::OutcomeUnknown`].
    OutcomeUnknown(Cause),
    /// The store answered with an error (a script error, out of memory, a wrong type).
    /// [`ErrorClass::Refused`].
    Server(Cause),
    /// A Redis Cluster node refused the call unrun because the cluster cannot serve its slot
    /// right now (`CLUSTERDOWN` while a replica is promoted, `TRYAGAIN` or a redirect not
    /// followed while a slot moves). [`ErrorClass::ClusterRefused`].
    ClusterRefused(Cause),
    /// Stored data that does not decode (a policy hash edited by hand, say).
    /// [`ErrorClass::Corrupt`].
    Corrupt(Cause),
    /// The embedded store already holds state for its most subjects
    /// (`limits.max_embedded_subjects`, the number given) and none of them has expired: a
    /// subject without state gets none. [`ErrorClass::Refused`]: nothing was unreachable.
    Full(u64),
}

/// What a [`StoreError`] means to the code that meets it. This table is the one place that says
/// it; the circuit breaker and the resend on a new connection (`store::redis`), the fail modes,
/// the cached-policy fallback and readiness (`service`), and the HTTP answer (`api::errors`) all
/// go by it.
///
/// | class | errors | transient (breaker counts it) | acquire answered by fail mode | cached policies served instead | HTTP answer |
/// |---|---|---|---|---|---|
/// | `Unreachable` | `Unavailable` | yes | yes | yes | 503 `store-unavailable` |
/// | `OutcomeUnknown` | `OutcomeUnknown` | yes | yes | yes | 503 `outcome-unknown` |
/// | `ClusterRefused` | `ClusterRefused` | yes (the breaker does not count it) | yes | yes | 503 `store-unavailable` |
/// | `Refused` | `Server`, `Full` | no | yes | no | 503 `store-unavailable` |
/// | `Corrupt` | `Corrupt` | no | yes | no | 500 `internal` |
///
/// - *Transient* ([`is_transient`](Self::is_transient)): the store was not reached, its
///   answer never came, or a Cluster said it cannot serve the key for now, so the same call may
///   succeed later without anyone changing anything. Those that say the store could not be
///   reached count against the circuit breaker ([`counts_against_breaker`](
///   Self::counts_against_breaker)): an error the store answered with proves it reachable, and
///   a Cluster's refusal during a failover is the cluster's state, not its master's, so a
///   breaker opened on it would keep a healthy master's keys in fail mode after the cluster
///   answers again. The Redis store sends a transient call once more on a new connection when
///   the connection proves nothing was sent. Readiness reports `Unreachable` and
///   `OutcomeUnknown` as "the store is unreachable", `ClusterRefused` as a degraded but ready
///   store (every instance sees the same cluster: taking them out of rotation would help no
///   one), and any other error of its probe write as "the store refuses writes".
/// - *Fail mode* ([`answered_by_fail_mode`](Self::answered_by_fail_mode)): every failed acquire
///   is answered by its policy's fail mode: `open` allows, `local` decides with the in-process
///   store (and allows when that is full), `closed` answers the error as what it is: a
///   decision whose call may have been counted by Redis is `outcome-unknown`, one that
///   provably was not is `store-unavailable`.
/// - *Cached policies* ([`may_serve_cached`](Self::may_serve_cached)): a policy read or list
///   that meets a transient error is answered from this instance's cache, once it has loaded
///   the policies; any other error is answered as an error. Writes never fall back.
/// - *HTTP* (chosen in `api/errors.rs`, the one place that chooses statuses; the body of a
///   store error never carries its cause, which goes to the log): `outcome-unknown` tells the
///   client to read a write back before retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The store could not be reached; the call provably did not take effect.
    Unreachable,
    /// The call was sent and no answer came: it may or may not have taken effect.
    OutcomeUnknown,
    /// A Redis Cluster refused the call unrun, for now: a failover or a slot migration is
    /// under way. The node that said so is reachable.
    ClusterRefused,
    /// The store was reached and said no: an error it answered with (a script error, out of
    /// memory, a wrong type, a command it refuses), or the embedded store full.
    Refused,
    /// The store answered something this version cannot read.
    Corrupt,
}

impl ErrorClass {
    /// Whether the store was not reached or did not answer, so that the same call may succeed
    /// later without anyone changing anything.
    pub const fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorClass::Unreachable | ErrorClass::OutcomeUnknown | ErrorClass::ClusterRefused
        )
    }

    /// Whether the circuit breaker counts the error as a failure to reach the store.
    pub const fn counts_against_breaker(self) -> bool {
        matches!(self, ErrorClass::Unreachable | ErrorClass::OutcomeUnknown)
    }

    /// Whether a failed acquire is answered by its policy's fail mode (rather than always as an
    /// error).
    pub const fn answered_by_fail_mode(self) -> bool {
        true
    }

    /// Whether a policy read may be answered from the cache instead (once it is loaded).
    pub const fn may_serve_cached(self) -> bool {
        self.is_transient()
    }
}

impl StoreError {
    /// What the error means to its reader: see [`ErrorClass`].
    pub const fn class(&self) -> ErrorClass {
        match self {
            StoreError::Unavailable(_) => ErrorClass::Unreachable,
            StoreError::OutcomeUnknown(_) => ErrorClass::OutcomeUnknown,
            StoreError::ClusterRefused(_) => ErrorClass::ClusterRefused,
            StoreError::Server(_) | StoreError::Full(_) => ErrorClass::Refused,
            StoreError::Corrupt(_) => ErrorClass::Corrupt,
        }
    }

    /// Whether the same call may succeed later without anyone changing anything
    /// ([`ErrorClass::is_transient`]).
    pub const fn is_transient(&self) -> bool {
        self.class().is_transient()
    }

    // The constructors take the message as a `String` or a `&str`; add the error that reported
    // it with `caused_by`.

    pub fn unavailable(cause: impl Into<Cause>) -> Self {
        StoreError::Unavailable(cause.into())
    }

    pub fn outcome_unknown(cause: impl Into<Cause>) -> Self {
        StoreError::OutcomeUnknown(cause.into())
    }

    pub fn server(cause: impl Into<Cause>) -> Self {
        StoreError::Server(cause.into())
    }

    pub fn cluster_refused(cause: impl Into<Cause>) -> Self {
        StoreError::ClusterRefused(cause.into())
    }

    pub fn corrupt(cause: impl Into<Cause>) -> Self {
        StoreError::Corrupt(cause.into())
    }

    /// Keeps `source` as the error that caused this one. `Full` has no cause to keep it in.
    pub fn caused_by(mut self, source: impl Into<BoxedError>) -> Self {
        if let Some(cause) = self.cause_mut() {
            cause.source = Some(source.into());
        }
        self
    }

    /// The same error for a call whose outcome is settled: its connection proves nothing was
    /// sent, or (a refused decision) whether it took effect does not matter. An unknown outcome
    /// becomes `Unavailable`; any other error is unchanged.
    pub fn outcome_known(self) -> Self {
        match self {
            StoreError::OutcomeUnknown(cause) => StoreError::Unavailable(cause),
            other => other,
        }
    }

    /// The same error again, for each decision of a batch whose call failed: the same variant
    /// and words, and the source's words as a source of their own.
    pub fn duplicate(&self) -> Self {
        let copy = |c: &Cause| Cause {
            message: c.message.clone(),
            source: c.source.as_ref().map(|s| BoxedError::from(s.to_string())),
        };
        match self {
            StoreError::Unavailable(c) => StoreError::Unavailable(copy(c)),
            StoreError::OutcomeUnknown(c) => StoreError::OutcomeUnknown(copy(c)),
            StoreError::Server(c) => StoreError::Server(copy(c)),
            StoreError::ClusterRefused(c) => StoreError::ClusterRefused(copy(c)),
            StoreError::Corrupt(c) => StoreError::Corrupt(copy(c)),
            StoreError::Full(max) => StoreError::Full(*max),
        }
    }

    fn cause(&self) -> Option<&Cause> {
        match self {
            StoreError::Unavailable(c)
            | StoreError::OutcomeUnknown(c)
            | StoreError::Server(c)
            | StoreError::ClusterRefused(c)
            | StoreError::Corrupt(c) => Some(c),
            StoreError::Full(_) => None,
        }
    }

    fn cause_mut(&mut self) -> Option<&mut Cause> {
        match self {
            StoreError::Unavailable(c)
            | StoreError::OutcomeUnknown(c)
            | StoreError::Server(c)
            | StoreError::ClusterRefused(c)
            | StoreError::Corrupt(c) => Some(c),
            StoreError::Full(_) => None,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(c) => write!(f, "store unavailable: {c}"),
            StoreError::OutcomeUnknown(c) => write!(f, "no answer from the store: {c}"),
            StoreError::Server(c) => write!(f, "store error: {c}"),
            StoreError::ClusterRefused(c) => {
                write!(f, "the Redis Cluster cannot serve the key for now: {c}")
            }
            StoreError::Corrupt(c) => write!(f, "stored data is corrupt: {c}"),
            StoreError::Full(max) => write!(
                f,
                "the embedded store is full: it keeps state for at most {max} subjects \
                 (limits.max_embedded_subjects)"
            ),
        }
    }
}

// Written out rather than derived with thiserror: a `#[source]` field must itself be the source,
// and `Cause` as a link of its own would repeat the message in every printed chain.
impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = self.cause()?.source.as_deref()?;
        Some(source)
    }
}

/// An error of any kind, kept as the source of a [`StoreError`].
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, in words, and the error that reported it, if any
/// ([`StoreError::caused_by`]). Reads as its message (`Display`, and `Deref` to `str`).
#[derive(Debug)]
pub struct Cause {
    message: String,
    source: Option<BoxedError>,
}

impl From<String> for Cause {
    fn from(message: String) -> Self {
        Cause {
            message,
            source: None,
        }
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        Cause::from(message.to_owned())
    }
}

impl std::ops::Deref for Cause {
    type Target = str;

    fn deref(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn every_error_is_read_as_its_class_says() {
        use ErrorClass::*;
        // The rows of `ErrorClass`'s table: error, class, transient, the breaker counts it,
        // answered by fail mode, cached policies served instead.
        let table = [
            (
                StoreError::unavailable("refused"),
                Unreachable,
                [true, true, true, true],
            ),
            (
                StoreError::outcome_unknown("no answer"),
                OutcomeUnknown,
                [true, true, true, true],
            ),
            (
                StoreError::cluster_refused("CLUSTERDOWN"),
                ClusterRefused,
                [true, false, true, true],
            ),
            (
                StoreError::server("OOM"),
                Refused,
                [false, false, true, false],
            ),
            (StoreError::Full(2), Refused, [false, false, true, false]),
            (
                StoreError::corrupt("policy hash"),
                Corrupt,
                [false, false, true, false],
            ),
        ];
        for (error, class, [transient, breaker, fail_mode, cached]) in table {
            assert_eq!(error.class(), class, "{error}");
            assert_eq!(error.is_transient(), transient, "{error}");
            assert_eq!(class.is_transient(), transient, "{error}");
            assert_eq!(class.counts_against_breaker(), breaker, "{error}");
            assert_eq!(class.answered_by_fail_mode(), fail_mode, "{error}");
            assert_eq!(class.may_serve_cached(), cached, "{error}");
        }
    }

    #[test]
    fn an_outcome_made_known_is_unavailable_with_its_message_and_source() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let error = StoreError::outcome_unknown("connection failed")
            .caused_by(io)
            .outcome_known();
        assert!(matches!(&error, StoreError::Unavailable(m) if &**m == "connection failed"));
        assert_eq!(error.to_string(), "store unavailable: connection failed");
        assert!(error
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some());
        let server = StoreError::server("OOM").outcome_known();
        assert_eq!(server.class(), ErrorClass::Refused);
    }

    #[test]
    fn messages_read_as_before_sources_were_kept() {
        assert_eq!(
            StoreError::unavailable("x").to_string(),
            "store unavailable: x"
        );
        assert_eq!(
            StoreError::outcome_unknown("x").to_string(),
            "no answer from the store: x"
        );
        assert_eq!(StoreError::server("x").to_string(), "store error: x");
        assert_eq!(
            StoreError::corrupt("x").to_string(),
            "stored data is corrupt: x"
        );
        assert_eq!(
            StoreError::Full(7).to_string(),
            "the embedded store is full: it keeps state for at most 7 subjects \
             (limits.max_embedded_subjects)"
        );
        assert!(StoreError::Full(7).caused_by("ignored").source().is_none());
    }
}
