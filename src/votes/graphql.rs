use std::sync::Arc;

use async_graphql::connection::PageInfo;
use async_graphql::{Context, Enum, ID, InputObject, Object, SimpleObject, Subscription};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt as _};

use super::admin::{NewOption, NewPoll, PollChanges};
use super::board::{self, Ranked, TiePolicy};
use super::config::{NotOpen, OptionConfig, PollConfig};
use super::live::LiveBoard;
use super::loader::{BoardLoader, ParticipantsLoader};
use super::periods::{self, Bucket, Period, PeriodState};
use super::rules::{LimitScope, LimitWindow, Rule};
use super::service::{
    self, Ballot, BallotOutcome, Board, BoardKey, Origin, Participants, Rejection,
};
use crate::error::{AppError, GqlResultExt};
use crate::graphql::ids::{self, NodeType};
use crate::graphql::pagination::Connected;
use crate::graphql::{actor, loaders, services};
use crate::pagination::{PageRequest, page_size};

/// Most entries one leaderboard page holds.
const MAX_LEADERBOARD_PAGE: i32 = 100;

/// What a leaderboard's period is, next to now and the poll's life.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "PeriodState", remote = "PeriodState")]
pub enum PeriodStateGql {
    /// The period holding now (ALL_TIME always): the live board.
    Current,
    /// Ended within `PULSE_VOTE_BUCKET_RETENTION`: the board as the period ended.
    Past,
    /// Not begun: only the carry-over credited to it so far.
    Future,
    /// Ends before the poll opened to votes (its creation or `startsAt`): every score is 0.
    BeforePoll,
    /// Ended longer ago than `PULSE_VOTE_BUCKET_RETENTION`: its board is no longer kept, and the
    /// leaderboard has no entries.
    Expired,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "Period")]
pub enum PeriodGql {
    Hour,
    Day,
    /// An ISO week (Monday to Monday) of the poll's zone.
    Week,
    Month,
    AllTime,
}

impl From<PeriodGql> for Period {
    fn from(period: PeriodGql) -> Self {
        match period {
            PeriodGql::Hour => Self::Hour,
            PeriodGql::Day => Self::Day,
            PeriodGql::Week => Self::Week,
            PeriodGql::Month => Self::Month,
            PeriodGql::AllTime => Self::AllTime,
        }
    }
}

impl From<Period> for PeriodGql {
    fn from(period: Period) -> Self {
        match period {
            Period::Hour => Self::Hour,
            Period::Day => Self::Day,
            Period::Week => Self::Week,
            Period::Month => Self::Month,
            Period::AllTime => Self::AllTime,
        }
    }
}

/// DISPLAY counts each vote as the option's bonus N; REAL counts 1.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "Board")]
pub enum BoardGql {
    Display,
    Real,
}

impl From<BoardGql> for Board {
    fn from(board: BoardGql) -> Self {
        match board {
            BoardGql::Display => Self::Display,
            BoardGql::Real => Self::Real,
        }
    }
}

impl From<Board> for BoardGql {
    fn from(board: Board) -> Self {
        match board {
            Board::Display => Self::Display,
            Board::Real => Self::Real,
        }
    }
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "TiePolicy")]
pub enum TiePolicyGql {
    /// 1, 2, 3: ties ordered by option id.
    Ordinal,
    /// 1, 1, 2.
    Dense,
    /// 1, 1, 3.
    Competition,
}

impl From<TiePolicyGql> for TiePolicy {
    fn from(policy: TiePolicyGql) -> Self {
        match policy {
            TiePolicyGql::Ordinal => Self::Ordinal,
            TiePolicyGql::Dense => Self::Dense,
            TiePolicyGql::Competition => Self::Competition,
        }
    }
}

impl From<TiePolicy> for TiePolicyGql {
    fn from(policy: TiePolicy) -> Self {
        match policy {
            TiePolicy::Ordinal => Self::Ordinal,
            TiePolicy::Dense => Self::Dense,
            TiePolicy::Competition => Self::Competition,
        }
    }
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "LimitScope")]
pub enum LimitScopeGql {
    Voter,
    Ip,
    Option,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "LimitWindow")]
