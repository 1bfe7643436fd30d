//! The follow feed: a push/pull hybrid on Redis sorted sets (seeds 003 and 004).
//!
//! Truth: SQL. `articles` and `follows` say what every feed holds; `feed_publications` is the
//! publish outbox, written in the article's own transaction, so a publish is never lost between
//! SQL and Redis: [`publications::Relay`] appends it to the dispatch stream after the commit, and
//! again later for rows not relayed (Redis was down) or relayed long ago and never dispatched
//! (their entry was lost with a Redis rollback).
//!
//! Cache, rebuilt from SQL on demand and never needing `pulse rebuild`:
//! - each author's **outbox** (their newest article ids, capped), trusted only once loaded from
//!   SQL (publishes add to it either way, so a publish racing a load is kept);
//! - each user's **inbox** (their timeline's newest ids, capped, trimmed on every write) with a
//!   TTL restarted by every read: its existence is what makes a user active, and only active users
//!   get fan-out writes. A missing inbox is rebuilt by pull from the followees' outboxes (SQL where
//!   one is not loaded) into a building key renamed in atomically, one rebuild at a time per user;
//! - each inbox's **floor**, in its anchor member's score: the inbox holds every article of the
//!   fanned-out followees from the floor up (0: the whole history, so reading past it skips SQL),
//!   and reads go to SQL below it. Whatever adds ids that are exact only down to some point (a
//!   rebuild's pull, a follow's backfill, a former celebrity's merge, a trim) raises the floor to
//!   that point in the same script, so an inbox never has a hole above its floor (issue 25);
//! - each author's **audience** (per feed shard): the followers whose inbox exists, joined when it
//!   is built, left on unfollow or when a delivery finds it expired. Fan-out reads it instead of
//!   every follower, so its cost grows with the active followers alone.
//!
//! Order: newest first is descending article id (ids are minted in publication order, and SQL's
//! timestamps keep whole seconds only), so every position is unique and a cursor is exact across
//! the inbox, celebrity outboxes and SQL. Cursors carry a MAC of (viewer, id, journal position).
//!
//! The graph changes under the inboxes: a follow or unfollow (told by the follows service's
//! listener) queues a `feed-follows` job that merges or removes the followee's articles; one that
//! lands during a rebuild sends the rebuild back to start over, since its pull may predate the
//! change; an unfollow that takes an author below the celebrity threshold queues the merge of their
//! articles into their audience's inboxes (they were merged at read time, never fanned out). A
//! rise above the threshold needs nothing: the inboxes keep what was fanned out, and reads merge
//! the outbox from then on.
//!
//! Exactly once: every write is a `ZADD` of an id, so re-delivered fan-out (a worker killed after
//! its writes and before its acknowledgement, a publication relayed twice) adds nothing, and a
//! live item is announced only by the write that added it. Reads filter by SQL's `follows`, so an
//! unfollowed author's items never show, even before the removal job ran.
//!
//! Live: `feedItemAdded` hears the viewer's channel (fan-out announces an item to online users
//! only, when its write added it) and the channels of the celebrities they follow (an article heard
//! there is delivered into the viewer's inbox by the subscription, and comes back on the viewer's
//! channel). Its positions are not article ids but the viewer's **journal** (a sorted set beside
//! the inbox): the delivery that adds an article to the inbox gives it the journal's next position
//! and announces it with it, in one script, so the journal is the order in which items joined the
//! feed (ids commit out of order, and fan-out of different authors runs concurrently, so an id
//! below one a client holds can still be delivered). A journal has an epoch; one created again (a
//! delivery found the inbox gone and left the audience, or Redis lost it) has a new one, and
//! cursors of the old one resync. Feed cursors carry (epoch, position); a page's carry the position
//! the inbox read found, so a subscription resumed from a page replays the items above its cursor
//! and those delivered after it. Resumed, the stream marks the viewer online and subscribes before
//! reading the journal, so an item is replayed or heard, and each goes out once, in journal order
//! ([`crate::realtime::resume`]).
//!
//! May be lost: nothing. Every inbox and outbox rebuilds from SQL.

pub mod dispatch;
pub mod fanout;
pub mod follow_sync;
pub mod graphql;
pub mod publications;
pub mod service;
pub mod store;
pub mod upkeep;

pub use service::FeedService;
pub use store::{FeedSettings, FeedStore};
