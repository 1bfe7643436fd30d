//! The feed-fanout job: one entry per chunk of an author's audience (active followers), a range of
//! follower ids within one feed shard, with the articles to deliver. Reads the chunk's followers
//! from the audience and pushes the articles into their inboxes, announcing them to those online,
//! with one script call per few hundred inbox writes; followers whose inbox has expired leave the
//! audience on the way. A worker killed
//! mid-chunk leaves the entry unacknowledged; whoever takes it over redoes this chunk only, and the
//! writes already made are no-ops the second time.

use std::collections::BTreeMap;

use anyhow::{Context as _, anyhow};

use super::FeedStore;
use super::store::AudienceSlice;
use crate::jobs::{Entry, Job, JobSpec};

pub const SPEC: JobSpec = JobSpec {
    name: "feed-fanout",
    shards: 8,
    tag: "ff",
};

pub struct Fanout(pub FeedStore);

/// Chunks of one batch handled at once.
const CHUNKS_AT_ONCE: usize = 8;

/// One fan-out entry: articles of one author for one slice of the author's audience.
pub struct Chunk {
    articles: Vec<i64>,
    author: i64,
    slice: AudienceSlice,
}

impl Chunk {
    /// The entry's fields; an open end of the slice is an empty field.
    pub fn fields(
        articles: &[i64],
        author: i64,
        slice: &AudienceSlice,
    ) -> [(&'static str, String); 5] {
        let bound = |id: Option<i64>| id.map(|id| id.to_string()).unwrap_or_default();
        let articles: Vec<String> = articles.iter().map(i64::to_string).collect();
        [
            ("articles", articles.join(",")),
            ("author", author.to_string()),
            ("shard", slice.shard.to_string()),
            ("after", bound(slice.after)),
            ("up_to", bound(slice.up_to)),
        ]
    }

    fn parse(entry: &Entry) -> anyhow::Result<Self> {
        let field = |name: &str| {
            entry
                .field(name)
                .ok_or_else(|| anyhow!("fan-out chunk {} has no {name}", entry.id))
        };
        let malformed = || format!("fan-out chunk {} is malformed", entry.id);
        let bound = |name: &str| -> anyhow::Result<Option<i64>> {
            match field(name)? {
                "" => Ok(None),
                id => Ok(Some(id.parse().with_context(malformed)?)),
            }
        };
        let shard: u32 = field("shard")?.parse().with_context(malformed)?;
        if shard >= crate::keys::FEED_SHARDS {
            return Err(anyhow!(malformed()));
        }
        let articles = field("articles")?
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<i64>, _>>()
            .with_context(malformed)?;
        Ok(Self {
            articles,
            author: field("author")?.parse().with_context(malformed)?,
            slice: AudienceSlice {
                shard,
                after: bound("after")?,
                up_to: bound("up_to")?,
            },
        })
    }
}

impl Fanout {
    async fn deliver(
        &self,
        author: i64,
        slice: &AudienceSlice,
        articles: &[i64],
    ) -> anyhow::Result<()> {
        let followers = self.0.audience_of(author, slice).await?;
        self.0.deliver(author, articles, &followers, true).await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Job for Fanout {
    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry]) -> anyhow::Result<()> {
        // Entries for the same slice (an author's burst) merge into one delivery of all their
        // articles: each inbox is then checked and trimmed once, not once per article.
        let mut merged: BTreeMap<(i64, AudienceSlice), Vec<i64>> = BTreeMap::new();
        for entry in batch {
            let chunk = Chunk::parse(entry)?;
            let articles = merged.entry((chunk.author, chunk.slice)).or_default();
            for article in chunk.articles {
                if !articles.contains(&article) {
                    articles.push(article);
                }
            }
        }
        // Slices are independent (different followers, or the same writes, which are
        // idempotent): a batch's slices overlap their Redis round trips.
        let deliveries: Vec<_> = merged.iter().collect();
        for group in deliveries.chunks(CHUNKS_AT_ONCE) {
            futures_util::future::try_join_all(
                group
                    .iter()
                    .map(|((author, slice), articles)| self.deliver(*author, slice, articles)),
            )
            .await?;
        }
        Ok(())
    }
}
