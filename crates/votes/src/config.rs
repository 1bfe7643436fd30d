//! Poll configuration as each process keeps it: loaded from SQL on first use, kept in memory
//! (seed 001 does the same: a vote reads no SQL), and dropped on every process within moments of
//! an admin's change, which is announced on a pub/sub channel. An entry also expires after a
//! while, in case an announcement was missed while the pub/sub connection was down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use futures_util::StreamExt as _;
use pulse_runtime::error::{AppError, AppResult, SharedResult};
use pulse_runtime::pagination::{Page, PageRequest, Position};
use pulse_runtime::realtime::Hub;
use pulse_runtime::redis::Redis;
use pulse_runtime::sql::retry_once;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use singleflight_async::SingleFlight;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::board::TiePolicy;
use super::periods::Period;
use super::rules::{LimitScope, LimitWindow, Rule};
use crate::entities::{poll_options, poll_rules, polls};
use crate::keys::VoteKeys;

/// How long a process trusts its copy of a poll without hearing of a change.
const MAX_AGE: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, PartialEq)]
pub struct PollConfig {
    pub id: i64,
    pub title: String,
    pub zone: Tz,
    pub periods: Vec<Period>,
    pub carry_over: f64,
    pub tie_policy: TiePolicy,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    pub closed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// In creation order.
    pub options: Vec<OptionConfig>,
    pub rules: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionConfig {
    pub id: i64,
    pub poll_id: i64,
    pub label: String,
    pub bonus: i32,
    pub initial_votes: i64,
}

impl PollConfig {
    pub fn option(&self, option: i64) -> Option<&OptionConfig> {
        self.options.iter().find(|candidate| candidate.id == option)
    }

    pub fn option_ids(&self) -> Vec<i64> {
        self.options.iter().map(|option| option.id).collect()
    }

    /// Why a ballot at `at` cannot be cast, if it cannot.
    pub fn not_open(&self, at: DateTime<Utc>) -> Option<NotOpen> {
        if self.closed_at.is_some() {
            Some(NotOpen::Closed)
        } else if self.starts_at.is_some_and(|start| at < start) {
            Some(NotOpen::NotStarted)
        } else if self.ends_at.is_some_and(|end| at >= end) {
            Some(NotOpen::Ended)
        } else {
            None
        }
    }

    /// `BAD_USER_INPUT` unless the poll keeps boards of `period`.
    pub fn require_period(&self, period: Period) -> AppResult<()> {
        if self.periods.contains(&period) {
            Ok(())
        } else {
            Err(AppError::bad_input(
                "period",
                format!("this poll keeps no {} boards", period.name()),
            ))
        }
    }

    fn from_rows(
        poll: polls::Model,
        options: Vec<poll_options::Model>,
        rules: Vec<poll_rules::Model>,
    ) -> AppResult<Self> {
        let corrupt =
            |what: &str| AppError::Internal(format!("poll {} has a malformed {what}", poll.id));
        let rules = rules
            .into_iter()
            .map(|rule| {
                Ok(Rule {
                    scope: LimitScope::parse(&rule.scope).ok_or_else(|| corrupt("rule scope"))?,
                    window: LimitWindow::parse(&rule.window)
                        .ok_or_else(|| corrupt("rule window"))?,
                    limit: rule.limit,
                    channel: rule.channel,
                    device: rule.device,
                })
            })
            .collect::<AppResult<Vec<_>>>()?;
        Ok(Self {
            id: poll.id,
            zone: poll.timezone.parse().map_err(|_| corrupt("timezone"))?,
            periods: Period::split(&poll.periods).ok_or_else(|| corrupt("period list"))?,
            tie_policy: TiePolicy::parse(&poll.tie_policy).ok_or_else(|| corrupt("tie policy"))?,
            title: poll.title,
            carry_over: poll.carry_over,
            starts_at: poll.starts_at.map(|at| at.and_utc()),
            ends_at: poll.ends_at.map(|at| at.and_utc()),
            closed_at: poll.closed_at.map(|at| at.and_utc()),
            created_at: poll.created_at.and_utc(),
            options: options
                .into_iter()
                .map(|option| OptionConfig {
                    id: option.id,
                    poll_id: option.poll_id,
                    label: option.label,
                    bonus: option.bonus,
                    initial_votes: option.initial_votes,
                })
                .collect(),
            rules,
        })
    }
}

/// Why a poll takes no ballots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotOpen {
    Closed,
    NotStarted,
    Ended,
}

type Cached = (Instant, Arc<PollConfig>);

