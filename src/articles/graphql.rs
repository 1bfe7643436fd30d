use async_graphql::{Context, ID, InputObject, Object, Subscription};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};

use super::loader::ArticleLoader;
use super::service::{ArticleChanges, NEWEST, USER_ARTICLES};
use crate::accounts::graphql::{User, load_user};
use crate::entities::articles;
use crate::error::{AppError, GqlResultExt};
use crate::graphql::ids::{self, NodeType};
use crate::graphql::pagination::{Connected, connection, connection_complexity};
use crate::graphql::{actor, loaders, services};
use crate::pagination::PageRequest;

pub struct Article(pub articles::Model);

pub type ArticleConnection = Connected<Article>;

#[Object]
impl Article {
    pub async fn id(&self) -> ID {
        ids::encode(NodeType::Article, self.0.id)
    }

    async fn title(&self) -> &str {
        &self.0.title
    }

    async fn body(&self) -> &str {
        &self.0.body
    }

    async fn author(&self, ctx: &Context<'_>) -> async_graphql::Result<User> {
        load_user(ctx, self.0.author_id)
            .await?
            .ok_or_else(|| AppError::Internal(format!("article {} has no author", self.0.id)))
            .gql()
    }

    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at.and_utc()
    }

    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at.and_utc()
    }

    /// Views counted so far, including those not yet flushed to SQL.
    async fn view_count(&self, ctx: &Context<'_>) -> async_graphql::Result<i64> {
        crate::views::graphql::view_count(ctx, &self.0).await
    }
}

/// Loads many articles in one batch.
pub async fn load_articles(
    ctx: &Context<'_>,
    ids: impl IntoIterator<Item = i64>,
) -> async_graphql::Result<std::collections::HashMap<i64, Article>> {
    let loaded = loaders(ctx).get::<ArticleLoader>().load_many(ids).await?;
    Ok(loaded
        .into_iter()
        .map(|(id, article)| (id, Article(article)))
        .collect())
}

/// Loads an article through the request's batching loader.
pub async fn load_article(ctx: &Context<'_>, id: i64) -> async_graphql::Result<Option<Article>> {
    Ok(loaders(ctx)
        .get::<ArticleLoader>()
        .load_one(id)
        .await?
        .map(Article))
}

#[derive(InputObject)]
pub struct PublishArticleInput {
    /// 1–200 characters.
    title: String,
    /// 1–50,000 characters.
    body: String,
}

#[derive(InputObject)]
pub struct EditArticleInput {
    title: Option<String>,
    body: Option<String>,
}

#[derive(Default)]
pub struct ArticlesQuery;

#[Object]
impl ArticlesQuery {
    async fn article(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Option<Article>> {
        let id = ids::decode(&id, NodeType::Article, "id").gql()?;
        load_article(ctx, id).await
    }

    /// All articles (or one author's), newest first.
    #[graphql(complexity = "connection_complexity(child_complexity, first)")]
    async fn articles(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
        author_id: Option<ID>,
    ) -> async_graphql::Result<ArticleConnection> {
        let author_id = author_id
            .map(|id| ids::decode(&id, NodeType::User, "authorId"))
            .transpose()
            .gql()?;
        // One author's articles are the walk `User.articles` pages too; a cursor of the whole list
        // is refused there, and the other way round. (A cursor of another author's list is not: it
        // only names a position among ids, and positions the same walk.)
        let walk = if author_id.is_some() {
            USER_ARTICLES
        } else {
            NEWEST
        };
        let page = PageRequest::parse(walk, first, after.as_deref()).gql()?;
        let articles = services(ctx).articles.list(page, author_id).await.gql()?;
        Ok(connection(articles, Article))
    }
}

#[derive(Default)]
pub struct ArticlesMutation;

#[Object]
impl ArticlesMutation {
    /// Publishes an article as the signed-in user.
    async fn publish_article(
        &self,
        ctx: &Context<'_>,
        input: PublishArticleInput,
    ) -> async_graphql::Result<Article> {
        let article = services(ctx)
            .articles
            .publish(actor(ctx), &input.title, &input.body)
            .await
            .gql()?;
        Ok(Article(article))
    }

    /// Changes title/body only; never touches counters. Author only.
    async fn edit_article(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: EditArticleInput,
    ) -> async_graphql::Result<Article> {
        let id = ids::decode(&id, NodeType::Article, "id").gql()?;
        let changes = ArticleChanges {
            title: input.title,
            body: input.body,
        };
        Ok(Article(
            services(ctx)
                .articles
                .edit(actor(ctx), id, changes)
                .await
                .gql()?,
        ))
    }
}

#[derive(Default)]
pub struct ArticlesSubscription;

#[Subscription]
impl ArticlesSubscription {
    /// Articles as they are published, optionally only one author's.
    async fn article_published(
        &self,
        ctx: &Context<'_>,
        author_id: Option<ID>,
    ) -> async_graphql::Result<impl Stream<Item = Article> + use<>> {
        let author_id = author_id
            .map(|id| ids::decode(&id, NodeType::User, "authorId"))
            .transpose()
            .gql()?;
        let published = services(ctx).articles.published();
        Ok(published.filter_map(move |article| async move {
            author_id
                .is_none_or(|author| author == article.author_id)
                .then_some(Article(article))
        }))
    }
}
