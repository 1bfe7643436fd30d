//! Casting votes and reading boards.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use pulse_kit::Actor;
use pulse_runtime::error::{AppError, AppResult};
use pulse_runtime::redis::Redis;

use super::board::{self, Ranked};
use super::config::{NotOpen, PollConfig, PollConfigs};
use super::periods::{self, Bucket, Period};
use super::rules::{self, LimitScope, Rule};
use crate::keys::VoteKeys;
use crate::scripts::VOTE_CAST;

/// Most ballots in one `castVotes` call.
pub const MAX_BALLOTS: usize = 50;

/// DISPLAY counts each vote as the option's bonus; REAL counts 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Board {
    Display,
    Real,
}

impl Board {
    /// The board's letter in keys.
    pub fn tag(self) -> &'static str {
        match self {
            Self::Display => "d",
            Self::Real => "r",
        }
    }
}

/// What one vote adds to each board: REAL 1 and DISPLAY the bonus in the current period's bucket,
/// and `carry_over` times that in the next one's. Computed once, here, for the script and for the
/// rebuild alike, so both add the very same doubles.
pub fn increments(bonus: i32, carry_over: f64) -> [(Board, bool, f64); 4] {
    let bonus = f64::from(bonus);
    [
        (Board::Real, false, 1.0),
        (Board::Display, false, bonus),
        (Board::Real, true, carry_over),
        (Board::Display, true, carry_over * bonus),
    ]
}

/// One board of one period bucket a vote moves: its key and when it expires.
#[derive(Clone, Debug, PartialEq)]
pub struct BoardTarget {
    pub board: Board,
    /// The next period's bucket (credited with the carry-over), not the current one.
    pub next: bool,
    pub bucket: String,
    /// Ms since the epoch; `None` for ALL_TIME, kept for good.
    pub expire_at: Option<i64>,
}

/// Every board a vote at `at` moves in a poll with these periods and this carry-over.
pub fn targets(
    periods: &[Period],
    carry_over: f64,
    zone: chrono_tz::Tz,
    at: DateTime<Utc>,
    retention: Duration,
) -> Vec<BoardTarget> {
    let expire = |bucket: &Bucket| {
        bucket
            .end()
            .map(|end| end.timestamp_millis() + retention.as_millis() as i64)
    };
    let mut targets = Vec::new();
    for &period in periods {
        let current = periods::bucket(period, at, zone);
        let next = (carry_over > 0.0)
            .then(|| periods::next(period, &current, zone))
            .flatten();
        for board in [Board::Real, Board::Display] {
            targets.push(BoardTarget {
                board,
                next: false,
                bucket: current.id.clone(),
                expire_at: expire(&current),
            });
            if let Some(next) = &next {
                targets.push(BoardTarget {
                    board,
                    next: true,
                    bucket: next.id.clone(),
                    expire_at: expire(next),
                });
            }
        }
    }
    targets
}

/// The increment of `target` for a vote with this bonus and carry-over.
pub fn increment_of(target: &BoardTarget, bonus: i32, carry_over: f64) -> f64 {
    increments(bonus, carry_over)
        .into_iter()
        .find(|(board, next, _)| *board == target.board && *next == target.next)
        .map_or(0.0, |(_, _, value)| value)
}

/// One ballot as asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ballot {
    pub poll: i64,
    pub option: i64,
}

/// Why a ballot was not counted.
#[derive(Clone, Debug, PartialEq)]
pub enum Rejection {
    /// A rate-limit rule is at its limit; it may pass after `retry_after` seconds (never, for a
    /// rule over the whole poll).
    RateLimited {
        rule: Rule,
        retry_after: Option<i64>,
    },
    /// The poll is closed, not started or ended.
    PollNotOpen(NotOpen),
}

#[derive(Clone, Debug, PartialEq)]
pub struct BallotOutcome {
    pub ballot: Ballot,
    pub rejection: Option<Rejection>,
}

/// Where a vote comes from, for the rules that look at it.
#[derive(Clone, Debug, Default)]
pub struct Origin {
    pub channel: Option<String>,
    pub device: Option<String>,
}

/// A board of one period bucket, as it is read.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BoardKey {
    pub poll: i64,
    pub board: Board,
    pub bucket: String,
}

/// A board's scores, and the poll's vote sequence read with them (the board's version).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BoardScores {
    pub scores: HashMap<i64, f64>,
    pub version: i64,
}

/// Whose distinct voters to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Participants {
    Poll(i64),
    Option { poll: i64, option: i64 },
}

