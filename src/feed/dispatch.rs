//! The feed-dispatch job: one entry per relayed publication. Adds the article to its author's
//! outbox and either announces it on the author's channel (a celebrity: not fanned out, merged at
//! read time) or splits the author's audience (their active followers) into chunks of about
//! `PULSE_FEED_FANOUT_CHUNK`, queued as separate [`super::fanout`] entries that any process's
//! workers share; the publications of one author in one batch travel together. Then marks the
//! publications dispatched. Idempotent: an entry handled twice queues its chunks twice, and a
//! chunk's writes are `ZADD`s of article ids, so the second adds nothing.

use std::collections::{BTreeMap, HashSet};

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use super::{FeedStore, fanout};
use crate::db::retry_once;
use crate::entities::{articles, feed_publications};
use crate::jobs::{Entry, Job, JobSpec};
use crate::keys::FeedKeys;

pub const SPEC: JobSpec = JobSpec {
    name: "feed-dispatch",
    shards: 4,
    tag: "fd",
};

/// The dispatch shard of an author's publications.
pub fn shard_of(author: i64) -> u32 {
    author.rem_euclid(i64::from(SPEC.shards)) as u32
}

pub struct Dispatcher(pub FeedStore);

/// A publication as the relay appends it (`publications.rs`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Publication {
    #[serde(rename = "publication")]
    pub id: i64,
    pub article: i64,
    pub author: i64,
}

impl Dispatcher {
    /// Dispatches `author`'s publications of one batch together: one outbox write and one set of
    /// fan-out chunks carrying all of their articles, so a burst of publications by one author
    /// costs each follower's inbox one script step, not one per article.
    async fn dispatch(&self, author: i64, publications: &[&Publication]) -> anyhow::Result<()> {
        let store = &self.0;
        let wanted: Vec<i64> = publications.iter().map(|p| p.article).collect();
        let exists = articles::Entity::find()
            .select_only()
            .column(articles::Column::Id)
            .filter(articles::Column::Id.is_in(wanted.iter().copied()));
        let found: HashSet<i64> = retry_once(|| exists.clone().into_tuple().all(&store.db))
            .await?
            .into_iter()
            .collect();
        // Deleted since: nothing to deliver. In publication order.
        let articles: Vec<i64> = wanted
            .into_iter()
            .filter(|article| found.contains(article))
            .collect();
        if !articles.is_empty() {
            store.outbox_add(author, &articles, false).await?;
            if store.is_celebrity(author).await? {
                let channel = store.redis.keys.feed_author_channel(author);
                let mut pipe = redis::pipe();
                for &article in &articles {
                    pipe.cmd(store.redis.target.sharded_publish())
                        .arg(&channel)
                        .arg(article)
                        .ignore();
                }
                let mut conn = store.redis.conn.clone();
                let () = pipe.query_async(&mut conn).await?;
                metrics::counter!("pulse_feed_celebrity_publishes_total")
                    .increment(articles.len() as u64);
            } else {
                self.queue_chunks(author, &articles).await?;
            }
        }
        let done = feed_publications::Entity::update_many()
            .col_expr(
                feed_publications::Column::DispatchedAt,
                Expr::value(crate::db::now()),
            )
            .filter(feed_publications::Column::Id.is_in(publications.iter().map(|p| p.id)));
        retry_once(|| done.clone().exec(&store.db)).await?;
        Ok(())
    }

    /// Queues one fan-out entry per slice of the author's audience (the active followers, cut
    /// into slices of about `PULSE_FEED_FANOUT_CHUNK` within one feed shard each), so a slice's
    /// inboxes share a hash tag and are written by one script call. The articles are in the
    /// outbox already: a follower who joins the audience after this read pulls them from there.
    async fn queue_chunks(&self, author: i64, articles: &[i64]) -> anyhow::Result<()> {
        let store = &self.0;
        let slices = store
            .audience_slices(author, u64::from(store.settings.fanout_chunk))
            .await?;
        if slices.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (index, slice) in slices.iter().enumerate() {
            // The same slice of an author in the same stream each time: a worker behind a burst
            // finds them in one batch and merges them.
            let shard = (author + index as i64).rem_euclid(i64::from(fanout::SPEC.shards));
            pipe.xadd(
                fanout::SPEC.keys(&store.redis, shard as u32).stream(),
                "*",
                &fanout::Chunk::new(articles, author, slice).fields()?,
            )
            .ignore();
        }
        let mut conn = store.redis.conn.clone();
        let () = pipe.query_async(&mut conn).await?;
        store.redis.bell.ring(fanout::SPEC.name);
        metrics::counter!("pulse_feed_fanout_chunks_total").increment(slices.len() as u64);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Job for Dispatcher {
    type Payload = Publication;

    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry<Publication>]) -> anyhow::Result<()> {
        let mut by_author: BTreeMap<i64, Vec<&Publication>> = BTreeMap::new();
        for entry in batch {
            let publication = &entry.payload;
            by_author
                .entry(publication.author)
                .or_default()
                .push(publication);
        }
        for (author, publications) in &by_author {
            self.dispatch(*author, publications).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Publication;

    /// The fields as the relay wrote them before the payload became typed still decode, and a
    /// publication written now has the same fields.
    #[test]
    fn a_publication_written_the_old_way_decodes() {
        let old: crate::jobs::Fields = [("publication", "31"), ("article", "400"), ("author", "9")]
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let publication: Publication = crate::jobs::fields::from_fields(&old).unwrap();
        assert_eq!(
            (publication.id, publication.article, publication.author),
            (31, 400, 9)
        );
        let written = crate::jobs::fields::to_fields(&publication).unwrap();
        assert_eq!(written.into_iter().collect::<crate::jobs::Fields>(), old);
    }
}
