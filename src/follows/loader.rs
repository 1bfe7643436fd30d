use std::collections::HashMap;

use async_graphql::ErrorExtensions;
use async_graphql::dataloader::Loader;
use pulse_kit::context::{FromServices, Registry};

use super::FollowService;
use super::service::FollowCounts;

/// Follower and following counts by user: a page of users costs one query.
pub struct FollowCountsLoader(pub FollowService);

impl FromServices for FollowCountsLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<FollowService>().clone())
    }
}

impl Loader<i64> for FollowCountsLoader {
    type Value = FollowCounts;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[i64]) -> Result<HashMap<i64, Self::Value>, Self::Error> {
        self.0.counts(keys).await.map_err(|err| err.extend())
    }
}

/// Whether a viewer follows each user, keyed (viewer, user): a page of users costs one query.
pub struct ViewerFollowsLoader(pub FollowService);

impl FromServices for ViewerFollowsLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<FollowService>().clone())
    }
}

impl Loader<(i64, i64)> for ViewerFollowsLoader {
    type Value = bool;
    type Error = async_graphql::Error;

    async fn load(
        &self,
        keys: &[(i64, i64)],
    ) -> Result<HashMap<(i64, i64), Self::Value>, Self::Error> {
        // One query for the batch, whatever its viewers: a batch of a shared loader holds the
        // followers of one item, each asking about themself. It may find follows no key asked
        // about (another viewer's of another user), which are left out.
        let mut viewers: Vec<i64> = keys.iter().map(|&(viewer, _)| viewer).collect();
        let mut users: Vec<i64> = keys.iter().map(|&(_, user)| user).collect();
        for ids in [&mut viewers, &mut users] {
            ids.sort_unstable();
            ids.dedup();
        }
        let follows = self
            .0
            .follows_among(&viewers, &users)
            .await
            .map_err(|err| err.extend())?;
        let mut found: HashMap<(i64, i64), bool> = keys.iter().map(|&key| (key, false)).collect();
        for pair in follows {
            if let Some(follows) = found.get_mut(&pair) {
                *follows = true;
            }
        }
        Ok(found)
    }
}