pub enum LimitWindowGql {
    Second,
    Minute,
    /// A local hour of the poll's zone; DAY, WEEK and MONTH too.
    Hour,
    Day,
    Week,
    Month,
    /// The poll's whole life.
    Poll,
}

impl From<LimitScopeGql> for LimitScope {
    fn from(scope: LimitScopeGql) -> Self {
        match scope {
            LimitScopeGql::Voter => Self::Voter,
            LimitScopeGql::Ip => Self::Ip,
            LimitScopeGql::Option => Self::Option,
        }
    }
}

impl From<LimitScope> for LimitScopeGql {
    fn from(scope: LimitScope) -> Self {
        match scope {
            LimitScope::Voter => Self::Voter,
            LimitScope::Ip => Self::Ip,
            LimitScope::Option => Self::Option,
        }
    }
}

impl From<LimitWindowGql> for LimitWindow {
    fn from(window: LimitWindowGql) -> Self {
        match window {
            LimitWindowGql::Second => Self::Second,
            LimitWindowGql::Minute => Self::Minute,
            LimitWindowGql::Hour => Self::Hour,
            LimitWindowGql::Day => Self::Day,
            LimitWindowGql::Week => Self::Week,
            LimitWindowGql::Month => Self::Month,
            LimitWindowGql::Poll => Self::Poll,
        }
    }
}

impl From<LimitWindow> for LimitWindowGql {
    fn from(window: LimitWindow) -> Self {
        match window {
            LimitWindow::Second => Self::Second,
            LimitWindow::Minute => Self::Minute,
            LimitWindow::Hour => Self::Hour,
            LimitWindow::Day => Self::Day,
            LimitWindow::Week => Self::Week,
            LimitWindow::Month => Self::Month,
            LimitWindow::Poll => Self::Poll,
        }
    }
}

/// Why a ballot was not counted.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum BallotRejection {
    /// A rate-limit rule is at its limit (see `rejectedBy`).
    RateLimited,
    /// The poll was closed by an admin.
    PollClosed,
    /// The poll's `startsAt` is still to come.
    PollNotStarted,
    /// The poll's `endsAt` has passed.
    PollEnded,
}

/// A rule with `channel` applies only to ballots from that channel; one with `device` counts per
/// device type.
#[derive(SimpleObject, Clone)]
pub struct RateLimitRule {
    scope: LimitScopeGql,
    window: LimitWindowGql,
    limit: i64,
    channel: Option<String>,
    device: Option<String>,
}

impl From<&Rule> for RateLimitRule {
    fn from(rule: &Rule) -> Self {
        Self {
            scope: rule.scope.into(),
            window: rule.window.into(),
            limit: rule.limit,
            channel: rule.channel.clone(),
            device: rule.device.clone(),
        }
    }
}

#[derive(InputObject)]
pub struct RateLimitRuleInput {
    scope: LimitScopeGql,
    window: LimitWindowGql,
    /// At least 1.
    limit: i64,
    /// Only ballots from this channel; among rules of one scope and window, a channel's rule
    /// replaces the general one for that channel's traffic.
    channel: Option<String>,
    /// Only ballots from this device type, counted apart from other devices.
    device: Option<String>,
}

impl From<RateLimitRuleInput> for Rule {
    fn from(input: RateLimitRuleInput) -> Self {
        Self {
            scope: input.scope.into(),
            window: input.window.into(),
            limit: input.limit,
            channel: input.channel,
            device: input.device,
        }
    }
}

#[derive(InputObject)]
pub struct PollOptionInput {
    label: String,
    /// What one vote adds on the DISPLAY boards (1 to 1,000,000).
    #[graphql(default = 1)]
    bonus: i32,
    /// Added once to the ALL_TIME DISPLAY board.
    #[graphql(default)]
    initial_votes: i64,
}

impl From<PollOptionInput> for NewOption {
    fn from(input: PollOptionInput) -> Self {
        Self {
            label: input.label,
            bonus: input.bonus,
            initial_votes: input.initial_votes,
        }
    }
}

