//! An article's featured comments (seed 002's recommended reviews): its most liked comments,
//! cached in Redis and recomputed from SQL under a lease.
//!
//! The list (comma-separated comment ids) is replaced whole by one script, so readers see the old
//! list or the new one. Whoever sets the lease (`SET NX`) recomputes; the store script keeps the
//! lease for the refresh interval, so an article's list is recomputed at most once per interval
//! across all processes. Readers of a list whose lease has lapsed get the list at once while one of
//! them refreshes it in the background. A cold article (no list) is filled once: in each process
//! concurrent readers share one attempt, and across processes the lease holder computes while the
//! others wait for its list.
//!
//! The likes archive refreshes the lists of the articles whose comments' counts it changed, right
//! after its commit, so that a like shows in the list once it is in SQL rather than a refresh
//! interval later (see [`FeaturedCommentService::refresh_after_archive`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use singleflight_async::SingleFlight;

use super::comments::CommentService;
use crate::error::{AppError, AppResult, SharedResult};
use crate::keys::LikeKeys;
use crate::redis::Redis;
use crate::scripts::SCRIPTS;

/// Longest list kept; `featuredComments(first)` takes at most this many.
pub const MAX_FEATURED: usize = 10;
/// How long a recompute may hold the lease before another process may take over.
const RECOMPUTE_LEASE: Duration = Duration::from_secs(10);
/// A list outlives its lease by far, so readers keep something to show while it is refreshed.
const LIST_TTL: Duration = Duration::from_secs(24 * 3600);
/// How often a reader of a cold article checks for the list another process is computing.
const COLD_POLL: Duration = Duration::from_millis(20);
/// The archive recomputes an article's list at most once per this interval: comments of a popular
/// article are liked in every batch of every shard, and each recompute reads all its comments.
const ARCHIVE_REFRESH_SPACING: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct FeaturedCommentService {
    redis: Redis,
    comments: CommentService,
    refresh: Duration,
    flights: Arc<SingleFlight<i64, SharedResult<Vec<i64>>>>,
    recomputes: Arc<AtomicU64>,
}

impl FeaturedCommentService {
    pub fn new(redis: Redis, comments: CommentService, refresh: Duration) -> Self {
        Self {
            redis,
            comments,
            refresh,
            flights: Arc::default(),
            recomputes: Arc::default(),
        }
    }

    /// How many times this process has recomputed and stored a list.
    pub fn recomputes(&self) -> u64 {
        self.recomputes.load(Ordering::Relaxed)
    }

    /// The ids of `article`'s featured comments, best first, at most `first`.
    #[tracing::instrument(skip_all, fields(article.id = article))]
    pub async fn get(&self, article: i64, first: usize) -> AppResult<Vec<i64>> {
        let mut ids = self
            .flights
            .work(article, || async {
                self.read(article).await.map_err(AppError::shared)
            })
            .await
            .map_err(AppError::Shared)?;
        ids.truncate(first);
        Ok(ids)
    }

    async fn read(&self, article: i64) -> AppResult<Vec<i64>> {
        let deadline = Instant::now() + 2 * RECOMPUTE_LEASE;
        loop {
            let token = format!("{:032x}", rand::random::<u128>());
            let (list, leased) = self.list_and_lease(article, &token).await?;
            match (list, leased) {
                (Some(list), false) => return parse(&list),
                (Some(list), true) => {
                    let featured = self.clone();
                    tokio::spawn(async move {
                        if let Err(err) = featured.recompute(article, &token).await {
                            tracing::warn!(error = %err, article.id = article, "cannot refresh featured comments");
                        }
                    });
                    return parse(&list);
                }
                (None, true) => return self.recompute(article, &token).await,
                (None, false) => {
                    // Another process holds the lease of a cold article: wait for its list.
                    if let Some(list) = self.wait_for_list(article).await? {
                        return parse(&list);
                    }
                    if Instant::now() >= deadline {
                        metrics::counter!("pulse_featured_fallbacks_total").increment(1);
                        return self.comments.most_liked(article, MAX_FEATURED as u64).await;
                    }
                }
            }
        }
    }

