//! The feed-follows job: one entry per follow or unfollow that changed the graph, and one per
//! author who fell below the celebrity threshold.
//!
//! A follow change brings the follower's inbox (if they are active) in line with SQL's `follows`
//! as it is when the job runs, not as the entry says, so entries of a quick follow/unfollow/follow
//! handled in any order, or twice, leave the right state: a followee followed now has their recent
//! articles (at most `PULSE_FEED_FOLLOW_BACKFILL`) in the inbox and the follower in their audience,
//! one not followed has neither. A backfill that cannot take every article of the followee above
//! the inbox's floor raises the floor (`lua/feed_merge.lua`), so reads take the rest from SQL
//! instead of skipping it. Until the job ran, reads filter by `follows` anyway.
//!
//! An author who falls below the threshold was merged at read time, so their articles since they
//! crossed it are in no inbox: their recent articles are merged into the inbox of every active
//! follower (their audience: readers join the audiences of celebrities too).

use anyhow::bail;

use super::FeedStore;
use crate::follows::service::{FollowChange, FollowListener};
use crate::jobs::{Entry, Job, JobSpec};
use crate::keys::FeedKeys;

pub const SPEC: JobSpec = JobSpec {
    name: "feed-follows",
    shards: 4,
    tag: "fw",
};

/// A feed-follows entry: a follow change (`follower` and `followee`), or an author who fell below
/// the celebrity threshold (`fallen`). Absent fields are left out of the entry, as before the
/// payload was typed.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FollowEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    follower: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    followee: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallen: Option<i64>,
}

/// The shard of a follower's follow changes: one user's changes stay in order.
pub fn shard_of(follower: i64) -> u32 {
    follower.rem_euclid(i64::from(SPEC.shards)) as u32
}

/// The feed's side of a follow or unfollow: queues the job that brings the follower's inbox in
/// line, and the one for an author it took below the celebrity threshold; the mutation does not
/// wait for them.
pub struct FollowHook(pub FeedStore);

#[async_trait::async_trait]
impl FollowListener for FollowHook {
    /// The graph in SQL changed already; a lost job only leaves an inbox that reads filter
    /// (unfollow) or that lacks a backfill until `pulse rebuild feed` or its expiry (follow).
    async fn changed(&self, change: FollowChange) {
        let (follower, followee) = (change.follower, change.followee);
        let mut entries = vec![(
            shard_of(follower),
            FollowEntry {
                follower: Some(follower),
                followee: Some(followee),
                fallen: None,
            },
        )];
        // The count is read in the change's own transaction: exactly one unfollow takes an
        // author from the threshold to just below it.
        let threshold = self.0.settings.celebrity_followers;
        if !change.following && u64::try_from(change.followers + 1).ok() == Some(threshold) {
            let fallen = FollowEntry {
                fallen: Some(followee),
                ..FollowEntry::default()
            };
            entries.push((shard_of(followee), fallen));
        }
        for (shard, entry) in entries {
            if let Err(err) = crate::jobs::enqueue(&self.0.redis, SPEC, shard, &entry).await {
                tracing::warn!(error = %err, follower, followee, "follow change not queued for the feed");
            }
        }
    }
}

pub struct FollowSync(pub FeedStore);

impl FollowSync {
    async fn sync(&self, follower: i64, followee: i64) -> anyhow::Result<()> {
        let store = &self.0;
        let keys = store.redis.keys.feed_user(follower);
        let mut conn = store.redis.conn.clone();
        let follows = store.is_following(follower, followee).await?;
        if !follows {
            store.leave_audience(follower, followee).await?;
        }
        let active: u32 = redis::cmd("EXISTS")
            .arg(keys.inbox())
            .arg(keys.inbox_building())
            .query_async(&mut conn)
            .await?;
        if active == 0 {
            return Ok(());
        }
        if follows {
            // Joined before the outbox is read, as a rebuild does (see `join_audiences`).
            store.join_audiences(follower, &[followee]).await?;
            let backfill = u64::from(store.settings.follow_backfill);
            let newest = store.newest_with_floor(followee, backfill).await?;
            store.merge(follower, &newest).await?;
        } else {
            let (ids, _) = store
                .outbox_page(followee, i64::MAX, u64::from(store.settings.cap))
                .await?;
            store.remove(follower, &ids).await?;
        }
        Ok(())
    }

    /// Merges the recent articles of `author`, no longer a celebrity, into the inboxes of their
    /// active followers.
    async fn fallen(&self, author: i64) -> anyhow::Result<()> {
        let store = &self.0;
        if store.is_celebrity(author).await? {
            return Ok(());
        }
        let backfill = u64::from(store.settings.follow_backfill);
        let newest = store.newest_with_floor(author, backfill).await?;
        let slices = store
            .audience_slices(author, u64::from(store.settings.fanout_chunk))
            .await?;
        let mut merged = 0;
        for slice in &slices {
            let followers = store.audience_of(author, slice).await?;
            merged += store.merge_many(&followers, &newest).await?;
        }
        tracing::info!(
            author,
            merged,
            "merged a former celebrity into their followers' inboxes"
        );
        Ok(())
    }
}

#[async_trait::async_trait]
impl Job for FollowSync {
    type Payload = FollowEntry;

    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry<FollowEntry>]) -> anyhow::Result<()> {
        for entry in batch {
            match entry.payload {
                FollowEntry {
                    fallen: Some(author),
                    ..
                } => self.fallen(author).await?,
                FollowEntry {
                    follower: Some(follower),
                    followee: Some(followee),
                    fallen: None,
                } => self.sync(follower, followee).await?,
                _ => bail!("feed-follows entry {} names no change", entry.id),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FollowEntry;

    fn fields(pairs: &[(&str, &str)]) -> crate::jobs::Fields {
        pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    /// Entries as they were queued before the payload became typed still decode, and an entry
    /// written now has the same fields.
    #[test]
    fn follow_changes_and_fallen_authors_written_the_old_way_decode() {
        for old in [
            fields(&[("follower", "12"), ("followee", "5")]),
            fields(&[("fallen", "5")]),
        ] {
            let entry: FollowEntry = crate::jobs::fields::from_fields(&old).unwrap();
            let written = crate::jobs::fields::to_fields(&entry).unwrap();
            assert_eq!(written.into_iter().collect::<crate::jobs::Fields>(), old);
        }
        let change: FollowEntry =
            crate::jobs::fields::from_fields(&fields(&[("follower", "12"), ("followee", "5")]))
                .unwrap();
        assert_eq!((change.follower, change.followee), (Some(12), Some(5)));
        assert_eq!(change.fallen, None);
    }
}
