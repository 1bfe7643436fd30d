use std::collections::HashMap;

use async_graphql::ErrorExtensions;
use async_graphql::dataloader::Loader;
use pulse_kit::context::{FromServices, Registry};

use super::service::{BoardKey, BoardScores, Participants, VoteService};

/// Board scores by (poll, board, bucket): every leaderboard and standing of a request, the
/// previous periods' boards included, costs one pipelined Redis round trip.
pub struct BoardLoader(pub VoteService);

impl FromServices for BoardLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<VoteService>().clone())
    }
}

impl Loader<BoardKey> for BoardLoader {
    type Value = BoardScores;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[BoardKey]) -> Result<HashMap<BoardKey, BoardScores>, Self::Error> {
        self.0.scores(keys).await.map_err(|err| err.extend())
    }
}

/// Distinct-voter estimates of polls and options: one pipelined round trip per request.
pub struct ParticipantsLoader(pub VoteService);

impl FromServices for ParticipantsLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<VoteService>().clone())
    }
}

impl Loader<Participants> for ParticipantsLoader {
    type Value = i64;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[Participants]) -> Result<HashMap<Participants, i64>, Self::Error> {
        self.0.participants(keys).await.map_err(|err| err.extend())
    }
}
