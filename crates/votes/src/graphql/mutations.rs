//! Ballots, and the admin mutations of polls and options.

use std::sync::Arc;

use async_graphql::{Context, Enum, ID, InputObject, Object, SimpleObject};
use chrono::Utc;
use pulse_kit::ids;
use pulse_kit::{actor, service};
use pulse_runtime::error::{AppError, GqlResultExt};

use super::admin::{CreatePollInput, PollOptionInput, UpdatePollInput};
use super::leaderboard::{BoardRequest, Standing, standing};
use super::poll::{Poll, PollOption};
use super::types::RateLimitRule;
use crate::config::{NotOpen, OptionConfig, PollConfig};
use crate::service::{Ballot, BallotOutcome, Board, Origin, Rejection};
use crate::{POLL, POLL_OPTION};
use crate::{PollAdminService, VoteService};

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

/// One ballot's outcome.
pub struct BallotResult {
    poll: Arc<PollConfig>,
    outcome: BallotOutcome,
}

#[Object]
impl BallotResult {
    async fn poll_id(&self) -> ID {
        ids::encode(POLL, self.outcome.ballot.poll)
    }

    async fn option_id(&self) -> ID {
        ids::encode(POLL_OPTION, self.outcome.ballot.option)
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
                    poll: ids::decode(&ballot.poll_id, POLL, "pollId")?,
                    option: ids::decode(&ballot.option_id, POLL_OPTION, "optionId")?,
                })
            })
            .collect::<Result<Vec<_>, AppError>>()
            .gql()?;
        let origin = Origin {
            channel: input.channel,
            device: input.device,
        };
        let votes = &service::<VoteService>(ctx);
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
        let created = service::<PollAdminService>(ctx)
            .create(actor(ctx), input.into())
            .await
            .gql()?;
        Ok(Poll(created))
    }

    /// Admin only.
    async fn update_poll(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdatePollInput,
    ) -> async_graphql::Result<Poll> {
        let poll = ids::decode(&id, POLL, "id").gql()?;
        let updated = service::<PollAdminService>(ctx)
            .update(actor(ctx), poll, input.into())
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
        let poll = ids::decode(&poll_id, POLL, "pollId").gql()?;
        let admin = &service::<PollAdminService>(ctx);
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
        let option = ids::decode(&id, POLL_OPTION, "id").gql()?;
        let admin = &service::<PollAdminService>(ctx);
        let option = admin
            .update_option(actor(ctx), option, input.into())
            .await
            .gql()?;
        option_with_poll(ctx, option).await
    }

    /// Admin only. Every later ballot is refused, on every process at once.
    async fn close_poll(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Poll> {
        let poll = ids::decode(&id, POLL, "id").gql()?;
        let closed = service::<PollAdminService>(ctx)
            .close(actor(ctx), poll)
            .await
            .gql()?;
        Ok(Poll(closed))
    }
}

async fn option_with_poll(
    ctx: &Context<'_>,
    option: OptionConfig,
) -> async_graphql::Result<PollOption> {
    let poll = service::<VoteService>(ctx)
        .configs()
        .require(option.poll_id)
        .await
        .gql()?;
    Ok(PollOption { poll, option })
}
