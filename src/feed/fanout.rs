//! The feed-fanout job: one entry per chunk of an author's followers, all of one feed shard, listed
//! in the entry by the dispatcher. Pushes the article into the inboxes of the chunk's followers that
//! are active (they read their feed within the inbox TTL, and their inbox exists), announcing it to
//! those online, with one script call for the whole chunk. A worker killed mid-chunk leaves the
//! entry unacknowledged; whoever takes it over redoes this chunk only, and the writes already made
//! are no-ops the second time.

use anyhow::{Context as _, anyhow};

use super::FeedStore;
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
        let field = |name: &str| {
            entry
                .field(name)
                .ok_or_else(|| anyhow!("fan-out chunk {} has no {name}", entry.id))
        };
        let malformed = || format!("fan-out chunk {} is malformed", entry.id);
        let article: i64 = field("article")?.parse().with_context(malformed)?;
        let followers = field("followers")?
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<i64>, _>>()
            .with_context(malformed)?;
        // Most followers are inactive: one command finds the active ones, and only their inboxes
        // go to the script.
        let active = self.0.active_among(&followers).await?;
        self.0.deliver(&[article], &active, true).await?;
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
