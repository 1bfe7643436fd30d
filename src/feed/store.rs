//! The feed's Redis and SQL primitives, shared by the read path and the jobs.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::sea_query::{Expr, ExprTrait as _, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait as _, DatabaseConnection, DbBackend, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Statement,
};

use crate::db::retry_once;
use crate::entities::{articles, follow_counts, follows};
use crate::error::{AppError, AppResult};
use crate::redis::Redis;
use crate::redis::keys::by_feed_shard;

/// The feed's knobs, from the configuration.
#[derive(Clone, Debug)]
pub struct FeedSettings {
    pub cap: u32,
    pub inbox_ttl: Duration,
    pub fanout_chunk: u32,
    pub celebrity_followers: u64,
    pub follow_backfill: u32,
}

impl FeedSettings {
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self {
            cap: config.feed_cap,
            inbox_ttl: config.feed_inbox_ttl,
            fanout_chunk: config.feed_fanout_chunk,
            celebrity_followers: config.feed_celebrity_followers,
            follow_backfill: config.feed_follow_backfill,
        }
    }
}

/// What inbox writes did, for the metrics and the tests.
#[derive(Debug, Default)]
pub struct FeedCounters {
    pub inbox_writes: AtomicU64,
    pub announcements: AtomicU64,
    pub rebuilds: AtomicU64,
}

#[derive(Clone)]
pub struct FeedStore {
    pub db: DatabaseConnection,
    pub redis: Redis,
    pub settings: FeedSettings,
    pub counters: Arc<FeedCounters>,
}

impl FeedStore {
    pub fn new(db: DatabaseConnection, redis: Redis, settings: FeedSettings) -> Self {
        Self {
            db,
            redis,
            settings,
            counters: Arc::default(),
        }
    }

    /// This store on another Redis handle (the jobs' own connection), counting into the same
    /// counters.
    pub fn with_redis(&self, redis: Redis) -> Self {
        Self {
            redis,
            ..self.clone()
        }
    }

    /// Whether `author` has so many followers that publishes are merged at read time instead.
    pub async fn is_celebrity(&self, author: i64) -> AppResult<bool> {
        let query = follow_counts::Entity::find_by_id(author);
        let row = retry_once(|| query.clone().one(&self.db)).await?;
        Ok(row.is_some_and(|row| row.followers as u64 >= self.settings.celebrity_followers))
    }

    pub async fn is_following(&self, follower: i64, followee: i64) -> AppResult<bool> {
        let query = follows::Entity::find()
            .select_only()
            .column(follows::Column::Id)
            .filter(follows::Column::FollowerId.eq(follower))
            .filter(follows::Column::FolloweeId.eq(followee));
        let row: Option<i64> = retry_once(|| query.clone().into_tuple().one(&self.db)).await?;
        Ok(row.is_some())
    }

    /// The followees fanned out to `follower` (everyone they follow but the celebrities).
    pub async fn fanned_out_followees(&self, follower: i64) -> AppResult<Vec<i64>> {
        let query = follows::Entity::find()
            .select_only()
            .column(follows::Column::FolloweeId)
            .filter(follows::Column::FollowerId.eq(follower));
        let followees: Vec<i64> = retry_once(|| query.clone().into_tuple().all(&self.db)).await?;
        let celebrities: HashSet<i64> = self
            .followed_celebrities(follower)
            .await?
            .into_iter()
            .collect();
        Ok(followees
            .into_iter()
            .filter(|followee| !celebrities.contains(followee))
            .collect())
    }

