//! The app crate's domains' Lua scripts, compiled into the binary from `lua/` and invoked by name.
//! A domain crate keeps its own (`pulse_votes::scripts`), as the job runtime does
//! (`pulse_runtime::redis::Scripts`); `services::scripts` lists them all for `Redis::connect`.

use std::sync::LazyLock;

use redis::Script;

/// Compiled once per process; a `Script` is its text and its SHA-1, the same for every connection.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(Scripts::load);

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
    /// Like or unlike, with its archive event: see `lua/like_set.lua`.
    pub like_set: Script,
    /// Archived like events settled in Redis: see `lua/like_settle.lua`.
    pub like_settle: Script,
    /// An article's stats version moved and announced: see `lua/article_stats_bump.lua`.
    pub article_stats_bump: Script,
    /// An article's live like count and stats version read together: see
    /// `lua/article_stats_read.lua`.
    pub article_stats_read: Script,
    /// An article's featured comments replaced under its lease: see `lua/featured_store.lua`.
    pub featured_store: Script,
    /// Articles into the timelines of one author's followers: see `lua/feed_deliver.lua`.
    pub feed_deliver: Script,
    /// One page of a timeline from its inbox: see `lua/feed_read.lua`.
    pub feed_read: Script,
    /// A journal (a reader's feed, the publications) after a position: see `lua/journal_read.lua`.
    pub journal_read: Script,
    /// A published article journaled and announced: see `lua/article_announce.lua`.
    pub article_announce: Script,
    /// A journal opened for a subscriber: see `lua/journal_open.lua`.
    pub journal_open: Script,
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
            rate_limit: Script::new(include_str!("../lua/rate_limit.lua")),
            record_view: Script::new(include_str!("../lua/record_view.lua")),
            view_flush_take: Script::new(include_str!("../lua/view_flush_take.lua")),
            view_flush_clear: Script::new(include_str!("../lua/view_flush_clear.lua")),
            view_flush_repair: Script::new(include_str!("../lua/view_flush_repair.lua")),
            like_set: Script::new(include_str!("../lua/like_set.lua")),
            like_settle: Script::new(include_str!("../lua/like_settle.lua")),
            article_stats_bump: Script::new(include_str!("../lua/article_stats_bump.lua")),
            article_stats_read: Script::new(include_str!("../lua/article_stats_read.lua")),
            featured_store: Script::new(include_str!("../lua/featured_store.lua")),
            feed_deliver: Script::new(include_str!("../lua/feed_deliver.lua")),
            feed_read: Script::new(include_str!("../lua/feed_read.lua")),
            journal_read: Script::new(include_str!("../lua/journal_read.lua")),
            article_announce: Script::new(include_str!("../lua/article_announce.lua")),
            journal_open: Script::new(include_str!("../lua/journal_open.lua")),
            feed_rebuild_begin: Script::new(include_str!("../lua/feed_rebuild_begin.lua")),
            feed_rebuild_install: Script::new(include_str!("../lua/feed_rebuild_install.lua")),
            feed_outbox_add: Script::new(include_str!("../lua/feed_outbox_add.lua")),
            feed_merge: Script::new(include_str!("../lua/feed_merge.lua")),
        }
    }

    /// Every script, for the registry to load at start-up (`Redis::connect`).
    pub fn all(&self) -> [&Script; 19] {
        [
            &self.rate_limit,
            &self.record_view,
            &self.view_flush_take,
            &self.view_flush_clear,
            &self.view_flush_repair,
            &self.like_set,
            &self.like_settle,
            &self.article_stats_bump,
            &self.article_stats_read,
            &self.featured_store,
            &self.feed_deliver,
            &self.feed_read,
            &self.journal_read,
            &self.article_announce,
            &self.journal_open,
            &self.feed_rebuild_begin,
            &self.feed_rebuild_install,
            &self.feed_outbox_add,
            &self.feed_merge,
        ]
    }
}
