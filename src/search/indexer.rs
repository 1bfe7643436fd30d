//! The indexer: one per process, feeding that process's replica from the SQL outbox.
//!
//! Each step reads the outbox rows above the replica's position (and the gaps it still watches),
//! collapses them to the set of articles they name, reads those articles' current values from SQL
//! and writes them (or removes the documents of articles gone), then commits the documents and the
//! new position together. A crash before the commit leaves the previous commit, which re-reads the
//! same rows: nothing is skipped, and nothing is applied twice.
//!
//! Outbox ids are taken when a transaction inserts its row, but transactions commit in any order,
//! so a row below the highest applied id can become visible later. Every id the indexer steps
//! over without seeing is kept as a gap and asked for again at every step, until it shows up
//! (applied then) or is older than the gap window (a rolled-back transaction's id never shows up).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

use super::counts::Counts;
use super::index::{Applied, ArticleDoc, Change, DocumentStore, Gap};
use super::outbox;
use crate::entities::articles;

/// Most gaps watched at once; past it the oldest are given up (and counted).
const MAX_GAPS: usize = 10_000;
/// Articles read per page while rebuilding.
const REBUILD_PAGE: u64 = 2_000;
/// Articles' counts read per page while loading them.
const COUNTS_PAGE: u64 = 50_000;
const PRUNE_EVERY: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug)]
pub struct IndexerSettings {
    /// How often the outbox is polled when idle.
    pub poll: Duration,
    /// Most outbox rows one step applies.
    pub batch: u64,
    /// How long an id stepped over is waited for.
    pub gap_window: Duration,
    /// How long applied outbox rows are kept.
    pub retention: Duration,
}

/// What one step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stepped {
    /// Outbox rows applied (gaps that showed up included).
    pub rows: usize,
    /// Articles brought up to date: documents written or removed, or counts alone.
    pub documents: usize,
    /// Whether the replica was rebuilt from SQL.
    pub rebuilt: bool,
    /// Whether more rows wait beyond the batch.
    pub more: bool,
}

#[derive(Clone)]
pub struct Indexer {
    db: DatabaseConnection,
    store: Arc<dyn DocumentStore>,
    settings: IndexerSettings,
}

fn millis(at: chrono::NaiveDateTime) -> i64 {
    at.and_utc().timestamp_millis()
}

/// An article's document: what its search index entry must hold.
pub fn document(article: &articles::Model) -> ArticleDoc {
    ArticleDoc {
        id: article.id,
        author_id: article.author_id,
        title: article.title.clone(),
        body: article.body.clone(),
        view_count: article.view_count,
        like_count: article.like_count,
        created_at: millis(article.created_at),
        updated_at: millis(article.updated_at),
    }
}

impl Indexer {
    pub fn new(
        db: DatabaseConnection,
        store: Arc<dyn DocumentStore>,
        settings: IndexerSettings,
    ) -> Self {
        Self {
            db,
            store,
            settings,
        }
    }

    /// Steps every `poll` (at once while rows wait) until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut last_prune: Option<Instant> = None;
        loop {
            let more = match self.step().await {
                Ok(stepped) => stepped.more,
                Err(err) => {
                    tracing::warn!(error = %err, "search indexing failed; retrying");
                    false
                }
            };
            if let Err(err) = self.measure_lag().await {
                tracing::debug!(error = %err, "cannot measure the search lag");
            }
            if last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(Instant::now());
                if let Err(err) = self.prune().await {
                    tracing::warn!(error = %err, "cannot prune the search outbox");
                }
            }
            if more {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.settings.poll) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// The position of the replica's last commit.
    pub async fn applied(&self) -> anyhow::Result<Option<Applied>> {
        self.store.applied().await
    }

    /// Deletes outbox rows older than the retention. A replica that had not applied them finds
    /// itself behind `pruned_through` at its next step and rebuilds.
    pub async fn prune(&self) -> anyhow::Result<u64> {
        let before = crate::db::now()
            - chrono::TimeDelta::from_std(self.settings.retention)
                .unwrap_or(chrono::TimeDelta::MAX);
        Ok(outbox::prune(&self.db, before).await?)
    }