    /// Every follower of `author`. SQLite hands sqlx one row at a time through a channel to its
    /// worker thread, a thread hop per row: reading 100,000 followers that way was most of a
    /// fan-out's cost. There the ids come as one text per page of `FOLLOWER_PAGE` instead; the
    /// other backends stream rows natively.
    pub async fn followers_of(&self, author: i64) -> AppResult<Vec<i64>> {
        if self.db.get_database_backend() != DbBackend::Sqlite {
            let query = follows::Entity::find()
                .select_only()
                .column(follows::Column::FollowerId)
                .filter(follows::Column::FolloweeId.eq(author));
            return Ok(retry_once(|| query.clone().into_tuple().all(&self.db)).await?);
        }
        let mut followers = Vec::new();
        let mut after = i64::MIN;
        loop {
            let page = Statement::from_sql_and_values(
                DbBackend::Sqlite,
                "SELECT group_concat(follower_id) FROM (SELECT follower_id FROM follows \
                 WHERE followee_id = ? AND follower_id > ? ORDER BY follower_id LIMIT ?)",
                [author.into(), after.into(), FOLLOWER_PAGE.into()],
            );
            let row = retry_once(|| self.db.query_one_raw(page.clone())).await?;
            let ids: Option<String> = match row {
                Some(row) => row.try_get_by_index(0)?,
                None => None,
            };
            let Some(ids) = ids else {
                return Ok(followers);
            };
            let start = followers.len();
            for id in ids.split(',') {
                let id = id.parse::<i64>().map_err(|err| {
                    AppError::Internal(format!("follower id {id:?} from SQLite: {err}"))
                })?;
                followers.push(id);
            }
            let page = &followers[start..];
            after = page.iter().copied().max().unwrap_or(i64::MAX);
            if (page.len() as u64) < FOLLOWER_PAGE {
                return Ok(followers);
            }
        }
    }

    /// The celebrities `follower` follows (read-time merge), in one query: a page read asks for
    /// these alone, not for every followee.
    pub async fn followed_celebrities(&self, follower: i64) -> AppResult<Vec<i64>> {
        let query = follow_counts::Entity::find()
            .select_only()
            .column(follow_counts::Column::UserId)
            .filter(
                follow_counts::Column::Followers
                    .gte(i64::try_from(self.settings.celebrity_followers).unwrap_or(i64::MAX)),
            )
            .filter(Expr::col(follow_counts::Column::UserId).in_subquery(followees_of(follower)));
        Ok(retry_once(|| query.clone().into_tuple().all(&self.db)).await?)
    }

    /// The articles of `ids` whose author `follower` follows now, in one query.
    pub async fn followed_articles(
        &self,
        follower: i64,
        ids: &[i64],
    ) -> AppResult<Vec<articles::Model>> {
        let query = articles::Entity::find()
            .filter(articles::Column::Id.is_in(ids.iter().copied()))
            .filter(Expr::col(articles::Column::AuthorId).in_subquery(followees_of(follower)));
        Ok(retry_once(|| query.clone().all(&self.db)).await?)
    }

    /// The newest `limit` article ids below `below` by any author `follower` follows, from SQL.
    pub async fn sql_feed(&self, follower: i64, below: i64, limit: u64) -> AppResult<Vec<i64>> {
        let query = articles::Entity::find()
            .select_only()
            .column(articles::Column::Id)
            .filter(Expr::col(articles::Column::AuthorId).in_subquery(followees_of(follower)))
            .filter(articles::Column::Id.lt(below))
            .order_by_desc(articles::Column::Id)
            .limit(limit);
        Ok(retry_once(|| query.clone().into_tuple().all(&self.db)).await?)
    }

    /// The newest `limit` article ids of any of `authors`, from SQL.
    pub async fn sql_newest(&self, authors: &[i64], limit: u64) -> AppResult<Vec<i64>> {
        if authors.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids = Vec::new();
        for chunk in authors.chunks(500) {
            let query = articles::Entity::find()
                .select_only()
                .column(articles::Column::Id)
                .filter(articles::Column::AuthorId.is_in(chunk.iter().copied()))
                .order_by_desc(articles::Column::Id)
                .limit(limit);
            let found: Vec<i64> = retry_once(|| query.clone().into_tuple().all(&self.db)).await?;
            ids.extend(found);
        }
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.truncate(limit as usize);
        Ok(ids)
    }

