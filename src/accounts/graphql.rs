use async_graphql::{Context, ID, Lookahead, Object, SimpleObject};
use chrono::{DateTime, Utc};
use pulse_kit::connection::{connection, connection_complexity};
use pulse_kit::ids;
use pulse_kit::{actor, loaders, service};

use super::loader::UserLoader;
use crate::accounts::AccountService;
use crate::accounts::USER;
use crate::articles::ArticleService;
use crate::articles::graphql::{Article, ArticleConnection, prefetch_page};
use crate::articles::service::USER_ARTICLES;
use crate::entities::users;
use crate::error::GqlResultExt;
use crate::pagination::PageRequest;

pub struct User {
    row: users::Model,
    /// Whoever asks is this user, though the request itself was anonymous: the answer to the
    /// sign-in or sign-up that made them so.
    own_session: bool,
}

impl From<users::Model> for User {
    fn from(row: users::Model) -> Self {
        Self {
            row,
            own_session: false,
        }
    }
}

#[Object]
impl User {
    pub async fn id(&self) -> ID {
        ids::encode(USER, self.row.id)
    }

    async fn handle(&self) -> &str {
        &self.row.handle
    }

    async fn created_at(&self) -> DateTime<Utc> {
        self.row.created_at.and_utc()
    }

    /// Whether this user holds the admin role. Only the user themself can see it; null for others.
    async fn is_admin(&self, ctx: &Context<'_>) -> Option<bool> {
        (self.own_session || actor(ctx).user == Some(self.row.id)).then_some(self.row.is_admin)
    }

    async fn follower_count(&self, ctx: &Context<'_>) -> async_graphql::Result<i64> {
        crate::follows::graphql::follower_count(ctx, self.row.id).await
    }

    async fn following_count(&self, ctx: &Context<'_>) -> async_graphql::Result<i64> {
        crate::follows::graphql::following_count(ctx, self.row.id).await
    }

    /// Whether the signed-in viewer follows this user; false when anonymous.
    async fn viewer_follows(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        crate::follows::graphql::viewer_follows(ctx, self.row.id).await
    }

    /// This user's followers, newest follow first.
    #[graphql(complexity = "connection_complexity(child_complexity, first)")]
    async fn followers(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
    ) -> async_graphql::Result<crate::follows::graphql::UserConnection> {
        crate::follows::graphql::followers(ctx, self.row.id, first, after).await
    }

    /// The users this user follows, newest follow first.
    #[graphql(complexity = "connection_complexity(child_complexity, first)")]
    async fn following(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
    ) -> async_graphql::Result<crate::follows::graphql::UserConnection> {
        crate::follows::graphql::following(ctx, self.row.id, first, after).await
    }

    /// This user's articles, newest first.
    #[graphql(complexity = "connection_complexity(child_complexity, first)")]
    async fn articles(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
    ) -> async_graphql::Result<ArticleConnection> {
        let page = PageRequest::parse(USER_ARTICLES, first, after.as_deref()).gql()?;
        let articles = service::<ArticleService>(ctx)
            .list(page, Some(self.row.id))
            .await
            .gql()?;
        prefetch_page(ctx, &articles).await?;
        Ok(connection(articles, Article))
    }
}

/// Loads the users of `ids` in one batch when `node` (the selection of one item of a list)
/// selects `author`; see [`pulse_kit::context`].
pub async fn prefetch_authors(
    ctx: &Context<'_>,
    node: &Lookahead<'_>,
    ids: impl IntoIterator<Item = i64>,
) -> async_graphql::Result<()> {
    if node.field("author").exists() {
        loaders(ctx).get::<UserLoader>().load_many(ids).await?;
    }
    Ok(())
}

/// Loads a user through the request's batching loader.
pub async fn load_user(ctx: &Context<'_>, id: i64) -> async_graphql::Result<Option<User>> {
    Ok(loaders(ctx)
        .get::<UserLoader>()
        .load_one(id)
        .await?
        .map(User::from))
}

#[derive(SimpleObject)]
pub struct AuthPayload {
    /// Send as `Authorization: Bearer <token>`, or as `token` in a websocket's connection_init payload.
    token: String,
    user: User,
}

impl From<super::service::Session> for AuthPayload {
    fn from(session: super::service::Session) -> Self {
        Self {
            token: session.token,
            user: User {
                row: session.user,
                own_session: true,
            },
        }
    }
}

#[derive(Default)]
pub struct AccountsQuery;

#[Object]
impl AccountsQuery {
    /// The signed-in user; null when anonymous.
    async fn viewer(&self, ctx: &Context<'_>) -> async_graphql::Result<Option<User>> {
        match actor(ctx).user {
            Some(id) => load_user(ctx, id).await,
            None => Ok(None),
        }
    }

    #[graphql(cache_control(max_age = 5))]
    async fn user(&self, ctx: &Context<'_>, handle: String) -> async_graphql::Result<Option<User>> {
        let Ok(handle) = super::service::Handle::parse(&handle) else {
            return Ok(None);
        };
        Ok(service::<AccountService>(ctx)
            .by_handle(&handle)
            .await
            .gql()?
            .map(User::from))
    }
}

#[derive(Default)]
pub struct AccountsMutation;

#[Object]
impl AccountsMutation {
    /// Creates an account and signs it in. Handles are case-insensitive.
    async fn sign_up(
        &self,
        ctx: &Context<'_>,
        handle: String,
        password: String,
    ) -> async_graphql::Result<AuthPayload> {
        Ok(service::<AccountService>(ctx)
            .sign_up(actor(ctx), &handle, &password)
            .await
            .gql()?
            .into())
    }

    async fn sign_in(
        &self,
        ctx: &Context<'_>,
        handle: String,
        password: String,
    ) -> async_graphql::Result<AuthPayload> {
        Ok(service::<AccountService>(ctx)
            .sign_in(actor(ctx), &handle, &password)
            .await
            .gql()?
            .into())
    }
}
