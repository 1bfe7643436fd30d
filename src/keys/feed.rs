//! Feed: each user's inbox (the timeline cache), outbox (their newest article ids), presence and
//! live channel. A user's keys carry the hash tag of the user's feed shard, `{f:<user mod
//! FEED_SHARDS>}`: every feed script is single-slot, and one call can write the inboxes of all the
//! followers of a fan-out chunk, since a chunk holds the followers of one shard.

use std::collections::BTreeMap;

use super::Keys;

/// Feed shards. Fewer shards make fuller fan-out batches (a chunk's followers share a shard), more
/// spread the feed's keys over more slots of a Redis Cluster. Changing it orphans every feed key:
/// inboxes rebuild on read and `pulse feed vacuum` does not know the old names.
pub const FEED_SHARDS: u32 = 32;

/// The feed shard of `user`'s keys.
pub fn feed_shard(user: i64) -> u32 {
    user.rem_euclid(i64::from(FEED_SHARDS)) as u32
}

/// `users` grouped by feed shard: the keys of each group share one hash tag.
pub fn by_feed_shard(users: impl IntoIterator<Item = i64>) -> BTreeMap<u32, Vec<i64>> {
    let mut groups: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    for user in users {
        groups.entry(feed_shard(user)).or_default().push(user);
    }
    groups
}

pub trait FeedKeys {
    /// The feed keys of `user`. See [`FeedUserKeys`].
    fn feed_user(&self, user: i64) -> FeedUserKeys<'_>;

    /// Pub/sub channel of the new items of `user`'s feed (article ids). In the slot of the user's
    /// feed keys, so the delivery script announces with `SPUBLISH` on a cluster, which only the
    /// slot's master and replicas carry.
    fn feed_channel(&self, user: i64) -> String;

    /// Pub/sub channel of the new articles of `author`, a celebrity whose followers are not fanned
    /// out to: their subscribers listen here. Sharded like [`Self::feed_channel`], in the slot of
    /// the author's own feed keys.
    fn feed_author_channel(&self, author: i64) -> String;

    /// Sorted set follower id → follower id: the followers of `author` in feed shard `shard` who
    /// are active, i.e. whose inbox exists. Fan-out reads these instead of every follower, so its
    /// cost grows with the active followers only. A follower joins when their inbox is built (and
    /// when they follow while it exists) and leaves when they unfollow, or when a delivery finds
    /// their inbox expired. In the followers' shard, so that delivery can drop the expired ones
    /// in the same script that finds them.
    fn feed_audience(&self, author: i64, shard: u32) -> String;

    /// The author and shard of an audience key under `prefix` (see [`Self::feed_audience`]).
    fn parse_feed_audience(prefix: &str, key: &str) -> Option<(i64, u32)>;

    /// A `SCAN MATCH` pattern for every feed key of every user.
    fn feed_pattern(&self) -> String;
}

impl FeedKeys for Keys {
    fn feed_user(&self, user: i64) -> FeedUserKeys<'_> {
        FeedUserKeys { keys: self, user }
    }

    fn feed_channel(&self, user: i64) -> String {
        format!(
            "{}events:feed:{user}:{{f:{}}}",
            self.prefix(),
            feed_shard(user)
        )
    }

    fn feed_author_channel(&self, author: i64) -> String {
        format!(
            "{}events:feed-author:{author}:{{f:{}}}",
            self.prefix(),
            feed_shard(author)
        )
    }

    fn feed_audience(&self, author: i64, shard: u32) -> String {
        format!("{}feed:audience:{author}:{{f:{shard}}}", self.prefix())
    }

    fn parse_feed_audience(prefix: &str, key: &str) -> Option<(i64, u32)> {
        let (rest, tag) = key.strip_prefix(prefix)?.rsplit_once(":{f:")?;
        let author = rest.strip_prefix("feed:audience:")?.parse().ok()?;
        let shard = tag.strip_suffix('}')?.parse().ok()?;
        (shard < FEED_SHARDS).then_some((author, shard))
    }

    fn feed_pattern(&self) -> String {
        format!("{}feed:*", self.prefix_pattern())
    }
}

pub struct FeedUserKeys<'a> {
    keys: &'a Keys,
    user: i64,
}

