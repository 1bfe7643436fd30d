//! Rebuilds a shard's view caches from SQL plus its pending deltas: the all-time ranking, and on
//! request the base counts. New keys are built aside and renamed into place, so readers never see
//! a half-built ranking. Views counted while a rebuild runs may be missing from the ranking until
//! the next rebuild; the counts themselves (SQL and pending) are never touched.

use std::collections::HashMap;

use sea_orm::sea_query::{Expr, ExprTrait as _};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::entities::articles;
use crate::error::AppResult;
use crate::keys::ViewKeys;
use crate::keys::{VIEW_SHARDS, view_shard_of};
use crate::redis::Redis;

/// Which caches a rebuild rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caches {
    /// Base counts and the all-time ranking. A flush that clears while the rebuild runs can have
    /// its new base overwritten by the older one read here, so this is for an operator's command,
    /// not for a running flusher.
    BaseAndRanking,
    /// The all-time ranking only.
    Ranking,
}

/// Rewrites every shard's base counts and all-time ranking from SQL plus pending views: `pulse
/// rebuild views`. Returns how many articles it read from SQL.
pub(super) async fn rebuild_all(db: &DatabaseConnection, redis: &Redis) -> AppResult<u64> {
    let shards: Vec<u32> = (0..VIEW_SHARDS).collect();
    rebuild(db, redis, &shards, Caches::BaseAndRanking).await
}

/// Rewrites `caches` of `shards` (each at most once); returns how many articles it read from SQL.
pub async fn rebuild(
    db: &DatabaseConnection,
    redis: &Redis,
    shards: &[u32],
    caches: Caches,
) -> AppResult<u64> {
    let mut conn = redis.conn.clone();
    let shards: Vec<_> = shards
        .iter()
        .map(|&index| redis.keys.view_shard_by_index(index))
        .collect();
    let position: HashMap<u32, usize> = shards
        .iter()
        .enumerate()
        .map(|(position, shard)| (shard.shard(), position))
        .collect();
    let with_base = caches == Caches::BaseAndRanking;
    let aside = |key: String| format!("{key}:rebuild");
    let mut reads = redis::pipe();
    for shard in &shards {
        reads
            .del(aside(shard.base()))
            .ignore()
            .del(aside(shard.rank_all_time()))
            .ignore();
        reads.hgetall(shard.pending());
    }
    let pending: Vec<HashMap<i64, i64>> = reads.query_async(&mut conn).await?;
    let mut filled = vec![false; shards.len()];
    let mut rebuilt = 0;
    let mut after = 0;
    loop {
        let mut page = articles::Entity::find()
            .select_only()
            .column(articles::Column::Id)
            .column(articles::Column::ViewCount)
            .filter(articles::Column::Id.gt(after));
        if shards.len() < VIEW_SHARDS as usize {
            page = page.filter(
                Expr::col(articles::Column::Id)
                    .modulo(i64::from(VIEW_SHARDS))
                    .is_in(position.keys().map(|&shard| i64::from(shard))),
            );
        }
        let rows: Vec<(i64, i64)> = page
            .order_by_asc(articles::Column::Id)
            .limit(1000)
            .into_tuple()
            .all(db)
            .await?;
        let Some(&(last, _)) = rows.last() else { break };
        after = last;
        let mut writes = redis::pipe();
        for &(article, count) in &rows {
            let Some(&index) = position.get(&view_shard_of(article)) else {
                continue;
            };
            let score = count + pending[index].get(&article).copied().unwrap_or(0);
            if with_base {
                writes
                    .hset(aside(shards[index].base()), article, count)
                    .ignore();
            }
            writes
                .zadd(aside(shards[index].rank_all_time()), article, score)
                .ignore();
            filled[index] = true;
            rebuilt += 1;
        }
        let () = writes.query_async(&mut conn).await?;
    }
    // One transaction per shard: a shard's keys share a hash slot, shards do not, and a cluster
    // runs a transaction in one slot only.
    for (shard, filled) in shards.iter().zip(filled) {
        let mut swap = redis::pipe();
        swap.atomic();
        if filled {
            if with_base {
                swap.rename(aside(shard.base()), shard.base()).ignore();
            }
            swap.rename(aside(shard.rank_all_time()), shard.rank_all_time())
                .ignore();
        } else {
            if with_base {
                swap.del(shard.base()).ignore();
            }
            swap.del(shard.rank_all_time()).ignore();
        }
        let () = swap.query_async(&mut conn).await?;
    }
    Ok(rebuilt)
}
