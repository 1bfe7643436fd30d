use async_graphql::{Context, ID, InputObject, Lookahead, Object, SimpleObject, Subscription};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};
use pulse_kit::connection::{Connected, connection, connection_complexity};
use pulse_kit::ids;
use pulse_kit::{actor, loaders, service};

use super::loader::ArticleLoader;
use super::service::{ArticleChanges, NEWEST, USER_ARTICLES};
use crate::accounts::USER;
use crate::accounts::graphql::{User, load_user, prefetch_authors};
use crate::articles::ARTICLE;
use crate::articles::ArticleService;
use crate::articles::ArticleStatsService;
use crate::entities::articles;
use crate::error::{AppError, AppResult, GqlResultExt};
use crate::likes::Subject;
use crate::likes::graphql as likes;
use crate::pagination::{Cursor, Page, PageRequest};

pub struct Article(pub articles::Model);

pub type ArticleConnection = Connected<Article>;

#[Object]
impl Article {
    pub async fn id(&self) -> ID {
        ids::encode(ARTICLE, self.0.id)
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

    /// Likes so far, including those not yet archived to SQL.
    async fn like_count(&self, ctx: &Context<'_>) -> async_graphql::Result<i64> {
        likes::like_count(ctx, Subject::Article(self.0.id), self.0.like_count).await
    }

    /// Whether the signed-in viewer likes this article; false when anonymous.
    async fn viewer_has_liked(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        likes::viewer_has_liked(ctx, Subject::Article(self.0.id)).await
    }

    async fn comment_count(&self) -> i64 {
        self.0.comment_count
    }

    /// Comments, newest first.
    #[graphql(complexity = "connection_complexity(child_complexity, first)")]
    async fn comments(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
    ) -> async_graphql::Result<likes::CommentConnection> {
        likes::article_comments(ctx, self.0.id, first, after).await
    }

    /// The most liked comments (0–10), best first; served from a cache refreshed under a lease.
    #[graphql(complexity = "first.unwrap_or(3).clamp(0, 10) as usize * child_complexity + 1")]
    async fn featured_comments(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 3)] first: Option<i32>,
    ) -> async_graphql::Result<Vec<likes::Comment>> {
        likes::featured_comments(ctx, self.0.id, first).await
    }
}

/// Loads, in one batch per kind, what the selected fields of `rows` need (`node` is the selection
/// of one article): a page of articles costs one round trip per kind whatever its size and however
/// its resolvers are scheduled. See [`pulse_kit::context`].
pub async fn prefetch_articles(
    ctx: &Context<'_>,
    node: Lookahead<'_>,
    rows: &[&articles::Model],
) -> async_graphql::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let authors = prefetch_authors(ctx, &node, rows.iter().map(|row| row.author_id));
    let views = async {
        if node.field("viewCount").exists() {
            let ids = rows.iter().map(|row| row.id);
            crate::views::graphql::prefetch_view_counts(ctx, ids).await?;
        }
        Ok(())
    };
    let subjects: Vec<Subject> = rows.iter().map(|row| Subject::Article(row.id)).collect();
    let likes = likes::prefetch(ctx, &node, &subjects);
    futures_util::try_join!(authors, views, likes)?;
    Ok(())
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

/// Prefetches for a connection of articles: see [`prefetch_articles`].
pub async fn prefetch_page(
    ctx: &Context<'_>,
    page: &Page<articles::Model>,
) -> async_graphql::Result<()> {
    let rows: Vec<&articles::Model> = page.edges.iter().map(|(_, row)| row).collect();
    prefetch_articles(ctx, ctx.look_ahead().field("edges").field("node"), &rows).await
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
    #[graphql(cache_control(max_age = 5))]
    async fn article(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Option<Article>> {
        let id = ids::decode(&id, ARTICLE, "id").gql()?;
        load_article(ctx, id).await
    }

    /// All articles (or one author's), newest first.
    #[graphql(
        complexity = "connection_complexity(child_complexity, first)",
        cache_control(max_age = 5)
    )]
    async fn articles(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
        author_id: Option<ID>,
    ) -> async_graphql::Result<ArticleConnection> {
        let author_id = author_id
            .map(|id| ids::decode(&id, USER, "authorId"))
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
        let articles = service::<ArticleService>(ctx)
            .list(page, author_id)
            .await
            .gql()?;
        prefetch_page(ctx, &articles).await?;
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
        let article = service::<ArticleService>(ctx)
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
        let id = ids::decode(&id, ARTICLE, "id").gql()?;
        let changes = ArticleChanges {
            title: input.title,
            body: input.body,
        };
        Ok(Article(
            service::<ArticleService>(ctx)
                .edit(actor(ctx), id, changes)
                .await
                .gql()?,
        ))
    }
}