impl FeedUserKeys<'_> {
    fn key(&self, name: &str) -> String {
        let (prefix, user) = (self.keys.prefix(), self.user);
        format!("{prefix}feed:{name}:{user}:{{f:{}}}", feed_shard(user))
    }

    /// The user and key name (`inbox`, `outbox`, …) of a key of this family under `prefix`.
    pub fn parse(prefix: &str, key: &str) -> Option<(i64, String)> {
        let (rest, tag) = key.strip_prefix(prefix)?.rsplit_once(":{f:")?;
        let (name, user) = rest.strip_prefix("feed:")?.rsplit_once(':')?;
        let user = user.parse::<i64>().ok()?;
        (tag.strip_suffix('}')? == feed_shard(user).to_string()).then(|| (user, name.to_owned()))
    }

    pub fn user(&self) -> i64 {
        self.user
    }

    /// Sorted set article id → article id: the user's timeline cache, newest `cap` items plus the
    /// anchor member `0` that keeps an empty timeline existing. The anchor's score is
    /// -(floor + 1): the inbox holds every article of the fanned-out followees from the floor up
    /// (floor 0: their whole history), and reads below it go to SQL (see `lua/feed_read.lua`).
    /// Expires when unread.
    pub fn inbox(&self) -> String {
        self.key("inbox")
    }

    /// The inbox being rebuilt, renamed onto [`Self::inbox`] when complete.
    pub fn inbox_building(&self) -> String {
        self.key("inbox-building")
    }

    /// String held by the one process rebuilding the inbox.
    pub fn rebuild_lock(&self) -> String {
        self.key("rebuild-lock")
    }

    /// Sorted set article id → article id: the user's newest `cap` articles.
    pub fn outbox(&self) -> String {
        self.key("outbox")
    }

    /// String present when [`Self::outbox`] was loaded from SQL: the outbox then holds the
    /// author's newest articles without a gap. Without it, the outbox holds only what was
    /// published since, and is not read.
    pub fn outbox_loaded(&self) -> String {
        self.key("outbox-loaded")
    }

    /// String kept alive while the user holds a `feedItemAdded` subscription: the user is online.
    pub fn online(&self) -> String {
        self.key("online")
    }

    /// Sorted set article id → position: the order in which articles were delivered into the
    /// user's inbox, 1, 2, 3…, the newest `PULSE_REPLAY_LIMIT` kept, plus the member `epoch` scored
    /// -epoch, which names this run of positions. What a resumed `feedItemAdded` replays; opened
    /// beside the inbox and expiring with it (see `lua/feed_read.lua`).
    pub fn journal(&self) -> String {
        self.key("journal")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_feed_keys_share_one_hash_tag() {
        let keys = Keys::new("p:");
        let user = keys.feed_user(42);
        for key in [
            user.inbox(),
            user.inbox_building(),
            user.rebuild_lock(),
            user.outbox(),
            user.outbox_loaded(),
            user.online(),
            user.journal(),
        ] {
            assert!(key.starts_with("p:feed:"), "{key} lacks the prefix");
            assert_eq!(key.matches('{').count(), 1, "{key} has more than one tag");
            assert!(
                key.ends_with(":42:{f:10}"),
                "{key} is not in user 42's shard"
            );
            let (user, name) = FeedUserKeys::parse("p:", &key).expect("a feed key parses");
            assert_eq!(user, 42);
            assert!(
                key.starts_with(&format!("p:feed:{name}:")),
                "{key} parsed as {name}"
            );
        }
        // The channels share the slot of the keys whose scripts announce on them.
        for channel in [keys.feed_channel(42), keys.feed_author_channel(42)] {
            assert!(
                channel.starts_with("p:events:"),
                "{channel} lacks the prefix"
            );
            assert!(
                channel.ends_with(":42:{f:10}"),
                "{channel} is not in 42's shard"
            );
            assert_eq!(FeedUserKeys::parse("p:", &channel), None);
        }
        assert_ne!(keys.feed_channel(42), keys.feed_author_channel(42));
        assert_ne!(user.inbox(), keys.feed_user(43).inbox());
        assert!(
            keys.feed_user(74).inbox().ends_with(":74:{f:10}"),
            "74 is in 42's shard"
        );
        let audience = keys.feed_audience(42, 3);
        assert!(audience.ends_with("{f:3}"), "{audience} is not in shard 3");
        assert_eq!(FeedUserKeys::parse("p:", &audience), None);
        assert_eq!(Keys::parse_feed_audience("p:", &audience), Some((42, 3)));
        assert_eq!(Keys::parse_feed_audience("p:", &user.inbox()), None);
        assert_eq!(FeedUserKeys::parse("p:", "p:feed:inbox:42:{f:11}"), None);
        assert_eq!(Keys::new("t*:").feed_pattern(), "t\\*:feed:*");
    }

    #[test]
    fn a_fan_out_groups_users_whose_inboxes_share_one_hash_tag() {
        let keys = Keys::new("p:");
        let groups = by_feed_shard(1..=1000);
        assert_eq!(groups.len(), FEED_SHARDS as usize);
        assert_eq!(groups.values().map(Vec::len).sum::<usize>(), 1000);
        for users in groups.values() {
            let tags: std::collections::BTreeSet<String> = users
                .iter()
                .map(|&user| keys.feed_user(user).inbox())
                .map(|inbox| inbox[inbox.rfind('{').unwrap()..].to_owned())
                .collect();
            assert_eq!(tags.len(), 1, "a group spans the tags {tags:?}");
        }
    }
}
