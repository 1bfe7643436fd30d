//! Polls and their options as GraphQL objects.

use std::sync::Arc;

use async_graphql::{Context, ID, Object};
use chrono::{DateTime, Utc};
use pulse_kit::connection::Connected;
use pulse_kit::ids;
use pulse_kit::loaders;
use pulse_runtime::error::GqlResultExt;
use pulse_runtime::pagination::PageSize;

use super::leaderboard::{
    BoardRequest, Leaderboard, MAX_LEADERBOARD_PAGE, Standing, leaderboard, option_row, standing,
};
use super::types::{BoardGql, PeriodGql, RateLimitRule, TiePolicyGql};
use crate::config::{OptionConfig, PollConfig};
use crate::loader::ParticipantsLoader;
use crate::service::Participants;
use crate::{POLL, POLL_OPTION};

pub struct Poll(pub Arc<PollConfig>);

pub type PollConnection = Connected<Poll>;

#[Object]
impl Poll {
    pub async fn id(&self) -> ID {
        ids::encode(POLL, self.0.id)
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
        let first = PageSize::parse(first, MAX_LEADERBOARD_PAGE).gql()?.get();
        let around = option_row(around)?;
        leaderboard(ctx, self.0.clone(), request, first, after, around).await
    }
}

#[derive(Clone)]
pub struct PollOption {
    pub(super) poll: Arc<PollConfig>,
    pub(super) option: OptionConfig,
}

#[Object]
impl PollOption {
    pub async fn id(&self) -> ID {
        ids::encode(POLL_OPTION, self.option.id)
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

async fn participants(ctx: &Context<'_>, who: Participants) -> async_graphql::Result<i64> {
    Ok(loaders(ctx)
        .get::<ParticipantsLoader>()
        .load_one(who)
        .await?
        .unwrap_or(0))
}