#[derive(Clone)]
pub struct VoteService {
    redis: Redis,
    configs: PollConfigs,
    retention: Duration,
    board_reads: Arc<AtomicU64>,
}

impl VoteService {
    pub fn new(redis: Redis, configs: PollConfigs, retention: Duration) -> Self {
        Self {
            redis,
            configs,
            retention,
            board_reads: Arc::default(),
        }
    }

    /// Rebuilds every poll's boards from the SQL vote log: `pulse rebuild votes`.
    pub async fn rebuild_all(&self) -> AppResult<super::rebuild::Rebuilt> {
        super::rebuild::rebuild_all(self.configs.db(), &self.redis, self.retention).await
    }

    pub fn configs(&self) -> &PollConfigs {
        &self.configs
    }

    /// Where `bucket` of `poll` stands now: current, past, future, before the poll opened, or
    /// past the retention of its board.
    pub fn period_state(&self, poll: &PollConfig, bucket: &Bucket) -> periods::PeriodState {
        let opened = poll
            .starts_at
            .map_or(poll.created_at, |start| start.max(poll.created_at));
        periods::state(bucket, Utc::now(), opened, self.retention)
    }

    pub fn redis_keys(&self) -> pulse_runtime::redis::Keys {
        self.redis.keys.clone()
    }

    /// Casts the signed-in actor's ballots at `now`, each with its own outcome, in the order given.
    /// Every poll and option is checked before anything is written; then each poll's ballots are
    /// one script call.
    #[tracing::instrument(skip_all, fields(ballots = ballots.len()))]
    pub async fn cast(
        &self,
        actor: &Actor,
        ballots: &[Ballot],
        origin: &Origin,
        now: DateTime<Utc>,
    ) -> AppResult<Vec<BallotOutcome>> {
        let voter = actor.require_user()?;
        if ballots.is_empty() || ballots.len() > MAX_BALLOTS {
            return Err(AppError::bad_input(
                "ballots",
                format!("give 1 to {MAX_BALLOTS} ballots"),
            ));
        }
        for (field, tag) in [("channel", &origin.channel), ("device", &origin.device)] {
            if let Some(tag) = tag
                && (tag.is_empty()
                    || tag.chars().count() > rules::MAX_TAG_CHARS
                    || tag.contains(['{', '}', ':']))
            {
                return Err(AppError::bad_input(
                    field,
                    format!(
                        "1 to {} characters, without braces or colons",
                        rules::MAX_TAG_CHARS
                    ),
                ));
            }
        }
        let mut by_poll: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (index, ballot) in ballots.iter().enumerate() {
            by_poll.entry(ballot.poll).or_default().push(index);
        }
        let mut configs = HashMap::new();
        for &poll in by_poll.keys() {
            let config = self.configs.require(poll).await?;
            for &index in &by_poll[&poll] {
                if config.option(ballots[index].option).is_none() {
                    return Err(AppError::bad_input(
                        "ballots",
                        "an option is not an option of its poll",
                    ));
                }
            }
            configs.insert(poll, config);
        }
        let picked: Vec<(&PollConfig, Vec<Ballot>)> = by_poll
            .iter()
            .map(|(poll, indexes)| {
                let ballots = indexes.iter().map(|&index| ballots[index]).collect();
                (configs[poll].as_ref(), ballots)
            })
            .collect();
        let calls = picked.iter().map(|(config, ballots)| {
            self.cast_in_poll(config, voter, actor.client_ip, ballots, origin, now)
        });
        let per_poll = futures_util::future::try_join_all(calls).await?;
        let mut outcomes: Vec<Option<BallotOutcome>> = vec![None; ballots.len()];
        for (indexes, results) in by_poll.values().zip(per_poll) {
            for (&index, outcome) in indexes.iter().zip(results) {
                outcomes[index] = Some(outcome);
            }
        }
        Ok(outcomes.into_iter().flatten().collect())
    }

