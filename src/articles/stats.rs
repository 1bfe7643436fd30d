//! Live article counters (`articleStatsChanged`): views, likes and comments of one article, pushed
//! to subscribers as they move.
//!
//! Whatever moves a counter (a counted view, a change of like, a comment added or deleted)
//! announces it on the article's channel; per process, one coalescing watcher per watched article
//! reads the three counters at most once per tick and pushes only what changed (see
//! [`crate::realtime::coalesce`]). An article deleted while watched ends its subscriptions.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt as _, Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ArticleService;
use crate::error::{AppError, AppResult};
use crate::keys::ArticleKeys;
use crate::likes::{LikeService, Subject};
use crate::realtime::{Coalescer, CoalescerConfig, Hub, Sharding, Snapshot};
use crate::redis::Keys;
use crate::views::ViewService;

/// An article's counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArticleStats {
    pub article: i64,
    pub view_count: i64,
    pub like_count: i64,
    pub comment_count: i64,
}

#[derive(Clone)]
pub struct ArticleStatsService {
    articles: ArticleService,
    live: Coalescer<i64, Option<ArticleStats>>,
}

/// Where the watchers run.
pub struct StatsWorkers<'a> {
    pub hub: &'a Hub,
    pub tasks: &'a TaskTracker,
    pub shutdown: &'a CancellationToken,
    /// Reads per article per process at most once per tick.
    pub tick: Duration,
}

impl ArticleStatsService {
    pub fn new(
        articles: ArticleService,
        views: ViewService,
        likes: LikeService,
        keys: Keys,
        workers: StatsWorkers<'_>,
    ) -> Self {
        let config = CoalescerConfig {
            kind: "article_stats",
            tick: workers.tick,
            // Announced by the view and the like scripts, each in its own slot's channel.
            sharding: Sharding::Sharded,
            hub: workers.hub,
            tasks: workers.tasks,
            shutdown: workers.shutdown,
        };
        let reader = articles.clone();
        let live = Coalescer::new(
            config,
            move |article: &i64| keys.article_stats_channels(*article),
            move |article: i64| {
                let (articles, views, likes) = (reader.clone(), views.clone(), likes.clone());
                async move { read(&articles, &views, &likes, article).await }.boxed()
            },
        );
        Self { articles, live }
    }

    /// The article's counters now, then each time they change; `NOT_FOUND` for no such article.
    pub async fn watch(&self, article: i64) -> AppResult<impl Stream<Item = ArticleStats> + use<>> {
        self.articles
            .get(article)
            .await?
            .ok_or(AppError::NotFound("article"))?;
        Ok(self
            .live
            .subscribe(article)
            .map(|snapshot: Arc<Snapshot<Option<ArticleStats>>>| snapshot.value)
            .take_while(|stats| std::future::ready(stats.is_some()))
            .filter_map(std::future::ready))
    }

    /// Counter reads this process has made (for tests and metrics).
    pub fn reads(&self) -> u64 {
        self.live.reads()
    }
}

/// One read: the article's row (its comment count, and the SQL counts the live ones build on) and
/// its live view and like counts. `None` once the article is gone.
async fn read(
    articles: &ArticleService,
    views: &ViewService,
    likes: &LikeService,
    article: i64,
) -> AppResult<Snapshot<Option<ArticleStats>>> {
    let Some(row) = articles.get(article).await? else {
        return Ok(Snapshot {
            version: i64::MAX,
            value: None,
            refresh_at: None,
        });
    };
    let (ids, subjects) = ([article], [Subject::Article(article)]);
    let (viewed, liked) = tokio::try_join!(views.live(&ids), likes.live(&subjects))?;
    let view_count = viewed
        .get(&article)
        .map_or(row.view_count, |live| live.total(row.view_count));
    let like_count = liked
        .get(&Subject::Article(article))
        .map_or(row.like_count, |live| live.total(row.like_count));
    Ok(Snapshot {
        version: chrono::Utc::now().timestamp_millis(),
        value: Some(ArticleStats {
            article,
            view_count,
            like_count,
            comment_count: row.comment_count,
        }),
        refresh_at: None,
    })
}