    /// The age of the oldest change this replica has not applied (0 when none), published as
    /// `pulse_search_lag_seconds`.
    pub async fn measure_lag(&self) -> anyhow::Result<Duration> {
        let through = self
            .store
            .applied()
            .await?
            .map_or(0, |applied| applied.through);
        let lag = match outbox::oldest_after(&self.db, through).await? {
            Some(created) => (crate::db::now() - created).to_std().unwrap_or_default(),
            None => Duration::ZERO,
        };
        metrics::gauge!("pulse_search_lag_seconds").set(lag.as_secs_f64());
        Ok(lag)
    }

    /// One step: a rebuild when the replica is new, of an older epoch or behind the pruning;
    /// otherwise the next batch of the outbox.
    #[tracing::instrument(skip_all)]
    pub async fn step(&self) -> anyhow::Result<Stepped> {
        let state = outbox::state(&self.db).await?;
        let applied = self.store.applied().await?;
        // Before a rebuild too: until it commits, searches answer from the old documents, and
        // rank them by these counts.
        if applied.is_some() && self.store.wants_counts().await? {
            self.load_counts().await?;
        }
        let applied = match applied {
            None => return self.rebuild(state.epoch, "new replica").await,
            Some(applied) if applied.epoch != state.epoch => {
                return self.rebuild(state.epoch, "rebuild requested").await;
            }
            Some(applied) if applied.through < state.pruned_through => {
                return self
                    .rebuild(state.epoch, "fell behind the outbox's pruning")
                    .await;
            }
            Some(applied) => applied,
        };
        let now = crate::db::now();
        let now_ms = millis(now);
        let watched: Vec<i64> = applied.gaps.iter().map(|gap| gap.id).collect();
        let filled = outbox::among(&self.db, &watched).await?;
        let rows = outbox::after(&self.db, applied.through, self.settings.batch).await?;
        let more = rows.len() as u64 == self.settings.batch;
        let window = self.settings.gap_window.as_millis() as i64;
        let filled_ids: HashSet<i64> = filled.iter().map(|row| row.id).collect();
        let mut gaps: Vec<Gap> = applied
            .gaps
            .iter()
            .filter(|gap| !filled_ids.contains(&gap.id))
            .filter(|gap| now_ms - gap.seen_at < window)
            .copied()
            .collect();
        let expired = applied.gaps.len() - filled_ids.len() - gaps.len();
        let mut through = applied.through;
        for row in &rows {
            gaps.extend(((through + 1)..row.id).map(|id| Gap {
                id,
                seen_at: now_ms,
            }));
            through = row.id;
        }
        let given_up = cap_gaps(&mut gaps);
        if rows.is_empty() && filled.is_empty() && expired == 0 && given_up == 0 {
            return Ok(Stepped::default());
        }
        let articles: BTreeSet<i64> = rows
            .iter()
            .chain(&filled)
            .map(|row| row.article_id)
            .collect();
        let changes = self.changes(&articles).await?;
        let documents = changes.len();
        let next = Applied {
            epoch: applied.epoch,
            through,
            gaps,
        };
        self.apply(changes, &next, false).await?;
        metrics::counter!("pulse_search_rows_applied_total")
            .increment((rows.len() + filled.len()) as u64);
        metrics::counter!("pulse_search_documents_written_total").increment(documents as u64);
        metrics::counter!("pulse_search_gaps_expired_total").increment((expired + given_up) as u64);
        if !filled.is_empty() {
            tracing::debug!(
                rows = filled.len(),
                "search outbox rows committed out of order applied"
            );
        }
        Ok(Stepped {
            rows: rows.len() + filled.len(),
            documents,
            rebuilt: false,
            more,
        })
    }

    /// Hands the store every article's counts as SQL has them now: read after the store's
    /// position, so no older than it, and the rows above the position then write the same
    /// absolute values again.
    async fn load_counts(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut counts = Vec::new();
        let mut after = 0;
        loop {
            let page = outbox::counts_after(&self.db, after, COUNTS_PAGE).await?;
            let Some(&(last, _, _)) = page.last() else {
                break;
            };
            after = last;
            counts.extend(
                page.into_iter()
                    .map(|(id, views, likes)| (id, Counts { views, likes })),
            );
        }
        let articles = counts.len();
        self.store.load_counts(counts).await?;
        tracing::info!(
            articles,
            seconds = started.elapsed().as_secs_f64(),
            "search replica's counts loaded from SQL"
        );
        Ok(())
    }

