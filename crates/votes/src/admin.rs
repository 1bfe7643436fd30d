//! Admin changes to polls: SQL first (the truth), then what Redis must reflect at once (an
//! option's initial votes on the ALL_TIME DISPLAY board, a closed poll's flag), then the
//! announcement that makes every process drop its cached copy.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use pulse_kit::{Actor, Admins};
use pulse_runtime::error::{AppError, AppResult};
use pulse_runtime::redis::Redis;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter,
    TransactionTrait,
};

use super::board::TiePolicy;
use super::config::{OptionConfig, PollConfig, PollConfigs};
use super::periods::Period;
use super::rules::{self, Rule};
use crate::entities::{poll_options, poll_rules, polls};
use crate::keys::VoteKeys;

/// Most options one poll may have: a board read ranks them all.
pub const MAX_OPTIONS: usize = 500;
const MAX_TITLE_CHARS: usize = 200;
const MAX_BONUS: i32 = 1_000_000;
const MAX_INITIAL_VOTES: i64 = 1_000_000_000_000;

/// A poll as an admin describes it.
#[derive(Clone, Debug)]
pub struct NewPoll {
    pub title: String,
    pub timezone: String,
    pub periods: Vec<Period>,
    pub carry_over: f64,
    pub tie_policy: TiePolicy,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    pub rules: Vec<Rule>,
    pub options: Vec<NewOption>,
}

/// What an admin changes in a poll: `None` leaves a field as it is.
#[derive(Clone, Debug, Default)]
pub struct PollChanges {
    pub title: Option<String>,
    pub timezone: Option<String>,
    pub periods: Option<Vec<Period>>,
    pub carry_over: Option<f64>,
    pub tie_policy: Option<TiePolicy>,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    pub rules: Option<Vec<Rule>>,
}

#[derive(Clone, Debug)]
pub struct NewOption {
    pub label: String,
    pub bonus: i32,
    pub initial_votes: i64,
}

#[derive(Clone)]
pub struct PollAdminService {
    db: DatabaseConnection,
    redis: Redis,
    admins: Arc<dyn Admins>,
    configs: PollConfigs,
}

impl PollAdminService {
    pub fn new(
        db: DatabaseConnection,
        redis: Redis,
        admins: Arc<dyn Admins>,
        configs: PollConfigs,
    ) -> Self {
        Self {
            db,
            redis,
            admins,
            configs,
        }
    }

    async fn require_admin(&self, actor: &Actor) -> AppResult<()> {
        let user = actor.require_user()?;
        self.admins.require_admin(user).await
    }