    /// Adds articles to `author`'s outbox; with `loaded`, they are the author's newest from SQL.
    pub async fn outbox_add(&self, author: i64, ids: &[i64], loaded: bool) -> AppResult<u64> {
        let keys = self.redis.keys.feed_user(author);
        let mut invocation = self.redis.scripts.feed_outbox_add.prepare_invoke();
        invocation
            .key(keys.outbox())
            .key(keys.outbox_loaded())
            .arg(self.settings.cap)
            .arg(u8::from(loaded));
        for id in ids {
            invocation.arg(*id);
        }
        let mut conn = self.redis.conn.clone();
        Ok(invocation.invoke_async(&mut conn).await?)
    }

    /// `author`'s outbox as a complete list of their newest articles (up to the cap), loading it
    /// from SQL first when it was never loaded. Returns the ids below `below`, newest first, at
    /// most `limit`, and whether the outbox holds the author's whole history.
    pub async fn outbox_page(
        &self,
        author: i64,
        below: i64,
        limit: u64,
    ) -> AppResult<(Vec<i64>, OutboxCoverage)> {
        let keys = self.redis.keys.feed_user(author);
        let mut conn = self.redis.conn.clone();
        let (loaded, size, lowest, ids): (bool, u64, Vec<i64>, Vec<i64>) = redis::pipe()
            .exists(keys.outbox_loaded())
            .zcard(keys.outbox())
            .zrange(keys.outbox(), 0, 0)
            .cmd("ZREVRANGEBYSCORE")
            .arg(keys.outbox())
            .arg(format!("({below}"))
            .arg("-inf")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await?;
        if loaded {
            let coverage = OutboxCoverage {
                complete: size < u64::from(self.settings.cap),
                lowest: lowest.first().copied().unwrap_or(0),
            };
            return Ok((ids, coverage));
        }
        let newest = self
            .sql_newest(&[author], u64::from(self.settings.cap))
            .await?;
        self.outbox_add(author, &newest, true).await?;
        let coverage = OutboxCoverage {
            complete: newest.len() < self.settings.cap as usize,
            lowest: newest.last().copied().unwrap_or(0),
        };
        let below_cursor = newest.into_iter().filter(|&id| id < below);
        Ok((below_cursor.take(limit as usize).collect(), coverage))
    }

    /// Marks `user` active now: fan-out writes to their inbox from now on (while it exists).
    pub async fn mark_active(&self, user: i64) -> AppResult<()> {
        let mut conn = self.redis.conn.clone();
        let now = chrono::Utc::now().timestamp_millis();
        let _: i64 = redis::cmd("ZADD")
            .arg(self.redis.keys.feed_active())
            .arg(now)
            .arg(user)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Those of `users` who read their feed within the inbox TTL, in one command.
    pub async fn active_among(&self, users: &[i64]) -> AppResult<Vec<i64>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.redis.conn.clone();
        let seen: Vec<Option<f64>> = redis::cmd("ZMSCORE")
            .arg(self.redis.keys.feed_active())
            .arg(users)
            .query_async(&mut conn)
            .await?;
        let since = chrono::Utc::now().timestamp_millis() as f64
            - self.settings.inbox_ttl.as_millis() as f64;
        Ok(users
            .iter()
            .zip(seen)
            .filter(|(_, at)| at.is_some_and(|at| at >= since))
            .map(|(&user, _)| user)
            .collect())
    }

