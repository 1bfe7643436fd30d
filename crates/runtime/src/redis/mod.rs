//! Redis access: one multiplexed, self-reconnecting connection per process for the API and one for
//! the background jobs, the key builder's shared part and the script registry. Services take what they need from
//! [`Redis`]; nothing else opens connections, except the realtime hub's dedicated pub/sub
//! connection. The same types serve a single server and a Redis Cluster (see [`link`]).

pub mod embedded;
pub mod keys;
pub mod link;
pub mod scripts;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Script, Value};

use crate::bell::Bell;
use crate::redacted_url;

pub use keys::Keys;
pub use link::{KeyScan, Link, PubSubNodes, Target};
pub use scripts::Scripts;

#[derive(Clone)]
pub struct Redis {
    pub target: Target,
    pub conn: CountedConnection,
    pub keys: Keys,
    pub scripts: Arc<Scripts>,
    /// Wakes the process's idle job workers when it queues work; shared by every handle of one
    /// process (see [`Self::own_connection`]).
    pub bell: Bell,
}

impl Redis {
    /// Connects and loads the runtime's scripts and the `domains`' into Redis.
    pub async fn connect(url: &str, prefix: &str, domains: &[&Script]) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        Keys::check_prefix(prefix).map_err(anyhow::Error::msg)?;
        let target = Target::parse(url).context("invalid REDIS_URL")?;
        let mut conn = target
            .connect()
            .await
            .with_context(|| format!("cannot connect to Redis at {}", redacted_url(url)))?;
        let scripts = Scripts::load();
        scripts
            .preload(domains, &mut conn)
            .await
            .context("cannot load Lua scripts into Redis")?;
        Ok(Self {
            target,
            conn: CountedConnection {
                inner: conn,
                round_trips: Arc::default(),
            },
            keys: Keys::new(prefix),
            scripts: Arc::new(scripts),
            bell: Bell::default(),
        })
    }

    /// The same Redis through a connection of its own, for background jobs. Redis answers one
    /// connection's commands in order, so a job's bulk traffic on the shared connection (a fan-out
    /// sends thousands of follower ids and inbox writes at once) made every API request queued
    /// behind it wait: a publish took 30 ms while the previous one fanned out.
    pub async fn own_connection(&self) -> redis::RedisResult<Self> {
        Ok(Self {
            target: self.target.clone(),
            conn: CountedConnection {
                inner: self.target.connect().await?,
                round_trips: Arc::default(),
            },
            keys: self.keys.clone(),
            scripts: self.scripts.clone(),
            bell: self.bell.clone(),
        })
    }

    /// Warns when Redis may evict any key under memory pressure (an `allkeys-*` policy): streams,
    /// pending counts and unarchived changes are not caches and must stay until SQL has them. A
    /// Redis that hides `CONFIG` (some managed services do) is taken on trust.
    pub async fn warn_if_evicting(&self) {
        let mut conn = self.conn.clone();
        let policy: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut conn)
            .await;
        match policy {
            Ok(reply) => {
                if let Some(policy) = reply.get(1).filter(|policy| policy.starts_with("allkeys")) {
                    tracing::warn!(
                        policy,
                        "Redis may evict any key when full: use noeviction or a volatile-* policy, or changes not yet in SQL can be lost"
                    );
                }
            }
            Err(err) => tracing::debug!(error = %err, "cannot read Redis's maxmemory-policy"),
        }
    }

    /// The best `first` members (ids) with a positive score across sorted sets that each rank one
    /// shard's members, best first, ties by member: one pipelined round trip. The overall top is
    /// among the shards' tops, so each shard gives its `first` best.
    pub async fn top_of_shards(
        &self,
        keys: impl IntoIterator<Item = String>,
        first: usize,
    ) -> redis::RedisResult<Vec<(i64, f64)>> {
        if first == 0 {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("ZRANGE")
                .arg(key)
                .arg("+inf")
                .arg("(0")
                .arg("BYSCORE")
                .arg("REV")
                .arg("LIMIT")
                .arg(0)
                .arg(first)
                .arg("WITHSCORES");
        }
        let mut conn = self.conn.clone();
        let per_shard: Vec<Vec<(i64, f64)>> = pipe.query_async(&mut conn).await?;
        let mut merged: Vec<(i64, f64)> = per_shard.into_iter().flatten().collect();
        merged.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        merged.truncate(first);
        Ok(merged)
    }

    /// Every key matching `pattern`, a `SCAN` step at a time (on every master of a cluster).
    pub fn scan(&self, pattern: impl Into<String>) -> KeyScan {
        self.conn.inner.scan(pattern)
    }

    /// Every master answers (a cluster is not whole while one is down and not yet replaced).
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut link = self.conn.inner.clone();
        for node in link.masters().await? {
            link.on_node(&node, redis::cmd("PING")).await?;
        }
        Ok(())
    }
}

/// The process's multiplexed connection, counting its round trips (one per command or pipeline
/// sent), so that what a request costs in round trips can be measured rather than argued.
#[derive(Clone)]
pub struct CountedConnection {
    inner: Link,
    round_trips: Arc<AtomicU64>,
}

impl CountedConnection {
    /// Round trips made so far through this connection and its clones.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }
}

impl ConnectionLike for CountedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
