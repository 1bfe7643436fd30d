use std::collections::HashMap;

use async_graphql::ErrorExtensions;
use async_graphql::dataloader::Loader;
use futures_util::future::try_join_all;
use pulse_kit::context::{FromServices, Registry};

use super::service::{LikeService, LiveLikes};
use super::{CommentService, Subject};
use crate::entities::comments;

/// Live like counts by subject: a page of articles or comments costs one pipelined Redis round
/// trip.
pub struct LikeCountLoader(pub LikeService);

impl FromServices for LikeCountLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<LikeService>().clone())
    }
}

impl Loader<Subject> for LikeCountLoader {
    type Value = LiveLikes;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[Subject]) -> Result<HashMap<Subject, Self::Value>, Self::Error> {
        self.0.live(keys).await.map_err(|err| err.extend())
    }
}

/// Whether a user likes each subject: a page costs one pipelined Redis round trip, plus one SQL
/// query when some relations are in neither Redis's cache nor its unarchived changes.
pub struct ViewerLikedLoader(pub LikeService);

impl FromServices for ViewerLikedLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<LikeService>().clone())
    }
}

impl Loader<(i64, Subject)> for ViewerLikedLoader {
    type Value = bool;
    type Error = async_graphql::Error;

    async fn load(
        &self,
        keys: &[(i64, Subject)],
    ) -> Result<HashMap<(i64, Subject), Self::Value>, Self::Error> {
        let mut by_user: HashMap<i64, Vec<Subject>> = HashMap::new();
        for &(user, subject) in keys {
            by_user.entry(user).or_default().push(subject);
        }
        // Users at once: a batch of a shared loader holds the followers of one item, each asking
        // about themself.
        let found = try_join_all(by_user.into_iter().map(|(user, subjects)| async move {
            let found = self.0.liked_by(user, &subjects).await;
            found.map(|found| (user, found))
        }))
        .await
        .map_err(|err| err.extend())?;
        let mut liked = HashMap::with_capacity(keys.len());
        for (user, found) in found {
            liked.extend(
                found
                    .into_iter()
                    .map(|(subject, state)| ((user, subject), state)),
            );
        }
        Ok(liked)
    }
}

/// Comments by id, batched.
pub struct CommentLoader(pub CommentService);

impl FromServices for CommentLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<CommentService>().clone())
    }
}

impl Loader<i64> for CommentLoader {
    type Value = comments::Model;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[i64]) -> Result<HashMap<i64, Self::Value>, Self::Error> {
        let comments = self.0.by_ids(keys).await.map_err(|err| err.extend())?;
        Ok(comments
            .into_iter()
            .map(|comment| (comment.id, comment))
            .collect())
    }
}
