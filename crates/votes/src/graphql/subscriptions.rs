//! Live leaderboards.

use std::sync::Arc;

use async_graphql::{Context, ID, Subscription};
use futures_util::{Stream, StreamExt as _};
use pulse_kit::ids;
use pulse_kit::service;
use pulse_runtime::error::GqlResultExt;
use pulse_runtime::pagination::PageSize;

use super::leaderboard::{BoardRequest, Leaderboard, MAX_LEADERBOARD_PAGE, page_of};
use super::types::{BoardGql, PeriodGql};
use crate::POLL;
use crate::board;
use crate::config::PollConfig;
use crate::live::LiveBoard;
use crate::periods::PeriodState;
use crate::service;
use crate::{LiveBoardService, VoteService};

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
        let first = PageSize::parse(first, MAX_LEADERBOARD_PAGE).gql()?.get();
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
        let configs = service::<VoteService>(ctx).configs().clone();
        let stream = service::<LiveBoardService>(ctx).watch(live, first);
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

async fn require_poll(
    ctx: &Context<'_>,
    id: &ID,
    field: &'static str,
) -> async_graphql::Result<Arc<PollConfig>> {
    let poll = ids::decode(id, POLL, field).gql()?;
    service::<VoteService>(ctx)
        .configs()
        .require(poll)
        .await
        .gql()
}
