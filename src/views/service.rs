use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use pulse_kit::actor::{Actor, Identity};
use sea_orm::{DatabaseConnection, EntityTrait, QuerySelect};
use singleflight_async::SingleFlight;

use super::buckets;
use super::crawler::CrawlerDetector;
use crate::db::retry_once;
use crate::entities::articles;
use crate::error::{AppError, AppResult, SharedResult};
use crate::keys::VIEW_SHARDS;
use crate::keys::ViewKeys;
use crate::redis::Redis;
use crate::scripts::SCRIPTS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    Duplicate,
    Crawler,
}

#[derive(Clone, Copy, Debug)]
pub struct ViewOutcome {
    pub counted: bool,
    pub skip_reason: Option<SkipReason>,
    /// Views so far including this one: SQL's count plus what is pending in Redis.
    pub view_count: i64,
}

/// What Redis knows of an article's views: SQL's count as of the last flush (when cached) and the
/// views counted since.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveViews {
    pub base: Option<i64>,
    pub pending: i64,
}

impl LiveViews {
    /// The count to show, given the `view_count` of the SQL row the caller already holds.
    pub fn total(&self, sql_view_count: i64) -> i64 {
        self.base.unwrap_or(sql_view_count) + self.pending
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankingWindow {
    AllTime,
    Day,
    Week,
}

impl RankingWindow {
    /// The time bucket this window ranks by now (a local day, an ISO week), or `None` for all time.
    pub fn bucket(self, zone: Tz) -> Option<String> {
        let now = chrono::Utc::now();
        match self {
            Self::AllTime => None,
            Self::Day => Some(buckets::day(now, zone)),
            Self::Week => Some(buckets::week(now, zone)),
        }
    }
}

#[derive(Clone)]
pub struct ViewService {
    db: DatabaseConnection,
    redis: Redis,
    crawlers: Arc<CrawlerDetector>,
    window: Duration,
    zone: Tz,
    /// In-flight SQL reads of an article's count, so that a burst of first views shares one.
    count_loads: Arc<SingleFlight<i64, SharedResult<Option<i64>>>>,
}

impl ViewService {
    pub fn new(
        db: DatabaseConnection,
        redis: Redis,
        crawlers: Arc<CrawlerDetector>,
        window: Duration,
        zone: Tz,
    ) -> Self {
        Self {
            db,
            redis,
            crawlers,
            window,
            zone,
            count_loads: Arc::default(),
        }
    }

    /// Rewrites every shard's base counts and all-time ranking from SQL plus pending views: `pulse
    /// rebuild views`. Returns how many articles it read from SQL.
    pub async fn rebuild_all(&self) -> AppResult<u64> {
        super::rebuild::rebuild_all(&self.db, &self.redis).await
    }

    /// Counts a view unless the actor (the signed-in user, else the client's address) was counted
    /// for this article within the window or its User-Agent is a crawler. One script call; SQL only
    /// the first time Redis meets the article.
    #[tracing::instrument(skip_all, fields(article.id = article))]
    pub async fn record(&self, article: i64, actor: &Actor) -> AppResult<ViewOutcome> {
        let viewer = actor.identity();
        let is_crawler = self.crawlers.is_crawler(actor.user_agent.as_deref());
        let (mut counted, mut total) = self.run_record(article, viewer, !is_crawler, None).await?;
        if counted < 0 {
            let sql_count = self
                .sql_view_count(article)
                .await?
                .ok_or(AppError::NotFound("article"))?;
            (counted, total) = self
                .run_record(article, viewer, !is_crawler, Some(sql_count))
                .await?;
        }
        let skip_reason = match (counted, is_crawler) {
            (1, _) => None,
            (_, true) => Some(SkipReason::Crawler),
            _ => Some(SkipReason::Duplicate),
        };
        Ok(ViewOutcome {
            counted: counted == 1,
            skip_reason,
            view_count: total,
        })
    }

    #[tracing::instrument(skip_all, fields(article.id = article, count))]
    async fn run_record(
        &self,
        article: i64,
        viewer: Identity,
        count: bool,
        sql_count: Option<i64>,
    ) -> AppResult<(i64, i64)> {
        let now = chrono::Utc::now();
        let shard = self.redis.keys.view_shard(article);
        let mut conn = self.redis.conn.clone();
        Ok(SCRIPTS
            .record_view
            .key(shard.seen(article, viewer))
            .key(shard.base())
            .key(shard.pending())
            .key(shard.rank_all_time())
            .key(shard.rank_bucket(&buckets::day(now, self.zone)))
            .key(shard.rank_bucket(&buckets::week(now, self.zone)))
            .arg(article)
            .arg(self.window.as_secs().max(1))
            .arg(if count { "1" } else { "0" })
            .arg(buckets::DAY_BUCKET_TTL.as_secs())
            .arg(buckets::WEEK_BUCKET_TTL.as_secs())
            .arg(sql_count.map(|count| count.to_string()).unwrap_or_default())
            .arg(shard.article_stats_channel(article))
            .arg(self.redis.target.sharded_publish())
            .invoke_async(&mut conn)
            .await?)
    }

    /// The article's `view_count` in SQL, `None` when it does not exist; concurrent callers share
    /// one read.
    #[tracing::instrument(skip_all, fields(article.id = article))]
    async fn sql_view_count(&self, article: i64) -> AppResult<Option<i64>> {
        let load = || async {
            let query = articles::Entity::find_by_id(article)
                .select_only()
                .column(articles::Column::ViewCount);
            retry_once(|| query.clone().into_tuple::<i64>().one(&self.db))
                .await
                .map_err(|err| AppError::from(err).shared())
        };
        self.count_loads
            .work(article, load)
            .await
            .map_err(AppError::Shared)
    }

    /// Live view state of many articles in one pipelined round trip.
    #[tracing::instrument(skip_all, fields(articles = articles.len()))]
    pub async fn live(&self, articles: &[i64]) -> AppResult<HashMap<i64, LiveViews>> {
        let mut pipe = redis::pipe();
        for &article in articles {
            let shard = self.redis.keys.view_shard(article);
            pipe.hget(shard.base(), article)
                .hget(shard.pending(), article);
        }
        let mut conn = self.redis.conn.clone();
        let replies: Vec<Option<i64>> = pipe.query_async(&mut conn).await?;
        Ok(articles
            .iter()
            .zip(replies.chunks_exact(2))
            .map(|(&article, reply)| {
                (
                    article,
                    LiveViews {
                        base: reply[0],
                        pending: reply[1].unwrap_or(0),
                    },
                )
            })
            .collect())
    }

    /// The most viewed articles in a window, best first: `(article, views)`. Each shard ranks its
    /// own articles; the overall top is merged from the shards' tops.
    #[tracing::instrument(skip_all, fields(window = ?window, first))]
    pub async fn top(&self, window: RankingWindow, first: usize) -> AppResult<Vec<(i64, f64)>> {
        let bucket = window.bucket(self.zone);
        let keys = (0..VIEW_SHARDS).map(|index| {
            let shard = self.redis.keys.view_shard_by_index(index);
            match &bucket {
                None => shard.rank_all_time(),
                Some(bucket) => shard.rank_bucket(bucket),
            }
        });
        Ok(self.redis.top_of_shards(keys, first).await?)
    }
}
