//! Lua scripts, compiled into the binary from `lua/` and invoked by name.
//!
//! `redis::Script` sends EVALSHA and falls back to loading the body on NOSCRIPT, so a Redis that
//! restarted (or a replica promoted) mid-run costs one extra round trip, never an error. On a
//! cluster, `SCRIPT LOAD` goes to every master and EVALSHA to the master of the script's keys.

use redis::Script;

pub struct Scripts {
    /// Fixed-window counter: see `lua/rate_limit.lua`.
    pub rate_limit: Script,
    /// Dedup + count + rank one article view: see `lua/record_view.lua`.
    pub record_view: Script,
    /// First step of a view flush: see `lua/view_flush_take.lua`.
    pub view_flush_take: Script,
    /// Last step of a view flush: see `lua/view_flush_clear.lua`.
    pub view_flush_clear: Script,
    /// Repair of a shard whose Redis is behind SQL: see `lua/view_flush_repair.lua`.
    pub view_flush_repair: Script,
    /// Dead letters back onto a job's stream: see `lua/job_retry_dead.lua`.
    pub job_retry_dead: Script,
    /// Idle, empty consumers of a job's group dropped: see `lua/job_forget_consumers.lua`.
    pub job_forget_consumers: Script,
    /// Like or unlike, with its archive event: see `lua/like_set.lua`.
    pub like_set: Script,
    /// Archived like events settled in Redis: see `lua/like_settle.lua`.
    pub like_settle: Script,
    /// An article's featured comments replaced under its lease: see `lua/featured_store.lua`.
    pub featured_store: Script,
    /// One voter's ballots in one poll, all or nothing each: see `lua/vote_cast.lua`.
    pub vote_cast: Script,
    /// One article into one follower's timeline: see `lua/feed_deliver.lua`.
    pub feed_deliver: Script,
    /// One page of a timeline from its inbox: see `lua/feed_read.lua`.
    pub feed_read: Script,
    /// A missing inbox's rebuild started under a lock: see `lua/feed_rebuild_begin.lua`.
    pub feed_rebuild_begin: Script,
    /// A rebuilt inbox renamed in: see `lua/feed_rebuild_install.lua`.
    pub feed_rebuild_install: Script,
    /// Articles into an author's outbox: see `lua/feed_outbox_add.lua`.
    pub feed_outbox_add: Script,
    /// A followee's articles merged into (or taken out of) an inbox: see `lua/feed_merge.lua`.
    pub feed_merge: Script,
}

impl Scripts {
    pub fn load() -> Self {
        Self {
            rate_limit: Script::new(include_str!("../../lua/rate_limit.lua")),
            record_view: Script::new(include_str!("../../lua/record_view.lua")),
            view_flush_take: Script::new(include_str!("../../lua/view_flush_take.lua")),
            view_flush_clear: Script::new(include_str!("../../lua/view_flush_clear.lua")),
            view_flush_repair: Script::new(include_str!("../../lua/view_flush_repair.lua")),
            job_retry_dead: Script::new(include_str!("../../lua/job_retry_dead.lua")),
            job_forget_consumers: Script::new(include_str!("../../lua/job_forget_consumers.lua")),
            like_set: Script::new(include_str!("../../lua/like_set.lua")),
            like_settle: Script::new(include_str!("../../lua/like_settle.lua")),
            featured_store: Script::new(include_str!("../../lua/featured_store.lua")),
            vote_cast: Script::new(include_str!("../../lua/vote_cast.lua")),
            feed_deliver: Script::new(include_str!("../../lua/feed_deliver.lua")),
            feed_read: Script::new(include_str!("../../lua/feed_read.lua")),
            feed_rebuild_begin: Script::new(include_str!("../../lua/feed_rebuild_begin.lua")),
            feed_rebuild_install: Script::new(include_str!("../../lua/feed_rebuild_install.lua")),
            feed_outbox_add: Script::new(include_str!("../../lua/feed_outbox_add.lua")),
            feed_merge: Script::new(include_str!("../../lua/feed_merge.lua")),
        }
    }

    fn all(&self) -> [&Script; 17] {
        [
            &self.rate_limit,
            &self.record_view,
            &self.view_flush_take,
            &self.view_flush_clear,
            &self.view_flush_repair,
            &self.job_retry_dead,
            &self.job_forget_consumers,
            &self.like_set,
            &self.like_settle,
            &self.featured_store,
            &self.vote_cast,
            &self.feed_deliver,
            &self.feed_read,
            &self.feed_rebuild_begin,
            &self.feed_rebuild_install,
            &self.feed_outbox_add,
            &self.feed_merge,
        ]
    }

    /// Loads every script into Redis's script cache up front, so the first request after start-up
    /// does not pay the NOSCRIPT round trip.
    pub async fn preload(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<()> {
        for script in self.all() {
            script.prepare_invoke().load_async(conn).await?;
        }
        Ok(())
    }
}
