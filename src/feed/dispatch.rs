//! The feed-dispatch job: one entry per relayed publication. Adds the article to its author's
//! outbox and either announces it on the author's channel (a celebrity: not fanned out, merged at
//! read time) or splits the author's followers into chunks of `PULSE_FEED_FANOUT_CHUNK`, queued as
//! separate [`super::fanout`] entries that any process's workers share. Then marks the publication
//! dispatched. Idempotent: an entry handled twice queues its chunks twice, and a chunk's writes are
//! `ZADD`s of one id, so the second adds nothing.

use anyhow::{Context as _, anyhow};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use super::{FeedStore, fanout};
use crate::db::retry_once;
use crate::entities::{articles, feed_publications};
use crate::jobs::{Entry, Job, JobSpec};
use crate::redis::keys::by_feed_shard;

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

/// A publication as the relay appended it.
struct Publication {
    id: i64,
    article: i64,
    author: i64,
}

impl Publication {
    fn parse(entry: &Entry) -> anyhow::Result<Self> {
        let number = |name: &str| -> anyhow::Result<i64> {
            entry
                .field(name)
                .ok_or_else(|| anyhow!("publication {} has no {name}", entry.id))?
                .parse()
                .with_context(|| format!("publication {} has a malformed {name}", entry.id))
        };
        Ok(Self {
            id: number("publication")?,
            article: number("article")?,
            author: number("author")?,
        })
    }
}

impl Dispatcher {
    async fn dispatch(&self, publication: &Publication) -> anyhow::Result<()> {
        let store = &self.0;
        let exists = articles::Entity::find_by_id(publication.article)
            .select_only()
            .column(articles::Column::Id);
        let found: Option<i64> = retry_once(|| exists.clone().into_tuple().one(&store.db)).await?;
        if found.is_some() {
            store
                .outbox_add(publication.author, &[publication.article], false)
                .await?;
            if store.is_celebrity(publication.author).await? {
                let mut conn = store.redis.conn.clone();
                let _: i64 = redis::cmd("PUBLISH")
                    .arg(store.redis.keys.feed_author_channel(publication.author))
                    .arg(publication.article)
                    .query_async(&mut conn)
                    .await?;
                metrics::counter!("pulse_feed_celebrity_publishes_total").increment(1);
            } else {
                self.queue_chunks(publication).await?;
            }
        }
        let done = feed_publications::Entity::update_many()
            .col_expr(
                feed_publications::Column::DispatchedAt,
                Expr::value(crate::db::now()),
            )
            .filter(feed_publications::Column::Id.eq(publication.id));
        retry_once(|| done.clone().exec(&store.db)).await?;
        Ok(())
    }

    /// Queues one fan-out entry per chunk of followers: the followers of each feed shard, split
    /// into chunks of at most `PULSE_FEED_FANOUT_CHUNK`, each listed in its entry, so a chunk's
    /// inboxes share a hash tag and are written by one script call. A follower who arrives after
    /// this read is not in any chunk; their follow's backfill reads the outbox, which holds the
    /// article already.
    async fn queue_chunks(&self, publication: &Publication) -> anyhow::Result<()> {
        let store = &self.0;
        let followers = store.followers_of(publication.author).await?;
        let by_shard = by_feed_shard(followers);
        let chunks: Vec<&[i64]> = by_shard
            .values()
            .flat_map(|group| group.chunks(store.settings.fanout_chunk.max(1) as usize))
            .collect();
        if chunks.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (index, chunk) in chunks.iter().enumerate() {
            let shard =
                (publication.article + index as i64).rem_euclid(i64::from(fanout::SPEC.shards));
            let ids: Vec<String> = chunk.iter().map(i64::to_string).collect();
            pipe.xadd(
                fanout::SPEC.keys(&store.redis, shard as u32).stream(),
                "*",
                &[
                    ("article", publication.article.to_string()),
                    ("author", publication.author.to_string()),
                    ("followers", ids.join(",")),
                ],
            )
            .ignore();
        }
        let mut conn = store.redis.conn.clone();
        let () = pipe.query_async(&mut conn).await?;
        metrics::counter!("pulse_feed_fanout_chunks_total").increment(chunks.len() as u64);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Job for Dispatcher {
    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry]) -> anyhow::Result<()> {
        for entry in batch {
            self.dispatch(&Publication::parse(entry)?).await?;
        }
        Ok(())
    }
}
