//! Pulse's shared machinery, with no domain in it: the Redis link (a single server or a cluster,
//! pipelines split by slot), the embedded `redis-server`, the script registry, the durable job
//! runtime on Redis Streams, the pub/sub hub and the coalescer of live snapshots, keyset
//! pagination, text rules, SQL failure classification and the request path's error type.
//!
//! This crate names no domain (views, likes, votes, the feed…): the app crate depends on it, never
//! the other way, so a domain type used here fails to compile. Domains bring their own Lua scripts
//! ([`redis::Redis::connect`] takes them), their key families (over [`redis::Keys`]) and their jobs
//! (each a [`jobs::Job`] with its [`jobs::JobSpec`]).

pub mod bell;
pub mod error;
pub mod jobs;
pub mod pagination;
pub mod realtime;
pub mod redis;
pub mod sql;
pub mod text;

/// A connection URL with its password replaced, fit for logs and error messages.
pub fn redacted_url(url: &str) -> String {
    let redacted = url.split_once("://").and_then(|(scheme, rest)| {
        let (credentials, host) = rest.split_once('@')?;
        // A URL without a password shows as it is: `postgres://app:***@db` would say it has one.
        let (user, _password) = credentials.split_once(':')?;
        Some(format!("{scheme}://{user}:***@{host}"))
    });
    redacted.unwrap_or_else(|| url.to_owned())
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redacted_url("redis://:s3cret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redacted_url("postgres://app:pw@db/pulse"),
            "postgres://app:***@db/pulse"
        );
        assert_eq!(
            redacted_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(
            redacted_url("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432/test"
        );
    }
}