    /// The newest articles of `authors` for a rebuild: from their outboxes in one pipelined round
    /// trip, and from SQL in one query for the authors whose outbox is not loaded. Returns up to
    /// the cap per source, and whether they are the authors' whole history.
    pub async fn pull(&self, authors: &[i64]) -> AppResult<(Vec<i64>, bool)> {
        if authors.is_empty() {
            return Ok((Vec::new(), true));
        }
        let cap = u64::from(self.settings.cap);
        let mut conn = self.redis.conn.clone();
        let mut pipe = redis::pipe();
        for &author in authors {
            let keys = self.redis.keys.feed_user(author);
            pipe.exists(keys.outbox_loaded())
                .zrevrange(keys.outbox(), 0, cap as isize - 1);
        }
        let replies: Vec<(bool, Vec<i64>)> = pipe.query_async(&mut conn).await?;
        let mut ids = Vec::new();
        let mut complete = true;
        let mut unloaded = Vec::new();
        for (&author, (loaded, newest)) in authors.iter().zip(replies) {
            if loaded {
                complete &= (newest.len() as u64) < cap;
                ids.extend(newest);
            } else {
                unloaded.push(author);
            }
        }
        let from_sql = self.sql_newest(&unloaded, cap + 1).await?;
        complete &= from_sql.len() as u64 <= cap;
        ids.extend(from_sql);
        Ok((ids, complete))
    }

    /// Delivers `articles` to the inboxes of `followers` that exist, in one pipelined round trip:
    /// one script call per feed shard among the followers (a fan-out chunk holds one shard, so it
    /// makes one call). `announce` publishes the new items to those online. Returns how many
    /// (inbox, article) pairs were added.
    pub async fn deliver(
        &self,
        articles: &[i64],
        followers: &[i64],
        announce: bool,
    ) -> AppResult<u64> {
        if followers.is_empty() || articles.is_empty() {
            return Ok(0);
        }
        let by_shard = by_feed_shard(followers.iter().copied());
        let mut conn = self.redis.conn.clone();
        let script = &self.redis.scripts.feed_deliver;
        // A pipeline does not reload a script Redis has lost (a restart); load it once up front.
        script.prepare_invoke().load_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        for group in by_shard.values() {
            for batch in group.chunks(MAX_INBOXES_PER_CALL) {
                let mut invocation = script.prepare_invoke();
                invocation.arg(self.settings.cap).arg(articles.len());
                for &article in articles {
                    invocation.arg(article);
                }
                for &follower in batch {
                    let keys = self.redis.keys.feed_user(follower);
                    invocation
                        .key(keys.inbox())
                        .key(keys.inbox_building())
                        .key(keys.no_more())
                        .key(keys.online());
                    let channel = if announce {
                        self.redis.keys.feed_channel(follower)
                    } else {
                        String::new()
                    };
                    invocation.arg(channel);
                }
                pipe.invoke_script(&invocation);
            }
        }
        let results: Vec<(u64, u64)> = pipe.query_async(&mut conn).await?;
        let added: u64 = results.iter().map(|(added, _)| added).sum();
        let announced: u64 = results.iter().map(|(_, announced)| announced).sum();
        self.counters
            .inbox_writes
            .fetch_add(added, Ordering::Relaxed);
        self.counters
            .announcements
            .fetch_add(announced, Ordering::Relaxed);
        metrics::counter!("pulse_feed_inbox_writes_total").increment(added);
        metrics::counter!("pulse_feed_announcements_total").increment(announced);
        Ok(added)
    }
}

/// Follower ids one SQLite read returns as one text.
const FOLLOWER_PAGE: u64 = 10_000;

/// Inboxes one deliver call writes at most: bounds how long one script holds Redis.
const MAX_INBOXES_PER_CALL: usize = 256;

/// `SELECT followee_id FROM follows WHERE follower_id = follower`, for `IN` filters.
fn followees_of(follower: i64) -> sea_orm::sea_query::SelectStatement {
    Query::select()
        .column(follows::Column::FolloweeId)
        .from(follows::Entity)
        .and_where(Expr::col(follows::Column::FollowerId).eq(follower))
        .to_owned()
}

/// How much of an author's history an outbox holds.
#[derive(Clone, Copy, Debug)]
pub struct OutboxCoverage {
    /// The outbox holds every article of the author.
    pub complete: bool,
    /// The lowest id it holds (0 when empty).
    pub lowest: i64,
}
