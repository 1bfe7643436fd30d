//! The follow graph: who follows whom.
//!
//! Truth: SQL. `follows` has one row per (follower, followee); `follow_counts` holds each user's
//! follower and following counts and is changed in the same transaction as the row it counts, so
//! a count never disagrees with the graph, and a repeated `follow` or `unfollow` (or two racing
//! ones) changes a count at most once. Nothing of the graph is cached in Redis: the feed's caches
//! (inboxes, outboxes) are filtered by it and rebuilt from it.
//!
//! Every change that committed is told to the service's [`service::FollowListener`]: the feed's
//! hook queues the job that brings the follower's inbox in line. The follows domain names no
//! other domain; the feed depends on it, not the other way round.

pub mod graphql;
pub mod loader;
pub mod service;

pub use service::FollowService;
