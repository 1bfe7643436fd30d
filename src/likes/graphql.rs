use async_graphql::{Context, ID, Lookahead, Object};
use chrono::{DateTime, Utc};
use pulse_kit::connection::{Connected, connection};
use pulse_kit::ids;
use pulse_kit::{actor, loaders, service};

use super::Subject;
use super::comments::ARTICLE_COMMENTS;
use super::featured::MAX_FEATURED;
use super::loader::{CommentLoader, LikeCountLoader, ViewerLikedLoader};
use crate::accounts::graphql::{User, load_user, prefetch_authors};
use crate::articles::ARTICLE;
use crate::articles::graphql::{Article, load_article};
use crate::entities::comments;
use crate::error::{AppError, GqlResultExt};
use crate::likes::COMMENT;
use crate::likes::CommentService;
use crate::likes::LikeService;
use crate::likes::featured::FeaturedCommentService;
use crate::pagination::{PageRequest, PageSize};

pub struct Comment(pub comments::Model);

pub type CommentConnection = Connected<Comment>;

#[Object]
impl Comment {
    pub async fn id(&self) -> ID {
        ids::encode(COMMENT, self.0.id)
    }

    async fn body(&self) -> &str {
        &self.0.body
    }

    async fn author(&self, ctx: &Context<'_>) -> async_graphql::Result<User> {
        load_user(ctx, self.0.author_id)
            .await?
            .ok_or_else(|| AppError::Internal(format!("comment {} has no author", self.0.id)))
            .gql()
    }

    async fn article(&self, ctx: &Context<'_>) -> async_graphql::Result<Article> {
        load_article(ctx, self.0.article_id)
            .await?
            .ok_or(AppError::NotFound("article"))
            .gql()
    }

    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at.and_utc()
    }

    /// Likes so far, including those not yet archived to SQL.
    async fn like_count(&self, ctx: &Context<'_>) -> async_graphql::Result<i64> {
        like_count(ctx, Subject::Comment(self.0.id), self.0.like_count).await
    }

    /// Whether the signed-in viewer likes this comment; false when anonymous.
    async fn viewer_has_liked(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        viewer_has_liked(ctx, Subject::Comment(self.0.id)).await
    }
}

/// Loads a comment through the request's batching loader.
pub async fn load_comment(ctx: &Context<'_>, id: i64) -> async_graphql::Result<Option<Comment>> {
    Ok(loaders(ctx)
        .get::<CommentLoader>()
        .load_one(id)
        .await?
        .map(Comment))
}

/// The likes to show for a subject whose SQL row (and so its archived count) the caller holds.
pub async fn like_count(
    ctx: &Context<'_>,
    subject: Subject,
    sql_like_count: i64,
) -> async_graphql::Result<i64> {
    let live = loaders(ctx)
        .get::<LikeCountLoader>()
        .load_one(subject)
        .await?
        .unwrap_or_default();
    Ok(live.total(sql_like_count))
}

/// Whether the signed-in viewer likes `subject`; false when anonymous.
pub async fn viewer_has_liked(ctx: &Context<'_>, subject: Subject) -> async_graphql::Result<bool> {
    let Some(user) = actor(ctx).user else {
        return Ok(false);
    };
    Ok(loaders(ctx)
        .get::<ViewerLikedLoader>()
        .load_one((user, subject))
        .await?
        .unwrap_or(false))
}

/// Loads in one batch per kind what the selected like fields of `subjects` need (`node` is the
/// selection of one subject). See [`pulse_kit::context`].
pub async fn prefetch(
    ctx: &Context<'_>,
    node: &Lookahead<'_>,
    subjects: &[Subject],
) -> async_graphql::Result<()> {
    let counts = async {
        if node.field("likeCount").exists() {
            let loader = loaders(ctx).get::<LikeCountLoader>();
            loader.load_many(subjects.iter().copied()).await?;
        }
        Ok::<_, async_graphql::Error>(())
    };
    let liked = async {
        if let Some(user) = actor(ctx).user
            && node.field("viewerHasLiked").exists()
        {
            let loader = loaders(ctx).get::<ViewerLikedLoader>();
            let keys = subjects.iter().map(|&subject| (user, subject));
            loader.load_many(keys).await?;
        }
        Ok(())
    };
    futures_util::try_join!(counts, liked)?;
    Ok(())
}

/// Prefetches what the selected fields of `rows` need; see [`prefetch`].
async fn prefetch_comments(
    ctx: &Context<'_>,
    node: Lookahead<'_>,
    rows: &[&comments::Model],
) -> async_graphql::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let authors = prefetch_authors(ctx, &node, rows.iter().map(|row| row.author_id));
    let subjects: Vec<Subject> = rows.iter().map(|row| Subject::Comment(row.id)).collect();
    futures_util::try_join!(authors, prefetch(ctx, &node, &subjects))?;
    Ok(())
}