#[derive(InputObject)]
pub struct CreatePollInput {
    title: String,
    /// An IANA zone, e.g. `Europe/Paris`: bounds the hours, days, ISO weeks and months.
    #[graphql(default_with = "String::from(\"UTC\")")]
    timezone: String,
    #[graphql(default_with = "vec![PeriodGql::AllTime]")]
    periods: Vec<PeriodGql>,
    /// Fraction (0 to 1) of each vote also credited to the next period's boards.
    #[graphql(default)]
    carry_over: f64,
    #[graphql(default_with = "TiePolicyGql::Competition")]
    tie_policy: TiePolicyGql,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    #[graphql(default)]
    rules: Vec<RateLimitRuleInput>,
    #[graphql(default)]
    options: Vec<PollOptionInput>,
}

/// Fields left out are left as they are; `rules` replaces every rule.
#[derive(InputObject)]
pub struct UpdatePollInput {
    title: Option<String>,
    timezone: Option<String>,
    periods: Option<Vec<PeriodGql>>,
    carry_over: Option<f64>,
    tie_policy: Option<TiePolicyGql>,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    rules: Option<Vec<RateLimitRuleInput>>,
}

#[derive(InputObject)]
pub struct BallotInput {
    poll_id: ID,
    option_id: ID,
}

#[derive(InputObject)]
pub struct CastVotesInput {
    /// 1 to 50 ballots, across polls; each gets its own result.
    ballots: Vec<BallotInput>,
    /// The traffic's channel (a partner's), for the rules that name one.
    channel: Option<String>,
    /// The device type (`web`, `mobile`…), for the rules that name one.
    device: Option<String>,
}

pub struct Poll(pub Arc<PollConfig>);

pub type PollConnection = Connected<Poll>;

#[Object]
impl Poll {
    pub async fn id(&self) -> ID {
        ids::encode(NodeType::Poll, self.0.id)
    }

    async fn title(&self) -> &str {
        &self.0.title
    }

    async fn timezone(&self) -> &str {
        self.0.zone.name()
    }

    async fn periods(&self) -> Vec<PeriodGql> {
        self.0.periods.iter().map(|&period| period.into()).collect()
    }

    /// Fraction of each vote also credited to the next period's boards.
    async fn carry_over(&self) -> f64 {
        self.0.carry_over
    }

    async fn tie_policy(&self) -> TiePolicyGql {
        self.0.tie_policy.into()
    }

    async fn starts_at(&self) -> Option<DateTime<Utc>> {
        self.0.starts_at
    }

    async fn ends_at(&self) -> Option<DateTime<Utc>> {
        self.0.ends_at
    }

    /// When an admin closed the poll; null while open.
    async fn closed_at(&self) -> Option<DateTime<Utc>> {
        self.0.closed_at
    }

    async fn options(&self) -> Vec<PollOption> {
        self.0
            .options
            .iter()
            .map(|option| PollOption {
                poll: self.0.clone(),
                option: option.clone(),
            })
            .collect()
    }

    /// HyperLogLog estimate of distinct voters.
    async fn participant_count(&self, ctx: &Context<'_>) -> async_graphql::Result<i64> {
        participants(ctx, Participants::Poll(self.0.id)).await
    }

    async fn rules(&self) -> Vec<RateLimitRule> {
        self.0.rules.iter().map(RateLimitRule::from).collect()
    }

    #[allow(clippy::too_many_arguments)]
    async fn leaderboard(
        &self,
        ctx: &Context<'_>,
        #[graphql(default_with = "PeriodGql::AllTime")] period: PeriodGql,
        at: Option<DateTime<Utc>>,
        #[graphql(default_with = "BoardGql::Display")] board: BoardGql,
        #[graphql(default = 10)] first: i32,
        after: Option<String>,
        around: Option<ID>,
    ) -> async_graphql::Result<Leaderboard> {
        let request = BoardRequest {
            period: period.into(),
            at,
            board: board.into(),
        };
        let first = page_size(first, MAX_LEADERBOARD_PAGE).gql()?;
        let around = option_row(around)?;
        leaderboard(ctx, self.0.clone(), request, first, after, around).await
    }
}

#[derive(Clone)]
pub struct PollOption {
    poll: Arc<PollConfig>,
    option: OptionConfig,
}

