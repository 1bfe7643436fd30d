use std::collections::HashMap;
use std::sync::Arc;

use pulse_kit::actor::Actor;
use sea_orm::sea_query::{Expr, ExprTrait as _, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, SqlErr, TransactionTrait,
};

use crate::db::retry_once;
use crate::entities::{follow_counts, follows};
use crate::error::{AppError, AppResult, Unique, UniqueViolationExt as _};
use crate::pagination::{Page, PageRequest, Position, Walk};

/// A user's followers, newest follow first (`User.followers`).
pub const FOLLOWERS: Walk = Walk("followers");
/// The users a user follows, newest follow first (`User.following`).
pub const FOLLOWING: Walk = Walk("following");

/// What a `follow` or `unfollow` left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowOutcome {
    /// Whether the viewer follows the user now.
    pub following: bool,
    /// Whether this call changed the graph (false for a repeat).
    pub changed: bool,
}

/// A follow or unfollow that changed the graph, as committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowChange {
    pub follower: i64,
    pub followee: i64,
    /// Whether `follower` follows `followee` after the change.
    pub following: bool,
    /// `followee`'s follower count right after the change, read in its transaction: a listener
    /// can tell which change crossed a threshold, even among concurrent ones.
    pub followers: i64,
}

/// What reacts to the graph's changes (the feed keeps its caches in line): told of every change
/// after it committed, before the mutation answers. A listener that fails must not fail the
/// mutation: the graph has changed already.
#[async_trait::async_trait]
pub trait FollowListener: Send + Sync {
    async fn changed(&self, change: FollowChange);
}

/// A user's follower and following counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowCounts {
    pub followers: i64,
    pub following: i64,
}

#[derive(Clone)]
pub struct FollowService {
    db: DatabaseConnection,
    listener: Option<Arc<dyn FollowListener>>,
}

