//! The view flusher: moves pending view counts from Redis to `articles.view_count`, exactly once.
//!
//! Per shard, one flush is three steps:
//! 1. take: a script copies the pending deltas into an in-flight batch with a fresh id and a lease
//!    (pending keeps them, so live totals never dip);
//! 2. commit: one SQL transaction adds each delta to `view_count` and records the batch id in
//!    `view_flush_batches`; a batch id already recorded means the batch was applied, and the
//!    transaction changes nothing;
//! 3. clear: a script subtracts exactly the committed deltas from pending, records SQL's new counts
//!    as the base and drops the batch, provided the batch is still the shard's in-flight one.
//!
//! A process that dies between any two steps leaves the batch in flight; once its lease runs out,
//! the next flush of any process (including this one after a restart) re-drives it from step 2,
//! and step 2's batch id makes that replay harmless. Several processes may flush at once: a shard
//! with a live lease is skipped by the others.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sea_orm::sea_query::{CaseStatement, Expr, ExprTrait as _};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter,
    QuerySelect, SqlErr, TransactionTrait,
};
use tokio_util::sync::CancellationToken;

use crate::entities::{articles, view_flush_batches};
use crate::error::{AppError, AppResult};
use crate::redis::Redis;
use crate::redis::keys::VIEW_SHARDS;

/// Most articles one batch takes from a shard; the rest wait for the next round.
const MAX_BATCH_ARTICLES: usize = 5_000;
/// Rows of one `UPDATE … CASE` statement.
const UPDATE_CHUNK: usize = 500;
/// Batch ids are kept this long: far longer than any batch can stay in flight, so a replay always
/// finds its id.
const BATCH_ID_RETENTION: chrono::TimeDelta = chrono::TimeDelta::days(7);
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// One shard's batch as the take step returned it.
#[derive(Debug)]
struct Batch {
    id: String,
    deltas: Vec<(i64, i64)>,
}

/// What one pass over all shards moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    pub batches: usize,
    pub views: i64,
    /// Shards skipped because another flusher holds their batch.
    pub busy_shards: usize,
}

#[derive(Clone)]
pub struct ViewFlusher {
    db: DatabaseConnection,
    redis: Redis,
    lease: Duration,
}

impl ViewFlusher {
    pub fn new(db: DatabaseConnection, redis: Redis, lease: Duration) -> Self {
        Self { db, redis, lease }
    }

