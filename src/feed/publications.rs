//! The publish outbox: an article's fan-out event is recorded in SQL in the article's own
//! transaction ([`record`]) and relayed to the dispatch stream after the commit ([`Relay`]), so a
//! publish while Redis is unreachable is relayed once Redis is back, by any process. The row also
//! says whether the article was announced to `articlePublished` subscribers: one the publish could
//! not announce, the relay loop announces ([`Relay::announce_pending`]).

use std::collections::HashMap;
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

/// How long the relay loop leaves a publication's announcement to its publish, which makes it
/// right after the commit: a row still unannounced past it is one the publish could not announce.
pub const ANNOUNCE_GRACE: Duration = Duration::from_secs(2);

/// Rows one relay pass takes.
const RELAY_BATCH: u64 = 500;

/// Publications one pass announces late: each brings its whole article, body and all.
const ANNOUNCE_BATCH: u64 = 100;

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

    /// Relays one publication just committed, and records whether its article was `announced`
    /// in the same update. A failure is logged, not returned: the publish has committed, and the
    /// relay loop picks the row up.
    pub async fn relay_now(&self, publication: &feed_publications::Model, announced: bool) {
        if let Err(err) = self
            .relay(std::slice::from_ref(publication), announced)
            .await
        {
            metrics::counter!("pulse_feed_relay_deferred_total").increment(1);
            tracing::warn!(error = %err, article.id = publication.article_id, "publication not relayed yet; the relay loop will");
        }
    }

    /// Appends the rows' dispatch events and marks them relayed (and announced, when the caller
    /// `announced` their articles).
    async fn relay(&self, rows: &[feed_publications::Model], announced: bool) -> AppResult<()> {
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
        let now = crate::db::now();
        let mut update = feed_publications::Entity::update_many()
            .col_expr(feed_publications::Column::RelayedAt, Expr::value(now))
            .filter(feed_publications::Column::Id.is_in(ids));
        if announced {
            update = update.col_expr(feed_publications::Column::AnnouncedAt, Expr::value(now));
        }
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
        self.relay(&rows, false).await?;
        Ok(rows.len())
    }

    /// Announces the articles of rows whose publish could not (Redis did not answer, or the process
    /// died first), oldest first, and marks them announced. A row younger than [`ANNOUNCE_GRACE`]
    /// is left to its publish, which is announcing it. Returns how many it announced; stops at the
    /// first announcement Redis refuses, for the next pass.
    pub async fn announce_pending(&self) -> AppResult<usize> {
        let settled = crate::db::now()
            - chrono::TimeDelta::from_std(ANNOUNCE_GRACE).unwrap_or(chrono::TimeDelta::MAX);
        let pending = feed_publications::Entity::find()
            .select_only()
            .column(feed_publications::Column::Id)
            .column(feed_publications::Column::ArticleId)
            .filter(feed_publications::Column::AnnouncedAt.is_null())
            .filter(feed_publications::Column::CreatedAt.lt(settled))
            .order_by_asc(feed_publications::Column::Id)
            .limit(ANNOUNCE_BATCH);
        let pending: Vec<(i64, i64)> =
            retry_once(|| pending.clone().into_tuple().all(&self.store.db)).await?;
        if pending.is_empty() {
            return Ok(0);
        }
        let rows = articles::Entity::find()
            .filter(articles::Column::Id.is_in(pending.iter().map(|&(_, article)| article)));
        let mut rows: HashMap<i64, articles::Model> =
            retry_once(|| rows.clone().all(&self.store.db))
                .await?
                .into_iter()
                .map(|article| (article.id, article))
                .collect();
        let mut announced = Vec::new();
        for (publication, article) in pending {
            // A deleted article's row goes with it (a cascade): this one was deleted meanwhile.
            let Some(article) = rows.remove(&article) else {
                continue;
            };
            let made = crate::articles::service::announce(
                &self.store.redis,
                self.store.settings.replay_limit,
                &article,
            )
            .await;
            if let Err(err) = made {
                tracing::warn!(error = %err, article.id = article.id, "cannot announce a publication yet; retrying");
                break;
            }
            announced.push(publication);
        }
        if announced.is_empty() {
            return Ok(0);
        }
        let count = announced.len();
        let update = feed_publications::Entity::update_many()
            .col_expr(
                feed_publications::Column::AnnouncedAt,
                Expr::value(crate::db::now()),
            )
            .filter(feed_publications::Column::Id.is_in(announced));
        retry_once(|| update.clone().exec(&self.store.db)).await?;
        metrics::counter!("pulse_article_announcements_late_total").increment(count as u64);
        Ok(count)
    }

    /// Relays pending rows every `interval` until `shutdown`.
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            let relayed = self.relay_pending().await.inspect_err(
                |err| tracing::warn!(error = %err, "cannot relay feed publications; retrying"),
            );
            let announced = self.announce_pending().await.inspect_err(
                |err| tracing::warn!(error = %err, "cannot announce publications; retrying"),
            );
            if relayed.is_ok_and(|n| n as u64 == RELAY_BATCH)
                || announced.is_ok_and(|n| n as u64 == ANNOUNCE_BATCH)
            {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }
}
