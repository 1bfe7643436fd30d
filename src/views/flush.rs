//! The view flusher: moves pending view counts from Redis to `articles.view_count`, exactly once.
//!
//! One file, like a job of [`crate::jobs`], but not run by its runtime: pending views are counters
//! that merge in a hash (a thousand views of one article are one delta), where a stream would hold,
//! and SQL apply, one entry per view. So it keeps a protocol of its own.
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
//!
//! Redis may also come back older than SQL: restarted from a snapshot or AOF that misses its last
//! writes, or a replica promoted before it caught up. Its pending deltas then hold views that a
//! later batch already committed, and flushing them would count them twice. Each shard's batches
//! therefore carry a flush sequence: Redis keeps the last one taken, SQL the last one committed
//! (`view_flush_shards`) and, per article, the one that last flushed it (`view_flush_seq`). A
//! commit refuses a batch whose sequence SQL has passed. A take is refused while Redis's sequence
//! is behind SQL's; the flusher then repairs the shard (`lua/view_flush_repair.lua`): a pending
//! article that SQL says was flushed after Redis's sequence had its whole pending count taken by
//! that flush, so its pending field is dropped; other pending articles keep theirs. The check runs
//! at every flush, the first one at start-up included, after any batch left in flight is re-driven.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::sea_query::{CaseStatement, Expr, ExprTrait as _};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, DatabaseTransaction,
    EntityTrait, QueryFilter, QuerySelect, TransactionTrait,
};
use tokio_util::sync::CancellationToken;

use super::rebuild::{self, Caches};
use crate::entities::{articles, view_flush_batches, view_flush_shards};
use crate::error::{AppError, AppResult, Unique, UniqueViolationExt as _};
use crate::keys::VIEW_SHARDS;
use crate::keys::ViewKeys;
use crate::redis::Redis;
use crate::scripts::SCRIPTS;

/// Most articles one batch takes from a shard; the rest wait for the next round.
const MAX_BATCH_ARTICLES: usize = 5_000;
/// Rows of one `UPDATE … CASE` statement.
const UPDATE_CHUNK: usize = 500;
/// Batch ids are kept this long: far longer than any batch can stay in flight, so a replay always
/// finds its id.
const BATCH_ID_RETENTION: chrono::TimeDelta = chrono::TimeDelta::days(7);
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Most take steps one shard gets per pass: a re-driven batch or a repair is followed at once by a
/// fresh take, and a shard that keeps changing under the flusher waits for the next pass.
const STEPS_PER_SHARD: usize = 4;

/// One shard's batch as the take step returned it.
#[derive(Debug)]
struct Batch {
    id: String,
    seq: i64,
    deltas: Vec<(i64, i64)>,
}

/// What the take step found.
enum Taken {
    Batch {
        batch: Batch,
        redrive: bool,
    },
    Empty,
    /// Another flusher holds the shard's batch.
    Busy,
    /// Redis's sequence for the shard is behind SQL's.
    Behind {
        redis_seq: i64,
    },
}

enum Committed {
    /// Every article's `view_count` after the batch (`None` for an article that no longer exists).
    Applied(HashMap<i64, Option<i64>>),
    /// SQL has committed a later batch under another id: this one came from a Redis that rolled back.
    Stale,
}

