//! The only place Redis keys are built.
//!
//! Every key starts with the configured prefix, so deployments and tests share one Redis safely.
//! Keys that one script touches together share a hash tag (`{v:3}` for view shard 3, `{ip:…}` for
//! one client's attempt counter, `{<tag>:N}` for shard N of a job's streams, where the tag is the
//! domain's own), which keeps every script single-slot on Redis Cluster.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::actor::Identity;
use crate::likes::Subject;

#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A prefix with a brace would put its own hash tag first in every key, sending every key to one
    /// Redis Cluster slot; refuse it at start-up instead.
    pub fn check_prefix(prefix: &str) -> Result<(), String> {
        if prefix.contains(['{', '}']) {
            Err(format!(
                "PULSE_REDIS_PREFIX {prefix:?} must not contain braces: they would override the keys' hash tags"
            ))
        } else {
            Ok(())
        }
    }

    /// String: which database owns the prefix (see `src/ownership.rs`). One key, so one slot on a
    /// cluster; no hash tag, since no script touches it.
    pub fn owner(&self) -> String {
        format!("{}owner", self.prefix)
    }

    /// A `SCAN MATCH` pattern for every key under the prefix.
    pub fn everything_pattern(&self) -> String {
        format!("{}*", escape_glob(&self.prefix))
    }

    /// Fixed-window counter of sign-in/sign-up attempts from one client address.
    pub fn auth_attempts(&self, client: IpAddr) -> String {
        format!("{}ratelimit:auth:{{ip:{client}}}", self.prefix)
    }

    /// The keys of article `article`'s view-count shard. See [`ViewShardKeys`].
    pub fn view_shard(&self, article: i64) -> ViewShardKeys<'_> {
        self.view_shard_by_index(view_shard_of(article))
    }

    pub fn view_shard_by_index(&self, shard: u32) -> ViewShardKeys<'_> {
        ViewShardKeys { keys: self, shard }
    }

    /// Pub/sub channel announcing newly published articles.
    pub fn articles_published_channel(&self) -> String {
        format!("{}events:articles:published", self.prefix)
    }
}

/// View counting spreads articles over this many shards. Every key of one shard shares the hash tag
/// `{v:N}`, so the one script that counts a view (dedup key, pending delta, rankings) is single-slot
/// on Redis Cluster while the load still spreads over slots. Changing it strands existing keys.
pub const VIEW_SHARDS: u32 = 16;

pub fn view_shard_of(article: i64) -> u32 {
    article.rem_euclid(i64::from(VIEW_SHARDS)) as u32
}

pub struct ViewShardKeys<'a> {
    keys: &'a Keys,
    shard: u32,
}

impl ViewShardKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}view:{name}:{{v:{}}}", self.keys.prefix, self.shard)
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Marks that `viewer` has been counted for `article` within the window (expires with it).
    /// Terse on purpose: there is one per viewer per article per window, and a key under 32 bytes
    /// takes Redis's smallest string header and allocation class, about 16 bytes less per marker.
    pub fn seen(&self, article: i64, viewer: Identity) -> String {
        let (prefix, shard) = (&self.keys.prefix, self.shard);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_prefix() {
        let keys = Keys::new("t1:");
        assert!(
            keys.auth_attempts("10.0.0.1".parse().unwrap())
                .starts_with("t1:")
        );
        assert!(keys.articles_published_channel().starts_with("t1:"));
        assert!(keys.view_shard(9).pending().starts_with("t1:"));
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
        ] {
            assert_eq!(
                key.matches('{').count(),
                1,
                "{key} has more than one hash tag"
            );
            assert!(key.contains(&tag), "{key} is not in shard 9");
        }
    }

    #[test]
    fn a_prefix_cannot_carry_its_own_hash_tag() {
        assert!(Keys::check_prefix("pulse:").is_ok());
        assert!(Keys::check_prefix("{tenant}:").is_err());
    }

    #[test]
    fn ipv6_clients_get_a_well_formed_hash_tag() {
        let key = Keys::new("p:").auth_attempts("::1".parse().unwrap());
        assert_eq!(key, "p:ratelimit:auth:{ip:::1}");
    }
}

// Jobs: the streams of the durable job runtime (`src/jobs/`).

