//! The like counters of SQL's liked tables (`articles`, `comments`): each has an id, a `like_count`
//! and a `like_version`, and every query on them is the same but for the table.

use std::collections::HashMap;

use sea_orm::sea_query::{CaseStatement, Expr, ExprTrait as _};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

use super::Subject;
use super::service::SqlCount;
use crate::entities::{articles, comments};

/// Rows per multi-row statement.
const CHUNK: usize = 200;

/// A liked table's columns.
struct Columns<C> {
    id: C,
    count: C,
    version: C,
}

const ARTICLES: Columns<articles::Column> = Columns {
    id: articles::Column::Id,
    count: articles::Column::LikeCount,
    version: articles::Column::LikeVersion,
};

const COMMENTS: Columns<comments::Column> = Columns {
    id: comments::Column::Id,
    count: comments::Column::LikeCount,
    version: comments::Column::LikeVersion,
};

/// What a kind of subject is called, for messages.
pub fn noun(subject: Subject) -> &'static str {
    match subject {
        Subject::Article(_) => "article",
        Subject::Comment(_) => "comment",
    }
}

/// Adds each subject's net change to its `like_count` and bumps its `like_version`.
pub async fn add(conn: &impl ConnectionTrait, deltas: &HashMap<Subject, i64>) -> Result<(), DbErr> {
    let (mut on_articles, mut on_comments) = (Vec::new(), Vec::new());
    for (&subject, &delta) in deltas.iter().filter(|(_, delta)| **delta != 0) {
        match subject {
            Subject::Article(id) => on_articles.push((id, delta)),
            Subject::Comment(id) => on_comments.push((id, delta)),
        }
    }
    add_to::<articles::Entity>(conn, &on_articles, &ARTICLES).await?;
    add_to::<comments::Entity>(conn, &on_comments, &COMMENTS).await
}

async fn add_to<E>(
    conn: &impl ConnectionTrait,
    deltas: &[(i64, i64)],
    columns: &Columns<E::Column>,
) -> Result<(), DbErr>
where
    E: EntityTrait,
{
    let Columns { id, count, version } = *columns;
    for chunk in deltas.chunks(CHUNK) {
        let mut by_id = CaseStatement::new();
        for &(row, delta) in chunk {
            by_id = by_id.case(id.eq(row), Expr::col(count).add(delta));
        }
        E::update_many()
            .col_expr(count, by_id.finally(Expr::col(count)).into())
            .col_expr(version, Expr::col(version).add(1))
            .filter(id.is_in(chunk.iter().map(|(row, _)| *row)))
            .exec(conn)
            .await?;
    }
    Ok(())
}

/// The count and version of every subject of `subjects` that exists.
pub async fn read(
    conn: &impl ConnectionTrait,
    subjects: impl IntoIterator<Item = Subject>,
) -> Result<HashMap<Subject, SqlCount>, DbErr> {
    let (mut article_ids, mut comment_ids) = (Vec::new(), Vec::new());
    for subject in subjects {
        match subject {
            Subject::Article(id) => article_ids.push(id),
            Subject::Comment(id) => comment_ids.push(id),
        }
    }
    let mut counts = HashMap::new();
    for (id, count) in read_from::<articles::Entity>(conn, &article_ids, &ARTICLES).await? {
        counts.insert(Subject::Article(id), count);
    }
    for (id, count) in read_from::<comments::Entity>(conn, &comment_ids, &COMMENTS).await? {
        counts.insert(Subject::Comment(id), count);
    }
    Ok(counts)
}

async fn read_from<E>(
    conn: &impl ConnectionTrait,
    ids: &[i64],
    columns: &Columns<E::Column>,
) -> Result<Vec<(i64, SqlCount)>, DbErr>
where
    E: EntityTrait,
{
    let Columns { id, count, version } = *columns;
    let mut found = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let rows: Vec<(i64, i64, i64)> = E::find()
            .select_only()
            .column(id)
            .column(count)
            .column(version)
            .filter(id.is_in(chunk.iter().copied()))
            .into_tuple()
            .all(conn)
            .await?;
        found.extend(
            rows.into_iter()
                .map(|(row, count, version)| (row, SqlCount { count, version })),
        );
    }
    Ok(found)
}

/// Up to `limit` subjects of `kind`'s table after id `after`, by id, with their counts.
pub async fn page(
    conn: &impl ConnectionTrait,
    kind: Subject,
    after: i64,
    limit: u64,
) -> Result<Vec<(Subject, SqlCount)>, DbErr> {
    Ok(match kind {
        Subject::Article(_) => page_of::<articles::Entity>(conn, after, limit, &ARTICLES)
            .await?
            .into_iter()
            .map(|(id, count)| (Subject::Article(id), count))
            .collect(),
        Subject::Comment(_) => page_of::<comments::Entity>(conn, after, limit, &COMMENTS)
            .await?
            .into_iter()
            .map(|(id, count)| (Subject::Comment(id), count))
            .collect(),
    })
}

async fn page_of<E>(
    conn: &impl ConnectionTrait,
    after: i64,
    limit: u64,
    columns: &Columns<E::Column>,
) -> Result<Vec<(i64, SqlCount)>, DbErr>
where
    E: EntityTrait,
{
    let Columns { id, count, version } = *columns;
    let rows: Vec<(i64, i64, i64)> = E::find()
        .select_only()
        .column(id)
        .column(count)
        .column(version)
        .filter(id.gt(after))
        .order_by_asc(id)
        .limit(limit)
        .into_tuple()
        .all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(row, count, version)| (row, SqlCount { count, version }))
        .collect())
}