#[Object]
impl PollOption {
    pub async fn id(&self) -> ID {
        ids::encode(NodeType::PollOption, self.option.id)
    }

    async fn label(&self) -> &str {
        &self.option.label
    }

    /// What one vote adds on the DISPLAY boards.
    async fn bonus(&self) -> i32 {
        self.option.bonus
    }

    async fn initial_votes(&self) -> i64 {
        self.option.initial_votes
    }

    async fn poll(&self) -> Poll {
        Poll(self.poll.clone())
    }

    /// HyperLogLog estimate of this option's distinct voters.
    async fn participant_count(&self, ctx: &Context<'_>) -> async_graphql::Result<i64> {
        participants(
            ctx,
            Participants::Option {
                poll: self.poll.id,
                option: self.option.id,
            },
        )
        .await
    }

    /// Rank, score, the option just ahead and the gap to it, and the previous period's rank and
    /// score, on one board of the period holding `at` (now by default).
    async fn standing(
        &self,
        ctx: &Context<'_>,
        #[graphql(default_with = "PeriodGql::AllTime")] period: PeriodGql,
        at: Option<DateTime<Utc>>,
        #[graphql(default_with = "BoardGql::Display")] board: BoardGql,
    ) -> async_graphql::Result<Standing> {
        let request = BoardRequest {
            period: period.into(),
            at,
            board: board.into(),
        };
        standing(ctx, self.poll.clone(), self.option.id, request).await
    }
}

/// One option's place on one board.
pub struct Standing {
    poll: Arc<PollConfig>,
    request: BoardRequest,
    bucket: Bucket,
    entry: Ranked,
    ahead: Option<(Ranked, f64)>,
}

impl Standing {
    fn option_object(&self, option: i64) -> Option<PollOption> {
        self.poll.option(option).map(|option| PollOption {
            poll: self.poll.clone(),
            option: option.clone(),
        })
    }
}

#[Object]
impl Standing {
    async fn option(&self) -> async_graphql::Result<PollOption> {
        self.option_object(self.entry.option)
            .ok_or_else(|| AppError::NotFound("poll option").into())
    }

    async fn rank(&self) -> Option<i64> {
        Some(self.entry.rank)
    }

    async fn score(&self) -> f64 {
        self.entry.score
    }

    /// The option ranked just ahead, and the score it leads by.
    async fn ahead(&self) -> Option<PollOption> {
        self.ahead
            .and_then(|(ahead, _)| self.option_object(ahead.option))
    }

    async fn gap_to_ahead(&self) -> Option<f64> {
        self.ahead.map(|(_, gap)| gap)
    }

    /// The option's rank and score in the period before this one (null for ALL_TIME).
    async fn previous_period(
        &self,
        ctx: &Context<'_>,
    ) -> async_graphql::Result<Option<PeriodStanding>> {
        let Some(previous) = periods::previous(self.request.period, &self.bucket, self.poll.zone)
        else {
            return Ok(None);
        };
        let ranked = ranked_board(ctx, &self.poll, self.request.board, previous).await?;
        let Some(entry) = ranked.ranked.iter().find(|e| e.option == self.entry.option) else {
            return Ok(None);
        };
        Ok(Some(PeriodStanding {
            rank: Some(entry.rank),
            score: entry.score,
            period_start: ranked.bucket.start().unwrap_or_default(),
        }))
    }
}

#[derive(SimpleObject)]
pub struct PeriodStanding {
    rank: Option<i64>,
    score: f64,
    period_start: DateTime<Utc>,
}

pub struct Leaderboard {
    poll: Arc<PollConfig>,
    request: BoardRequest,
    bucket: Bucket,
    state: PeriodState,
    version: i64,
    entries: Vec<Standing>,
    page_info: PageInfo,
    total_options: usize,
}

#[Object]
impl Leaderboard {
    async fn poll_id(&self) -> ID {
        ids::encode(NodeType::Poll, self.poll.id)
    }

    async fn period(&self) -> PeriodGql {
        self.request.period.into()
    }

    /// When the period began (null for ALL_TIME).
    async fn period_start(&self) -> Option<DateTime<Utc>> {
        self.bucket.start()
    }

