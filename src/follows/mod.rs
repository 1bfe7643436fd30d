//! The follow graph: who follows whom.
//!
//! Truth: SQL. `follows` has one row per (follower, followee); `follow_counts` holds each user's
//! follower and following counts and is changed in the same transaction as the row it counts, so
//! a count never disagrees with the graph, and a repeated `follow` or `unfollow` (or two racing
//! ones) changes a count at most once. Nothing of the graph is cached in Redis: the feed's caches
//! (inboxes, outboxes) are filtered by it and rebuilt from it.

pub mod graphql;
pub mod loader;
pub mod service;

pub use service::FollowService;