/// An article's comments, newest first.
pub async fn article_comments(
    ctx: &Context<'_>,
    article: i64,
    first: Option<i32>,
    after: Option<String>,
) -> async_graphql::Result<CommentConnection> {
    let page = PageRequest::parse(ARTICLE_COMMENTS, first, after.as_deref()).gql()?;
    let comments = service::<CommentService>(ctx)
        .list(article, page)
        .await
        .gql()?;
    let rows: Vec<&comments::Model> = comments.edges.iter().map(|(_, row)| row).collect();
    prefetch_comments(ctx, ctx.look_ahead().field("edges").field("node"), &rows).await?;
    Ok(connection(comments, Comment))
}

/// An article's most liked comments, best first.
pub async fn featured_comments(
    ctx: &Context<'_>,
    article: i64,
    first: Option<i32>,
) -> async_graphql::Result<Vec<Comment>> {
    let first = PageSize::parse(first.unwrap_or(3), MAX_FEATURED as i32)
        .gql()?
        .get();
    let ids = service::<FeaturedCommentService>(ctx)
        .get(article, first)
        .await
        .gql()?;
    let mut found = loaders(ctx)
        .get::<CommentLoader>()
        .load_many(ids.iter().copied())
        .await?;
    // A comment deleted since the list was computed simply drops out.
    let featured: Vec<comments::Model> =
        ids.into_iter().filter_map(|id| found.remove(&id)).collect();
    prefetch_comments(ctx, ctx.look_ahead(), &featured.iter().collect::<Vec<_>>()).await?;
    Ok(featured.into_iter().map(Comment).collect())
}

/// What a like or unlike left, at once.
pub struct LikePayload {
    liked: bool,
    like_count: i64,
    subject: Subject,
}

#[Object]
impl LikePayload {
    /// Whether the viewer likes the subject now.
    async fn liked(&self) -> bool {
        self.liked
    }

    /// The subject's likes now, this change included.
    async fn like_count(&self) -> i64 {
        self.like_count
    }

    async fn subject_id(&self) -> ID {
        subject_id(self.subject)
    }
}

fn subject_id(subject: Subject) -> ID {
    match subject {
        Subject::Article(id) => ids::encode(ARTICLE, id),
        Subject::Comment(id) => ids::encode(COMMENT, id),
    }
}

fn decode_subject(id: &ID) -> Result<Subject, AppError> {
    match ids::decode_among(id, &[ARTICLE, COMMENT], "subjectId")? {
        Some((ARTICLE, id)) => Ok(Subject::Article(id)),
        Some((_, id)) => Ok(Subject::Comment(id)),
        None => Err(AppError::bad_input(
            "subjectId",
            "not an Article or Comment id",
        )),
    }
}

#[derive(Default)]
pub struct LikesMutation;

#[Object]
impl LikesMutation {
    /// Likes an Article or a Comment as the signed-in user. Idempotent: liking twice counts once.
    async fn like(&self, ctx: &Context<'_>, subject_id: ID) -> async_graphql::Result<LikePayload> {
        set_like(ctx, &subject_id, true).await
    }

    /// Withdraws a like. Idempotent: unliking what is not liked changes nothing.
    async fn unlike(
        &self,
        ctx: &Context<'_>,
        subject_id: ID,
    ) -> async_graphql::Result<LikePayload> {
        set_like(ctx, &subject_id, false).await
    }

    /// Comments on an article as the signed-in user (1–5,000 characters).
    async fn add_comment(
        &self,
        ctx: &Context<'_>,
        article_id: ID,
        body: String,
    ) -> async_graphql::Result<Comment> {
        let article = ids::decode(&article_id, ARTICLE, "articleId").gql()?;
        let comment = service::<CommentService>(ctx)
            .add(actor(ctx), article, &body)
            .await
            .gql()?;
        Ok(Comment(comment))
    }

    /// Deletes a comment: its author or an admin only. True once it is gone.
    async fn delete_comment(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<bool> {
        let id = ids::decode(&id, COMMENT, "id").gql()?;
        service::<CommentService>(ctx)
            .delete(actor(ctx), id)
            .await
            .gql()?;
        Ok(true)
    }
}

async fn set_like(
    ctx: &Context<'_>,
    subject_id: &ID,
    like: bool,
) -> async_graphql::Result<LikePayload> {
    let subject = decode_subject(subject_id).gql()?;
    let outcome = service::<LikeService>(ctx)
        .set(actor(ctx), subject, like)
        .await
        .gql()?;
    Ok(LikePayload {
        liked: outcome.liked,
        like_count: outcome.like_count,
        subject,
    })
}