    pub async fn create(&self, actor: &Actor, poll: NewPoll) -> AppResult<Arc<PollConfig>> {
        self.require_admin(actor).await?;
        validate_title(&poll.title)?;
        parse_zone(&poll.timezone)?;
        validate_periods(&poll.periods)?;
        validate_carry_over(poll.carry_over)?;
        validate_span(poll.starts_at, poll.ends_at)?;
        rules::validate(&poll.rules)?;
        if poll.options.len() > MAX_OPTIONS {
            return Err(AppError::bad_input(
                "options",
                format!("a poll has at most {MAX_OPTIONS} options"),
            ));
        }
        for option in &poll.options {
            validate_option(option)?;
        }
        let now = pulse_runtime::sql::now();
        let txn = self.db.begin().await?;
        let row = polls::ActiveModel {
            title: Set(poll.title.trim().to_owned()),
            timezone: Set(poll.timezone.clone()),
            periods: Set(Period::join(&poll.periods)),
            carry_over: Set(poll.carry_over),
            tie_policy: Set(poll.tie_policy.name().to_owned()),
            starts_at: Set(poll.starts_at.map(|at| at.naive_utc())),
            ends_at: Set(poll.ends_at.map(|at| at.naive_utc())),
            closed_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        insert_rules(&txn, row.id, &poll.rules).await?;
        let mut initial = Vec::new();
        for option in &poll.options {
            let inserted = insert_option(&txn, row.id, option).await?;
            initial.push((inserted.id, inserted.initial_votes));
        }
        txn.commit().await?;
        self.add_initial_votes(row.id, &initial).await?;
        self.configs.announce_change(row.id).await?;
        self.configs.require(row.id).await
    }

    pub async fn update(
        &self,
        actor: &Actor,
        poll: i64,
        changes: PollChanges,
    ) -> AppResult<Arc<PollConfig>> {
        self.require_admin(actor).await?;
        let current = self.configs.require(poll).await?;
        if let Some(title) = &changes.title {
            validate_title(title)?;
        }
        if let Some(zone) = &changes.timezone {
            parse_zone(zone)?;
        }
        if let Some(periods) = &changes.periods {
            validate_periods(periods)?;
        }
        if let Some(carry_over) = changes.carry_over {
            validate_carry_over(carry_over)?;
        }
        validate_span(
            changes.starts_at.or(current.starts_at),
            changes.ends_at.or(current.ends_at),
        )?;
        if let Some(rules) = &changes.rules {
            rules::validate(rules)?;
        }
        let txn = self.db.begin().await?;
        let mut row: polls::ActiveModel = polls::Entity::find_by_id(poll)
            .one(&txn)
            .await?
            .ok_or(AppError::NotFound("poll"))?
            .into();
        if let Some(title) = changes.title {
            row.title = Set(title.trim().to_owned());
        }
        if let Some(zone) = changes.timezone {
            row.timezone = Set(zone);
        }
        if let Some(periods) = changes.periods {
            row.periods = Set(Period::join(&periods));
        }
        if let Some(carry_over) = changes.carry_over {
            row.carry_over = Set(carry_over);
        }
        if let Some(policy) = changes.tie_policy {
            row.tie_policy = Set(policy.name().to_owned());
        }
        if let Some(at) = changes.starts_at {
            row.starts_at = Set(Some(at.naive_utc()));
        }
        if let Some(at) = changes.ends_at {
            row.ends_at = Set(Some(at.naive_utc()));
        }
        row.updated_at = Set(pulse_runtime::sql::now());
        row.update(&txn).await?;
        if let Some(rules) = &changes.rules {
            poll_rules::Entity::delete_many()
                .filter(poll_rules::Column::PollId.eq(poll))
                .exec(&txn)
                .await?;
            insert_rules(&txn, poll, rules).await?;
        }
        txn.commit().await?;
        self.configs.announce_change(poll).await?;
        self.configs.require(poll).await
    }

    pub async fn add_option(
        &self,
        actor: &Actor,
        poll: i64,
        option: NewOption,
    ) -> AppResult<OptionConfig> {
        self.require_admin(actor).await?;
        validate_option(&option)?;
        let current = self.configs.require(poll).await?;
        if current.options.len() >= MAX_OPTIONS {
            return Err(AppError::bad_input(
                "pollId",
                format!("a poll has at most {MAX_OPTIONS} options"),
            ));
        }
        let txn = self.db.begin().await?;
        let inserted = insert_option(&txn, poll, &option).await?;
        txn.commit().await?;
        self.add_initial_votes(poll, &[(inserted.id, inserted.initial_votes)])
            .await?;
        self.configs.announce_change(poll).await?;
        Ok(option_config(inserted))
    }

    pub async fn update_option(
        &self,
        actor: &Actor,
        option: i64,
        changes: NewOption,
    ) -> AppResult<OptionConfig> {
        self.require_admin(actor).await?;
        validate_option(&changes)?;
        let row = poll_options::Entity::find_by_id(option)
            .one(&self.db)
            .await?
            .ok_or(AppError::NotFound("poll option"))?;
        let delta = changes.initial_votes - row.initial_votes;
        let poll = row.poll_id;
        let mut active: poll_options::ActiveModel = row.into();
        active.label = Set(changes.label.trim().to_owned());
        active.bonus = Set(changes.bonus);
        active.initial_votes = Set(changes.initial_votes);
        let updated = active.update(&self.db).await?;
        self.add_initial_votes(poll, &[(option, delta)]).await?;
        self.configs.announce_change(poll).await?;
        Ok(option_config(updated))
    }

    /// Closes a poll for good: SQL records it, and the flag in Redis makes the vote script refuse
    /// every later ballot at once, on every process.
    pub async fn close(&self, actor: &Actor, poll: i64) -> AppResult<Arc<PollConfig>> {
        self.require_admin(actor).await?;
        let row = polls::Entity::find_by_id(poll)
            .one(&self.db)
            .await?
            .ok_or(AppError::NotFound("poll"))?;
        if row.closed_at.is_none() {
            let mut active: polls::ActiveModel = row.into();
            active.closed_at = Set(Some(pulse_runtime::sql::now()));
            active.updated_at = Set(pulse_runtime::sql::now());
            active.update(&self.db).await?;
        }
        let mut conn = self.redis.conn.clone();
        redis::cmd("SET")
            .arg(self.redis.keys.poll(poll).closed())
            .arg(1)
            .query_async::<()>(&mut conn)
            .await?;
        self.configs.announce_change(poll).await?;
        self.configs.require(poll).await
    }

    /// Initial votes count on the ALL_TIME DISPLAY board (a change counts its difference).
    async fn add_initial_votes(&self, poll: i64, deltas: &[(i64, i64)]) -> AppResult<()> {
        let board = self.redis.keys.poll(poll).board("d", "all");
        let deltas: Vec<_> = deltas.iter().filter(|(_, delta)| *delta != 0).collect();
        if deltas.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for &&(option, delta) in &deltas {
            pipe.zincr(&board, option, delta).ignore();
        }
        let mut conn = self.redis.conn.clone();
        pipe.query_async::<()>(&mut conn).await?;
        Ok(())
    }
}

fn option_config(row: poll_options::Model) -> OptionConfig {
    OptionConfig {
        id: row.id,
        poll_id: row.poll_id,
        label: row.label,
        bonus: row.bonus,
        initial_votes: row.initial_votes,
    }
}

async fn insert_rules(
    txn: &sea_orm::DatabaseTransaction,
    poll: i64,
    rules: &[Rule],
) -> AppResult<()> {
    if rules.is_empty() {
        return Ok(());
    }
    let rows = rules.iter().map(|rule| poll_rules::ActiveModel {
        poll_id: Set(poll),
        scope: Set(rule.scope.name().to_owned()),
        window: Set(rule.window.name().to_owned()),
        limit: Set(rule.limit),
        channel: Set(rule.channel.clone()),
        device: Set(rule.device.clone()),
        ..Default::default()
    });
    poll_rules::Entity::insert_many(rows)
        .exec_without_returning(txn)
        .await?;
    Ok(())
}

async fn insert_option(
    txn: &sea_orm::DatabaseTransaction,
    poll: i64,
    option: &NewOption,
) -> AppResult<poll_options::Model> {
    Ok(poll_options::ActiveModel {
        poll_id: Set(poll),
        label: Set(option.label.trim().to_owned()),
        bonus: Set(option.bonus),
        initial_votes: Set(option.initial_votes),
        created_at: Set(pulse_runtime::sql::now()),
        ..Default::default()
    }
    .insert(txn)
    .await?)
}

fn validate_title(title: &str) -> AppResult<()> {
    let length = title.trim().chars().count();
    if (1..=MAX_TITLE_CHARS).contains(&length) {
        Ok(())
    } else {
        Err(AppError::bad_input(
            "title",
            format!("a title has 1 to {MAX_TITLE_CHARS} characters"),
        ))
    }
}

/// An IANA zone name, e.g. `Europe/Paris`.
pub fn parse_zone(zone: &str) -> AppResult<Tz> {
    zone.parse::<Tz>()
        .map_err(|_| AppError::bad_input("timezone", format!("{zone:?} is not an IANA time zone")))
}

fn validate_periods(periods: &[Period]) -> AppResult<()> {
    let mut sorted = periods.to_vec();
    sorted.sort();
    sorted.dedup();
    if periods.is_empty() || sorted.len() != periods.len() {
        return Err(AppError::bad_input(
            "periods",
            "give one or more periods, each once",
        ));
    }
    Ok(())
}

fn validate_carry_over(carry_over: f64) -> AppResult<()> {
    if (0.0..=1.0).contains(&carry_over) {
        Ok(())
    } else {
        Err(AppError::bad_input(
            "carryOver",
            "carry-over is a fraction between 0 and 1",
        ))
    }
}

fn validate_span(
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
) -> AppResult<()> {
    match (starts_at, ends_at) {
        (Some(start), Some(end)) if start >= end => {
            Err(AppError::bad_input("endsAt", "a poll ends after it starts"))
        }
        _ => Ok(()),
    }
}

fn validate_option(option: &NewOption) -> AppResult<()> {
    let length = option.label.trim().chars().count();
    if !(1..=MAX_TITLE_CHARS).contains(&length) {
        return Err(AppError::bad_input(
            "label",
            format!("a label has 1 to {MAX_TITLE_CHARS} characters"),
        ));
    }
    if !(1..=MAX_BONUS).contains(&option.bonus) {
        return Err(AppError::bad_input(
            "bonus",
            format!("a bonus is between 1 and {MAX_BONUS}"),
        ));
    }
    if !(0..=MAX_INITIAL_VOTES).contains(&option.initial_votes) {
        return Err(AppError::bad_input(
            "initialVotes",
            format!("initial votes are between 0 and {MAX_INITIAL_VOTES}"),
        ));
    }
    Ok(())
}
