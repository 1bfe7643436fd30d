use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono_tz::Tz;
use pulse_kit::actor::Actor;
use sea_orm::{ColumnTrait, Condition, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect};
use singleflight_async::SingleFlight;

use super::{Subject, counts};
use crate::db::retry_once;
use crate::entities::likes;
use crate::error::{AppError, AppResult, SharedResult};
use crate::keys::LikeKeys;
use crate::keys::{LIKE_SHARDS, LikeShardKeys};
use crate::redis::Redis;
use crate::scripts::SCRIPTS;
use crate::views::buckets;
use crate::views::service::RankingWindow;

/// What a like or unlike left: the viewer's relation and the subject's count, at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LikeOutcome {
    pub liked: bool,
    pub like_count: i64,
    /// Whether this call changed the relation (false for a repeat).
    pub changed: bool,
}

/// What Redis knows of a subject's likes: SQL's count as cached (when it is) and the changes not
/// archived yet.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveLikes {
    pub base: Option<i64>,
    pub pending: i64,
}

impl LiveLikes {
    /// The count to show, given the `like_count` of the SQL row the caller already holds.
    pub fn total(&self, sql_like_count: i64) -> i64 {
        self.base.unwrap_or(sql_like_count) + self.pending
    }
}

#[derive(Clone)]
pub struct LikeService {
    db: DatabaseConnection,
    redis: Redis,
    relation_ttl: Duration,
    zone: Tz,
    /// In-flight SQL reads of a relation, so concurrent requests on one (user, subject) share one.
    relation_loads: Arc<SingleFlight<(i64, Subject), SharedResult<bool>>>,
    /// In-flight loads of a subject's count into Redis, so concurrent requests share one.
    count_loads: Arc<SingleFlight<Subject, SharedResult<Option<SqlCount>>>>,
    sql_count_loads: Arc<AtomicU64>,
}

/// A subject's count as SQL holds it, with the version that orders it among cached counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqlCount {
    pub count: i64,
    pub version: i64,
}

impl LikeService {
    pub fn new(db: DatabaseConnection, redis: Redis, relation_ttl: Duration, zone: Tz) -> Self {
        Self {
            db,
            redis,
            relation_ttl,
            zone,
            relation_loads: Arc::default(),
            count_loads: Arc::default(),
            sql_count_loads: Arc::default(),
        }
    }

    /// Rebuilds the like counts and the all-time ranking from SQL: `pulse rebuild likes`.
    pub async fn rebuild_all(&self) -> AppResult<super::rebuild::Rebuilt> {
        super::rebuild::rebuild_all(&self.db, &self.redis).await
    }

    /// Likes (`like`) or unlikes `subject` as the signed-in actor. Idempotent: only a change of
    /// state counts and is archived. One script call; SQL only when Redis has neither the relation
    /// nor the subject's count (and then once for all concurrent callers of this process).
    #[tracing::instrument(skip_all, fields(subject = ?subject, like))]
    pub async fn set(&self, actor: &Actor, subject: Subject, like: bool) -> AppResult<LikeOutcome> {
        let user = actor.require_user()?;
        let event = format!("{:032x}", rand::random::<u128>());
        let mut known = SqlState::default();
        for _ in 0..3 {
            let reply = self.run_set(user, subject, like, &event, &known).await?;
            match reply[..] {
                [-1, need_relation, need_count] => {
                    let (relation, count) = tokio::try_join!(
                        async {
                            match need_relation {
                                1 => self.sql_relation(user, subject).await.map(Some),
                                _ => Ok(known.relation),
                            }
                        },
                        async {
                            match need_count {
                                1 => self.ensure_base(subject).await,
                                _ => Ok(known.count),
                            }
                        },
                    )?;
                    known = SqlState { relation, count };
                }
                [changed, liked, count] => {
                    if changed == 1 {
                        let action = if like { "like" } else { "unlike" };
                        metrics::counter!("pulse_like_changes_total", "action" => action)
                            .increment(1);
                    }
                    return Ok(LikeOutcome {
                        liked: liked == 1,
                        like_count: count,
                        changed: changed == 1,
                    });
                }
                _ => break,
            }
        }
        Err(AppError::Internal(format!(
            "like_set kept missing the state of {subject:?} it was given"
        )))
    }