    /// The writes that bring the documents of `articles` to SQL's values.
    async fn changes(&self, articles: &BTreeSet<i64>) -> anyhow::Result<Vec<Change>> {
        let ids: Vec<i64> = articles.iter().copied().collect();
        let rows: HashMap<i64, articles::Model> = outbox::articles(&self.db, &ids)
            .await?
            .into_iter()
            .map(|article| (article.id, article))
            .collect();
        Ok(ids
            .into_iter()
            .map(|id| match rows.get(&id) {
                Some(article) => Change::Upsert(document(article)),
                None => Change::Delete(id),
            })
            .collect())
    }

    async fn apply(
        &self,
        changes: Vec<Change>,
        applied: &Applied,
        clear: bool,
    ) -> anyhow::Result<()> {
        let outcome = async {
            if clear {
                self.store.clear().await?;
            }
            self.store.stage(changes).await?;
            self.store.commit(applied).await
        }
        .await;
        if outcome.is_err()
            && let Err(err) = self.store.abandon().await
        {
            tracing::warn!(error = %err, "cannot drop staged search changes");
        }
        outcome
    }

    /// Builds the replica from SQL: every article, then the position where the outbox takes
    /// over. The position is read before the articles, so every change committed before it is in
    /// what the scan reads; ids above the last row older than the gap window that are not visible
    /// yet may belong to transactions still open, and are watched as gaps.
    #[tracing::instrument(skip_all, fields(reason))]
    pub async fn rebuild(&self, epoch: i64, reason: &str) -> anyhow::Result<Stepped> {
        let started = Instant::now();
        tracing::warn!(reason, "rebuilding this process's search replica from SQL");
        let now = crate::db::now();
        let window =
            chrono::TimeDelta::from_std(self.settings.gap_window).unwrap_or(chrono::TimeDelta::MAX);
        let (high, settled) = outbox::high_marks(&self.db, now - window).await?;
        let visible = outbox::ids_between(&self.db, settled, high).await?;
        let now_ms = millis(now);
        let mut gaps: Vec<Gap> = ((settled + 1)..=high)
            .filter(|id| !visible.contains(id))
            .map(|id| Gap {
                id,
                seen_at: now_ms,
            })
            .collect();
        cap_gaps(&mut gaps);
        let outcome = async {
            self.store.clear().await?;
            let mut after = 0;
            let mut documents = 0;
            loop {
                let page = outbox::articles_after(&self.db, after, REBUILD_PAGE).await?;
                let Some(last) = page.last() else { break };
                after = last.id;
                documents += page.len();
                self.store
                    .stage(page.iter().map(|a| Change::Upsert(document(a))).collect())
                    .await?;
            }
            self.store
                .commit(&Applied {
                    epoch,
                    through: high,
                    gaps,
                })
                .await?;
            anyhow::Ok(documents)
        }
        .await;
        let documents = match outcome {
            Ok(documents) => documents,
            Err(err) => {
                if let Err(err) = self.store.abandon().await {
                    tracing::warn!(error = %err, "cannot drop a failed rebuild's documents");
                }
                return Err(err);
            }
        };
        metrics::counter!("pulse_search_rebuilds_total").increment(1);
        tracing::warn!(
            reason,
            documents,
            seconds = started.elapsed().as_secs_f64(),
            "search replica rebuilt from SQL"
        );
        Ok(Stepped {
            rows: 0,
            documents,
            rebuilt: true,
            more: true,
        })
    }
}

/// Keeps the newest [`MAX_GAPS`] gaps; returns how many were given up.
fn cap_gaps(gaps: &mut Vec<Gap>) -> usize {
    if gaps.len() <= MAX_GAPS {
        return 0;
    }
    gaps.sort_by_key(|gap| gap.id);
    let excess = gaps.len() - MAX_GAPS;
    gaps.drain(..excess);
    tracing::warn!(
        given_up = excess,
        "too many search outbox ids stepped over at once; the oldest are no longer waited for"
    );
    excess
}