/// The process's poll configurations.
#[derive(Clone)]
pub struct PollConfigs {
    db: DatabaseConnection,
    redis: Redis,
    cache: Arc<Mutex<Cache>>,
    loads: Arc<SingleFlight<i64, SharedResult<Option<Arc<PollConfig>>>>>,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<i64, Cached>,
    /// Grows with every invalidation, so a load that began before one does not store what it read.
    generation: u64,
}

/// The walk of `polls(first, after)`: newest first.
pub const POLLS: pulse_runtime::pagination::Walk = pulse_runtime::pagination::Walk("polls");

impl PollConfigs {
    pub(super) fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    pub fn new(db: DatabaseConnection, redis: Redis) -> Self {
        Self {
            db,
            redis,
            cache: Arc::default(),
            loads: Arc::default(),
        }
    }

    /// Listens for changes announced by any process and drops them from this one's cache.
    pub fn start_invalidation(&self, hub: &Hub, tasks: &TaskTracker, shutdown: &CancellationToken) {
        let mut changes = hub.subscribe(self.redis.keys.polls_changed_channel());
        let configs = self.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    change = changes.next() => match change {
                        Some(payload) => {
                            let poll = std::str::from_utf8(&payload).ok().and_then(|id| id.parse().ok());
                            match poll {
                                Some(poll) => configs.forget(poll),
                                None => configs.forget_all(),
                            }
                        }
                        None => break,
                    },
                }
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn forget(&self, poll: i64) {
        let mut cache = self.lock();
        cache.entries.remove(&poll);
        cache.generation += 1;
    }

    fn forget_all(&self) {
        let mut cache = self.lock();
        cache.entries.clear();
        cache.generation += 1;
    }

    /// Drops `poll` here and tells every other process to.
    pub async fn announce_change(&self, poll: i64) -> AppResult<()> {
        self.forget(poll);
        let mut conn = self.redis.conn.clone();
        redis::cmd("PUBLISH")
            .arg(self.redis.keys.polls_changed_channel())
            .arg(poll)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// A poll's configuration, from memory when this process has it; `None` for no such poll.
    pub async fn get(&self, poll: i64) -> AppResult<Option<Arc<PollConfig>>> {
        {
            let cache = self.lock();
            if let Some((loaded, config)) = cache.entries.get(&poll)
                && loaded.elapsed() < MAX_AGE
            {
                return Ok(Some(config.clone()));
            }
        }
        let load = || async {
            let generation = self.lock().generation;
            let loaded = self.load(poll).await.map_err(AppError::shared)?;
            let mut cache = self.lock();
            if let Some(config) = &loaded
                && cache.generation == generation
            {
                cache.entries.insert(poll, (Instant::now(), config.clone()));
            }
            Ok(loaded)
        };
        self.loads.work(poll, load).await.map_err(AppError::Shared)
    }

    /// A poll's configuration, or `NOT_FOUND`.
    pub async fn require(&self, poll: i64) -> AppResult<Arc<PollConfig>> {
        self.get(poll).await?.ok_or(AppError::NotFound("poll"))
    }

    async fn load(&self, poll: i64) -> AppResult<Option<Arc<PollConfig>>> {
        let Some(row) = retry_once(|| polls::Entity::find_by_id(poll).one(&self.db)).await? else {
            return Ok(None);
        };
        let options = retry_once(|| {
            poll_options::Entity::find()
                .filter(poll_options::Column::PollId.eq(poll))
                .order_by_asc(poll_options::Column::Id)
                .all(&self.db)
        })
        .await?;
        let rules = retry_once(|| {
            poll_rules::Entity::find()
                .filter(poll_rules::Column::PollId.eq(poll))
                .order_by_asc(poll_rules::Column::Id)
                .all(&self.db)
        })
        .await?;
        PollConfig::from_rows(row, options, rules).map(|config| Some(Arc::new(config)))
    }

    /// A page of poll ids, newest first.
    pub async fn list(&self, page: PageRequest) -> AppResult<Page<i64>> {
        let mut query = polls::Entity::find()
            .select_only()
            .column(polls::Column::Id)
            .order_by_desc(polls::Column::Id)
            .limit(page.fetch_limit());
        if let Some(after) = page.after {
            query = query.filter(polls::Column::Id.lt(after.id));
        }
        let ids = retry_once(|| query.clone().into_tuple::<i64>().all(&self.db)).await?;
        Ok(Page::from_overfetch(ids, &page, |id| Position::id(*id)))
    }

    /// The poll an option belongs to, or `NOT_FOUND`.
    pub async fn poll_of_option(&self, option: i64) -> AppResult<i64> {
        let query = poll_options::Entity::find_by_id(option)
            .select_only()
            .column(poll_options::Column::PollId);
        retry_once(|| query.clone().into_tuple::<i64>().one(&self.db))
            .await?
            .ok_or(AppError::NotFound("poll option"))
    }
}
