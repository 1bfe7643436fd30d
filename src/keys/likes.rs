//! Likes: relations, counters and rankings of liked subjects (articles and comments), and each
//! article's featured comments. A subject is named by its field (`a42` for an article, `c7` for a
//! comment: see `likes::Subject::field`) and sharded by its id.

use super::Keys;

/// Likes spread subjects over this many shards, each with the hash tag `{l:N}`: the one script
/// that likes (relation, counter, ranking, the archive stream's entry) is single-slot on Redis
/// Cluster while the load spreads over slots. Changing it strands existing keys.
pub const LIKE_SHARDS: u32 = 16;

/// The like shard of the subject (article or comment) with id `subject`.
pub fn like_shard_of(subject: i64) -> u32 {
    subject.rem_euclid(i64::from(LIKE_SHARDS)) as u32
}

pub trait LikeKeys {
    /// The keys of the like shard of the subject with id `subject`. See [`LikeShardKeys`].
    fn like_shard(&self, subject: i64) -> LikeShardKeys<'_>;

    fn like_shard_by_index(&self, shard: u32) -> LikeShardKeys<'_>;
}

impl LikeKeys for Keys {
    fn like_shard(&self, subject: i64) -> LikeShardKeys<'_> {
        self.like_shard_by_index(like_shard_of(subject))
    }

    fn like_shard_by_index(&self, shard: u32) -> LikeShardKeys<'_> {
        LikeShardKeys { keys: self, shard }
    }
}

pub struct LikeShardKeys<'a> {
    keys: &'a Keys,
    shard: u32,
}

impl LikeShardKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}like:{name}:{{l:{}}}", self.keys.prefix(), self.shard)
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The cached relation of `user` to the subject named `subject` (its field): `2 × seq +
    /// liked`, expiring some time after its last write. Terse, like the view markers: there is one
    /// per recent (user, subject) pair.
    pub fn relation(&self, subject: &str, user: i64) -> String {
        format!(
            "{}lr:{{l:{}}}:{subject}:{user}",
            self.keys.prefix(),
            self.shard
        )
    }

    /// A `SCAN MATCH` pattern for every cached relation of the shard.
    pub fn relation_pattern(&self) -> String {
        format!("{}lr:{{l:{}}}:*", self.keys.prefix_pattern(), self.shard)
    }

    /// The field of (`subject`, `user`) in [`Self::unarchived`], `subject` being the subject's field.
    pub fn relation_field(subject: &str, user: i64) -> String {
        format!("{subject}:{user}")
    }

    /// Hash relation field → `2 × seq + liked` of the relations whose last change is not archived
    /// yet: with SQL, the truth for a relation the cache has lost.
    pub fn unarchived(&self) -> String {
        self.key("unarchived")
    }

    /// Hash subject field → `like_count` as SQL had it (at the version in [`Self::base_versions`]).
    pub fn base(&self) -> String {
        self.key("base")
    }

    /// Hash subject field → the `like_version` of the cached base count.
    pub fn base_versions(&self) -> String {
        self.key("basever")
    }

    /// Hash subject field → likes minus unlikes not archived yet.
    pub fn pending(&self) -> String {
        self.key("pending")
    }

    /// String: the shard's last event sequence.
    pub fn seq(&self) -> String {
        self.key("seq")
    }

    /// Hash article → the version of its live counters' like and comment part: every change of
    /// the article's like or comment count moves it past its last value and the time in
    /// microseconds (see `lua/like_set.lua`, `lua/article_stats_bump.lua`).
    pub fn article_stats_versions(&self) -> String {
        self.key("statsver")
    }

    /// Sorted set article → likes (the live count).
    pub fn rank_all_time(&self) -> String {
        self.key("rank:all")
    }

    /// Sorted set article → likes minus unlikes in one time bucket (a local day, an ISO week).
    pub fn rank_bucket(&self, bucket: &str) -> String {
        format!("{}:{bucket}", self.key("rank"))
    }

    /// String: the featured (top-liked) comment ids of `article`, comma-separated, replaced whole.
    pub fn featured(&self, article: i64) -> String {
        format!("{}:{article}", self.key("featured"))
    }

    /// String held while `article`'s featured list is fresh or being recomputed: whoever sets it
    /// recomputes; it expires after the refresh interval.
    pub fn featured_lease(&self, article: i64) -> String {
        format!("{}:{article}", self.key("featured-lease"))
    }

    /// Pub/sub channel told when `article`'s like or comment count moves, for an article of this
    /// shard: in its slot, so the like script publishes it with `SPUBLISH` on a cluster (see
    /// [`crate::keys::ArticleKeys`]).
    pub fn article_stats_channel(&self, article: i64) -> String {
        format!("{}:{article}", self.key("events"))
    }

    /// String held for a moment after the likes archive refreshed `article`'s featured list, so
    /// that it refreshes the list at most once in that moment.
    pub fn featured_archived(&self, article: i64) -> String {
        format!("{}:{article}", self.key("featured-archived"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_like_touches_keys_of_one_slot() {
        let keys = Keys::new("p:");
        let (subject, field) = (5 + i64::from(LIKE_SHARDS), "c21");
        let shard = keys.like_shard(subject);
        let job = keys.job_shard("likes-archive", "l", like_shard_of(subject));
        for key in [
            shard.relation(field, 77),
            shard.unarchived(),
            shard.base(),
            shard.base_versions(),
            shard.pending(),
            shard.seq(),
            shard.rank_all_time(),
            shard.rank_bucket("20261123"),
            shard.featured(5),
            shard.featured_lease(5),
            shard.article_stats_channel(5),
            job.stream(),
            job.dead(),
        ] {
            assert!(key.starts_with("p:"), "{key} lacks the prefix");
            assert_eq!(
                key.matches('{').count(),
                1,
                "{key} has more than one hash tag"
            );
            assert!(key.contains("{l:5}"), "{key} is not in like shard 5");
        }
    }

    #[test]
    fn the_relation_pattern_matches_relations_of_its_shard_only() {
        let keys = Keys::new("t*[1]:");
        let pattern = keys.like_shard_by_index(4).relation_pattern();
        assert_eq!(pattern, "t\\*\\[1\\]:lr:{l:4}:*");
        let relation = keys.like_shard_by_index(4).relation("a20", 9);
        assert!(relation.starts_with("t*[1]:lr:{l:4}:"), "{relation}");
    }
}
