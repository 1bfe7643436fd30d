//! The likes archive job: moves like and unlike events from the shards' streams into SQL.
//!
//! Each batch (events of one shard, in stream order) is one SQL transaction that:
//! 1. locks the shard's `like_archive_shards` row, so batches of one shard never interleave, even
//!    when two consumers hold entries of the same shard (a lease ran out on a slow one);
//! 2. skips events whose id `like_events` already has (a replay after a crash, or `retry-dead`);
//! 3. applies the others as state transitions against SQL's own `likes` rows, in the order of their
//!    sequence: an event older than the row's (a dead consumer's entries are taken over after newer
//!    ones were archived) changes nothing, and a like where SQL has the like already (or an unlike
//!    where it has none) changes no count, so even events from a Redis that came back older than SQL
//!    cannot count twice;
//!
//!    Such events are normal after a consumer died: besides the late event itself, the newer events
//!    archived before it find SQL in the state the late one left out (a like never archived, then
//!    its unlike). Only an event that no older event of its relation explains, one still pending in
//!    the stream and not in SQL, shows that Redis lost a change SQL holds; the job warns of those
//!    alone (`pulse_like_events_unchanged_total`) and counts the others apart
//!    (`pulse_like_events_late_total`);
//! 4. adds each subject's net change to its `like_count`, bumps its `like_version`, inserts one
//!    `like_events` row per event with the count after it and its local date, and upserts the
//!    `likes` rows whose state changed.
//!
//! Then one script settles the batch in Redis (`lua/like_settle.lua`): it acknowledges the entries
//! itself and subtracts from the pending counts only what its own acknowledgement covered, so a
//! batch settled twice subtracts once; it caches SQL's counts (unless a newer one is cached) and
//! SQL's state of each relation, and drops the archived relations from the unarchived hash. A crash
//! between the commit and the settle leaves the entries pending: they come again, step 2 recognises
//! them, and the settle runs then.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{anyhow, bail};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use redis::streams::{StreamPendingCountReply, StreamRangeReply};
use sea_orm::sea_query::{Expr, ExprTrait as _, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, DatabaseConnection, DatabaseTransaction, EntityTrait,
    QueryFilter, QuerySelect, TransactionTrait,
};

use super::featured::FeaturedCommentService;
use super::service::SqlCount;
use super::{Subject, counts};
use crate::entities::{comments, like_archive_shards, like_events, likes};
use crate::jobs::{Entry, Job, JobSpec};
use crate::keys::{LIKE_SHARDS, LikeKeys, LikeShardKeys};
use crate::redis::Redis;
use crate::scripts::SCRIPTS;

pub const SPEC: JobSpec = JobSpec {
    name: "likes-archive",
    shards: LIKE_SHARDS,
    tag: "l",
};

/// Rows per multi-row statement.
const CHUNK: usize = 200;

/// Most pending entries read when looking for the older events that explain a batch's no-op
/// events: a dead consumer held at most a batch or a few (`PULSE_JOB_BATCH`, 100 by default).
const PENDING_SCAN: usize = 10_000;

/// A like event's fields, as `lua/like_set.lua` appends them.
#[derive(Debug, serde::Deserialize)]
pub struct LikeEntry {
    event: String,
    user: i64,
    kind: i16,
    subject: i64,
    liked: bool,
    seq: i64,
    /// Milliseconds since the epoch.
    at: i64,
}

/// One like or unlike as the like script appended it.
#[derive(Clone, Debug)]
struct Event {
    /// The stream entry's id, which the settle acknowledges.
    entry: String,
    id: String,
    user: i64,
    subject: Subject,
    liked: bool,
    seq: i64,
    at: DateTime<Utc>,
}

impl Event {
    fn parse(entry: &Entry<LikeEntry>) -> anyhow::Result<Self> {
        let fields = &entry.payload;
        if fields.event.is_empty() || fields.event.len() > 32 {
            bail!("like event {} has a malformed event id", entry.id);
        }
        let subject = Subject::from_kind_code(fields.kind, fields.subject)
            .ok_or_else(|| anyhow!("like event {} has an unknown subject kind", entry.id))?;
        let at = DateTime::from_timestamp_millis(fields.at)
            .ok_or_else(|| anyhow!("like event {} has a malformed time", entry.id))?;
        Ok(Self {
            entry: entry.id.clone(),
            id: fields.event.clone(),
            user: fields.user,
            subject,
            liked: fields.liked,
            seq: fields.seq,
            at,
        })
    }

    fn relation(&self) -> (i64, Subject) {
        (self.user, self.subject)
    }
}

