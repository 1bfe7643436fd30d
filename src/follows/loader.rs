use std::collections::HashMap;

use async_graphql::ErrorExtensions;
use async_graphql::dataloader::Loader;
use futures_util::future::try_join_all;
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
        let mut by_viewer: HashMap<i64, Vec<i64>> = HashMap::new();
        for &(viewer, user) in keys {
            by_viewer.entry(viewer).or_default().push(user);
        }
        // Viewers at once: a batch of a shared loader holds the followers of one item.
        let answers = try_join_all(by_viewer.into_iter().map(|(viewer, users)| async move {
            let followed = self.0.follows_among(viewer, &users).await;
            followed.map(|followed| (viewer, users, followed))
        }))
        .await
        .map_err(|err| err.extend())?;
        let mut found = HashMap::with_capacity(keys.len());
        for (viewer, users, followed) in answers {
            found.extend(users.iter().map(|&user| ((viewer, user), false)));
            found.extend(followed.into_iter().map(|user| ((viewer, user), true)));
        }
        Ok(found)
    }
}