impl Keys {
    /// The keys of shard `shard` of job `job`, whose shards carry the hash tag `{<tag>:<shard>}`.
    /// See [`JobShardKeys`].
    pub fn job_shard<'a>(&'a self, job: &'a str, tag: &'a str, shard: u32) -> JobShardKeys<'a> {
        JobShardKeys {
            keys: self,
            job,
            tag,
            shard,
        }
    }
}

/// One shard of a job: its stream and its dead letters carry the domain's own shard hash tag (a
/// job of the views domain would use `{v:N}`), so a domain script can append an event to the
/// stream of the shard it writes in, single-slot, and moving dead letters back is single-slot too.
pub struct JobShardKeys<'a> {
    keys: &'a Keys,
    job: &'a str,
    tag: &'a str,
    shard: u32,
}

impl JobShardKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!(
            "{}job:{}:{name}:{{{}:{}}}",
            self.keys.prefix, self.job, self.tag, self.shard
        )
    }

    /// Stream of the job's entries on this shard, read by the consumer group named after the job.
    pub fn stream(&self) -> String {
        self.key("stream")
    }

    /// Stream of the entries that failed every delivery, each with its error and original id.
    pub fn dead(&self) -> String {
        self.key("dead")
    }
}

#[cfg(test)]
mod job_key_tests {
    use super::*;

    #[test]
    fn a_job_shards_stream_and_dead_letters_share_the_domains_hash_tag() {
        let keys = Keys::new("p:");
        let shard = keys.job_shard("likes", "l", 3);
        for key in [shard.stream(), shard.dead()] {
            assert!(key.starts_with("p:"), "{key} lacks the prefix");
            assert_eq!(
                key.matches('{').count(),
                1,
                "{key} has more than one hash tag"
            );
            assert!(key.ends_with("{l:3}"), "{key} is not in shard 3 of likes");
        }
        assert_ne!(shard.stream(), keys.job_shard("likes", "l", 4).stream());
        assert_ne!(shard.stream(), keys.job_shard("votes", "l", 3).stream());
    }
}

// Likes: relations, counters and rankings of liked subjects (articles and comments), and each
// article's featured comments.

/// Likes spread subjects over this many shards, each with the hash tag `{l:N}`: the one script
/// that likes (relation, counter, ranking, the archive stream's entry) is single-slot on Redis
/// Cluster while the load spreads over slots. Changing it strands existing keys.
pub const LIKE_SHARDS: u32 = 16;

/// The like shard of `subject`.
pub fn like_shard_of(subject: Subject) -> u32 {
    subject.id().rem_euclid(i64::from(LIKE_SHARDS)) as u32
}

/// `subject`'s name in hash fields and keys: `a42` for an article, `c7` for a comment, so that an
/// article and a comment with one id never share a counter.
pub fn like_field(subject: Subject) -> String {
    match subject {
        Subject::Article(id) => format!("a{id}"),
        Subject::Comment(id) => format!("c{id}"),
    }
}

impl Keys {
    /// The keys of the like shard `subject` lives in. See [`LikeShardKeys`].
    pub fn like_shard(&self, subject: Subject) -> LikeShardKeys<'_> {
        self.like_shard_by_index(like_shard_of(subject))
    }

    pub fn like_shard_by_index(&self, shard: u32) -> LikeShardKeys<'_> {
        LikeShardKeys { keys: self, shard }
    }

    /// Pub/sub channel told whenever one of an article's counters (views, likes, comments) moves.
    pub fn article_stats_channel(&self, article: i64) -> String {
        format!("{}events:article-stats:{article}", self.prefix)
    }
}

pub struct LikeShardKeys<'a> {
    keys: &'a Keys,
    shard: u32,
}

