//! The feed-fanout job: one entry per chunk of an author's followers (by follower id range).
//! Pushes the article into the inboxes of the chunk's followers that are active (they read their
//! feed within the inbox TTL, and their inbox exists), announcing it to those online. A worker killed mid-chunk leaves the entry
//! unacknowledged; whoever takes it over redoes this chunk only, and the writes already made are
//! no-ops the second time.

use anyhow::{Context as _, anyhow};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use super::FeedStore;
use crate::db::retry_once;
use crate::entities::follows;
use crate::jobs::{Entry, Job, JobSpec};

pub const SPEC: JobSpec = JobSpec {
    name: "feed-fanout",
    shards: 8,
    tag: "ff",
};

pub struct Fanout(pub FeedStore);

/// Chunks of one batch handled at once.
const CHUNKS_AT_ONCE: usize = 8;

impl Fanout {
    async fn chunk(&self, entry: &Entry) -> anyhow::Result<()> {
        let number = |name: &str| -> anyhow::Result<i64> {
            entry
                .field(name)
                .ok_or_else(|| anyhow!("fan-out chunk {} has no {name}", entry.id))?
                .parse()
                .with_context(|| format!("fan-out chunk {} has a malformed {name}", entry.id))
        };
        let (article, author) = (number("article")?, number("author")?);
        let query = follows::Entity::find()
            .select_only()
            .column(follows::Column::FollowerId)
            .filter(follows::Column::FolloweeId.eq(author))
            .filter(follows::Column::FollowerId.gt(number("after")?))
            .filter(follows::Column::FollowerId.lte(number("through")?));
        let followers: Vec<i64> = retry_once(|| query.clone().into_tuple().all(&self.0.db)).await?;
        // Most followers are inactive: one command finds the active ones, and only those cost
        // a script call.
        let active = self.0.active_among(&followers).await?;
        self.0.deliver(article, &active, true).await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Job for Fanout {
    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry]) -> anyhow::Result<()> {
        // Chunks are independent (different followers, or the same writes, which are idempotent):
        // a batch's chunks overlap their SQL reads and Redis round trips.
        for entries in batch.chunks(CHUNKS_AT_ONCE) {
            futures_util::future::try_join_all(entries.iter().map(|entry| self.chunk(entry)))
                .await?;
        }
        Ok(())
    }
}
