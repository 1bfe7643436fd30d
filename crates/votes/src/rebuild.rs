//! Rebuilds every poll's boards from the SQL vote log: `pulse rebuild votes`.
//!
//! Per poll, the log is replayed in sequence order (the order the vote script applied the votes)
//! with the configuration each vote was cast under, through the same bucket and increment
//! functions as the script's caller, so every board gets the same doubles added in the same
//! order: the rebuilt scores equal the live ones exactly. The initial votes of the options go on
//! the ALL_TIME DISPLAY board (integers: their order does not matter). Each board is built aside
//! and renamed in, so readers never see half a board; the HyperLogLogs get every voter again, the
//! sequence is raised to the log's last, and the closed flag follows SQL.
//!
//! Ballots still in the archive stream are not in the log yet: run it once `pulse jobs status`
//! shows the votes archive drained, or after Redis lost its data (when the stream is gone too).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use pulse_runtime::error::{AppError, AppResult};
use pulse_runtime::redis::Redis;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use super::config::PollConfigs;
use super::periods::Period;
use super::service::{increment_of, targets};
use crate::entities::{polls, vote_log};
use crate::keys::VoteKeys;

/// Log rows read per query.
const PAGE: u64 = 5000;
/// Members per write command.
const CHUNK: usize = 500;

/// What a rebuild did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    pub polls: u64,
    pub votes: u64,
}

pub(super) async fn rebuild_all(
    db: &DatabaseConnection,
    redis: &Redis,
    retention: Duration,
) -> AppResult<Rebuilt> {
    let ids: Vec<i64> = polls::Entity::find()
        .select_only()
        .column(polls::Column::Id)
        .order_by_asc(polls::Column::Id)
        .into_tuple()
        .all(db)
        .await?;
    let mut rebuilt = Rebuilt::default();
    for poll in ids {
        rebuilt.votes += rebuild_poll(db, redis, poll, retention).await?;
        rebuilt.polls += 1;
    }
    Ok(rebuilt)
}

/// One board being rebuilt: its expiry and option → score.
#[derive(Default)]
struct Built {
    expire_at: Option<i64>,
    scores: BTreeMap<i64, f64>,
}

/// Rebuilds one poll; returns the votes replayed.
pub async fn rebuild_poll(
    db: &DatabaseConnection,
    redis: &Redis,
    poll: i64,
    retention: Duration,
) -> AppResult<u64> {
    let config = PollConfigs::new(db.clone(), redis.clone())
        .require(poll)
        .await?;
    let keys = redis.keys.poll(poll);
    let mut boards: HashMap<String, Built> = HashMap::new();
    let mut voters: HashSet<i64> = HashSet::new();
    let mut option_voters: HashMap<i64, HashSet<i64>> = HashMap::new();
    let mut last_seq = 0;
    let mut replayed = 0;
    loop {
        let rows = vote_log::Entity::find()
            .filter(vote_log::Column::PollId.eq(poll))
            .filter(vote_log::Column::Seq.gt(last_seq))
            .order_by_asc(vote_log::Column::Seq)
            .limit(PAGE)
            .all(db)
            .await?;
        let Some(last) = rows.last() else {
            break;
        };
        last_seq = last.seq;
        for row in rows {
            let corrupt = |what: &str| {
                AppError::Internal(format!("vote {} has a malformed {what}", row.event_id))
            };
            let periods = Period::split(&row.periods).ok_or_else(|| corrupt("period list"))?;
            let zone = row.timezone.parse().map_err(|_| corrupt("timezone"))?;
            let at: DateTime<Utc> =
                DateTime::from_timestamp_millis(row.at_ms).ok_or_else(|| corrupt("time"))?;
            for target in targets(&periods, row.carry_over, zone, at, retention) {
                let built = boards
                    .entry(keys.board(target.board.tag(), &target.bucket))
                    .or_default();
                built.expire_at = target.expire_at;
                *built.scores.entry(row.option_id).or_insert(0.0) +=
                    increment_of(&target, row.bonus, row.carry_over);
            }
            voters.insert(row.voter_id);
            option_voters
                .entry(row.option_id)
                .or_default()
                .insert(row.voter_id);
            replayed += 1;
        }
    }
    for option in &config.options {
        if option.initial_votes != 0 {
            *boards
                .entry(keys.board("d", "all"))
                .or_default()
                .scores
                .entry(option.id)
                .or_insert(0.0) += option.initial_votes as f64;
        }
    }

    let mut conn = redis.conn.clone();
    let now_ms = Utc::now().timestamp_millis();
    let mut stale: Vec<String> = redis.scan(keys.board_pattern()).collect().await?;
    stale.retain(|key| !key.ends_with(":rebuild"));
    let mut writes = redis::pipe();
    for (key, built) in &boards {
        if built.expire_at.is_some_and(|at| at <= now_ms) {
            continue;
        }
        let aside = format!("{key}:rebuild");
        writes.del(&aside).ignore();
        let members: Vec<(i64, f64)> = built.scores.iter().map(|(o, s)| (*o, *s)).collect();
        for chunk in members.chunks(CHUNK) {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&aside);
            for (option, score) in chunk {
                zadd.arg(score.to_string()).arg(option);
            }
            writes.add_command(zadd).ignore();
        }
        writes.rename(&aside, key).ignore();
        if let Some(at) = built.expire_at {
            writes.cmd("PEXPIREAT").arg(key).arg(at).ignore();
        }
    }
    for key in stale.iter().filter(|key| !boards.contains_key(*key)) {
        writes.del(key).ignore();
    }
    writes.del(keys.participants()).ignore();
    let voters: Vec<i64> = voters.into_iter().collect();
    for chunk in voters.chunks(CHUNK) {
        writes.pfadd(keys.participants(), chunk).ignore();
    }
    for option in &config.options {
        writes.del(keys.option_participants(option.id)).ignore();
        if let Some(set) = option_voters.get(&option.id) {
            let set: Vec<i64> = set.iter().copied().collect();
            for chunk in set.chunks(CHUNK) {
                writes
                    .pfadd(keys.option_participants(option.id), chunk)
                    .ignore();
            }
        }
    }
    if config.closed_at.is_some() {
        writes.set(keys.closed(), 1).ignore();
    } else {
        writes.del(keys.closed()).ignore();
    }
    writes.query_async::<()>(&mut conn).await?;
    // The sequence only rises: a live ballot since the log's last one keeps its number.
    let current: Option<i64> = redis::cmd("GET")
        .arg(keys.seq())
        .query_async(&mut conn)
        .await?;
    if current.unwrap_or(0) < last_seq {
        redis::cmd("SET")
            .arg(keys.seq())
            .arg(last_seq)
            .query_async::<()>(&mut conn)
            .await?;
    }
    Ok(replayed)
}
