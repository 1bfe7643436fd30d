//! Comments on articles: added by signed-in users, deleted by their author or an admin, listed
//! newest first. A comment and its article's `comment_count` change in one transaction.

use pulse_kit::actor::Actor;
use sea_orm::sea_query::{Expr, ExprTrait as _};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, SqlErr, TransactionTrait,
};

use super::Subject;
use crate::accounts::AccountService;
use crate::db::retry_once;
use crate::entities::{articles, comments, likes};
use crate::error::{AppError, AppResult};
use crate::keys::LikeKeys;
use crate::pagination::{Page, PageRequest, Position, Walk};
use crate::redis::Redis;
use crate::text::{Controls, TextRule, Trim};

/// One article's comments, newest first (`Article.comments`).
pub const ARTICLE_COMMENTS: Walk = Walk("comments");

pub const MAX_COMMENT_CHARS: usize = 5_000;

/// A comment as stored: exactly as sent, with something besides whitespace.
const BODY: TextRule = TextRule {
    field: "body",
    noun: "a comment",
    chars: 1..=MAX_COMMENT_CHARS,
    unit: "characters",
    trim: Trim::Kept,
    controls: Controls::AllButNul,
};

#[derive(Clone)]
pub struct CommentService {
    db: DatabaseConnection,
    redis: Redis,
    accounts: AccountService,
}

impl CommentService {
    pub fn new(db: DatabaseConnection, redis: Redis, accounts: AccountService) -> Self {
        Self {
            db,
            redis,
            accounts,
        }
    }

    /// Adds a comment as the signed-in actor; `NOT_FOUND` when the article does not exist.
    #[tracing::instrument(skip_all, fields(article.id = article))]
    pub async fn add(&self, actor: &Actor, article: i64, body: &str) -> AppResult<comments::Model> {
        let author = actor.require_user()?;
        let body = BODY.parse(body)?.to_owned();
        let txn = self.db.begin().await?;
        // The count first: it locks the article's row (and fails early when there is none), and on
        // SQLite it makes the transaction a writer from its first statement.
        let counted = articles::Entity::update_many()
            .col_expr(
                articles::Column::CommentCount,
                Expr::col(articles::Column::CommentCount).add(1),
            )
            .filter(articles::Column::Id.eq(article))
            .exec(&txn)
            .await?;
        if counted.rows_affected == 0 {
            return Err(AppError::NotFound("article"));
        }
        let comment = comments::ActiveModel {
            article_id: Set(article),
            author_id: Set(author),
            body: Set(body),
            like_count: Set(0),
            like_version: Set(0),
            created_at: Set(crate::db::now()),
            ..Default::default()
        }
        .insert(&txn)
        .await
        .map_err(|err| match err.sql_err() {
            // The article went between the count and the insert, or the author no longer exists.
            Some(SqlErr::ForeignKeyConstraintViolation(_)) => AppError::NotFound("article"),
            _ => err.into(),
        })?;
        txn.commit().await?;
        self.announce(article).await;
        Ok(comment)
    }

    /// Deletes a comment, its likes and its place in the article's count. The author or an admin
    /// only; `NOT_FOUND` when no such comment exists.
    #[tracing::instrument(skip_all, fields(comment.id = id))]
    pub async fn delete(&self, actor: &Actor, id: i64) -> AppResult<()> {
        let user = actor.require_user()?;
        let comment = self.get(id).await?.ok_or(AppError::NotFound("comment"))?;
        if comment.author_id != user {
            self.accounts.require_admin(user).await.map_err(|_| {
                AppError::Forbidden("only the author or an admin can delete a comment")
            })?;
        }
        let txn = self.db.begin().await?;
        let deleted = comments::Entity::delete_by_id(id).exec(&txn).await?;
        if deleted.rows_affected == 0 {
            return Err(AppError::NotFound("comment"));
        }
        articles::Entity::update_many()
            .col_expr(
                articles::Column::CommentCount,
                Expr::col(articles::Column::CommentCount).sub(1),
            )
            .filter(articles::Column::Id.eq(comment.article_id))
            .exec(&txn)
            .await?;
        let subject = Subject::Comment(id);
        likes::Entity::delete_many()
            .filter(likes::Column::SubjectKind.eq(subject.kind_code()))
            .filter(likes::Column::SubjectId.eq(id))
            .exec(&txn)
            .await?;
        txn.commit().await?;
        // Without its cached count, a like of the deleted comment reads SQL and is NOT_FOUND.
        let shard = self.redis.keys.like_shard(subject.id());
        let mut forget = redis::pipe();
        forget
            .hdel(shard.base(), subject.field())
            .ignore()
            .hdel(shard.base_versions(), subject.field())
            .ignore();
        let mut conn = self.redis.conn.clone();
        if let Err(err) = forget.query_async::<()>(&mut conn).await {
            tracing::warn!(error = %err, comment.id = id, "comment deleted but its cached like count kept");
        }
        self.announce(comment.article_id).await;
        Ok(())
    }