    async fn run_set(
        &self,
        user: i64,
        subject: Subject,
        like: bool,
        event: &str,
        known: &SqlState,
    ) -> AppResult<Vec<i64>> {
        let now = chrono::Utc::now();
        let shard = self.redis.keys.like_shard(subject.id());
        let mut invocation = SCRIPTS.like_set.prepare_invoke();
        invocation
            .key(shard.relation(&subject.field(), user))
            .key(shard.unarchived())
            .key(shard.base())
            .key(shard.base_versions())
            .key(shard.pending())
            .key(shard.seq())
            .key(self.archive_stream(&shard));
        let channel = match subject {
            Subject::Article(article) => {
                invocation
                    .key(shard.rank_all_time())
                    .key(shard.rank_bucket(&buckets::day(now, self.zone)))
                    .key(shard.rank_bucket(&buckets::week(now, self.zone)))
                    .key(shard.article_stats_versions());
                shard.article_stats_channel(article)
            }
            Subject::Comment(_) => String::new(),
        };
        let (sql_count, sql_version) = match known.count {
            Some(count) => (count.count.to_string(), count.version.to_string()),
            None => (String::new(), String::new()),
        };
        invocation
            .arg(if like { "1" } else { "0" })
            .arg(subject.field())
            .arg(LikeShardKeys::relation_field(&subject.field(), user))
            .arg(user)
            .arg(event)
            .arg(match known.relation {
                Some(true) => "1",
                Some(false) => "0",
                None => "",
            })
            .arg(sql_count)
            .arg(sql_version)
            .arg(self.relation_ttl.as_secs().max(1))
            .arg(now.timestamp_millis())
            .arg(buckets::DAY_BUCKET_TTL.as_secs())
            .arg(buckets::WEEK_BUCKET_TTL.as_secs())
            .arg(subject.kind_code())
            .arg(subject.id())
            .arg(channel)
            .arg(self.redis.target.sharded_publish());
        let mut conn = self.redis.conn.clone();
        Ok(invocation.invoke_async(&mut conn).await?)
    }

    fn archive_stream(&self, shard: &LikeShardKeys<'_>) -> String {
        super::archive::SPEC
            .keys(&self.redis, shard.shard())
            .stream()
    }

    /// Whether SQL has `user` liking `subject`; one read for all concurrent callers.
    async fn sql_relation(&self, user: i64, subject: Subject) -> AppResult<bool> {
        let load = || async {
            metrics::counter!("pulse_like_sql_loads_total", "what" => "relation").increment(1);
            let query = likes::Entity::find_by_id((user, subject.kind_code(), subject.id()))
                .select_only()
                .column(likes::Column::Liked);
            retry_once(|| query.clone().into_tuple::<bool>().one(&self.db))
                .await
                .map(|liked| liked.unwrap_or(false))
                .map_err(|err| AppError::from(err).shared())
        };
        self.relation_loads
            .work((user, subject), load)
            .await
            .map_err(AppError::Shared)
    }

    /// Puts `subject`'s SQL count into Redis as its base, unless Redis has one: `NOT_FOUND` when
    /// the subject does not exist. Concurrent callers in this process share one attempt, and the
    /// attempt stores what it read before it ends, so callers that come after it find the base in
    /// Redis: a missing count is read from SQL once, not once per request. Returns the count when
    /// it read one.
    async fn ensure_base(&self, subject: Subject) -> AppResult<Option<SqlCount>> {
        let load = || async { self.load_base(subject).await.map_err(AppError::shared) };
        self.count_loads
            .work(subject, load)
            .await
            .map_err(AppError::Shared)
    }

    async fn load_base(&self, subject: Subject) -> AppResult<Option<SqlCount>> {
        let shard = self.redis.keys.like_shard(subject.id());
        let field = subject.field();
        let mut conn = self.redis.conn.clone();
        let cached: bool = redis::cmd("HEXISTS")
            .arg(shard.base())
            .arg(&field)
            .query_async(&mut conn)
            .await?;
        if cached {
            return Ok(None);
        }
        self.sql_count_loads.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("pulse_like_sql_loads_total", "what" => "count").increment(1);
        let count = self
            .sql_count(subject)
            .await?
            .ok_or(AppError::NotFound(counts::noun(subject)))?;
        // NX: a settle that ran meanwhile cached a newer count.
        let () = redis::pipe()
            .hset_nx(shard.base(), &field, count.count)
            .ignore()
            .hset_nx(shard.base_versions(), &field, count.version)
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(Some(count))
    }

    /// `subject`'s count and version in SQL, `None` when it does not exist.
    pub async fn sql_count(&self, subject: Subject) -> AppResult<Option<SqlCount>> {
        let mut found = retry_once(|| counts::read(&self.db, [subject])).await?;
        Ok(found.remove(&subject))
    }

    /// How many times this process has read a like count from SQL because Redis had none.
    pub fn sql_count_loads(&self) -> u64 {
        self.sql_count_loads.load(Ordering::Relaxed)
    }

    /// Live like state of many subjects in one pipelined round trip.
    #[tracing::instrument(skip_all, fields(subjects = subjects.len()))]
    pub async fn live(&self, subjects: &[Subject]) -> AppResult<HashMap<Subject, LiveLikes>> {
        let mut pipe = redis::pipe();
        for &subject in subjects {
            let shard = self.redis.keys.like_shard(subject.id());
            let field = subject.field();
            pipe.hget(shard.base(), &field)
                .hget(shard.pending(), &field);
        }
        let mut conn = self.redis.conn.clone();
        let replies: Vec<Option<i64>> = pipe.query_async(&mut conn).await?;
        Ok(subjects
            .iter()
            .zip(replies.chunks_exact(2))
            .map(|(&subject, reply)| {
                let live = LiveLikes {
                    base: reply[0],
                    pending: reply[1].unwrap_or(0),
                };
                (subject, live)
            })
            .collect())
    }