    /// The list, and whether this call took the lease (when it was free), in one round trip.
    async fn list_and_lease(&self, article: i64, token: &str) -> AppResult<(Option<String>, bool)> {
        let shard = self.redis.keys.like_shard(article);
        let mut conn = self.redis.conn.clone();
        let (list, leased): (Option<String>, Option<String>) = redis::pipe()
            .get(shard.featured(article))
            .cmd("SET")
            .arg(shard.featured_lease(article))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(RECOMPUTE_LEASE.as_millis() as u64)
            .query_async(&mut conn)
            .await?;
        Ok((list, leased.is_some()))
    }

    /// After the likes archive committed changes to the like counts of `articles`' comments:
    /// recomputes the lists of those that have one (or are computing one), so a reader sees the
    /// change as soon as SQL has it. The lease is taken over, not waited for, so that a recompute
    /// that read SQL before the commit can no longer store what it read. Within
    /// [`ARCHIVE_REFRESH_SPACING`] of the last such recompute, the lease is cut to that spacing
    /// instead, and the next reader after it refreshes the list.
    #[tracing::instrument(skip_all, fields(articles = articles.len()))]
    pub async fn refresh_after_archive(&self, articles: &[i64]) -> AppResult<()> {
        let spacing = ARCHIVE_REFRESH_SPACING.as_millis() as u64;
        for &article in articles {
            let shard = self.redis.keys.like_shard(article);
            let mut conn = self.redis.conn.clone();
            let (cached, first): (u32, Option<String>) = redis::pipe()
                .exists(&[shard.featured(article), shard.featured_lease(article)])
                .cmd("SET")
                .arg(shard.featured_archived(article))
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(spacing)
                .query_async(&mut conn)
                .await?;
            if cached == 0 {
                continue;
            }
            if first.is_none() {
                let _: () = redis::cmd("PEXPIRE")
                    .arg(shard.featured_lease(article))
                    .arg(spacing)
                    .query_async(&mut conn)
                    .await?;
                continue;
            }
            let token = format!("{:032x}", rand::random::<u128>());
            let _: () = redis::cmd("SET")
                .arg(shard.featured_lease(article))
                .arg(&token)
                .arg("PX")
                .arg(RECOMPUTE_LEASE.as_millis() as u64)
                .query_async(&mut conn)
                .await?;
            self.recompute(article, &token).await?;
        }
        Ok(())
    }

    /// Polls for the list until it appears, or the lease is gone (its holder died: `None`).
    async fn wait_for_list(&self, article: i64) -> AppResult<Option<String>> {
        let shard = self.redis.keys.like_shard(article);
        loop {
            tokio::time::sleep(COLD_POLL).await;
            let mut conn = self.redis.conn.clone();
            let (list, lease): (Option<String>, Option<String>) = redis::pipe()
                .get(shard.featured(article))
                .get(shard.featured_lease(article))
                .query_async(&mut conn)
                .await?;
            if list.is_some() || lease.is_none() {
                return Ok(list);
            }
        }
    }

    /// Computes the list from SQL and stores it, if the lease `token` names is still ours.
    #[tracing::instrument(skip_all, fields(article.id = article))]
    async fn recompute(&self, article: i64, token: &str) -> AppResult<Vec<i64>> {
        let ids = self
            .comments
            .most_liked(article, MAX_FEATURED as u64)
            .await?;
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let shard = self.redis.keys.like_shard(article);
        let mut conn = self.redis.conn.clone();
        let stored: i64 = SCRIPTS
            .featured_store
            .key(shard.featured(article))
            .key(shard.featured_lease(article))
            .arg(list)
            .arg(token)
            .arg(self.refresh.as_millis().max(1) as u64)
            .arg(LIST_TTL.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        if stored == 1 {
            self.recomputes.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("pulse_featured_recomputes_total").increment(1);
        }
        Ok(ids)
    }
}

fn parse(list: &str) -> AppResult<Vec<i64>> {
    list.split(',')
        .filter(|id| !id.is_empty())
        .map(|id| {
            id.parse().map_err(|_| {
                AppError::Internal(format!("malformed featured comments list {list:?}"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn lists_parse_and_an_empty_one_means_none() {
        assert_eq!(parse("3,1,2").unwrap(), vec![3, 1, 2]);
        assert!(parse("").unwrap().is_empty());
        assert!(parse("3,x").is_err());
    }
}
