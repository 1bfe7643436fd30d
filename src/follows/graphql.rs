use async_graphql::{Context, ID, Object};
use pulse_kit::connection::{Connected, connection};
use pulse_kit::ids;
use pulse_kit::{actor, loaders, service};

use super::loader::{FollowCountsLoader, ViewerFollowsLoader};
use super::service::{FOLLOWERS, FOLLOWING, FollowOutcome};
use crate::accounts::USER;
use crate::accounts::graphql::{User, load_user};
use crate::accounts::loader::UserLoader;
use crate::error::{AppError, GqlResultExt};
use crate::follows::FollowService;
use crate::pagination::{Page, PageRequest, Walk};

pub type UserConnection = Connected<User>;

pub struct FollowPayload {
    outcome: FollowOutcome,
    user: i64,
}

#[Object]
impl FollowPayload {
    /// Whether the viewer follows the user now.
    async fn following(&self) -> bool {
        self.outcome.following
    }

    async fn user(&self, ctx: &Context<'_>) -> async_graphql::Result<User> {
        load_user(ctx, self.user)
            .await?
            .ok_or(AppError::NotFound("user"))
            .gql()
    }
}

/// `User.followerCount`.
pub async fn follower_count(ctx: &Context<'_>, user: i64) -> async_graphql::Result<i64> {
    let counts = loaders(ctx)
        .get::<FollowCountsLoader>()
        .load_one(user)
        .await?;
    Ok(counts.unwrap_or_default().followers)
}

/// `User.followingCount`.
pub async fn following_count(ctx: &Context<'_>, user: i64) -> async_graphql::Result<i64> {
    let counts = loaders(ctx)
        .get::<FollowCountsLoader>()
        .load_one(user)
        .await?;
    Ok(counts.unwrap_or_default().following)
}

/// `User.viewerFollows`: false when anonymous.
pub async fn viewer_follows(ctx: &Context<'_>, user: i64) -> async_graphql::Result<bool> {
    let Some(viewer) = actor(ctx).user else {
        return Ok(false);
    };
    let loader = loaders(ctx).get::<ViewerFollowsLoader>();
    Ok(loader.load_one((viewer, user)).await?.unwrap_or(false))
}

/// `User.followers`.
pub async fn followers(
    ctx: &Context<'_>,
    user: i64,
    first: Option<i32>,
    after: Option<String>,
) -> async_graphql::Result<UserConnection> {
    user_list(ctx, FOLLOWERS, user, first, after).await
}

/// `User.following`.
pub async fn following(
    ctx: &Context<'_>,
    user: i64,
    first: Option<i32>,
    after: Option<String>,
) -> async_graphql::Result<UserConnection> {
    user_list(ctx, FOLLOWING, user, first, after).await
}

async fn user_list(
    ctx: &Context<'_>,
    walk: Walk,
    user: i64,
    first: Option<i32>,
    after: Option<String>,
) -> async_graphql::Result<UserConnection> {
    let page = PageRequest::parse(walk, first, after.as_deref()).gql()?;
    let page = service::<FollowService>(ctx).list(user, page).await.gql()?;
    let ids: Vec<i64> = page.edges.iter().map(|(_, id)| *id).collect();
    let mut users = loaders(ctx).get::<UserLoader>().load_many(ids).await?;
    // A user deleted since the page was read is left out, not shown as an error.
    let edges = page
        .edges
        .into_iter()
        .filter_map(|(cursor, id)| users.remove(&id).map(|user| (cursor, user)))
        .collect();
    let page = Page {
        edges,
        has_next_page: page.has_next_page,
    };
    Ok(connection(page, User::from))
}

#[derive(Default)]
pub struct FollowsMutation;

#[Object]
impl FollowsMutation {
    /// Follows a user. Idempotent; the user's recent articles join the viewer's feed shortly.
    async fn follow(&self, ctx: &Context<'_>, user_id: ID) -> async_graphql::Result<FollowPayload> {
        let user = ids::decode(&user_id, USER, "userId").gql()?;
        let outcome = service::<FollowService>(ctx)
            .follow(actor(ctx), user)
            .await
            .gql()?;
        Ok(FollowPayload { outcome, user })
    }

    /// Stops following a user. Idempotent; the user's articles leave the viewer's feed at once.
    async fn unfollow(
        &self,
        ctx: &Context<'_>,
        user_id: ID,
    ) -> async_graphql::Result<FollowPayload> {
        let user = ids::decode(&user_id, USER, "userId").gql()?;
        let outcome = service::<FollowService>(ctx)
            .unfollow(actor(ctx), user)
            .await
            .gql()?;
        Ok(FollowPayload { outcome, user })
    }
}