/// A relation as SQL holds it: liked or not, as of the event with this sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Relation {
    liked: bool,
    seq: i64,
}

/// What a committed batch left in SQL, for the settle.
struct Committed {
    /// Every subject of the batch that exists, with its count after the batch.
    counts: HashMap<Subject, SqlCount>,
    /// SQL's state of every relation of the batch.
    relations: HashMap<(i64, Subject), Relation>,
    outcome: Archived,
    /// The articles whose comments' like counts the batch changed, whose featured comments may
    /// have changed with them.
    featured_changed: Vec<i64>,
}

/// What archiving a batch did with its events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Archived {
    /// Events newly written to `like_events` (not the ones it already held).
    pub archived: usize,
    /// Events that changed nothing because the same relation's events were archived out of
    /// stream order: a takeover of a dead consumer's entries, not a loss.
    pub late: usize,
    /// Events that changed nothing with nothing to explain it: Redis had lost state SQL holds.
    pub lost: usize,
}

pub struct LikeArchiver {
    db: DatabaseConnection,
    redis: Redis,
    featured: FeaturedCommentService,
    relation_ttl: Duration,
    zone: Tz,
}

impl LikeArchiver {
    pub fn new(
        db: DatabaseConnection,
        redis: Redis,
        featured: FeaturedCommentService,
        relation_ttl: Duration,
        zone: Tz,
    ) -> Self {
        Self {
            db,
            redis,
            featured,
            relation_ttl,
            zone,
        }
    }

    #[tracing::instrument(skip_all, fields(shard, events = events.len()))]
    async fn commit(&self, shard: u32, events: &[Event]) -> anyhow::Result<Committed> {
        let txn = self.db.begin().await?;
        // The lock goes first: it also makes the transaction a writer from its first statement,
        // which SQLite needs (it cannot upgrade a reader while other writers commit).
        let locked = like_archive_shards::Entity::update_many()
            .col_expr(
                like_archive_shards::Column::Batches,
                Expr::col(like_archive_shards::Column::Batches).add(1),
            )
            .filter(like_archive_shards::Column::Shard.eq(shard as i32))
            .exec(&txn)
            .await?;
        if locked.rows_affected == 0 {
            bail!("like_archive_shards has no row for shard {shard}");
        }
        let archived = archived_ids(&txn, events).await?;
        let mut relations = sql_relations(&txn, events).await?;
        let mut changed_relations = HashSet::new();
        let mut deltas: HashMap<Subject, i64> = HashMap::new();
        let mut fresh: Vec<(&Event, bool)> = Vec::new();
        let mut seen = HashSet::new();
        let mut late = 0;
        let mut unexplained = Vec::new();
        for event in events {
            if archived.contains(&event.id) || !seen.insert(event.id.as_str()) {
                continue;
            }
            let state = relations.entry(event.relation()).or_default();
            let mut changed = false;
            if event.seq > state.seq {
                changed = state.liked != event.liked;
                *state = Relation {
                    liked: event.liked,
                    seq: event.seq,
                };
                changed_relations.insert(event.relation());
                if changed {
                    *deltas.entry(event.subject).or_default() += if event.liked { 1 } else { -1 };
                } else {
                    unexplained.push(event);
                }
            } else {
                late += 1;
            }
            fresh.push((event, changed));
        }
        // Asked while the shard's lock is held: an older event cannot be committed and acknowledged
        // by another consumer meanwhile.
        let overtaken = self.overtaken(&txn, shard, events, &unexplained).await?;
        counts::add(&txn, &deltas).await?;
        let subjects: HashSet<Subject> = events.iter().map(|event| event.subject).collect();
        let counts = counts::read(&txn, subjects).await?;
        let mut running: HashMap<Subject, i64> = counts
            .iter()
            .map(|(subject, count)| {
                let before = count.count - deltas.get(subject).copied().unwrap_or(0);
                (*subject, before)
            })
            .collect();
        let mut rows = Vec::with_capacity(fresh.len());
        for &(event, changed) in &fresh {
            let count = running.entry(event.subject).or_default();
            if changed {
                *count += if event.liked { 1 } else { -1 };
            }
            rows.push(like_events::ActiveModel {
                event_id: Set(event.id.clone()),
                user_id: Set(event.user),
                subject_kind: Set(event.subject.kind_code()),
                subject_id: Set(event.subject.id()),
                liked: Set(event.liked),
                like_count: Set(*count),
                date_key: Set(date_key(event.at, self.zone)),
                created_at: Set(event.at.naive_utc()),
                ..Default::default()
            });
        }
        for chunk in rows.chunks(CHUNK) {
            like_events::Entity::insert_many(chunk.to_vec())
                .exec_without_returning(&txn)
                .await?;
        }
        let now = crate::db::now();
        // A subject deleted since (its likes went with it) gets no relation back.
        let upserts: Vec<likes::ActiveModel> = changed_relations
            .iter()
            .filter(|(_, subject)| counts.contains_key(subject))
            .map(|&(user, subject)| {
                let relation = relations[&(user, subject)];
                likes::ActiveModel {
                    user_id: Set(user),
                    subject_kind: Set(subject.kind_code()),
                    subject_id: Set(subject.id()),
                    liked: Set(relation.liked),
                    seq: Set(relation.seq),
                    updated_at: Set(now),
                }
            })
            .collect();
        for chunk in upserts.chunks(CHUNK) {
            likes::Entity::insert_many(chunk.to_vec())
                .on_conflict(
                    OnConflict::columns([
                        likes::Column::UserId,
                        likes::Column::SubjectKind,
                        likes::Column::SubjectId,
                    ])
                    .update_columns([
                        likes::Column::Liked,
                        likes::Column::Seq,
                        likes::Column::UpdatedAt,
                    ])
                    .to_owned(),
                )
                .exec_without_returning(&txn)
                .await?;
        }
        let featured_changed = articles_of_comments(&txn, &deltas).await?;
        let liked_articles = deltas.iter().filter_map(|(subject, delta)| match subject {
            Subject::Article(id) if *delta != 0 => Some(*id),
            _ => None,
        });
        crate::search::outbox::record(&txn, liked_articles).await?;
        txn.commit().await?;
        Ok(Committed {
            counts,
            relations,
            outcome: Archived {
                archived: fresh.len(),
                late: late + overtaken,
                lost: unexplained.len() - overtaken,
            },
            featured_changed,
        })
    }

