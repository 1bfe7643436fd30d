//! The feed-fanout job: one entry per chunk of an author's audience (active followers), a range of
//! follower ids within one feed shard, with the articles to deliver. Reads the chunk's followers
//! from the audience and pushes the articles into their inboxes, announcing them to those online,
//! with one script call per few hundred inbox writes; followers whose inbox has expired leave the
//! audience on the way. A worker killed
//! mid-chunk leaves the entry unacknowledged; whoever takes it over redoes this chunk only, and the
//! writes already made are no-ops the second time.

use std::collections::BTreeMap;

use anyhow::bail;

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

/// One fan-out entry: articles of one author for one slice of the author's audience. An open end
/// of the slice is an empty field.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Chunk {
    articles: Articles,
    author: i64,
    shard: u32,
    after: Option<i64>,
    up_to: Option<i64>,
}

/// Article ids, comma-separated in the entry.
#[derive(Debug, PartialEq)]
struct Articles(Vec<i64>);

impl serde::Serialize for Articles {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ids: Vec<String> = self.0.iter().map(i64::to_string).collect();
        serializer.serialize_str(&ids.join(","))
    }
}

impl<'de> serde::Deserialize<'de> for Articles {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.split(',')
            .map(str::parse)
            .collect::<Result<Vec<i64>, _>>()
            .map(Self)
            .map_err(|_| serde::de::Error::custom(format!("{text:?} is not a list of ids")))
    }
}

impl Chunk {
    pub fn new(articles: &[i64], author: i64, slice: &AudienceSlice) -> Self {
        Self {
            articles: Articles(articles.to_vec()),
            author,
            shard: slice.shard,
            after: slice.after,
            up_to: slice.up_to,
        }
    }

    /// The entry's fields, for a pipeline's `XADD`.
    pub fn fields(&self) -> anyhow::Result<Vec<(String, String)>> {
        Ok(crate::jobs::fields::to_fields(self)?)
    }

    fn slice(&self) -> anyhow::Result<AudienceSlice> {
        if self.shard >= crate::keys::FEED_SHARDS {
            bail!("fan-out chunk names feed shard {}", self.shard);
        }
        Ok(AudienceSlice {
            shard: self.shard,
            after: self.after,
            up_to: self.up_to,
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
    type Payload = Chunk;

    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry<Chunk>]) -> anyhow::Result<()> {
        // Entries for the same slice (an author's burst) merge into one delivery of all their
        // articles: each inbox is then checked and trimmed once, not once per article.
        let mut merged: BTreeMap<(i64, AudienceSlice), Vec<i64>> = BTreeMap::new();
        for entry in batch {
            let chunk = &entry.payload;
            let articles = merged.entry((chunk.author, chunk.slice()?)).or_default();
            for &article in &chunk.articles.0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields in the order and form the dispatcher wrote them before the payload became typed,
    /// so chunks already in the streams still decode; and a chunk written now reads back the same.
    #[test]
    fn a_chunk_written_the_old_way_decodes_and_a_new_one_round_trips() {
        let old: crate::jobs::Fields = [
            ("articles", "41,40"),
            ("author", "7"),
            ("shard", "3"),
            ("after", ""),
            ("up_to", "900"),
        ]
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
        let chunk: Chunk = crate::jobs::fields::from_fields(&old).unwrap();
        let slice = AudienceSlice {
            shard: 3,
            after: None,
            up_to: Some(900),
        };
        assert_eq!(chunk, Chunk::new(&[41, 40], 7, &slice));
        assert_eq!(chunk.slice().unwrap(), slice);
        let written: crate::jobs::Fields = chunk.fields().unwrap().into_iter().collect();
        assert_eq!(written, old);

        let mut bad = old.clone();
        bad.insert("articles".into(), "41,x".into());
        assert!(crate::jobs::fields::from_fields::<Chunk>(&bad).is_err());
        bad.insert("articles".into(), "41".into());
        bad.insert("shard".into(), crate::keys::FEED_SHARDS.to_string());
        let chunk: Chunk = crate::jobs::fields::from_fields(&bad).unwrap();
        assert!(chunk.slice().is_err());
    }
}