impl LikeShardKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}like:{name}:{{l:{}}}", self.keys.prefix, self.shard)
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The cached relation of `user` to `subject`: `2 × seq + liked`, expiring some time after its
    /// last write. Terse, like the view markers: there is one per recent (user, subject) pair.
    pub fn relation(&self, subject: Subject, user: i64) -> String {
        format!(
            "{}lr:{{l:{}}}:{}:{user}",
            self.keys.prefix,
            self.shard,
            like_field(subject)
        )
    }

    /// A `SCAN MATCH` pattern for every cached relation of the shard.
    pub fn relation_pattern(&self) -> String {
        let prefix: String = self
            .keys
            .prefix
            .chars()
            .flat_map(|c| match c {
                '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        format!("{prefix}lr:{{l:{}}}:*", self.shard)
    }

    /// The field of (`subject`, `user`) in [`Self::unarchived`].
    pub fn relation_field(subject: Subject, user: i64) -> String {
        format!("{}:{user}", like_field(subject))
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

    /// String held for a moment after the likes archive refreshed `article`'s featured list, so
    /// that it refreshes the list at most once in that moment.
    pub fn featured_archived(&self, article: i64) -> String {
        format!("{}:{article}", self.key("featured-archived"))
    }
}

#[cfg(test)]
mod like_key_tests {
    use super::*;

    #[test]
    fn a_like_touches_keys_of_one_slot() {
        let keys = Keys::new("p:");
        let subject = Subject::Comment(5 + i64::from(LIKE_SHARDS));
        let shard = keys.like_shard(subject);
        let job = keys.job_shard("likes-archive", "l", like_shard_of(subject));
        for key in [
            shard.relation(subject, 77),
            shard.unarchived(),
            shard.base(),
            shard.base_versions(),
            shard.pending(),
            shard.seq(),
            shard.rank_all_time(),
            shard.rank_bucket("20261123"),
            shard.featured(5),
            shard.featured_lease(5),
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
        let relation = keys
            .like_shard_by_index(4)
            .relation(Subject::Article(20), 9);
        assert!(relation.starts_with("t*[1]:lr:{l:4}:"), "{relation}");
    }

    #[test]
    fn an_article_and_a_comment_with_one_id_are_different_subjects() {
        assert_ne!(
            like_field(Subject::Article(3)),
            like_field(Subject::Comment(3))
        );
    }
}

// Votes: a poll's boards, participant counters, rate-limit counters and vote sequence.

/// Polls spread over this many shards, each with the hash tag `{vp:N}`: every key of one poll
/// (and the shard's archive stream) is in one slot, so the one script that casts a poll's votes
/// is single-slot on Redis Cluster. Changing it strands existing keys.
pub const VOTE_SHARDS: u32 = 16;

pub fn vote_shard_of(poll: i64) -> u32 {
    poll.rem_euclid(i64::from(VOTE_SHARDS)) as u32
}

impl Keys {
    /// The keys of poll `poll`. See [`PollKeys`].
    pub fn poll(&self, poll: i64) -> PollKeys<'_> {
        PollKeys { keys: self, poll }
    }

    /// Pub/sub channel told the id of a poll whose configuration an admin changed.
    pub fn polls_changed_channel(&self) -> String {
        format!("{}events:polls:changed", self.prefix)
    }
}

pub struct PollKeys<'a> {
    keys: &'a Keys,
    poll: i64,
}

impl PollKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!(
            "{}vote:{name}:{{vp:{}}}:{}",
            self.keys.prefix,
            vote_shard_of(self.poll),
            self.poll
        )
    }

    pub fn shard(&self) -> u32 {
        vote_shard_of(self.poll)
    }

    /// Sorted set option → score of one board (`r` REAL, `d` DISPLAY) in one period bucket.
    pub fn board(&self, board: &str, bucket: &str) -> String {
        format!("{}:{board}:{bucket}", self.key("b"))
    }

    /// A `SCAN MATCH` pattern for every board of the poll.
    pub fn board_pattern(&self) -> String {
        let prefix: String = self
            .keys
            .prefix
            .chars()
            .flat_map(|c| match c {
                '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        format!(
            "{prefix}vote:b:\\{{vp:{}\\}}:{}:*",
            vote_shard_of(self.poll),
            self.poll
        )
    }

    /// HyperLogLog of the poll's distinct voters.
    pub fn participants(&self) -> String {
        self.key("hll")
    }

    /// HyperLogLog of the distinct voters of one option.
    pub fn option_participants(&self, option: i64) -> String {
        format!("{}:{option}", self.key("hll"))
    }

    /// Counter of one rate-limit rule for one subject (voter, address, option) in one window.
    pub fn limit_counter(&self, counter: &str, subject: &str, window: &str) -> String {
        format!("{}:{counter}:{subject}:{window}", self.key("rl"))
    }

    /// Set while the poll is closed: the vote script refuses every ballot, whatever a process's
    /// cached configuration says.
    pub fn closed(&self) -> String {
        self.key("closed")
    }

    /// String: the poll's vote sequence, one per accepted ballot; orders the vote log and versions
    /// the live boards.
    pub fn seq(&self) -> String {
        self.key("seq")
    }

    /// Pub/sub channel told whenever one of the poll's boards moves.
    pub fn votes_channel(&self) -> String {
        format!("{}events:poll-votes:{}", self.keys.prefix, self.poll)
    }
}