    /// How many of `unexplained` (events newer than SQL's state of their relation that find it
    /// already as they would leave it) an older event of the same relation explains: one still
    /// pending in the shard's stream, outside this batch and not yet in SQL, which moved the
    /// relation in Redis before them and will come late, as a takeover of a dead consumer's
    /// entries does.
    async fn overtaken(
        &self,
        txn: &DatabaseTransaction,
        shard: u32,
        batch: &[Event],
        unexplained: &[&Event],
    ) -> anyhow::Result<usize> {
        let Some(newest) = unexplained
            .iter()
            .map(|event| stream_order(&event.entry))
            .max()
        else {
            return Ok(0);
        };
        let stream = SPEC.keys(&self.redis, shard).stream();
        let mut conn = self.redis.conn.clone();
        let pending: StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(SPEC.name)
            .arg("-")
            .arg(format!("{}-{}", newest.0, newest.1))
            .arg(PENDING_SCAN)
            .query_async(&mut conn)
            .await?;
        let in_batch: HashSet<&str> = batch.iter().map(|event| event.entry.as_str()).collect();
        let mut ranges = redis::pipe();
        for entry in pending
            .ids
            .iter()
            .filter(|entry| !in_batch.contains(entry.id.as_str()))
        {
            ranges
                .cmd("XRANGE")
                .arg(&stream)
                .arg(&entry.id)
                .arg(&entry.id);
        }
        if ranges.is_empty() {
            return Ok(0);
        }
        let replies: Vec<StreamRangeReply> = ranges.query_async(&mut conn).await?;
        let mut older = Vec::new();
        for id in replies.into_iter().flat_map(|reply| reply.ids) {
            let fields = id
                .map
                .iter()
                .filter_map(|(name, value)| {
                    let value = redis::from_redis_value_ref::<String>(value).ok()?;
                    Some((name.clone(), value))
                })
                .collect();
            let entry = Entry {
                shard,
                id: id.id,
                payload: fields,
                deliveries: 1,
            };
            // An entry this job cannot read explains nothing; it fails on its own delivery.
            if let Ok(event) = entry.decode().and_then(|entry| Event::parse(&entry)) {
                older.push(event);
            }
        }
        let archived = archived_ids(txn, &older).await?;
        let earliest: HashMap<(i64, Subject), (u64, u64)> = older
            .iter()
            .filter(|event| !archived.contains(&event.id))
            .fold(HashMap::new(), |mut earliest, event| {
                let order = stream_order(&event.entry);
                earliest
                    .entry(event.relation())
                    .and_modify(|at: &mut (u64, u64)| *at = (*at).min(order))
                    .or_insert(order);
                earliest
            });
        Ok(unexplained
            .iter()
            .filter(|event| {
                earliest
                    .get(&event.relation())
                    .is_some_and(|&at| at < stream_order(&event.entry))
            })
            .count())
    }

