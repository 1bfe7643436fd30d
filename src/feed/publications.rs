//! The publish outbox: an article's fan-out event is recorded in SQL in the article's own
//! transaction ([`record`]) and relayed to the dispatch stream after the commit ([`Relay`]), so a
//! publish while Redis is unreachable is relayed once Redis is back, by any process.

use std::time::Duration;

use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use tokio_util::sync::CancellationToken;

use super::{FeedStore, dispatch};
use crate::db::retry_once;
use crate::entities::{articles, feed_publications};
use crate::error::{AppError, AppResult};

/// A row relayed this long ago and still not dispatched lost its stream entry (a Redis that came
/// back older than SQL): it is relayed again. Far longer than a dispatch takes, since a row relayed
/// twice is dispatched twice (harmless, but wasted).
pub const RELAY_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// Rows one relay pass takes.
const RELAY_BATCH: u64 = 500;

/// Records `article`'s fan-out event; call inside the transaction that inserts the article.
pub async fn record(
    txn: &impl ConnectionTrait,
    article: &articles::Model,
) -> Result<feed_publications::Model, sea_orm::DbErr> {
    feed_publications::ActiveModel {
        article_id: Set(article.id),
        author_id: Set(article.author_id),
        created_at: Set(article.created_at),
        ..Default::default()
    }
    .insert(txn)
    .await
}

/// Moves recorded publications onto the dispatch stream.
#[derive(Clone)]
pub struct Relay {
    store: FeedStore,
}

impl Relay {
    pub fn new(store: FeedStore) -> Self {
        Self { store }
    }

    /// Relays one publication just committed. A failure is logged, not returned: the publish has
    /// committed, and the relay loop picks the row up.
    pub async fn relay_now(&self, publication: &feed_publications::Model) {
        if let Err(err) = self.relay(std::slice::from_ref(publication)).await {
            metrics::counter!("pulse_feed_relay_deferred_total").increment(1);
            tracing::warn!(error = %err, article.id = publication.article_id, "publication not relayed yet; the relay loop will");
        }
    }

    async fn relay(&self, rows: &[feed_publications::Model]) -> AppResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        // The author's outbox first: a celebrity's followers read it, and should see the article
        // as soon as the publish has answered, not once the dispatcher ran.
        for row in rows {
            self.store
                .outbox_add(row.author_id, &[row.article_id], false)
                .await?;
        }
        let mut conn = self.store.redis.conn.clone();
        let mut pipe = redis::pipe();
        for row in rows {
            let stream = dispatch::SPEC
                .keys(&self.store.redis, dispatch::shard_of(row.author_id))
                .stream();
            let publication = dispatch::Publication {
                id: row.id,
                article: row.article_id,
                author: row.author_id,
            };
            let fields = crate::jobs::fields::to_fields(&publication)
                .map_err(|err| AppError::Internal(err.to_string()))?;
            pipe.xadd(stream, "*", &fields).ignore();
        }
        let () = pipe.query_async(&mut conn).await?;
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        let update = feed_publications::Entity::update_many()
            .col_expr(
                feed_publications::Column::RelayedAt,
                Expr::value(crate::db::now()),
            )
            .filter(feed_publications::Column::Id.is_in(ids));
        retry_once(|| update.clone().exec(&self.store.db)).await?;
        metrics::counter!("pulse_feed_relayed_total").increment(rows.len() as u64);
        Ok(())
    }

    /// Relays the rows never relayed, and those relayed long ago and never dispatched. Returns how
    /// many it relayed.
    pub async fn relay_pending(&self) -> AppResult<usize> {
        let stale = crate::db::now()
            - chrono::TimeDelta::from_std(RELAY_AGAIN_AFTER).unwrap_or(chrono::TimeDelta::MAX);
        let query = feed_publications::Entity::find()
            .filter(feed_publications::Column::DispatchedAt.is_null())
            .filter(
                Condition::any()
                    .add(feed_publications::Column::RelayedAt.is_null())
                    .add(feed_publications::Column::RelayedAt.lt(stale)),
            )
            .order_by_asc(feed_publications::Column::Id)
            .limit(RELAY_BATCH);
        let rows = retry_once(|| query.clone().all(&self.store.db)).await?;
        self.relay(&rows).await?;
        Ok(rows.len())
    }

    /// Relays pending rows every `interval` until `shutdown`.
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            match self.relay_pending().await {
                Ok(n) if n as u64 == RELAY_BATCH => continue,
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "cannot relay feed publications; retrying")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }
}