    /// Whether the board is the live one, a kept past one, a future one, or a period no vote can
    /// be in or whose board is no longer kept: what an all-zero or empty board means.
    async fn period_state(&self) -> PeriodStateGql {
        self.state.into()
    }

    async fn board(&self) -> BoardGql {
        self.request.board.into()
    }

    /// Grows with every change; a client drops a snapshot older than the last one it showed.
    async fn version(&self) -> String {
        self.version.to_string()
    }

    async fn entries(&self) -> &[Standing] {
        &self.entries
    }

    async fn page_info(&self) -> &PageInfo {
        &self.page_info
    }

    async fn total_options(&self) -> usize {
        self.total_options
    }
}

/// Which board, of which period, at what time.
#[derive(Clone, Copy)]
struct BoardRequest {
    period: Period,
    at: Option<DateTime<Utc>>,
    board: Board,
}

async fn participants(ctx: &Context<'_>, who: Participants) -> async_graphql::Result<i64> {
    Ok(loaders(ctx)
        .get::<ParticipantsLoader>()
        .load_one(who)
        .await?
        .unwrap_or(0))
}

async fn ranked_board(
    ctx: &Context<'_>,
    poll: &Arc<PollConfig>,
    board: Board,
    bucket: Bucket,
) -> async_graphql::Result<service::RankedBoard> {
    let key = BoardKey {
        poll: poll.id,
        board,
        bucket: bucket.id.clone(),
    };
    let scores = loaders(ctx)
        .get::<BoardLoader>()
        .load_one(key)
        .await?
        .unwrap_or_default();
    Ok(service::ranked(poll, bucket, &scores))
}

fn current_bucket(poll: &PollConfig, request: &BoardRequest) -> async_graphql::Result<Bucket> {
    poll.require_period(request.period).gql()?;
    if request.period == Period::AllTime && request.at.is_some() {
        return Err(AppError::bad_input(
            "at",
            "ALL_TIME is one board for the poll's whole life; leave at out",
        ))
        .gql();
    }
    let at = request.at.unwrap_or_else(Utc::now);
    Ok(periods::bucket(request.period, at, poll.zone))
}

async fn standing(
    ctx: &Context<'_>,
    poll: Arc<PollConfig>,
    option: i64,
    request: BoardRequest,
) -> async_graphql::Result<Standing> {
    let bucket = current_bucket(&poll, &request)?;
    let ranked = ranked_board(ctx, &poll, request.board, bucket).await?;
    let index = ranked
        .ranked
        .iter()
        .position(|entry| entry.option == option)
        .ok_or(AppError::NotFound("poll option"))
        .gql()?;
    Ok(Standing {
        entry: ranked.ranked[index],
        ahead: board::ahead(&ranked.ranked, index),
        bucket: ranked.bucket,
        poll,
        request,
    })
}

async fn leaderboard(
    ctx: &Context<'_>,
    poll: Arc<PollConfig>,
    request: BoardRequest,
    first: usize,
    after: Option<String>,
    around: Option<i64>,
) -> async_graphql::Result<Leaderboard> {
    let bucket = current_bucket(&poll, &request)?;
    let state = services(ctx).votes.period_state(&poll, &bucket);
    let mut ranked = ranked_board(ctx, &poll, request.board, bucket).await?;
    if state == PeriodState::Expired {
        // Its keys are gone: zeros would claim scores nobody knows any more.
        ranked.ranked.clear();
    }
    let window = board::page(&ranked.ranked, first, after.as_deref(), around).gql()?;
    Ok(page_of(poll, request, state, ranked, window))
}

fn option_row(around: Option<ID>) -> async_graphql::Result<Option<i64>> {
    around
        .map(|id| ids::decode(&id, NodeType::PollOption, "around"))
        .transpose()
        .gql()
}

