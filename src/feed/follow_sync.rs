//! The feed-follows job: one entry per follow or unfollow that changed the graph. Brings the
//! follower's inbox (if they are active) in line with SQL's `follows` as it is when the job runs,
//! not as the entry says, so entries of a quick follow/unfollow/follow handled in any order, or
//! twice, leave the right state: a followee followed now has their recent articles (bounded by
//! `PULSE_FEED_FOLLOW_BACKFILL`) in the inbox and the follower in their audience, one not followed
//! has neither. Until the job ran, reads filter by `follows` anyway.

use super::FeedStore;
use crate::jobs::{Entry, Job, JobSpec};
use crate::keys::FeedKeys;

pub const SPEC: JobSpec = JobSpec {
    name: "feed-follows",
    shards: 4,
    tag: "fw",
};

/// A follow or unfollow that changed the graph, as `FeedService` queues it.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FollowChange {
    pub follower: i64,
    pub followee: i64,
}

/// The shard of a follower's follow changes: one user's changes stay in order.
pub fn shard_of(follower: i64) -> u32 {
    follower.rem_euclid(i64::from(SPEC.shards)) as u32
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
            let (ids, coverage) = store.outbox_page(followee, i64::MAX, backfill).await?;
            store.deliver(followee, &ids, &[follower], false).await?;
            if !coverage.complete || ids.len() as u64 == backfill {
                // Older articles of the followee are in SQL and not in the inbox.
                let () = redis::cmd("DEL")
                    .arg(keys.no_more())
                    .query_async(&mut conn)
                    .await?;
            }
        } else {
            let (ids, _) = store
                .outbox_page(followee, i64::MAX, u64::from(store.settings.cap))
                .await?;
            if !ids.is_empty() {
                let () = redis::pipe()
                    .zrem(keys.inbox(), &ids)
                    .ignore()
                    .zrem(keys.inbox_building(), &ids)
                    .ignore()
                    .query_async(&mut conn)
                    .await?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Job for FollowSync {
    type Payload = FollowChange;

    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry<FollowChange>]) -> anyhow::Result<()> {
        for entry in batch {
            self.sync(entry.payload.follower, entry.payload.followee)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FollowChange;

    /// The fields as they were queued before the payload became typed still decode.
    #[test]
    fn a_follow_change_written_the_old_way_decodes() {
        let old: crate::jobs::Fields = [("follower", "12"), ("followee", "5")]
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let change: FollowChange = crate::jobs::fields::from_fields(&old).unwrap();
        assert_eq!(
            change,
            FollowChange {
                follower: 12,
                followee: 5
            }
        );
        let written = crate::jobs::fields::to_fields(&change).unwrap();
        assert_eq!(written.into_iter().collect::<crate::jobs::Fields>(), old);
    }
}