    async fn cast_in_poll(
        &self,
        config: &PollConfig,
        voter: i64,
        ip: IpAddr,
        ballots: &[Ballot],
        origin: &Origin,
        now: DateTime<Utc>,
    ) -> AppResult<Vec<BallotOutcome>> {
        let refuse_all = |reason| {
            ballots
                .iter()
                .map(|&ballot| BallotOutcome {
                    ballot,
                    rejection: Some(Rejection::PollNotOpen(reason)),
                })
                .collect()
        };
        if let Some(reason) = config.not_open(now) {
            return Ok(refuse_all(reason));
        }
        let call = vote_cast_call(&CastCall {
            keys: &self.redis.keys,
            config,
            voter: &voter.to_string(),
            ip: &ip.to_string(),
            ballots,
            origin,
            now,
            retention: self.retention,
            event_prefix: &format!("{:032x}", rand::random::<u128>()),
            publish: self.redis.target.sharded_publish(),
        });
        let mut invocation = VOTE_CAST.prepare_invoke();
        for key in &call.keys {
            invocation.key(key);
        }
        for arg in &call.args {
            invocation.arg(arg);
        }
        let mut conn = self.redis.conn.clone();
        let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
        if reply == [-1] {
            return Ok(refuse_all(NotOpen::Closed));
        }
        if reply.len() != ballots.len() * 3 {
            return Err(AppError::Internal(format!(
                "vote_cast answered {} values for {} ballots",
                reply.len(),
                ballots.len()
            )));
        }
        let outcomes: Vec<BallotOutcome> = ballots
            .iter()
            .zip(reply.chunks_exact(3))
            .map(|(&ballot, result)| BallotOutcome {
                ballot,
                rejection: (result[0] == 0).then(|| Rejection::RateLimited {
                    rule: config.rules[result[1] as usize].clone(),
                    retry_after: (result[2] >= 0).then_some(result[2]),
                }),
            })
            .collect();
        let accepted = outcomes.iter().filter(|o| o.rejection.is_none()).count();
        metrics::counter!("pulse_votes_total", "outcome" => "accepted").increment(accepted as u64);
        metrics::counter!("pulse_votes_total", "outcome" => "rate_limited")
            .increment((outcomes.len() - accepted) as u64);
        Ok(outcomes)
    }

    /// The scores of several boards and their polls' vote sequences: one pipelined round trip.
    #[tracing::instrument(skip_all, fields(boards = boards.len()))]
    pub async fn scores(&self, boards: &[BoardKey]) -> AppResult<HashMap<BoardKey, BoardScores>> {
        let mut pipe = redis::pipe();
        for board in boards {
            let keys = self.redis.keys.poll(board.poll);
            pipe.cmd("ZRANGE")
                .arg(keys.board(board.board.tag(), &board.bucket))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .get(keys.seq());
        }
        self.board_reads
            .fetch_add(boards.len() as u64, Ordering::Relaxed);
        metrics::counter!("pulse_vote_board_reads_total").increment(boards.len() as u64);
        let mut conn = self.redis.conn.clone();
        let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let mut read = HashMap::with_capacity(boards.len());
        for (board, reply) in boards.iter().zip(replies.chunks_exact(2)) {
            let members: Vec<(i64, f64)> = redis::from_redis_value(reply[0].clone())
                .map_err(|err| AppError::Internal(format!("a board read answered {err}")))?;
            let version: Option<i64> = redis::from_redis_value(reply[1].clone())
                .map_err(|err| AppError::Internal(format!("a board read answered {err}")))?;
            read.insert(
                board.clone(),
                BoardScores {
                    scores: members.into_iter().collect(),
                    version: version.unwrap_or(0),
                },
            );
        }
        Ok(read)
    }

    /// Board reads this process has made (each board of a pipelined read counts once).
    pub fn board_reads(&self) -> u64 {
        self.board_reads.load(Ordering::Relaxed)
    }

    /// Distinct-voter estimates: one pipelined round trip.
    pub async fn participants(
        &self,
        whose: &[Participants],
    ) -> AppResult<HashMap<Participants, i64>> {
        let mut pipe = redis::pipe();
        for &who in whose {
            let key = match who {
                Participants::Poll(poll) => self.redis.keys.poll(poll).participants(),
                Participants::Option { poll, option } => {
                    self.redis.keys.poll(poll).option_participants(option)
                }
            };
            pipe.cmd("PFCOUNT").arg(key);
        }
        let mut conn = self.redis.conn.clone();
        let counts: Vec<i64> = pipe.query_async(&mut conn).await?;
        Ok(whose.iter().copied().zip(counts).collect())
    }
}

/// What one call of `lua/vote_cast.lua` is made of.
pub struct CastCall<'a> {
    pub keys: &'a pulse_runtime::redis::Keys,
    pub config: &'a PollConfig,
    /// The voter's user id as the script records it (the load tool's ceiling passes a
    /// placeholder).
    pub voter: &'a str,
    pub ip: &'a str,
    /// Ballots of `config`'s poll, with options of it.
    pub ballots: &'a [Ballot],
    pub origin: &'a Origin,
    pub now: DateTime<Utc>,
    pub retention: Duration,
    pub event_prefix: &'a str,
    /// The command announcing the move on the poll's channel ([`pulse_runtime::redis::Target::sharded_publish`]).
    pub publish: &'a str,
}

