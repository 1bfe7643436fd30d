//! `like-memory`: what likes cost Redis, written on the server's own key format and value shapes
//! and read as `used_memory` growth, in three parts:
//!
//! - cached relations: one string per recent (user, subject) pair, expiring after
//!   `PULSE_LIKE_RELATION_TTL`;
//! - counters: per liked subject, SQL's count and its version (two hash fields) and its entry in
//!   the all-time ranking;
//! - changes not archived yet: per like, its unarchived relation (a hash field) and its stream
//!   entry, with the subject's pending count; this is the backlog an unavailable SQL leaves in Redis.

use anyhow::Context as _;
use pulse::keys::LikeShardKeys;
use pulse::likes::Subject;
use pulse::redis::Keys;
use pulse::redis::Link;
use serde_json::json;

use crate::redis_util::{self, Batcher};
use crate::report::{print_table, thousands};
use crate::{LikeMemoryArgs, random_hex};
use pulse::keys::LikeKeys;

const SMOKE_LIKES: u32 = 10_000;
const SMOKE_ARTICLES: u32 = 1_000;

/// The run's likes: like `i` is by user `i / articles + 1` of article `i % articles + 1`, so every
/// article has the same number of likes, each by another user.
struct Spread {
    likes: u32,
    articles: u32,
}

impl Spread {
    fn like(&self, index: u32) -> (Subject, i64) {
        (
            Subject::Article(i64::from(index % self.articles + 1)),
            i64::from(index / self.articles + 1),
        )
    }
}

struct Part {
    name: &'static str,
    what: &'static str,
    items: u32,
    bytes: f64,
}

pub async fn run(args: LikeMemoryArgs) -> anyhow::Result<()> {
    let spread = if args.common.smoke {
        Spread {
            likes: SMOKE_LIKES,
            articles: SMOKE_ARTICLES,
        }
    } else {
        Spread {
            likes: args.likes,
            articles: args.articles.min(args.likes),
        }
    };
    let mut conn = redis_util::connect_for_memory(&args.common.redis_url, "like-memory").await?;
    let prefix = redis_util::fresh_prefix(&mut conn).await?;
    let measured = measure(&mut conn, &prefix, &spread).await;
    let deleted = redis_util::delete_prefix(&mut conn, &prefix).await;
    let parts = measured?;
    let deleted = deleted.context("cannot delete the run's keys")?;

    let mut rows: Vec<(&str, String)> = parts
        .iter()
        .map(|part| {
            (
                part.name,
                format!(
                    "{:.1} bytes each ({} {}; {:.1} MB in all)",
                    part.bytes / f64::from(part.items),
                    thousands(f64::from(part.items)),
                    part.what,
                    part.bytes / 1e6
                ),
            )
        })
        .collect();
    rows.push(("keys deleted afterwards", thousands(deleted as f64)));
    print_table(
        &format!(
            "pulse-bench like-memory: {} likes of {} articles on {}",
            thousands(f64::from(spread.likes)),
            thousands(f64::from(spread.articles)),
            redis_util::redacted(&args.common.redis_url)
        ),
        &rows,
    );
    if args.common.json {
        let parts: Vec<_> = parts
            .iter()
            .map(|part| {
                json!({
                    "part": part.name,
                    "items": part.items,
                    "bytes": part.bytes,
                    "bytes_each": part.bytes / f64::from(part.items),
                })
            })
            .collect();
        let report = json!({
            "scenario": "like-memory",
            "likes": spread.likes,
            "articles": spread.articles,
            "parts": parts,
        });
        println!("{report}");
    }
    Ok(())
}

async fn measure(conn: &mut Link, prefix: &str, spread: &Spread) -> anyhow::Result<Vec<Part>> {
    let keys = Keys::new(prefix);
    let defaults = pulse::Config::defaults();
    let ttl = defaults.like_relation_ttl.as_secs().max(1);
    let now = chrono::Utc::now();
    // Sequences as the like script mints them: never below the time in microseconds.
    let first_seq = now.timestamp_micros();
    let relation_value = |index: u32| 2 * (first_seq + i64::from(index)) + 1;

    let mut parts = Vec::new();
    let before = redis_util::settled_used_memory(conn).await?;
    let mut batch = Batcher::new(conn);
    for index in 0..spread.likes {
        let (subject, user) = spread.like(index);
        let mut set = redis::cmd("SET");
        set.arg(
            keys.like_shard(subject.id())
                .relation(&subject.field(), user),
        )
        .arg(relation_value(index))
        .arg("EX")
        .arg(ttl);
        batch.push(set).await?;
    }
    batch.flush().await?;
    let after = redis_util::settled_used_memory(conn).await?;
    parts.push(Part {
        name: "cached relation",
        what: "relations",
        items: spread.likes,
        bytes: after - before,
    });

    let before = after;
    let likes_per_article = spread.likes / spread.articles;
    let mut batch = Batcher::new(conn);
    for article in 1..=i64::from(spread.articles) {
        let subject = Subject::Article(article);
        let shard = keys.like_shard(subject.id());
        let field = subject.field();
        let mut base = redis::cmd("HSET");
        base.arg(shard.base()).arg(&field).arg(likes_per_article);
        batch.push(base).await?;
        let mut version = redis::cmd("HSET");
        version.arg(shard.base_versions()).arg(&field).arg(article);
        batch.push(version).await?;
        let mut rank = redis::cmd("ZADD");
        rank.arg(shard.rank_all_time())
            .arg(likes_per_article)
            .arg(article);
        batch.push(rank).await?;
    }
    batch.flush().await?;
    let after = redis_util::settled_used_memory(conn).await?;
    parts.push(Part {
        name: "counter",
        what: "subjects: base, version, all-time ranking",
        items: spread.articles,
        bytes: after - before,
    });

    let before = after;
    let mut batch = Batcher::new(conn);
    for index in 0..spread.likes {
        let (subject, user) = spread.like(index);
        let shard = keys.like_shard(subject.id());
        let seq = first_seq + i64::from(index);
        let mut unarchived = redis::cmd("HSET");
        unarchived
            .arg(shard.unarchived())
            .arg(LikeShardKeys::relation_field(&subject.field(), user))
            .arg(relation_value(index));
        batch.push(unarchived).await?;
        let mut pending = redis::cmd("HINCRBY");
        pending.arg(shard.pending()).arg(subject.field()).arg(1);
        batch.push(pending).await?;
        let stream = redis_util::like_archive_stream(&keys, shard.shard());
        let mut event = redis::cmd("XADD");
        event
            .arg(stream)
            .arg("*")
            .arg("event")
            .arg(random_hex(32))
            .arg("user")
            .arg(user)
            .arg("kind")
            .arg(subject.kind_code())
            .arg("subject")
            .arg(subject.id())
            .arg("liked")
            .arg(1)
            .arg("seq")
            .arg(seq)
            .arg("at")
            .arg(now.timestamp_millis());
        batch.push(event).await?;
    }
    batch.flush().await?;
    let after = redis_util::settled_used_memory(conn).await?;
    parts.push(Part {
        name: "unarchived change",
        what: "likes waiting for the archive: field, stream entry, pending count",
        items: spread.likes,
        bytes: after - before,
    });
    Ok(parts)
}