    /// Flushes every `interval` until `shutdown`, then once more so that a clean stop leaves
    /// nothing pending that this process could have written.
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_prune: Option<Instant> = None;
        loop {
            let stopping = tokio::select! {
                _ = ticker.tick() => false,
                _ = shutdown.cancelled() => true,
            };
            match self.flush_all().await {
                Ok(report) if report.batches > 0 => {
                    tracing::debug!(
                        batches = report.batches,
                        views = report.views,
                        "views flushed"
                    );
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "view flush failed; retrying next round"),
            }
            if last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(Instant::now());
                if let Err(err) = self.prune_batch_ids().await {
                    tracing::warn!(error = %err, "cannot prune old view batch ids");
                }
            }
            if stopping {
                return;
            }
        }
    }

    /// One pass over every shard. A failing shard does not stop the others; the first error is
    /// returned after the pass.
    pub async fn flush_all(&self) -> AppResult<FlushReport> {
        let mut report = FlushReport::default();
        let mut first_error = None;
        for shard in 0..VIEW_SHARDS {
            match self.flush_shard(shard).await {
                Ok(Flushed::Batch(views)) => {
                    report.batches += 1;
                    report.views += views;
                }
                Ok(Flushed::Busy) => report.busy_shards += 1,
                Ok(Flushed::Nothing) => {}
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(report),
        }
    }

    async fn flush_shard(&self, shard: u32) -> AppResult<Flushed> {
        let Some(batch) = self.take(shard).await? else {
            return Ok(Flushed::Busy);
        };
        if batch.deltas.is_empty() {
            return Ok(Flushed::Nothing);
        }
        let counts = self.commit(&batch).await?;
        self.clear(shard, &batch, &counts).await?;
        Ok(Flushed::Batch(
            batch.deltas.iter().map(|(_, views)| views).sum(),
        ))
    }

    /// Step 1. `None` when another flusher holds the shard; an empty batch when nothing is pending.
    async fn take(&self, shard: u32) -> AppResult<Option<Batch>> {
        let keys = self.redis.keys.view_shard_by_index(shard);
        let new_id = format!("v{shard}-{:032x}", rand::random::<u128>());
        let mut conn = self.redis.conn.clone();
        let reply: Vec<String> = self
            .redis
            .scripts
            .view_flush_take
            .key(keys.pending())
            .key(keys.in_flight())
            .arg(&new_id)
            .arg(self.lease.as_millis() as u64)
            .arg(MAX_BATCH_ARTICLES)
            .invoke_async(&mut conn)
            .await?;
        let malformed =
            || AppError::Internal(format!("unexpected reply from view_flush_take: {reply:?}"));
        match reply.first().map(String::as_str) {
            Some("busy") => Ok(None),
            Some("empty") => Ok(Some(Batch {
                id: new_id,
                deltas: Vec::new(),
            })),
            Some(status @ ("taken" | "redrive")) => {
                let id = reply.get(1).cloned().ok_or_else(malformed)?;
                let deltas = reply[2..]
                    .chunks_exact(2)
                    .map(|pair| Some((pair[0].parse().ok()?, pair[1].parse().ok()?)))
                    .collect::<Option<Vec<(i64, i64)>>>()
                    .ok_or_else(malformed)?;
                if status == "redrive" {
                    tracing::info!(batch.id = %id, shard, "re-driving a view batch left in flight");
                }
                Ok(Some(Batch { id, deltas }))
            }
            _ => Err(malformed()),
        }
    }

    /// Step 2: applies the batch to SQL once, and returns every article's `view_count` after it
    /// (`None` for an article that no longer exists).
    async fn commit(&self, batch: &Batch) -> AppResult<HashMap<i64, Option<i64>>> {
        let ids: Vec<i64> = batch.deltas.iter().map(|(article, _)| *article).collect();
        let txn = self.db.begin().await?;
        // The marker goes first: it makes the transaction a writer from its first statement (SQLite
        // cannot upgrade a reader under concurrent writers), and a replay stops right here.
        let marker = view_flush_batches::ActiveModel {
            batch_id: Set(batch.id.clone()),
            articles: Set(batch.deltas.len() as i32),
            views: Set(batch.deltas.iter().map(|(_, views)| views).sum()),
            applied_at: Set(crate::db::now()),
        };
        if let Err(err) = marker.insert(&txn).await {
            return match err.sql_err() {
                Some(SqlErr::UniqueConstraintViolation(_)) => {
                    tracing::info!(batch.id = %batch.id, "view batch was applied before; not applying it again");
                    drop(txn);
                    self.view_counts(&self.db, &ids).await
                }
                _ => Err(err.into()),
            };
        }
        for chunk in batch.deltas.chunks(UPDATE_CHUNK) {
            let mut by_article = CaseStatement::new();
            for &(article, views) in chunk {
                by_article = by_article.case(
                    articles::Column::Id.eq(article),
                    Expr::col(articles::Column::ViewCount).add(views),
                );
            }
            let by_article = by_article.finally(Expr::col(articles::Column::ViewCount));
            articles::Entity::update_many()
                .col_expr(articles::Column::ViewCount, by_article.into())
                .filter(articles::Column::Id.is_in(chunk.iter().map(|(article, _)| *article)))
                .exec(&txn)
                .await?;
        }
        let counts = self.view_counts(&txn, &ids).await?;
        txn.commit().await?;
        Ok(counts)
    }

    async fn view_counts(
        &self,
        conn: &impl sea_orm::ConnectionTrait,
        ids: &[i64],
    ) -> AppResult<HashMap<i64, Option<i64>>> {
        let mut counts: HashMap<i64, Option<i64>> = ids.iter().map(|id| (*id, None)).collect();
        for chunk in ids.chunks(UPDATE_CHUNK) {
            let rows: Vec<(i64, i64)> = articles::Entity::find()
                .select_only()
                .column(articles::Column::Id)
                .column(articles::Column::ViewCount)
                .filter(articles::Column::Id.is_in(chunk.iter().copied()))
                .into_tuple()
                .all(conn)
                .await?;
            counts.extend(rows.into_iter().map(|(id, count)| (id, Some(count))));
        }
        Ok(counts)
    }

    /// Step 3.
    async fn clear(
        &self,
        shard: u32,
        batch: &Batch,
        counts: &HashMap<i64, Option<i64>>,
    ) -> AppResult<()> {
        let keys = self.redis.keys.view_shard_by_index(shard);
        let mut invocation = self.redis.scripts.view_flush_clear.prepare_invoke();
        invocation
            .key(keys.pending())
            .key(keys.in_flight())
            .key(keys.base())
            .key(keys.rank_all_time());
        invocation.arg(&batch.id);
        for (article, count) in counts {
            invocation
                .arg(article)
                .arg(count.map(|count| count.to_string()).unwrap_or_default());
        }
        let mut conn = self.redis.conn.clone();
        let cleared: i64 = invocation.invoke_async(&mut conn).await?;
        if cleared == 0 {
            tracing::info!(batch.id = %batch.id, "view batch was cleared by another flusher");
        }
        Ok(())
    }

    async fn prune_batch_ids(&self) -> AppResult<u64> {
        let cutoff = crate::db::now() - BATCH_ID_RETENTION;
        let result = view_flush_batches::Entity::delete_many()
            .filter(view_flush_batches::Column::AppliedAt.lt(cutoff))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected)
    }
}

enum Flushed {
    Batch(i64),
    Busy,
    Nothing,
}