/// The script's KEYS and ARGV for a call; see the header of `lua/vote_cast.lua`.
pub struct ScriptCall {
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// Builds the vote script's call: shared by the service and the load tool's same-run ceiling,
/// so both run the very same work.
pub fn vote_cast_call(call: &CastCall<'_>) -> ScriptCall {
    let config = call.config;
    let keys = call.keys.poll(config.id);
    let targets = targets(
        &config.periods,
        config.carry_over,
        config.zone,
        call.now,
        call.retention,
    );
    let applicable = rules::applicable(
        &config.rules,
        call.origin.channel.as_deref(),
        call.origin.device.as_deref(),
    );
    let stream = super::archive::SPEC
        .keys_in(call.keys, keys.shard())
        .stream();
    let mut script_keys = vec![keys.closed(), keys.seq(), keys.participants(), stream];
    script_keys.extend(
        targets
            .iter()
            .map(|target| keys.board(target.board.tag(), &target.bucket)),
    );
    let mut args: Vec<String> = vec![
        call.now.timestamp_millis().to_string(),
        call.voter.to_owned(),
        call.event_prefix.to_owned(),
        call.origin.channel.clone().unwrap_or_default(),
        call.origin.device.clone().unwrap_or_default(),
        config.id.to_string(),
        Period::join(&config.periods),
        config.zone.name().to_owned(),
        config.carry_over.to_string(),
        keys.votes_channel(),
        targets.len().to_string(),
        call.ballots.len().to_string(),
        call.publish.to_owned(),
    ];
    args.extend(
        targets
            .iter()
            .map(|target| target.expire_at.unwrap_or(0).to_string()),
    );
    for ballot in call.ballots {
        let option = config
            .option(ballot.option)
            .expect("options are checked before a call is built");
        script_keys.push(keys.option_participants(option.id));
        args.extend([
            option.id.to_string(),
            option.bonus.to_string(),
            applicable.len().to_string(),
        ]);
        args.extend(
            targets
                .iter()
                .map(|target| increment_of(target, option.bonus, config.carry_over).to_string()),
        );
        for &(index, rule) in &applicable {
            let subject = match rule.scope {
                LimitScope::Voter => call.voter.to_owned(),
                LimitScope::Ip => call.ip.to_owned(),
                LimitScope::Option => option.id.to_string(),
            };
            let (window, end) = rule.window.current(call.now, config.zone);
            let end = end.or(config.ends_at);
            let left_ms = end.map(|end| (end - call.now).num_milliseconds().max(1));
            let retry_after = match rule.window {
                rules::LimitWindow::Poll => -1,
                _ => left_ms.map_or(-1, |ms| (ms + 999) / 1000),
            };
            script_keys.push(keys.limit_counter(&rule.counter_name(), &subject, &window));
            args.extend([
                rule.limit.to_string(),
                left_ms.map_or(0, |ms| ms + 1_000).to_string(),
                retry_after.to_string(),
                index.to_string(),
            ]);
        }
    }
    ScriptCall {
        keys: script_keys,
        args,
    }
}

/// A board ranked for reading: which bucket, and every option in order.
#[derive(Clone, Debug, PartialEq)]
pub struct RankedBoard {
    pub bucket: Bucket,
    pub ranked: Vec<Ranked>,
    pub version: i64,
}

/// Ranks a board read for `config` under its tie policy.
pub fn ranked(config: &PollConfig, bucket: Bucket, scores: &BoardScores) -> RankedBoard {
    RankedBoard {
        ranked: board::rank(&scores.scores, &config.option_ids(), config.tie_policy),
        bucket,
        version: scores.version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_periods_with_carry_over_move_eighteen_boards() {
        let at: DateTime<Utc> = "2026-11-25T10:00:00Z".parse().unwrap();
        let all = targets(&Period::ALL, 0.1, chrono_tz::UTC, at, Duration::ZERO);
        assert_eq!(all.len(), 18);
        let without_carry = targets(&Period::ALL, 0.0, chrono_tz::UTC, at, Duration::ZERO);
        assert_eq!(without_carry.len(), 10);
        let display_next = all
            .iter()
            .find(|t| t.board == Board::Display && t.next && t.bucket == "20261126")
            .unwrap();
        assert!((increment_of(display_next, 3, 0.1) - 0.3).abs() < 1e-12);
    }
}