    /// `article`'s live likes and the like and comment part of its stats version, which every
    /// change of its like or comment count moves (see `lua/article_stats_bump.lua`), read in one
    /// step (`lua/article_stats_read.lua`).
    pub async fn article_live(&self, article: i64) -> AppResult<(LiveLikes, i64)> {
        let shard = self.redis.keys.like_shard(article);
        let mut conn = self.redis.conn.clone();
        let (base, pending, version): (i64, i64, i64) = SCRIPTS
            .article_stats_read
            .key(shard.base())
            .key(shard.pending())
            .key(shard.article_stats_versions())
            .arg(Subject::Article(article).field())
            .arg(article)
            .arg(chrono::Utc::now().timestamp_micros())
            .invoke_async(&mut conn)
            .await?;
        let live = LiveLikes {
            base: (base >= 0).then_some(base),
            pending,
        };
        Ok((live, version))
    }

    /// Which of `subjects` `user` likes: one pipelined Redis round trip, and one SQL query for the
    /// relations neither the cache nor the unarchived changes know, which are then cached.
    #[tracing::instrument(skip_all, fields(subjects = subjects.len()))]
    pub async fn liked_by(
        &self,
        user: i64,
        subjects: &[Subject],
    ) -> AppResult<HashMap<Subject, bool>> {
        let mut pipe = redis::pipe();
        for &subject in subjects {
            let shard = self.redis.keys.like_shard(subject.id());
            pipe.get(shard.relation(&subject.field(), user)).hget(
                shard.unarchived(),
                LikeShardKeys::relation_field(&subject.field(), user),
            );
        }
        let mut conn = self.redis.conn.clone();
        let replies: Vec<Option<i64>> = pipe.query_async(&mut conn).await?;
        let mut liked = HashMap::with_capacity(subjects.len());
        let mut unknown = Vec::new();
        for (&subject, reply) in subjects.iter().zip(replies.chunks_exact(2)) {
            match reply[0].or(reply[1]) {
                Some(state) => {
                    liked.insert(subject, state % 2 == 1);
                }
                None => unknown.push(subject),
            }
        }
        if unknown.is_empty() {
            return Ok(liked);
        }
        let from_sql = self.sql_relations(user, &unknown).await?;
        let mut fill = redis::pipe();
        for &subject in &unknown {
            let state = from_sql.contains(&subject);
            liked.insert(subject, state);
            let shard = self.redis.keys.like_shard(subject.id());
            // NX: a like that landed since the read above wrote a newer state.
            fill.cmd("SET")
                .arg(shard.relation(&subject.field(), user))
                .arg(if state { 1 } else { 0 })
                .arg("EX")
                .arg(self.relation_ttl.as_secs().max(1))
                .arg("NX")
                .ignore();
        }
        let mut conn = self.redis.conn.clone();
        // Caching is a saving for the next reader; this one has its answer already.
        tokio::spawn(async move {
            if let Err(err) = fill.query_async::<()>(&mut conn).await {
                tracing::debug!(error = %err, "cannot cache like relations read from SQL");
            }
        });
        Ok(liked)
    }

    /// The subjects among `subjects` that SQL has `user` liking.
    async fn sql_relations(
        &self,
        user: i64,
        subjects: &[Subject],
    ) -> AppResult<std::collections::HashSet<Subject>> {
        let mut any = Condition::any();
        for subject in subjects {
            any = any.add(
                Condition::all()
                    .add(likes::Column::SubjectKind.eq(subject.kind_code()))
                    .add(likes::Column::SubjectId.eq(subject.id())),
            );
        }
        let query = likes::Entity::find()
            .select_only()
            .column(likes::Column::SubjectKind)
            .column(likes::Column::SubjectId)
            .filter(likes::Column::UserId.eq(user))
            .filter(likes::Column::Liked.eq(true))
            .filter(any);
        let rows = retry_once(|| query.clone().into_tuple::<(i16, i64)>().all(&self.db)).await?;
        Ok(rows
            .into_iter()
            .filter_map(|(kind, id)| Subject::from_kind_code(kind, id))
            .collect())
    }

    /// The most liked articles in a window, best first: `(article, score)`. ALL_TIME ranks by the
    /// live count; DAY and WEEK by likes minus unlikes within the bucket.
    #[tracing::instrument(skip_all, fields(window = ?window, first))]
    pub async fn top(&self, window: RankingWindow, first: usize) -> AppResult<Vec<(i64, f64)>> {
        let bucket = window.bucket(self.zone);
        let keys = (0..LIKE_SHARDS).map(|index| {
            let shard = self.redis.keys.like_shard_by_index(index);
            match &bucket {
                None => shard.rank_all_time(),
                Some(bucket) => shard.rank_bucket(bucket),
            }
        });
        Ok(self.redis.top_of_shards(keys, first).await?)
    }
}

/// What the caller has read from SQL for one like.
#[derive(Clone, Copy, Debug, Default)]
struct SqlState {
    relation: Option<bool>,
    count: Option<SqlCount>,
}
