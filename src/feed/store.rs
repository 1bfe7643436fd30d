//! The feed's Redis and SQL primitives, shared by the read path and the jobs.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::sea_query::{Expr, ExprTrait as _, Query};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::db::retry_once;
use crate::entities::{articles, follow_counts, follows};
use crate::error::AppResult;
use crate::keys::FeedKeys;
use crate::keys::{FEED_SHARDS, Keys, by_feed_shard, feed_shard};
use crate::redis::Redis;
use crate::scripts::SCRIPTS;

/// The feed's knobs, from the configuration.
#[derive(Clone, Debug)]
pub struct FeedSettings {
    pub cap: u32,
    pub inbox_ttl: Duration,
    pub fanout_chunk: u32,
    pub celebrity_followers: u64,
    pub follow_backfill: u32,
    /// Most items a resumed `feedItemAdded` replays.
    pub replay_limit: u32,
}

impl FeedSettings {
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self {
            cap: config.feed_cap,
            inbox_ttl: config.feed_inbox_ttl,
            fanout_chunk: config.feed_fanout_chunk,
            celebrity_followers: config.feed_celebrity_followers,
            follow_backfill: config.feed_follow_backfill,
            replay_limit: config.replay_limit,
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

    /// Everyone `follower` follows.
    pub async fn followees(&self, follower: i64) -> AppResult<Vec<i64>> {
        let query = follows::Entity::find()
            .select_only()
            .column(follows::Column::FolloweeId)
            .filter(follows::Column::FollowerId.eq(follower));
        Ok(retry_once(|| query.clone().into_tuple().all(&self.db)).await?)
    }

    /// Puts `follower` in the audiences of all of `followees`, then returns those not celebrities
    /// now, whose articles an inbox holds. In that order: an author who falls below the
    /// threshold after the celebrities are read finds `follower` in their audience, and their
    /// merge job reaches this inbox (or sends its rebuild back); one who fell before is fanned out.
    pub async fn join_and_split(&self, follower: i64, followees: &[i64]) -> AppResult<Vec<i64>> {
        self.join_audiences(follower, followees).await?;
        let celebrities: HashSet<i64> = self
            .followed_celebrities(follower)
            .await?
            .into_iter()
            .collect();
        Ok(followees
            .iter()
            .copied()
            .filter(|followee| !celebrities.contains(followee))
            .collect())
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

    /// For each (follower, article) pair, the article if it exists and the follower follows its
    /// author, in two queries whatever the number of pairs: how one live item pushed to many
    /// subscribers is read once instead of once per subscriber.
    pub async fn followed_articles_of(
        &self,
        pairs: &[(i64, i64)],
    ) -> AppResult<HashMap<(i64, i64), articles::Model>> {
        let ids: BTreeSet<i64> = pairs.iter().map(|&(_, article)| article).collect();
        let query = articles::Entity::find().filter(articles::Column::Id.is_in(ids));
        let by_id: HashMap<i64, articles::Model> = retry_once(|| query.clone().all(&self.db))
            .await?
            .into_iter()
            .map(|row| (row.id, row))
            .collect();
        let authors: BTreeSet<i64> = by_id.values().map(|row| row.author_id).collect();
        let followers: Vec<i64> = pairs
            .iter()
            .map(|&(follower, _)| follower)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut followed = HashSet::new();
        if !authors.is_empty() {
            for chunk in followers.chunks(500) {
                let query = follows::Entity::find()
                    .select_only()
                    .column(follows::Column::FollowerId)
                    .column(follows::Column::FolloweeId)
                    .filter(follows::Column::FollowerId.is_in(chunk.iter().copied()))
                    .filter(follows::Column::FolloweeId.is_in(authors.iter().copied()));
                let found: Vec<(i64, i64)> =
                    retry_once(|| query.clone().into_tuple().all(&self.db)).await?;
                followed.extend(found);
            }
        }
        Ok(pairs
            .iter()
            .filter_map(|&(follower, article)| {
                let row = by_id.get(&article)?;
                followed
                    .contains(&(follower, row.author_id))
                    .then(|| ((follower, article), row.clone()))
            })
            .collect())
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
        let mut invocation = SCRIPTS.feed_outbox_add.prepare_invoke();
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

    /// Adds `follower` to the audiences of `authors`: fan-out reaches them from now on (while
    /// their inbox exists). Called before the inbox reads the authors' outboxes: an article
    /// published meanwhile went to the outbox before its fan-out read the audience, so either the
    /// read of the outbox or the fan-out sees it.
    pub async fn join_audiences(&self, follower: i64, authors: &[i64]) -> AppResult<()> {
        if authors.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        add_audience_joins(&mut pipe, &self.redis.keys, follower, authors);
        let mut conn = self.redis.conn.clone();
        let () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    pub async fn leave_audience(&self, follower: i64, author: i64) -> AppResult<()> {
        let mut conn = self.redis.conn.clone();
        let _: u64 = redis::cmd("ZREM")
            .arg(self.redis.keys.feed_audience(author, feed_shard(follower)))
            .arg(follower)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// `author`'s audience cut into slices of at most about `size` followers (a slice may gain
    /// followers who join after this read), each within one feed shard. The slices of a shard
    /// cover every id, so no follower falls between two of them whatever joins or leaves.
    pub async fn audience_slices(&self, author: i64, size: u64) -> AppResult<Vec<AudienceSlice>> {
        let size = Ord::max(size, 1);
        let keys = &self.redis.keys;
        let mut conn = self.redis.conn.clone();
        let mut counts = redis::pipe();
        for shard in 0..FEED_SHARDS {
            counts.zcard(keys.feed_audience(author, shard));
        }
        let counts: Vec<u64> = counts.query_async(&mut conn).await?;
        // The last id of every full slice but the shard's last: ranks size-1, 2·size-1, …
        let mut bounds = redis::pipe();
        let mut bounded = Vec::new();
        for (shard, &count) in (0..FEED_SHARDS).zip(&counts) {
            for rank in (size - 1..count.saturating_sub(1)).step_by(size as usize) {
                bounds.zrange(
                    keys.feed_audience(author, shard),
                    rank as isize,
                    rank as isize,
                );
                bounded.push(shard);
            }
        }
        let bounds: Vec<Vec<i64>> = if bounded.is_empty() {
            Vec::new()
        } else {
            bounds.query_async(&mut conn).await?
        };
        let mut slices = Vec::new();
        let mut bounds = bounded.into_iter().zip(bounds).peekable();
        for (shard, &count) in (0..FEED_SHARDS).zip(&counts) {
            if count == 0 {
                continue;
            }
            let mut after = None;
            while let Some((_, bound)) = bounds.next_if(|(of, _)| *of == shard) {
                // A follower who left between the two reads leaves a gap; the range still covers it.
                let Some(&up_to) = bound.first() else {
                    continue;
                };
                slices.push(AudienceSlice {
                    shard,
                    after,
                    up_to: Some(up_to),
                });
                after = Some(up_to);
            }
            slices.push(AudienceSlice {
                shard,
                after,
                up_to: None,
            });
        }
        Ok(slices)
    }

    /// The followers in one slice of `author`'s audience now.
    pub async fn audience_of(&self, author: i64, slice: &AudienceSlice) -> AppResult<Vec<i64>> {
        let mut conn = self.redis.conn.clone();
        let min = slice.after.map_or("-inf".to_owned(), |id| format!("({id}"));
        let max = slice.up_to.map_or("+inf".to_owned(), |id| id.to_string());
        Ok(redis::cmd("ZRANGEBYSCORE")
            .arg(self.redis.keys.feed_audience(author, slice.shard))
            .arg(min)
            .arg(max)
            .query_async(&mut conn)
            .await?)
    }

    /// The newest articles of `authors` for an inbox, at most the cap, newest first, with their
    /// floor: from the authors' outboxes in one pipelined round trip, and from SQL in one query
    /// for the authors whose outbox is not loaded.
    pub async fn timeline(&self, authors: &[i64]) -> AppResult<Timeline> {
        let (mut ids, complete) = self.pull(authors).await?;
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.dedup();
        let cap = self.settings.cap as usize;
        // Every source gave its newest, up to the cap each: the union is exact down to its cap-th
        // id, since a source missing an id above it gave a cap of ids above it.
        let floor = if complete && ids.len() <= cap {
            0
        } else {
            ids.truncate(cap);
            ids.last().copied().unwrap_or(0)
        };
        Ok(Timeline { ids, floor })
    }

    /// Up to the cap per source, and whether they are the authors' whole history.
    async fn pull(&self, authors: &[i64]) -> AppResult<(Vec<i64>, bool)> {
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

    /// `author`'s newest `limit` articles, newest first, with their floor: 0 when they are the
    /// author's whole history, else just above the author's next older article (or the lowest of
    /// them, where the outbox ends).
    pub async fn newest_with_floor(&self, author: i64, limit: u64) -> AppResult<Timeline> {
        let (mut ids, coverage) = self.outbox_page(author, i64::MAX, limit + 1).await?;
        let floor = if ids.len() as u64 > limit {
            let next_older = ids[limit as usize];
            ids.truncate(limit as usize);
            next_older + 1
        } else if coverage.complete {
            0
        } else {
            coverage.lowest
        };
        Ok(Timeline { ids, floor })
    }

    /// Merges `articles` (exact from their floor up) into `reader`'s inbox, raising its floor to
    /// theirs where that is higher; see `lua/feed_merge.lua`.
    pub async fn merge(&self, reader: i64, articles: &Timeline) -> AppResult<Merged> {
        self.merge_call("add", reader, &articles.ids, articles.floor)
            .await
    }

    /// [`Self::merge`] for each of `readers`, in one pipelined round trip. Returns how many
    /// inboxes it changed.
    pub async fn merge_many(&self, readers: &[i64], articles: &Timeline) -> AppResult<usize> {
        if readers.is_empty() {
            return Ok(0);
        }
        let script = &SCRIPTS.feed_merge;
        let mut conn = self.redis.conn.clone();
        // A pipeline does not reload a script Redis has lost (a restart); load it once up front.
        script.prepare_invoke().load_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        for &reader in readers {
            let keys = self.redis.keys.feed_user(reader);
            let mut invocation = script.prepare_invoke();
            invocation
                .key(keys.inbox())
                .key(keys.inbox_building())
                .arg("add")
                .arg(self.settings.cap)
                .arg(articles.floor);
            for &article in &articles.ids {
                invocation.arg(article);
            }
            pipe.invoke_script(&invocation);
        }
        let outcomes: Vec<u8> = pipe.query_async(&mut conn).await?;
        Ok(outcomes.into_iter().filter(|&outcome| outcome == 1).count())
    }

    /// Takes `articles` out of `reader`'s inbox.
    pub async fn remove(&self, reader: i64, articles: &[i64]) -> AppResult<Merged> {
        self.merge_call("remove", reader, articles, 0).await
    }

    async fn merge_call(
        &self,
        mode: &str,
        reader: i64,
        articles: &[i64],
        floor: i64,
    ) -> AppResult<Merged> {
        let keys = self.redis.keys.feed_user(reader);
        let mut invocation = SCRIPTS.feed_merge.prepare_invoke();
        invocation
            .key(keys.inbox())
            .key(keys.inbox_building())
            .arg(mode)
            .arg(self.settings.cap)
            .arg(floor);
        for &article in articles {
            invocation.arg(article);
        }
        let mut conn = self.redis.conn.clone();
        let outcome: u8 = invocation.invoke_async(&mut conn).await?;
        Ok(match outcome {
            1 => Merged::Changed,
            2 => Merged::RebuildRestarted,
            _ => Merged::Inactive,
        })
    }

    /// Delivers `author`'s `articles` to the inboxes of `followers` that exist, in one pipelined
    /// round trip: script calls of at most [`MAX_WRITES_PER_CALL`] writes, each within one feed
    /// shard (a fan-out chunk holds one shard). Followers without an inbox leave the author's audience.
    /// `announce` publishes the new items to those online. Returns how many (inbox, article)
    /// pairs were added.
    pub async fn deliver(
        &self,
        author: i64,
        articles: &[i64],
        followers: &[i64],
        announce: bool,
    ) -> AppResult<u64> {
        if followers.is_empty() || articles.is_empty() {
            return Ok(0);
        }
        let by_shard = by_feed_shard(followers.iter().copied());
        let mut conn = self.redis.conn.clone();
        let script = &SCRIPTS.feed_deliver;
        // A pipeline does not reload a script Redis has lost (a restart); load it once up front.
        script.prepare_invoke().load_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        let inboxes_per_call = (MAX_WRITES_PER_CALL / articles.len()).max(1);
        for (&shard, group) in &by_shard {
            for batch in group.chunks(inboxes_per_call) {
                let mut invocation = script.prepare_invoke();
                invocation
                    .key(self.redis.keys.feed_audience(author, shard))
                    .arg(self.settings.cap)
                    .arg(self.settings.replay_limit)
                    .arg(self.redis.target.sharded_publish())
                    .arg(articles.len());
                for &article in articles {
                    invocation.arg(article);
                }
                for &follower in batch {
                    let keys = self.redis.keys.feed_user(follower);
                    invocation
                        .key(keys.inbox())
                        .key(keys.inbox_building())
                        .key(keys.online())
                        .key(keys.journal());
                    let channel = if announce {
                        self.redis.keys.feed_channel(follower)
                    } else {
                        String::new()
                    };
                    invocation.arg(follower).arg(channel);
                }
                pipe.invoke_script(&invocation);
            }
        }
        let results: Vec<(u64, u64, u64)> = pipe.query_async(&mut conn).await?;
        let (mut added, mut announced, mut dropped) = (0, 0, 0);
        for (a, b, c) in results {
            added += a;
            announced += b;
            dropped += c;
        }
        self.counters
            .inbox_writes
            .fetch_add(added, Ordering::Relaxed);
        self.counters
            .announcements
            .fetch_add(announced, Ordering::Relaxed);
        metrics::counter!("pulse_feed_inbox_writes_total").increment(added);
        metrics::counter!("pulse_feed_announcements_total").increment(announced);
        metrics::counter!("pulse_feed_audience_left_total").increment(dropped);
        Ok(added)
    }
}

/// Adds to `pipe` the commands that put `follower` in the audiences of `authors`, one per author
/// (each audience is in its own slot). Public for the load tool and the tests, which activate
/// many readers at once without reading.
pub fn add_audience_joins(pipe: &mut redis::Pipeline, keys: &Keys, follower: i64, authors: &[i64]) {
    let shard = feed_shard(follower);
    for &author in authors {
        pipe.zadd(keys.feed_audience(author, shard), follower, follower)
            .ignore();
    }
}

/// Part of an author's audience within one feed shard: the followers whose ids are above `after`
/// and up to `up_to` (unbounded where `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AudienceSlice {
    pub shard: u32,
    pub after: Option<i64>,
    pub up_to: Option<i64>,
}

/// (Inbox, article) pairs one deliver call writes at most (but always one inbox): bounds how long
/// one script holds Redis, a few milliseconds.
const MAX_WRITES_PER_CALL: usize = 256;

/// `SELECT followee_id FROM follows WHERE follower_id = follower`, for `IN` filters.
fn followees_of(follower: i64) -> sea_orm::sea_query::SelectStatement {
    Query::select()
        .column(follows::Column::FolloweeId)
        .from(follows::Entity)
        .and_where(Expr::col(follows::Column::FollowerId).eq(follower))
        .to_owned()
}

/// Article ids newest first, exact from `floor` up: every article of their authors with an id at or
/// above it is among them (0: the authors' whole history).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    pub ids: Vec<i64>,
    pub floor: i64,
}

/// What a merge into an inbox found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merged {
    /// The inbox exists and was changed.
    Changed,
    /// No inbox, but one was being rebuilt, perhaps from the graph before this change: it starts
    /// over.
    RebuildRestarted,
    /// No inbox: the reader is inactive.
    Inactive,
}

/// How much of an author's history an outbox holds.
#[derive(Clone, Copy, Debug)]
pub struct OutboxCoverage {
    /// The outbox holds every article of the author.
    pub complete: bool,
    /// The lowest id it holds (0 when empty).
    pub lowest: i64,
}
