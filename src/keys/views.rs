//! Views: each view shard's dedup markers, pending deltas, flush state and rankings.

use pulse_kit::actor::Identity;

use super::Keys;

/// View counting spreads articles over this many shards. Every key of one shard shares the hash tag
/// `{v:N}`, so the one script that counts a view (dedup key, pending delta, rankings) is single-slot
/// on Redis Cluster while the load still spreads over slots. Changing it strands existing keys.
pub const VIEW_SHARDS: u32 = 16;

pub fn view_shard_of(article: i64) -> u32 {
    article.rem_euclid(i64::from(VIEW_SHARDS)) as u32
}

pub trait ViewKeys {
    /// The keys of article `article`'s view-count shard. See [`ViewShardKeys`].
    fn view_shard(&self, article: i64) -> ViewShardKeys<'_>;

    fn view_shard_by_index(&self, shard: u32) -> ViewShardKeys<'_>;
}

impl ViewKeys for Keys {
    fn view_shard(&self, article: i64) -> ViewShardKeys<'_> {
        self.view_shard_by_index(view_shard_of(article))
    }

    fn view_shard_by_index(&self, shard: u32) -> ViewShardKeys<'_> {
        ViewShardKeys { keys: self, shard }
    }
}

pub struct ViewShardKeys<'a> {
    keys: &'a Keys,
    shard: u32,
}

impl ViewShardKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}view:{name}:{{v:{}}}", self.keys.prefix(), self.shard)
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Marks that `viewer` has been counted for `article` within the window (expires with it).
    /// Terse on purpose: there is one per viewer per article per window, and a key under 32 bytes
    /// takes Redis's smallest string header and allocation class, about 16 bytes less per marker.
    pub fn seen(&self, article: i64, viewer: Identity) -> String {
        let (prefix, shard) = (self.keys.prefix(), self.shard);
        match viewer {
            Identity::User(user) => format!("{prefix}vs:{{v:{shard}}}:{article}:u{user}"),
            Identity::Address(ip) => format!("{prefix}vs:{{v:{shard}}}:{article}:{ip}"),
        }
    }

    /// Hash article → `view_count` as SQL had it at the last flush (or first read).
    pub fn base(&self) -> String {
        self.key("base")
    }

    /// Hash article → views counted but not yet flushed to SQL.
    pub fn pending(&self) -> String {
        self.key("pending")
    }

    /// Hash: the batch being flushed to SQL (`batch`, `lease`, and article → views taken).
    pub fn in_flight(&self) -> String {
        self.key("inflight")
    }

    /// String: the flush sequence of the shard's last taken batch, which SQL's `view_flush_shards`
    /// must not be ahead of.
    pub fn seq(&self) -> String {
        self.key("seq")
    }

    /// Sorted set article → all-time views.
    pub fn rank_all_time(&self) -> String {
        self.key("rank:all")
    }

    /// Sorted set article → views in one time bucket (a local day `20261121`, an ISO week `2026W47`).
    pub fn rank_bucket(&self, bucket: &str) -> String {
        format!("{}:{bucket}", self.key("rank"))
    }

    /// Pub/sub channel told when `article`'s view count moves: in the shard's slot, so the view
    /// script publishes it with `SPUBLISH` on a cluster (see [`crate::keys::ArticleKeys`]).
    pub fn article_stats_channel(&self, article: i64) -> String {
        format!("{}:{article}", self.key("events"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_prefix() {
        assert!(Keys::new("t1:").view_shard(9).pending().starts_with("t1:"));
    }

    #[test]
    fn one_articles_view_keys_share_a_hash_tag() {
        let keys = Keys::new("p:");
        let shard = keys.view_shard(9 + i64::from(VIEW_SHARDS));
        let tag = format!("{{v:{}}}", 9);
        for key in [
            shard.seen(25, Identity::User(7)),
            shard.seen(25, Identity::Address("::1".parse().unwrap())),
            shard.base(),
            shard.pending(),
            shard.in_flight(),
            shard.seq(),
            shard.rank_all_time(),
            shard.rank_bucket("20261121"),
            shard.article_stats_channel(25),
        ] {
            assert_eq!(
                key.matches('{').count(),
                1,
                "{key} has more than one hash tag"
            );
            assert!(key.contains(&tag), "{key} is not in shard 9");
        }
    }
}
