//! Live article counters (`articleStatsChanged`): views, likes and comments of one article, pushed
//! to subscribers as they move.
//!
//! Whatever moves a counter (a counted view, a change of like, a comment added or deleted)
//! announces it on the article's channel; per process, one coalescing watcher per watched article
//! reads the three counters at most once per tick and pushes only what changed (see
//! [`crate::realtime::coalesce`]). An article deleted while watched ends its subscriptions.
//!
//! Versions: each snapshot's is the article's view count (which only grows) plus the version of
//! its like and comment counts, which every like change (`lua/like_set.lua`) and every comment
//! added or deleted (`lua/article_stats_bump.lua`) moves past its last value in the step that
//! announces the change, and which is read with the like count in one step. It is part of what
//! the watcher compares, so a read whose version moved is sent even if its counts did not (a
//! comment's version read in the moment between its commit and its announcement, then read
//! again). A client that keeps a snapshot whose version is at least that of the one it shows, and
//! drops older ones (as after reconnecting to another process), ends on the latest counts: the
//! read that follows the last change has the highest version and the latest counts.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt as _, Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ArticleService;
use crate::error::{AppError, AppResult};
use crate::keys::ArticleKeys;
use crate::likes::LikeService;
use crate::realtime::{Coalescer, CoalescerConfig, Hub, Sharding, Snapshot};
use crate::redis::Keys;
use crate::views::ViewService;

/// An article's counters at one moment, and its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArticleStats {
    pub article: i64,
    /// Part of what a watcher compares: a read whose counts are those it sent last but whose
    /// version moved (a change read with its counts before its version was) is sent, so that a
    /// client that keeps the highest version ends on the latest counts.
    pub version: i64,
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
    let ids = [article];
    let (viewed, (liked, counted_version)) =
        tokio::try_join!(views.live(&ids), likes.article_live(article))?;
    let view_count = viewed
        .get(&article)
        .map_or(row.view_count, |live| live.total(row.view_count));
    let like_count = liked.total(row.like_count);
    let version = view_count + counted_version;
    Ok(Snapshot {
        version,
        value: Some(ArticleStats {
            article,
            version,
            view_count,
            like_count,
            comment_count: row.comment_count,
        }),
        refresh_at: None,
    })
}