    /// See `lua/like_settle.lua`.
    #[tracing::instrument(skip_all, fields(shard, events = events.len()))]
    async fn settle(
        &self,
        shard: u32,
        events: &[Event],
        committed: &Committed,
    ) -> anyhow::Result<()> {
        let keys = self.redis.keys.like_shard_by_index(shard);
        let mut invocation = SCRIPTS.like_settle.prepare_invoke();
        invocation
            .key(keys.unarchived())
            .key(keys.base())
            .key(keys.base_versions())
            .key(keys.pending())
            .key(SPEC.keys(&self.redis, shard).stream())
            .key(keys.rank_all_time());
        invocation
            .arg(SPEC.name)
            .arg(std::cmp::max(self.relation_ttl.as_secs(), 1))
            .arg(events.len());
        for event in events {
            invocation
                .arg(&event.entry)
                .arg(event.subject.field())
                .arg(if event.liked { 1 } else { -1 });
        }
        invocation.arg(committed.counts.len());
        for (subject, count) in &committed.counts {
            let article = match subject {
                Subject::Article(id) => id.to_string(),
                Subject::Comment(_) => String::new(),
            };
            invocation
                .arg(subject.field())
                .arg(count.count)
                .arg(count.version)
                .arg(article);
        }
        // Each relation's last event in the batch: what it wrote is what the unarchived hash holds
        // unless a later change came since.
        let mut last: HashMap<(i64, Subject), &Event> = HashMap::new();
        for event in events {
            let slot = last.entry(event.relation()).or_insert(event);
            if event.seq > slot.seq {
                *slot = event;
            }
        }
        for (&(user, subject), event) in &last {
            let in_sql = committed
                .relations
                .get(&(user, subject))
                .copied()
                .unwrap_or_default();
            invocation.key(keys.relation(&subject.field(), user));
            invocation
                .arg(LikeShardKeys::relation_field(&subject.field(), user))
                .arg(2 * event.seq + i64::from(event.liked))
                .arg(2 * in_sql.seq + i64::from(in_sql.liked));
        }
        let mut conn = self.redis.conn.clone();
        let acknowledged: u64 = invocation.invoke_async(&mut conn).await?;
        tracing::debug!(shard, acknowledged, "like events settled");
        Ok(())
    }
}

#[async_trait::async_trait]
impl Job for LikeArchiver {
    type Payload = LikeEntry;

    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry<LikeEntry>]) -> anyhow::Result<()> {
        self.archive(batch).await.map(drop)
    }
}

impl LikeArchiver {
    /// Archives one batch of a shard's entries and settles it in Redis: the job's work, callable
    /// by itself (a test that takes entries over by hand).
    pub async fn archive(&self, batch: &[Entry<LikeEntry>]) -> anyhow::Result<Archived> {
        let Some(shard) = batch.first().map(|entry| entry.shard) else {
            return Ok(Archived::default());
        };
        let events = batch
            .iter()
            .map(Event::parse)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let committed = self.commit(shard, &events).await?;
        let outcome = committed.outcome;
        metrics::counter!("pulse_like_events_archived_total").increment(outcome.archived as u64);
        if outcome.late > 0 {
            metrics::counter!("pulse_like_events_late_total").increment(outcome.late as u64);
            tracing::debug!(
                shard,
                events = outcome.late,
                "like events archived after newer ones of their relation (taken over)"
            );
        }
        if outcome.lost > 0 {
            // Redis counted a change that SQL already had: it had come back older than SQL.
            metrics::counter!("pulse_like_events_unchanged_total").increment(outcome.lost as u64);
            tracing::warn!(
                shard,
                events = outcome.lost,
                "like events that change nothing in SQL: Redis had lost state SQL holds"
            );
        }
        self.settle(shard, &events, &committed).await?;
        // The batch is archived and settled whatever happens here: a list left stale is
        // refreshed when its lease lapses.
        if let Err(err) = self
            .featured
            .refresh_after_archive(&committed.featured_changed)
            .await
        {
            tracing::warn!(shard, error = %err, "cannot refresh featured comments after archiving");
        }
        Ok(outcome)
    }
}

/// The articles of the comments whose like count `deltas` changed.
async fn articles_of_comments(
    txn: &DatabaseTransaction,
    deltas: &HashMap<Subject, i64>,
) -> anyhow::Result<Vec<i64>> {
    let changed: Vec<i64> = deltas
        .iter()
        .filter_map(|(subject, delta)| match subject {
            Subject::Comment(id) if *delta != 0 => Some(*id),
            _ => None,
        })
        .collect();
    let mut articles = HashSet::new();
    for chunk in changed.chunks(CHUNK) {
        let rows: Vec<i64> = comments::Entity::find()
            .select_only()
            .column(comments::Column::ArticleId)
            .filter(comments::Column::Id.is_in(chunk.iter().copied()))
            .into_tuple()
            .all(txn)
            .await?;
        articles.extend(rows);
    }
    Ok(articles.into_iter().collect())
}