fn page_of(
    poll: Arc<PollConfig>,
    request: BoardRequest,
    state: PeriodState,
    ranked: service::RankedBoard,
    window: board::Window,
) -> Leaderboard {
    let slice = &ranked.ranked[window.start..window.end];
    let page_info = PageInfo {
        has_previous_page: window.has_previous(),
        has_next_page: window.has_next(&ranked.ranked),
        start_cursor: slice.first().map(board::cursor),
        end_cursor: slice.last().map(board::cursor),
    };
    let entries = (window.start..window.end)
        .map(|index| Standing {
            poll: poll.clone(),
            request,
            bucket: ranked.bucket.clone(),
            entry: ranked.ranked[index],
            ahead: board::ahead(&ranked.ranked, index),
        })
        .collect();
    Leaderboard {
        total_options: ranked.ranked.len(),
        version: ranked.version,
        state,
        bucket: ranked.bucket,
        poll,
        request,
        entries,
        page_info,
    }
}

/// A poll by its row id, or null.
pub async fn load_poll(ctx: &Context<'_>, poll: i64) -> async_graphql::Result<Option<Poll>> {
    Ok(services(ctx)
        .votes
        .configs()
        .get(poll)
        .await
        .gql()?
        .map(Poll))
}

/// A poll option by its row id, or null.
pub async fn load_poll_option(
    ctx: &Context<'_>,
    option: i64,
) -> async_graphql::Result<Option<PollOption>> {
    let configs = services(ctx).votes.configs();
    let poll = match configs.poll_of_option(option).await {
        Ok(poll) => poll,
        Err(AppError::NotFound(_)) => return Ok(None),
        Err(err) => return Err(err).gql(),
    };
    let Some(config) = configs.get(poll).await.gql()? else {
        return Ok(None);
    };
    Ok(config.option(option).cloned().map(|option| PollOption {
        poll: config.clone(),
        option,
    }))
}

async fn require_poll(
    ctx: &Context<'_>,
    id: &ID,
    field: &'static str,
) -> async_graphql::Result<Arc<PollConfig>> {
    let poll = ids::decode(id, NodeType::Poll, field).gql()?;
    services(ctx).votes.configs().require(poll).await.gql()
}

#[derive(Default)]
pub struct VotesQuery;

#[Object]
impl VotesQuery {
    async fn poll(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Option<Poll>> {
        let poll = ids::decode(&id, NodeType::Poll, "id").gql()?;
        load_poll(ctx, poll).await
    }

    /// Polls, newest first.
    async fn polls(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: i32,
        after: Option<String>,
    ) -> async_graphql::Result<PollConnection> {
        let page = PageRequest::parse(super::config::POLLS, Some(first), after.as_deref()).gql()?;
        let configs = services(ctx).votes.configs();
        let ids = configs.list(page).await.gql()?;
        let mut connection = PollConnection::new(false, ids.has_next_page);
        for (cursor, id) in ids.edges {
            if let Some(config) = configs.get(id).await.gql()? {
                connection.edges.push(async_graphql::connection::Edge::new(
                    cursor.into_string(),
                    Poll(config),
                ));
            }
        }
        Ok(connection)
    }

    /// One board of a poll, best first; null for an unknown poll. `around` centres the page on an
    /// option (around-me).
    #[allow(clippy::too_many_arguments)]
    async fn leaderboard(
        &self,
        ctx: &Context<'_>,
        poll_id: ID,
        #[graphql(default_with = "PeriodGql::AllTime")] period: PeriodGql,
        at: Option<DateTime<Utc>>,
        #[graphql(default_with = "BoardGql::Display")] board: BoardGql,
        #[graphql(default = 10)] first: i32,
        after: Option<String>,
        around: Option<ID>,
    ) -> async_graphql::Result<Option<Leaderboard>> {
        let poll = ids::decode(&poll_id, NodeType::Poll, "pollId").gql()?;
        let first = page_size(first, MAX_LEADERBOARD_PAGE).gql()?;
        let Some(poll) = services(ctx).votes.configs().get(poll).await.gql()? else {
            return Ok(None);
        };
        let around = option_row(around)?;
        let request = BoardRequest {
            period: period.into(),
            at,
            board: board.into(),
        };
        leaderboard(ctx, poll, request, first, after, around)
            .await
            .map(Some)
    }
}

/// One ballot's outcome.
pub struct BallotResult {
    poll: Arc<PollConfig>,
    outcome: BallotOutcome,
}

#[Object]
impl BallotResult {
    async fn poll_id(&self) -> ID {
        ids::encode(NodeType::Poll, self.outcome.ballot.poll)
    }