#[cfg(test)]
mod vote_key_tests {
    use super::*;

    #[test]
    fn a_polls_vote_touches_keys_of_one_slot() {
        let keys = Keys::new("p:");
        let poll = keys.poll(7 + i64::from(VOTE_SHARDS));
        let job = keys.job_shard("votes-archive", "vp", poll.shard());
        for key in [
            poll.board("r", "20261125"),
            poll.board("d", "all"),
            poll.participants(),
            poll.option_participants(3),
            poll.limit_counter("VOTER:MINUTE:*", "42", "m1"),
            poll.closed(),
            poll.seq(),
            job.stream(),
        ] {
            assert!(key.starts_with("p:"), "{key} lacks the prefix");
            assert_eq!(
                key.matches('{').count(),
                1,
                "{key} has more than one hash tag"
            );
            assert!(key.contains("{vp:7}"), "{key} is not in vote shard 7");
        }
        assert_ne!(poll.board("r", "all"), keys.poll(7).board("r", "all"));
    }

    #[test]
    fn the_board_pattern_matches_this_polls_boards_only() {
        let keys = Keys::new("p:");
        assert_eq!(keys.poll(23).board_pattern(), "p:vote:b:\\{vp:7\\}:23:*");
    }
}

// Feed: each user's inbox (the timeline cache), outbox (their newest article ids), presence and
// live channel. A user's keys carry the hash tag of the user's feed shard, `{f:<user mod
// FEED_SHARDS>}`: every feed script is single-slot, and one call can write the inboxes of all the
// followers of a fan-out chunk, since a chunk holds the followers of one shard.

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

impl Keys {
    /// The feed keys of `user`. See [`FeedUserKeys`].
    pub fn feed_user(&self, user: i64) -> FeedUserKeys<'_> {
        FeedUserKeys { keys: self, user }
    }

    /// Pub/sub channel of the new items of `user`'s feed (article ids).
    pub fn feed_channel(&self, user: i64) -> String {
        format!("{}events:feed:{user}", self.prefix)
    }

    /// Pub/sub channel of the new articles of `author`, a celebrity whose followers are not fanned
    /// out to: their subscribers listen here.
    pub fn feed_author_channel(&self, author: i64) -> String {
        format!("{}events:feed-author:{author}", self.prefix)
    }

    /// Sorted set follower id → follower id: the followers of `author` in feed shard `shard` who
    /// are active, i.e. whose inbox exists. Fan-out reads these instead of every follower, so its
    /// cost grows with the active followers only. A follower joins when their inbox is built (and
    /// when they follow while it exists) and leaves when they unfollow, or when a delivery finds
    /// their inbox expired. In the followers' shard, so that delivery can drop the expired ones
    /// in the same script that finds them.
    pub fn feed_audience(&self, author: i64, shard: u32) -> String {
        format!("{}feed:audience:{author}:{{f:{shard}}}", self.prefix)
    }

    /// The author and shard of an audience key under `prefix` (see [`Self::feed_audience`]).
    pub fn parse_feed_audience(prefix: &str, key: &str) -> Option<(i64, u32)> {
        let (rest, tag) = key.strip_prefix(prefix)?.rsplit_once(":{f:")?;
        let author = rest.strip_prefix("feed:audience:")?.parse().ok()?;
        let shard = tag.strip_suffix('}')?.parse().ok()?;
        (shard < FEED_SHARDS).then_some((author, shard))
    }

    /// A `SCAN MATCH` pattern for every feed key of every user.
    pub fn feed_pattern(&self) -> String {
        format!("{}feed:*", escape_glob(&self.prefix))
    }
}

fn escape_glob(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

pub struct FeedUserKeys<'a> {
    keys: &'a Keys,
    user: i64,
}

impl FeedUserKeys<'_> {
    fn key(&self, name: &str) -> String {
        let (prefix, user) = (&self.keys.prefix, self.user);
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
}

#[cfg(test)]
mod feed_key_tests {
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

// Persisted queries: the text of a document by its hex SHA-256, one key each.

impl Keys {
    /// String: the document whose SHA-256 is `sha256`, registered by an automatic persisted query.
    pub fn persisted_query(&self, sha256: &str) -> String {
        format!("{}apq:{sha256}", self.prefix)
    }
}