/// An article's counters at one moment.
#[derive(SimpleObject)]
pub struct ArticleStats {
    article_id: ID,
    /// Grows with every change of the counters, and compares across server processes: a client
    /// that reconnects (to any process) keeps a snapshot whose version is at least that of the
    /// one it shows, and drops an older one. A decimal integer in a string, as a leaderboard's.
    version: String,
    view_count: i64,
    like_count: i64,
    comment_count: i64,
}

#[derive(Default)]
pub struct ArticlesSubscription;

#[Subscription]
impl ArticlesSubscription {
    /// Articles as they are published, optionally only one author's, in the order they were
    /// announced (not always that of their ids: those commit out of order). With `after` (the
    /// `id` of the last article the client got, or a cursor from `articles`), first every article
    /// announced after it while the client was away, oldest first, then the new ones, each once.
    /// When those cannot be replayed (more than PULSE_REPLAY_LIMIT, or `after` is no longer in
    /// the journal of publications), or the live source lost articles it cannot replay, the
    /// stream sends one error with `extensions.code` RESYNC_REQUIRED and ends: subscribe again
    /// without `after`, then query `articles`, dropping by id what both bring (subscribing after
    /// the newest of a fresh page would not do: an article announced before the journal was
    /// started again is not in it, and resuming after it answers RESYNC_REQUIRED again).
    async fn article_published(
        &self,
        ctx: &Context<'_>,
        author_id: Option<ID>,
        after: Option<String>,
    ) -> async_graphql::Result<impl Stream<Item = async_graphql::Result<Article>> + use<>> {
        let author_id = author_id
            .map(|id| ids::decode(&id, USER, "authorId"))
            .transpose()
            .gql()?;
        let after = after.as_deref().map(published_position).transpose().gql()?;
        let published = service::<ArticleService>(ctx)
            .published(after, author_id)
            .await
            .gql()?;
        // Each event is a new article: what its subscribers share (its author) is read once per
        // span of the shared loaders, and none of it is older than that span.
        loaders(ctx).share();
        Ok(published.map(|article| article.map(Article).gql()))
    }

    /// An article's view, like and comment counts: at once, then whenever they change (at most
    /// one update per `PULSE_STATS_TICK`). Ends if the article is deleted.
    async fn article_stats_changed(
        &self,
        ctx: &Context<'_>,
        article_id: ID,
    ) -> async_graphql::Result<impl Stream<Item = ArticleStats> + use<>> {
        let article = ids::decode(&article_id, ARTICLE, "articleId").gql()?;
        let stats = service::<ArticleStatsService>(ctx)
            .watch(article)
            .await
            .gql()?;
        Ok(stats.map(|stats| ArticleStats {
            article_id: ids::encode(ARTICLE, stats.article),
            version: stats.version.to_string(),
            view_count: stats.view_count,
            like_count: stats.like_count,
            comment_count: stats.comment_count,
        }))
    }
}

/// The publication position `articlePublished`'s `after` names: an Article id, or a cursor of
/// `articles` (both walk articles by id, the publication order).
fn published_position(after: &str) -> AppResult<i64> {
    if let Ok(article) = ids::decode(&ID::from(after), ARTICLE, "after") {
        return Ok(article);
    }
    Cursor::decode::<()>(NEWEST, after)
        .map(|position| position.id)
        .map_err(|_| AppError::bad_input("after", "not an Article id or an `articles` cursor"))
}