/// The ids among `events` that `like_events` already holds.
async fn archived_ids(
    txn: &DatabaseTransaction,
    events: &[Event],
) -> anyhow::Result<HashSet<String>> {
    let mut found = HashSet::new();
    for chunk in events.chunks(CHUNK) {
        let rows: Vec<String> = like_events::Entity::find()
            .select_only()
            .column(like_events::Column::EventId)
            .filter(like_events::Column::EventId.is_in(chunk.iter().map(|event| event.id.clone())))
            .into_tuple()
            .all(txn)
            .await?;
        found.extend(rows);
    }
    Ok(found)
}

/// SQL's state of every relation among `events` (not liked, at sequence 0, where SQL has no row).
async fn sql_relations(
    txn: &DatabaseTransaction,
    events: &[Event],
) -> anyhow::Result<HashMap<(i64, Subject), Relation>> {
    let wanted: HashSet<(i64, Subject)> = events.iter().map(Event::relation).collect();
    let wanted: Vec<_> = wanted.into_iter().collect();
    let mut states: HashMap<(i64, Subject), Relation> = wanted
        .iter()
        .map(|&relation| (relation, Relation::default()))
        .collect();
    for chunk in wanted.chunks(CHUNK) {
        let mut any = Condition::any();
        for &(user, subject) in chunk {
            any = any.add(
                Condition::all()
                    .add(likes::Column::UserId.eq(user))
                    .add(likes::Column::SubjectKind.eq(subject.kind_code()))
                    .add(likes::Column::SubjectId.eq(subject.id())),
            );
        }
        for row in likes::Entity::find().filter(any).all(txn).await? {
            if let Some(subject) = Subject::from_kind_code(row.subject_kind, row.subject_id) {
                let relation = Relation {
                    liked: row.liked,
                    seq: row.seq,
                };
                states.insert((row.user_id, subject), relation);
            }
        }
    }
    Ok(states)
}

/// A stream id (`<ms>-<seq>`) as a pair that sorts as the stream does; a malformed one first.
fn stream_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// The local date of `at` as a number: 20261123.
fn date_key(at: DateTime<Utc>, zone: Tz) -> i32 {
    let date = at.with_timezone(&zone).date_naive();
    use chrono::Datelike as _;
    date.year() * 10_000 + date.month() as i32 * 100 + date.day() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_keys_follow_the_zone() {
        let at: DateTime<Utc> = "2026-11-23T23:30:00Z".parse().unwrap();
        assert_eq!(date_key(at, chrono_tz::UTC), 20261123);
        assert_eq!(date_key(at, chrono_tz::Asia::Shanghai), 20261124);
    }

    #[test]
    fn stream_ids_sort_as_the_stream_does() {
        assert!(stream_order("9-3") < stream_order("10-0"));
        assert!(stream_order("10-2") < stream_order("10-11"));
        assert_eq!(stream_order("1763900000000-0"), (1_763_900_000_000, 0));
    }

    /// An event as the runtime reads it from the stream, decoded as the job does.
    fn parse(fields: &[(&str, &str)]) -> anyhow::Result<Event> {
        let entry = Entry {
            shard: 3,
            id: "1-0".into(),
            payload: fields
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            deliveries: 1,
        };
        Event::parse(&entry.decode()?)
    }

    /// The fields in the order and form `lua/like_set.lua` has always written them, so entries
    /// already in the streams when the payload became typed still decode.
    #[test]
    fn events_parse_and_malformed_ones_are_refused() {
        let good = [
            ("event", "00ff"),
            ("user", "9"),
            ("kind", "2"),
            ("subject", "19"),
            ("liked", "1"),
            ("seq", "4"),
            ("at", "1763900000000"),
        ];
        let event = parse(&good).unwrap();
        assert_eq!(event.subject, Subject::Comment(19));
        assert!(event.liked);
        for (name, bad) in [
            ("kind", "7"),
            ("liked", "yes"),
            ("user", "x"),
            ("event", ""),
        ] {
            let fields: Vec<_> = good
                .iter()
                .map(|&(field, value)| (field, if field == name { bad } else { value }))
                .collect();
            assert!(parse(&fields).is_err(), "{name} = {bad}");
        }
        assert!(parse(&good[1..]).is_err());
    }
}
