//! What the Redis store's failures are to the rest of the service: one classification of every
//! redis-rs error as a [`StoreError`], and URLs shown with their password hidden.

use redis::RedisError;

use super::connection::{self, is_cluster_refusal};
use crate::store::StoreError;

impl From<RedisError> for StoreError {
    /// One classification of every redis-rs error. Errors that mean the command was not run
    /// (refused, wrong password, Redis still loading) are `Unavailable`; a connection that broke
    /// or a reply that did not parse may have come after Redis ran the command, so those are
    /// `OutcomeUnknown` (the store's `call` turns them into `Unavailable` when the connection
    /// proves nothing was sent); a Cluster's refusal of an unrun call for now (`CLUSTERDOWN`,
    /// `TRYAGAIN`, `MASTERDOWN`, or a `MOVED`/`ASK` the client stopped following) is
    /// `ClusterRefused`; any other error Redis answered the command with is `Server`. The
    /// redis-rs error is kept as the source.
    fn from(e: RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        let kind = e.kind();
        let ours = |what: &str| kind == ErrorKind::Client && e.to_string().starts_with(what);
        let error = if ours(connection::CLUSTER_REFUSED)
            || is_cluster_refusal(e.code())
            || matches!(e.code(), Some("MOVED" | "ASK"))
        {
            StoreError::cluster_refused(e.to_string())
        } else if ours(connection::SENT_THEN_FAILED) {
            StoreError::outcome_unknown(format!("connection failed: {e}"))
        } else if kind == ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        {
            StoreError::unavailable(format!("authentication failed: {e}"))
        } else if e.is_connection_refusal() {
            StoreError::unavailable(format!("connection refused: {e}"))
        } else if kind == ErrorKind::Server(ServerErrorKind::BusyLoading) {
            StoreError::unavailable(format!("Redis is loading its data: {e}"))
        } else if e.is_io_error()
            || e.is_unrecoverable_error()
            || kind == ErrorKind::ClusterConnectionNotFound
        {
            StoreError::outcome_unknown(format!("connection failed: {e}"))
        } else {
            StoreError::server(e.to_string())
        };
        error.caused_by(e)
    }
}

/// The URL with any password replaced, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::store::ErrorClass;

    #[test]
    fn passwords_never_reach_the_logs() {
        assert_eq!(
            redact_url("redis://:s3cret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redact_url("redis://user:s3cret@host"),
            "redis://user:***@host"
        );
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
    }

    #[test]
    fn redis_errors_are_classified_and_kept_as_the_source() {
        use ::redis::{ErrorKind, RedisError, ServerErrorKind};
        let cases = [
            (
                RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
                ErrorClass::Unreachable,
                "store unavailable: connection refused: ",
            ),
            (
                RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS")),
                ErrorClass::Unreachable,
                "store unavailable: authentication failed: ",
            ),
            (
                RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "LOADING")),
                ErrorClass::Unreachable,
                "store unavailable: Redis is loading its data: ",
            ),
            (
                RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
                ErrorClass::OutcomeUnknown,
                "no answer from the store: connection failed: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ResponseError),
                    "OOM command not allowed",
                )),
                ErrorClass::Refused,
                "store error: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ClusterDown),
                    "The cluster is down",
                )),
                ErrorClass::ClusterRefused,
                "the Redis Cluster cannot serve the key for now: ",
            ),
            (
                RedisError::from((ErrorKind::Server(ServerErrorKind::Moved), "MOVED")),
                ErrorClass::ClusterRefused,
                "the Redis Cluster cannot serve the key for now: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Client,
                    connection::CLUSTER_REFUSED,
                    "TRYAGAIN".to_owned(),
                )),
                ErrorClass::ClusterRefused,
                "the Redis Cluster cannot serve the key for now: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Client,
                    connection::SENT_THEN_FAILED,
                    "broken pipe".to_owned(),
                )),
                ErrorClass::OutcomeUnknown,
                "no answer from the store: connection failed: ",
            ),
        ];
        for (redis_error, class, text) in cases {
            let said = redis_error.to_string();
            let error = StoreError::from(redis_error);
            assert_eq!(error.class(), class, "{error}");
            assert_eq!(error.to_string(), format!("{text}{said}"));
            let source = error
                .source()
                .and_then(|s| s.downcast_ref::<RedisError>())
                .map(ToString::to_string);
            assert_eq!(source.as_deref(), Some(said.as_str()), "{error}");
        }
    }
}