    /// Tells `articleStatsChanged` subscribers that the article's comment count moved, with a new
    /// version. The change is committed already; a failure is logged, and the next change of any
    /// counter tells anew.
    async fn announce(&self, article: i64) {
        let mut conn = self.redis.conn.clone();
        let shard = self.redis.keys.like_shard(article);
        let published = crate::scripts::SCRIPTS
            .article_stats_bump
            .key(shard.article_stats_versions())
            .arg(article)
            .arg(chrono::Utc::now().timestamp_micros())
            .arg(shard.article_stats_channel(article))
            .arg(self.redis.target.sharded_publish())
            .invoke_async::<i64>(&mut conn)
            .await;
        if let Err(err) = published {
            tracing::warn!(error = %err, article.id = article, "cannot announce an article's new comment count");
        }
    }

    pub async fn get(&self, id: i64) -> AppResult<Option<comments::Model>> {
        Ok(retry_once(|| comments::Entity::find_by_id(id).one(&self.db)).await?)
    }

    pub async fn by_ids(&self, ids: &[i64]) -> AppResult<Vec<comments::Model>> {
        let query =
            comments::Entity::find().filter(comments::Column::Id.is_in(ids.iter().copied()));
        Ok(retry_once(|| query.clone().all(&self.db)).await?)
    }

    /// An article's comments, newest first: ids grow with time, so it is a descending walk of
    /// `(article_id, id)`.
    pub async fn list(&self, article: i64, page: PageRequest) -> AppResult<Page<comments::Model>> {
        let mut query = comments::Entity::find()
            .filter(comments::Column::ArticleId.eq(article))
            .order_by_desc(comments::Column::Id);
        if let Some(after) = page.after {
            query = query.filter(comments::Column::Id.lt(after.id));
        }
        let query = query.limit(page.fetch_limit());
        let rows = retry_once(|| query.clone().all(&self.db)).await?;
        Ok(Page::from_overfetch(rows, &page, |row| {
            Position::id(row.id)
        }))
    }

    /// The ids of an article's most liked comments as archived in SQL, best first (ties: older
    /// first).
    pub async fn most_liked(&self, article: i64, limit: u64) -> AppResult<Vec<i64>> {
        let query = comments::Entity::find()
            .select_only()
            .column(comments::Column::Id)
            .filter(comments::Column::ArticleId.eq(article))
            .filter(comments::Column::LikeCount.gt(0))
            .order_by_desc(comments::Column::LikeCount)
            .order_by_asc(comments::Column::Id)
            .limit(limit);
        Ok(retry_once(|| query.clone().into_tuple::<i64>().all(&self.db)).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comment_bodies_are_bounded_and_kept_as_sent() {
        assert_eq!(BODY.parse("  nice  ").unwrap(), "  nice  ");
        assert!(BODY.parse("   ").is_err());
        assert!(BODY.parse(&"é".repeat(MAX_COMMENT_CHARS)).is_ok());
        assert!(BODY.parse(&"é".repeat(MAX_COMMENT_CHARS + 1)).is_err());
        assert!(BODY.parse("nul\0").is_err());
    }
}