impl FollowService {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db, listener: None }
    }

    /// This service, telling `listener` of every change it makes.
    pub fn with_listener(self, listener: Arc<dyn FollowListener>) -> Self {
        Self {
            listener: Some(listener),
            ..self
        }
    }

    async fn tell(&self, change: Option<FollowChange>) {
        if let (Some(listener), Some(change)) = (&self.listener, change) {
            listener.changed(change).await;
        }
    }

    /// Makes the signed-in actor follow `followee`. Idempotent; following oneself is refused.
    #[tracing::instrument(skip_all, fields(followee))]
    pub async fn follow(&self, actor: &Actor, followee: i64) -> AppResult<FollowOutcome> {
        let follower = actor.require_user()?;
        if follower == followee {
            return Err(AppError::bad_input("userId", "you cannot follow yourself"));
        }
        let followers = retry_once(|| self.insert_follow(follower, followee))
            .await
            .map_err(|err| match err.sql_err() {
                Some(SqlErr::ForeignKeyConstraintViolation(_)) => AppError::NotFound("user"),
                _ => err.into(),
            })?;
        let change = followers.map(|followers| FollowChange {
            follower,
            followee,
            following: true,
            followers,
        });
        self.tell(change).await;
        Ok(FollowOutcome {
            following: true,
            changed: change.is_some(),
        })
    }

    /// One transaction: the row (unless there is one) and, only if it was inserted, both counts.
    /// Returns the followee's follower count after an insert, `None` for a repeat. Safe to retry:
    /// a committed first attempt makes the second find the row and change nothing.
    async fn insert_follow(
        &self,
        follower: i64,
        followee: i64,
    ) -> Result<Option<i64>, sea_orm::DbErr> {
        let txn = self.db.begin().await?;
        // A duplicate is the one outcome refused by the unique pair, not an update of the row to
        // itself: MySQL would count that as an affected row.
        let inserted = follows::Entity::insert(follows::ActiveModel {
            follower_id: Set(follower),
            followee_id: Set(followee),
            created_at: Set(crate::db::now()),
            ..Default::default()
        })
        .exec_without_returning(&txn)
        .await
        .or_duplicate()?;
        if let Unique::Duplicate = inserted {
            txn.rollback().await?;
            return Ok(None);
        }
        let followers = shift_counts(&txn, follower, followee, 1).await?;
        txn.commit().await?;
        Ok(Some(followers))
    }

    /// Makes the signed-in actor stop following `followee`. Idempotent.
    #[tracing::instrument(skip_all, fields(followee))]
    pub async fn unfollow(&self, actor: &Actor, followee: i64) -> AppResult<FollowOutcome> {
        let follower = actor.require_user()?;
        let delete = || async {
            let txn = self.db.begin().await?;
            let deleted = follows::Entity::delete_many()
                .filter(follows::Column::FollowerId.eq(follower))
                .filter(follows::Column::FolloweeId.eq(followee))
                .exec(&txn)
                .await?
                .rows_affected;
            let followers = if deleted == 1 {
                Some(shift_counts(&txn, follower, followee, -1).await?)
            } else {
                None
            };
            txn.commit().await?;
            Ok::<_, sea_orm::DbErr>(followers)
        };
        let change = retry_once(delete).await?.map(|followers| FollowChange {
            follower,
            followee,
            following: false,
            followers,
        });
        self.tell(change).await;
        Ok(FollowOutcome {
            following: false,
            changed: change.is_some(),
        })
    }

    /// Follower and following counts of `users`; users without a row count 0.
    pub async fn counts(&self, users: &[i64]) -> AppResult<HashMap<i64, FollowCounts>> {
        let query = follow_counts::Entity::find()
            .filter(follow_counts::Column::UserId.is_in(users.iter().copied()));
        let rows = retry_once(|| query.clone().all(&self.db)).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let counts = FollowCounts {
                    followers: row.followers,
                    following: row.following,
                };
                (row.user_id, counts)
            })
            .collect())
    }

    /// The follows from any of `followers` to any of `followees`, as (follower, followee).
    pub async fn follows_among(
        &self,
        followers: &[i64],
        followees: &[i64],
    ) -> AppResult<Vec<(i64, i64)>> {
        let query = follows::Entity::find()
            .select_only()
            .column(follows::Column::FollowerId)
            .column(follows::Column::FolloweeId)
            .filter(follows::Column::FollowerId.is_in(followers.iter().copied()))
            .filter(follows::Column::FolloweeId.is_in(followees.iter().copied()));
        Ok(retry_once(|| query.clone().into_tuple::<(i64, i64)>().all(&self.db)).await?)
    }

    /// Everyone `follower` follows.
    pub async fn followees(&self, follower: i64) -> AppResult<Vec<i64>> {
        let query = follows::Entity::find()
            .select_only()
            .column(follows::Column::FolloweeId)
            .filter(follows::Column::FollowerId.eq(follower));
        Ok(retry_once(|| query.clone().into_tuple::<i64>().all(&self.db)).await?)
    }

    /// A page of `user`'s followers (`FOLLOWERS`) or followees (`FOLLOWING`) as user ids, newest
    /// follow first.
    pub async fn list(&self, user: i64, page: PageRequest) -> AppResult<Page<i64>> {
        let (mine, theirs) = if page.walk == FOLLOWERS {
            (follows::Column::FolloweeId, follows::Column::FollowerId)
        } else {
            (follows::Column::FollowerId, follows::Column::FolloweeId)
        };
        let mut query = follows::Entity::find()
            .select_only()
            .column(follows::Column::Id)
            .column(theirs)
            .filter(mine.eq(user))
            .order_by_desc(follows::Column::Id)
            .limit(page.fetch_limit());
        if let Some(after) = page.after {
            query = query.filter(follows::Column::Id.lt(after.id));
        }
        let rows: Vec<(i64, i64)> = retry_once(|| query.clone().into_tuple().all(&self.db)).await?;
        let page = Page::from_overfetch(rows, &page, |&(id, _)| Position::id(id));
        Ok(Page {
            edges: page
                .edges
                .into_iter()
                .map(|(cursor, (_, user))| (cursor, user))
                .collect(),
            has_next_page: page.has_next_page,
        })
    }
}

/// Adds `by` to `follower`'s following count and `followee`'s follower count, creating their rows.
/// Returns `followee`'s follower count after it: the transaction's own update holds the row, so
/// no concurrent change comes between.
async fn shift_counts(
    txn: &impl ConnectionTrait,
    follower: i64,
    followee: i64,
    by: i64,
) -> Result<i64, sea_orm::DbErr> {
    let rows = [follower, followee].map(|user| follow_counts::ActiveModel {
        user_id: Set(user),
        followers: Set(0),
        following: Set(0),
    });
    follow_counts::Entity::insert_many(rows)
        .on_conflict(
            OnConflict::column(follow_counts::Column::UserId)
                .do_nothing_on([follow_counts::Column::UserId])
                .to_owned(),
        )
        .exec_without_returning(txn)
        .await?;
    for (user, column) in [
        (follower, follow_counts::Column::Following),
        (followee, follow_counts::Column::Followers),
    ] {
        follow_counts::Entity::update_many()
            .col_expr(column, Expr::col(column).add(by))
            .filter(follow_counts::Column::UserId.eq(user))
            .exec(txn)
            .await?;
    }
    let followers: Option<i64> = follow_counts::Entity::find_by_id(followee)
        .select_only()
        .column(follow_counts::Column::Followers)
        .into_tuple()
        .one(txn)
        .await?;
    followers.ok_or_else(|| sea_orm::DbErr::RecordNotFound("the followee's counts".into()))
}
