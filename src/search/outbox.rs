//! The search outbox in SQL: what the domains write, in their own transactions, and what the
//! indexer reads back.

use std::collections::BTreeSet;

use sea_orm::sea_query::{Expr, ExprTrait as _};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};

use crate::entities::{articles, search_outbox, search_state};

/// Rows of one multi-row insert.
const CHUNK: usize = 500;

/// Records that the search documents of `articles` changed. Call it inside the transaction that
/// changes them, so the record commits (or rolls back) with the change.
pub async fn record(
    txn: &impl ConnectionTrait,
    articles: impl IntoIterator<Item = i64>,
) -> Result<(), DbErr> {
    let now = crate::db::now();
    let ids: BTreeSet<i64> = articles.into_iter().collect();
    let rows: Vec<search_outbox::ActiveModel> = ids
        .into_iter()
        .map(|article_id| search_outbox::ActiveModel {
            article_id: Set(article_id),
            created_at: Set(now),
            ..Default::default()
        })
        .collect();
    for chunk in rows.chunks(CHUNK) {
        search_outbox::Entity::insert_many(chunk.to_vec())
            .exec_without_returning(txn)
            .await?;
    }
    Ok(())
}

/// Outbox rows above `through`, oldest first.
pub async fn after(
    db: &impl ConnectionTrait,
    through: i64,
    limit: u64,
) -> Result<Vec<search_outbox::Model>, DbErr> {
    search_outbox::Entity::find()
        .filter(search_outbox::Column::Id.gt(through))
        .order_by_asc(search_outbox::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The rows among `ids` that are visible now.
pub async fn among(
    db: &impl ConnectionTrait,
    ids: &[i64],
) -> Result<Vec<search_outbox::Model>, DbErr> {
    let mut rows = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        rows.extend(
            search_outbox::Entity::find()
                .filter(search_outbox::Column::Id.is_in(chunk.iter().copied()))
                .all(db)
                .await?,
        );
    }
    Ok(rows)
}

/// The creation time of the oldest row above `through`, if any.
pub async fn oldest_after(
    db: &impl ConnectionTrait,
    through: i64,
) -> Result<Option<chrono::NaiveDateTime>, DbErr> {
    search_outbox::Entity::find()
        .select_only()
        .column(search_outbox::Column::CreatedAt)
        .filter(search_outbox::Column::Id.gt(through))
        .order_by_asc(search_outbox::Column::Id)
        .into_tuple()
        .one(db)
        .await
}

/// The highest outbox id, and the highest one created before `before`.
pub async fn high_marks(
    db: &impl ConnectionTrait,
    before: chrono::NaiveDateTime,
) -> Result<(i64, i64), DbErr> {
    let max = |filter: Option<chrono::NaiveDateTime>| async move {
        let mut query = search_outbox::Entity::find()
            .select_only()
            .expr(search_outbox::Column::Id.max());
        if let Some(before) = filter {
            query = query.filter(search_outbox::Column::CreatedAt.lt(before));
        }
        query
            .into_tuple::<Option<i64>>()
            .one(db)
            .await
            .map(|max| max.flatten().unwrap_or(0))
    };
    Ok((max(None).await?, max(Some(before)).await?))
}

/// The ids among `low+1..=high` that have a row now.
pub async fn ids_between(
    db: &impl ConnectionTrait,
    low: i64,
    high: i64,
) -> Result<BTreeSet<i64>, DbErr> {
    let ids: Vec<i64> = search_outbox::Entity::find()
        .select_only()
        .column(search_outbox::Column::Id)
        .filter(search_outbox::Column::Id.gt(low))
        .filter(search_outbox::Column::Id.lte(high))
        .into_tuple()
        .all(db)
        .await?;
    Ok(ids.into_iter().collect())
}

/// The shared state row.
pub async fn state(db: &impl ConnectionTrait) -> Result<search_state::Model, DbErr> {
    search_state::Entity::find_by_id(1)
        .one(db)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("search_state has no row".into()))
}

/// Raises the epoch: every replica rebuilds from SQL at its next poll.
pub async fn raise_epoch(db: &impl ConnectionTrait) -> Result<i64, DbErr> {
    search_state::Entity::update_many()
        .col_expr(
            search_state::Column::Epoch,
            Expr::col(search_state::Column::Epoch).add(1),
        )
        .filter(search_state::Column::Id.eq(1))
        .exec(db)
        .await?;
    Ok(state(db).await?.epoch)
}

/// Deletes the rows created before `before`, and records the highest id deleted in
/// `search_state.pruned_through` in the same transaction. Returns how many rows went.
pub async fn prune(db: &DatabaseConnection, before: chrono::NaiveDateTime) -> Result<u64, DbErr> {
    let txn = db.begin().await?;
    let (_, through) = high_marks(&txn, before).await?;
    if through == 0 {
        return Ok(0);
    }
    let deleted = search_outbox::Entity::delete_many()
        .filter(search_outbox::Column::Id.lte(through))
        .exec(&txn)
        .await?;
    search_state::Entity::update_many()
        .col_expr(search_state::Column::PrunedThrough, Expr::value(through))
        .filter(search_state::Column::Id.eq(1))
        .filter(search_state::Column::PrunedThrough.lt(through))
        .exec(&txn)
        .await?;
    txn.commit().await?;
    Ok(deleted.rows_affected)
}

/// The articles of `ids` as they are now, in one query (an id with no row was deleted).
pub async fn articles(
    db: &impl ConnectionTrait,
    ids: &[i64],
) -> Result<Vec<articles::Model>, DbErr> {
    let mut rows = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        rows.extend(
            articles::Entity::find()
                .filter(articles::Column::Id.is_in(chunk.iter().copied()))
                .all(db)
                .await?,
        );
    }
    Ok(rows)
}

/// A page of all articles by id, for a rebuild.
pub async fn articles_after(
    db: &impl ConnectionTrait,
    after: i64,
    limit: u64,
) -> Result<Vec<articles::Model>, DbErr> {
    articles::Entity::find()
        .filter(articles::Column::Id.gt(after))
        .order_by_asc(articles::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// A page of every article's (id, views, likes) by id, for a replica loading its counts.
pub async fn counts_after(
    db: &impl ConnectionTrait,
    after: i64,
    limit: u64,
) -> Result<Vec<(i64, i64, i64)>, DbErr> {
    articles::Entity::find()
        .select_only()
        .columns([
            articles::Column::Id,
            articles::Column::ViewCount,
            articles::Column::LikeCount,
        ])
        .filter(articles::Column::Id.gt(after))
        .order_by_asc(articles::Column::Id)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}