/// What one pass over all shards moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    pub batches: usize,
    pub views: i64,
    /// Shards skipped because another flusher holds their batch.
    pub busy_shards: usize,
    /// Shards repaired because Redis came back older than SQL.
    pub repaired_shards: usize,
    /// Pending views those repairs dropped because SQL already held them.
    pub dropped_views: i64,
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

    /// Flushes every `interval` (the first one `interval` from now: start-up flushes once before
    /// it serves) until `shutdown`, then once more so that a clean stop leaves nothing pending
    /// that this process could have written.
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        // Pruning runs beside the passes, not between them: a prune waiting for the batch table
        // (a long DELETE, a lock taken by a migration or an operator) must not hold up the views.
        let pruning = async {
            let mut every = tokio::time::interval(PRUNE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Err(err) = self.prune_batch_ids().await {
                    tracing::warn!(error = %err, "cannot prune old view batch ids");
                }
            }
        };
        let flushing = async {
            let mut ticker =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    Err(err) => {
                        tracing::warn!(error = %err, "view flush failed; retrying next round")
                    }
                }
                if stopping {
                    return;
                }
            }
        };
        tokio::select! {
            () = flushing => {}
            () = pruning => {}
        }
    }

    /// One pass over every shard. A failing shard does not stop the others; the first error is
    /// returned after the pass.
    #[tracing::instrument(skip_all)]
    pub async fn flush_all(&self) -> AppResult<FlushReport> {
        let mut report = FlushReport::default();
        let mut first_error = None;
        let sql_seqs = self.sql_seqs().await?;
        for shard in 0..VIEW_SHARDS {
            let sql_seq = sql_seqs.get(&shard).copied().unwrap_or(0);
            if let Err(err) = self.flush_shard(shard, sql_seq, &mut report).await {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(report),
        }
    }

    /// `sql_seq` is the shard's last committed sequence as SQL had it at the start of the pass.
    #[tracing::instrument(skip_all, fields(shard))]
    async fn flush_shard(
        &self,
        shard: u32,
        mut sql_seq: i64,
        report: &mut FlushReport,
    ) -> AppResult<()> {
        for step in 0..STEPS_PER_SHARD {
            if step > 0 {
                sql_seq = self.sql_seq(shard).await?;
            }
            match self.take(shard, sql_seq).await? {
                Taken::Empty => return Ok(()),
                Taken::Busy => {
                    report.busy_shards += 1;
                    return Ok(());
                }
                Taken::Behind { redis_seq } => {
                    self.repair(shard, redis_seq, redis_seq, None, report)
                        .await?;
                }
                Taken::Batch { batch, redrive } => match self.commit(shard, &batch).await? {
                    Committed::Applied(counts) => {
                        self.clear(shard, &batch, &counts).await?;
                        report.batches += 1;
                        report.views += batch.deltas.iter().map(|(_, views)| views).sum::<i64>();
                        if !redrive {
                            return Ok(());
                        }
                    }
                    // The take bumped Redis's sequence to the batch's, so Redis was at the one
                    // before it.
                    Committed::Stale => {
                        self.repair(shard, batch.seq, batch.seq - 1, Some(&batch.id), report)
                            .await?;
                    }
                },
            }
        }
        Ok(())
    }

    /// Every shard's last committed sequence in SQL, in one query. Creates the rows of shards that
    /// have none yet (0), outside any commit: a commit then only updates an existing row, which
    /// MariaDB locks alone, rather than inserting into a gap that concurrent commits also lock.
    #[tracing::instrument(skip_all)]
    async fn sql_seqs(&self) -> AppResult<HashMap<u32, i64>> {
        let rows: Vec<(i32, i64)> = view_flush_shards::Entity::find()
            .select_only()
            .column(view_flush_shards::Column::Shard)
            .column(view_flush_shards::Column::LastSeq)
            .into_tuple()
            .all(&self.db)
            .await?;
        let seqs: HashMap<u32, i64> = rows
            .into_iter()
            .map(|(shard, last_seq)| (shard as u32, last_seq))
            .collect();
        for shard in (0..VIEW_SHARDS).filter(|shard| !seqs.contains_key(shard)) {
            let first = view_flush_shards::ActiveModel {
                shard: Set(shard as i32),
                last_seq: Set(0),
            };
            // A duplicate means another flusher created the row meanwhile: at 0, or past it,
            // which the commit's own check catches.
            view_flush_shards::Entity::insert(first)
                .exec_without_returning(&self.db)
                .await
                .or_duplicate()?;
        }
        Ok(seqs)
    }

    /// One shard's last committed sequence in SQL.
    #[tracing::instrument(skip_all, fields(shard))]
    async fn sql_seq(&self, shard: u32) -> AppResult<i64> {
        Ok(view_flush_shards::Entity::find_by_id(shard as i32)
            .select_only()
            .column(view_flush_shards::Column::LastSeq)
            .into_tuple::<i64>()
            .one(&self.db)
            .await?
            .unwrap_or(0))
    }

    /// Step 1.
    #[tracing::instrument(skip_all, fields(shard, sql.seq = sql_seq))]
    async fn take(&self, shard: u32, sql_seq: i64) -> AppResult<Taken> {
        let keys = self.redis.keys.view_shard_by_index(shard);
        let new_id = format!("v{shard}-{:032x}", rand::random::<u128>());
        let mut conn = self.redis.conn.clone();
        let reply: Vec<String> = SCRIPTS
            .view_flush_take
            .key(keys.pending())
            .key(keys.in_flight())
            .key(keys.seq())
            .arg(&new_id)
            .arg(self.lease.as_millis() as u64)
            .arg(MAX_BATCH_ARTICLES)
            .arg(sql_seq)
            .invoke_async(&mut conn)
            .await?;
        let malformed =
            || AppError::Internal(format!("unexpected reply from view_flush_take: {reply:?}"));
        match reply.first().map(String::as_str) {
            Some("busy") => Ok(Taken::Busy),
            Some("empty") => Ok(Taken::Empty),
            Some("behind") => {
                let redis_seq = reply.get(1).and_then(|seq| seq.parse().ok());
                Ok(Taken::Behind {
                    redis_seq: redis_seq.ok_or_else(malformed)?,
                })
            }
            Some(status @ ("taken" | "redrive")) => {
                let id = reply.get(1).cloned().ok_or_else(malformed)?;
                let seq = reply.get(2).and_then(|seq| seq.parse().ok());
                let seq = seq.ok_or_else(malformed)?;
                let deltas = reply[3..]
                    .chunks_exact(2)
                    .map(|pair| Some((pair[0].parse().ok()?, pair[1].parse().ok()?)))
                    .collect::<Option<Vec<(i64, i64)>>>()
                    .ok_or_else(malformed)?;
                let redrive = status == "redrive";
                if redrive {
                    tracing::info!(batch.id = %id, shard, "re-driving a view batch left in flight");
                }
                Ok(Taken::Batch {
                    batch: Batch { id, seq, deltas },
                    redrive,
                })
            }
            _ => Err(malformed()),
        }
    }

    /// Step 2: applies the batch to SQL once, unless SQL has passed its sequence.
    #[tracing::instrument(skip_all, fields(shard, batch.id = %batch.id, batch.seq = batch.seq))]
    async fn commit(&self, shard: u32, batch: &Batch) -> AppResult<Committed> {
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
        if let Unique::Duplicate = marker.insert(&txn).await.or_duplicate()? {
            tracing::info!(batch.id = %batch.id, "view batch was applied before; not applying it again");
            drop(txn);
            return Ok(Committed::Applied(self.view_counts(&self.db, &ids).await?));
        }
        if !advance_seq(&txn, shard, batch.seq).await? {
            drop(txn);
            tracing::warn!(
                batch.id = %batch.id,
                batch.seq,
                shard,
                "SQL has committed this view batch's sequence under another batch: it was taken from a Redis that rolled back; not applying it"
            );
            return Ok(Committed::Stale);
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
                .col_expr(articles::Column::ViewFlushSeq, Expr::value(batch.seq))
                .filter(articles::Column::Id.is_in(chunk.iter().map(|(article, _)| *article)))
                .exec(&txn)
                .await?;
        }
        let counts = self.view_counts(&txn, &ids).await?;
        crate::search::outbox::record(&txn, ids.iter().copied()).await?;
        txn.commit().await?;
        Ok(Committed::Applied(counts))
    }

    /// Brings a shard whose Redis is at sequence `redis_seq` (as far as its pending deltas go) up to
    /// SQL: see `lua/view_flush_repair.lua`. `expected_seq` is the sequence the shard's key must
    /// still hold and `discard` the caller's own batch that SQL refused, so that a repair racing
    /// another one, or a take, changes nothing.
    #[tracing::instrument(skip_all, fields(shard, redis.seq = redis_seq))]
    async fn repair(
        &self,
        shard: u32,
        expected_seq: i64,
        redis_seq: i64,
        discard: Option<&str>,
        report: &mut FlushReport,
    ) -> AppResult<()> {
        let keys = self.redis.keys.view_shard_by_index(shard);
        let mut conn = self.redis.conn.clone();
        // Read outside the script, with each article's count: the script subtracts exactly what was
        // read, so views counted after this read (on any article) are genuinely new and kept.
        let pending: HashMap<i64, i64> = redis::cmd("HGETALL")
            .arg(keys.pending())
            .query_async(&mut conn)
            .await?;
        // SQL's sequence first: a batch committed after this read (one taken from the Redis of
        // before the rollback, by a flusher that was still running) may be missing from the
        // articles below, and then Redis stays behind it and the next flush repairs again.
        let sql_seq = self.sql_seq(shard).await?;
        let ids: Vec<i64> = pending.keys().copied().collect();
        let flushed = self.flushed_since(&ids, redis_seq).await?;
        let mut invocation = SCRIPTS.view_flush_repair.prepare_invoke();
        invocation
            .key(keys.pending())
            .key(keys.in_flight())
            .key(keys.seq())
            .key(keys.base());
        invocation
            .arg(expected_seq)
            .arg(sql_seq)
            .arg(discard.unwrap_or_default());
        for article in &flushed {
            invocation.arg(article).arg(pending[article]);
        }
        let dropped: i64 = invocation.invoke_async(&mut conn).await?;
        if dropped < 0 {
            tracing::info!(
                shard,
                "view shard changed before its repair; another flusher has it"
            );
            return Ok(());
        }
        metrics::counter!("pulse_view_rollbacks_total").increment(1);
        metrics::counter!("pulse_view_rollback_dropped_views_total").increment(dropped as u64);
        tracing::warn!(
            shard,
            redis.seq = redis_seq,
            sql.seq = sql_seq,
            views.dropped = dropped,
            articles.repaired = flushed.len(),
            "Redis came back older than SQL; dropped the pending views SQL already holds"
        );
        report.repaired_shards += 1;
        report.dropped_views += dropped;
        // The repaired articles, and those flushed after the snapshot with nothing pending there,
        // have stale scores.
        rebuild::rebuild(&self.db, &self.redis, &[shard], Caches::Ranking).await?;
        Ok(())
    }

    /// Those of `ids` that a batch after `seq` flushed.
    #[tracing::instrument(skip_all, fields(articles = ids.len(), seq))]
    async fn flushed_since(&self, ids: &[i64], seq: i64) -> AppResult<Vec<i64>> {
        let mut flushed = Vec::new();
        for chunk in ids.chunks(UPDATE_CHUNK) {
            let rows: Vec<i64> = articles::Entity::find()
                .select_only()
                .column(articles::Column::Id)
                .filter(articles::Column::Id.is_in(chunk.iter().copied()))
                .filter(articles::Column::ViewFlushSeq.gt(seq))
                .into_tuple()
                .all(&self.db)
                .await?;
            flushed.extend(rows);
        }
        Ok(flushed)
    }

    #[tracing::instrument(skip_all, fields(articles = ids.len()))]
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
    #[tracing::instrument(skip_all, fields(shard, batch.id = %batch.id))]
    async fn clear(
        &self,
        shard: u32,
        batch: &Batch,
        counts: &HashMap<i64, Option<i64>>,
    ) -> AppResult<()> {
        let keys = self.redis.keys.view_shard_by_index(shard);
        let mut invocation = SCRIPTS.view_flush_clear.prepare_invoke();
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

    #[tracing::instrument(skip_all)]
    async fn prune_batch_ids(&self) -> AppResult<u64> {
        let cutoff = crate::db::now() - BATCH_ID_RETENTION;
        let result = view_flush_batches::Entity::delete_many()
            .filter(view_flush_batches::Column::AppliedAt.lt(cutoff))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected)
    }
}

/// Records `seq` as the shard's last committed sequence, provided SQL has not passed it. The row
/// exists: the pass created it before taking anything.
#[tracing::instrument(skip_all, fields(shard, seq))]
async fn advance_seq(txn: &DatabaseTransaction, shard: u32, seq: i64) -> AppResult<bool> {
    let advanced = view_flush_shards::Entity::update_many()
        .col_expr(view_flush_shards::Column::LastSeq, Expr::value(seq))
        .filter(view_flush_shards::Column::Shard.eq(shard as i32))
        .filter(view_flush_shards::Column::LastSeq.lt(seq))
        .exec(txn)
        .await?;
    Ok(advanced.rows_affected > 0)
}
