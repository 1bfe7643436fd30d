//! Leaderboards and standings: one board of one period, paged or around an option.

use std::sync::Arc;

use async_graphql::connection::PageInfo;
use async_graphql::{Context, ID, Object, SimpleObject};
use chrono::{DateTime, Utc};
use pulse_kit::ids;
use pulse_kit::{loaders, service};
use pulse_runtime::error::{AppError, GqlResultExt};

use super::poll::PollOption;
use super::types::{BoardGql, PeriodGql, PeriodStateGql};
use crate::VoteService;
use crate::board::{self, Ranked};
use crate::config::PollConfig;
use crate::loader::BoardLoader;
use crate::periods::{self, Bucket, Period, PeriodState};
use crate::service::{self, Board, BoardKey};
use crate::{POLL, POLL_OPTION};

/// Most entries one leaderboard page holds.
pub(super) const MAX_LEADERBOARD_PAGE: i32 = 100;

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
    pub(super) page_info: PageInfo,
    pub(super) total_options: usize,
}

#[Object]
impl Leaderboard {
    async fn poll_id(&self) -> ID {
        ids::encode(POLL, self.poll.id)
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
pub(super) struct BoardRequest {
    pub(super) period: Period,
    pub(super) at: Option<DateTime<Utc>>,
    pub(super) board: Board,
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

pub(super) async fn standing(
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

pub(super) async fn leaderboard(
    ctx: &Context<'_>,
    poll: Arc<PollConfig>,
    request: BoardRequest,
    first: usize,
    after: Option<String>,
    around: Option<i64>,
) -> async_graphql::Result<Leaderboard> {
    let bucket = current_bucket(&poll, &request)?;
    let state = service::<VoteService>(ctx).period_state(&poll, &bucket);
    let mut ranked = ranked_board(ctx, &poll, request.board, bucket).await?;
    if state == PeriodState::Expired {
        // Its keys are gone: zeros would claim scores nobody knows any more.
        ranked.ranked.clear();
    }
    let window = board::page(&ranked.ranked, first, after.as_deref(), around).gql()?;
    Ok(page_of(poll, request, state, ranked, window))
}

pub(super) fn option_row(around: Option<ID>) -> async_graphql::Result<Option<i64>> {
    around
        .map(|id| ids::decode(&id, POLL_OPTION, "around"))
        .transpose()
        .gql()
}

pub(super) fn page_of(
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