    async fn option_id(&self) -> ID {
        ids::encode(NodeType::PollOption, self.outcome.ballot.option)
    }

    async fn accepted(&self) -> bool {
        self.outcome.rejection.is_none()
    }

    async fn reason(&self) -> Option<BallotRejection> {
        self.outcome
            .rejection
            .as_ref()
            .map(|rejection| match rejection {
                Rejection::RateLimited { .. } => BallotRejection::RateLimited,
                Rejection::PollNotOpen(NotOpen::NotStarted) => BallotRejection::PollNotStarted,
                Rejection::PollNotOpen(NotOpen::Ended) => BallotRejection::PollEnded,
                Rejection::PollNotOpen(NotOpen::Closed) => BallotRejection::PollClosed,
            })
    }

    /// The rule at its limit, when one refused the ballot.
    async fn rejected_by(&self) -> Option<RateLimitRule> {
        match &self.outcome.rejection {
            Some(Rejection::RateLimited { rule, .. }) => Some(rule.into()),
            _ => None,
        }
    }

    /// When the refusing rule's window ends (null when it never does).
    async fn retry_after_seconds(&self) -> Option<i64> {
        match &self.outcome.rejection {
            Some(Rejection::RateLimited { retry_after, .. }) => *retry_after,
            _ => None,
        }
    }

    /// The option's standing on the DISPLAY board of the poll's longest period, now.
    async fn standing(&self, ctx: &Context<'_>) -> async_graphql::Result<Option<Standing>> {
        let Some(&period) = self.poll.periods.iter().max() else {
            return Ok(None);
        };
        let request = BoardRequest {
            period,
            at: None,
            board: Board::Display,
        };
        standing(ctx, self.poll.clone(), self.outcome.ballot.option, request)
            .await
            .map(Some)
    }
}

#[derive(SimpleObject)]
pub struct CastVotesPayload {
    results: Vec<BallotResult>,
}

#[derive(Default)]
pub struct VotesMutation;

#[Object]
impl VotesMutation {
    /// Votes as the signed-in user: each ballot is counted whole or not at all, and says why not.
    async fn cast_votes(
        &self,
        ctx: &Context<'_>,
        input: CastVotesInput,
    ) -> async_graphql::Result<CastVotesPayload> {
        let ballots = input
            .ballots
            .iter()
            .map(|ballot| {
                Ok(Ballot {
                    poll: ids::decode(&ballot.poll_id, NodeType::Poll, "pollId")?,
                    option: ids::decode(&ballot.option_id, NodeType::PollOption, "optionId")?,
                })
            })
            .collect::<Result<Vec<_>, AppError>>()
            .gql()?;
        let origin = Origin {
            channel: input.channel,
            device: input.device,
        };
        let votes = &services(ctx).votes;
        let outcomes = votes
            .cast(actor(ctx), &ballots, &origin, Utc::now())
            .await
            .gql()?;
        let mut results = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            let poll = votes.configs().require(outcome.ballot.poll).await.gql()?;
            results.push(BallotResult { poll, outcome });
        }
        Ok(CastVotesPayload { results })
    }

    /// Admin only.
    async fn create_poll(
        &self,
        ctx: &Context<'_>,
        input: CreatePollInput,
    ) -> async_graphql::Result<Poll> {
        let poll = NewPoll {
            title: input.title,
            timezone: input.timezone,
            periods: input.periods.into_iter().map(Period::from).collect(),
            carry_over: input.carry_over,
            tie_policy: input.tie_policy.into(),
            starts_at: input.starts_at,
            ends_at: input.ends_at,
            rules: input.rules.into_iter().map(Rule::from).collect(),
            options: input.options.into_iter().map(NewOption::from).collect(),
        };
        let created = services(ctx).polls.create(actor(ctx), poll).await.gql()?;
        Ok(Poll(created))
    }

