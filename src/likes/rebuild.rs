//! Rebuilds the likes caches from SQL: `pulse rebuild likes`.
//!
//! Per shard, the bases (SQL's counts with their versions) and the all-time ranking (bases plus the
//! changes not archived yet) are built aside and renamed in, so readers never see half a rebuild.
//! Cached relations are dropped rather than rewritten: a missing relation is read from the
//! unarchived changes or SQL on its next use, which is exact, and memory stays what recent activity
//! needs. The unarchived changes and pending counts are the truth of what SQL lacks yet: they are
//! kept. DAY and WEEK rankings are not rebuilt (no bucketed history in SQL beyond `like_events`);
//! they refill as likes come.

use std::collections::HashMap;

use sea_orm::DatabaseConnection;

use super::service::SqlCount;
use super::{Subject, counts};
use crate::error::AppResult;
use crate::keys::LikeKeys;
use crate::keys::{LIKE_SHARDS, like_shard_of};
use crate::redis::Redis;

/// Rows read from SQL per query.
const PAGE: u64 = 1000;

/// What a rebuild did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    pub subjects: u64,
    pub relations_dropped: u64,
}

pub(super) async fn rebuild_all(db: &DatabaseConnection, redis: &Redis) -> AppResult<Rebuilt> {
    let mut conn = redis.conn.clone();
    let aside = |key: String| format!("{key}:rebuild");
    let shards: Vec<_> = (0..LIKE_SHARDS)
        .map(|index| redis.keys.like_shard_by_index(index))
        .collect();
    let mut reads = redis::pipe();
    for shard in &shards {
        for key in [shard.base(), shard.base_versions(), shard.rank_all_time()] {
            reads.del(aside(key)).ignore();
        }
        reads.hgetall(shard.pending());
    }
    let pending: Vec<HashMap<String, i64>> = reads.query_async(&mut conn).await?;
    let mut rebuilt = Rebuilt::default();
    let mut filled = vec![false; shards.len()];
    let mut ranked = vec![false; shards.len()];
    for kind in [Subject::Article(0), Subject::Comment(0)] {
        let mut after = 0;
        loop {
            let rows = counts::page(db, kind, after, PAGE).await?;
            let Some(&(last, _)) = rows.last() else {
                break;
            };
            after = last.id();
            let mut writes = redis::pipe();
            for (subject, SqlCount { count, version }) in rows {
                let index = like_shard_of(subject.id()) as usize;
                let (shard, field) = (&shards[index], subject.field());
                writes
                    .hset(aside(shard.base()), &field, count)
                    .ignore()
                    .hset(aside(shard.base_versions()), &field, version)
                    .ignore();
                if let Subject::Article(article) = subject {
                    let live = count + pending[index].get(&field).copied().unwrap_or(0);
                    if live > 0 {
                        writes
                            .zadd(aside(shard.rank_all_time()), article, live)
                            .ignore();
                        ranked[index] = true;
                    }
                }
                filled[index] = true;
                rebuilt.subjects += 1;
            }
            let () = writes.query_async(&mut conn).await?;
        }
    }
    // One transaction per shard: a shard's keys share a hash slot, shards do not, and a cluster
    // runs a transaction in one slot only.
    for (index, shard) in shards.iter().enumerate() {
        let mut swap = redis::pipe();
        swap.atomic();
        let written = [
            (shard.base(), filled[index]),
            (shard.base_versions(), filled[index]),
            (shard.rank_all_time(), ranked[index]),
        ];
        for (key, written) in written {
            if written {
                swap.rename(aside(key.clone()), key).ignore();
            } else {
                swap.del(key).ignore();
            }
        }
        let () = swap.query_async(&mut conn).await?;
    }
    rebuilt.relations_dropped = drop_relations(redis).await?;
    Ok(rebuilt)
}

/// Drops every cached relation; returns how many.
async fn drop_relations(redis: &Redis) -> AppResult<u64> {
    let mut conn = redis.conn.clone();
    let mut dropped = 0;
    for index in 0..LIKE_SHARDS {
        let mut scan = redis.scan(redis.keys.like_shard_by_index(index).relation_pattern());
        while let Some(keys) = scan.next_batch().await? {
            if !keys.is_empty() {
                dropped += redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async::<u64>(&mut conn)
                    .await?;
            }
        }
    }
    Ok(dropped)
}
