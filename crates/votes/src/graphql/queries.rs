//! Reading polls and leaderboards.

use async_graphql::{Context, ID, Object};
use chrono::{DateTime, Utc};
use pulse_kit::ids;
use pulse_kit::service;
use pulse_runtime::error::{AppError, GqlResultExt};
use pulse_runtime::pagination::{PageRequest, PageSize};

use super::leaderboard::{
    BoardRequest, Leaderboard, MAX_LEADERBOARD_PAGE, leaderboard, option_row,
};
use super::poll::{Poll, PollConnection, PollOption};
use super::types::{BoardGql, PeriodGql};
use crate::POLL;
use crate::VoteService;

/// A poll by its row id, or null.
pub async fn load_poll(ctx: &Context<'_>, poll: i64) -> async_graphql::Result<Option<Poll>> {
    Ok(service::<VoteService>(ctx)
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
    let configs = service::<VoteService>(ctx).configs();
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

#[derive(Default)]
pub struct VotesQuery;

#[Object]
impl VotesQuery {
    async fn poll(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Option<Poll>> {
        let poll = ids::decode(&id, POLL, "id").gql()?;
        load_poll(ctx, poll).await
    }

    /// Polls, newest first.
    async fn polls(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: i32,
        after: Option<String>,
    ) -> async_graphql::Result<PollConnection> {
        let page = PageRequest::parse(crate::config::POLLS, Some(first), after.as_deref()).gql()?;
        let configs = service::<VoteService>(ctx).configs();
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
        let poll = ids::decode(&poll_id, POLL, "pollId").gql()?;
        let first = PageSize::parse(first, MAX_LEADERBOARD_PAGE).gql()?.get();
        let Some(poll) = service::<VoteService>(ctx)
            .configs()
            .get(poll)
            .await
            .gql()?
        else {
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