    /// Admin only.
    async fn update_poll(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdatePollInput,
    ) -> async_graphql::Result<Poll> {
        let poll = ids::decode(&id, NodeType::Poll, "id").gql()?;
        let changes = PollChanges {
            title: input.title,
            timezone: input.timezone,
            periods: input
                .periods
                .map(|periods| periods.into_iter().map(Period::from).collect()),
            carry_over: input.carry_over,
            tie_policy: input.tie_policy.map(TiePolicy::from),
            starts_at: input.starts_at,
            ends_at: input.ends_at,
            rules: input
                .rules
                .map(|rules| rules.into_iter().map(Rule::from).collect()),
        };
        let updated = services(ctx)
            .polls
            .update(actor(ctx), poll, changes)
            .await
            .gql()?;
        Ok(Poll(updated))
    }

    /// Admin only.
    async fn add_poll_option(
        &self,
        ctx: &Context<'_>,
        poll_id: ID,
        input: PollOptionInput,
    ) -> async_graphql::Result<PollOption> {
        let poll = ids::decode(&poll_id, NodeType::Poll, "pollId").gql()?;
        let admin = &services(ctx).polls;
        let option = admin
            .add_option(actor(ctx), poll, input.into())
            .await
            .gql()?;
        option_with_poll(ctx, option).await
    }

    /// Admin only.
    async fn update_poll_option(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: PollOptionInput,
    ) -> async_graphql::Result<PollOption> {
        let option = ids::decode(&id, NodeType::PollOption, "id").gql()?;
        let admin = &services(ctx).polls;
        let option = admin
            .update_option(actor(ctx), option, input.into())
            .await
            .gql()?;
        option_with_poll(ctx, option).await
    }

    /// Admin only. Every later ballot is refused, on every process at once.
    async fn close_poll(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Poll> {
        let poll = ids::decode(&id, NodeType::Poll, "id").gql()?;
        let closed = services(ctx).polls.close(actor(ctx), poll).await.gql()?;
        Ok(Poll(closed))
    }
}

async fn option_with_poll(
    ctx: &Context<'_>,
    option: OptionConfig,
) -> async_graphql::Result<PollOption> {
    let poll = services(ctx)
        .votes
        .configs()
        .require(option.poll_id)
        .await
        .gql()?;
    Ok(PollOption { poll, option })
}

#[derive(Default)]
pub struct VotesSubscription;

#[Subscription]
impl VotesSubscription {
    /// Coalesced snapshots of the top of a board: at once, then whenever the top `first` change
    /// (at most one per `PULSE_LEADERBOARD_TICK`), each with a growing version.
    async fn leaderboard_changed(
        &self,
        ctx: &Context<'_>,
        poll_id: ID,
        #[graphql(default_with = "PeriodGql::AllTime")] period: PeriodGql,
        #[graphql(default_with = "BoardGql::Display")] board: BoardGql,
        #[graphql(default = 10)] first: i32,
    ) -> async_graphql::Result<impl Stream<Item = Leaderboard> + use<>> {
        let first = page_size(first, MAX_LEADERBOARD_PAGE).gql()?;
        let poll = require_poll(ctx, &poll_id, "pollId").await?;
        let request = BoardRequest {
            period: period.into(),
            at: None,
            board: board.into(),
        };
        poll.require_period(request.period).gql()?;
        let live = LiveBoard {
            poll: poll.id,
            period: request.period,
            board: request.board,
        };
        let configs = services(ctx).votes.configs().clone();
        let stream = services(ctx).live_boards.watch(live, first);
        Ok(stream.then(move |top| {
            let configs = configs.clone();
            let fallback = poll.clone();
            async move {
                // Options added since the subscription began carry their labels.
                let poll = configs
                    .get(fallback.id)
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or(fallback);
                let ranked = service::RankedBoard {
                    bucket: top.bucket,
                    ranked: top.top,
                    version: top.version,
                };
                let shown = ranked.ranked.len();
                let mut page = page_of(
                    poll,
                    request,
                    PeriodState::Current,
                    ranked,
                    board::Window {
                        start: 0,
                        end: shown,
                    },
                );
                page.total_options = top.total;
                page.page_info.has_next_page = shown < top.total;
                page
            }
        }))
    }
}
