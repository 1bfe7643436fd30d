//! The domains' Redis keys, one file per family, the only place they are built.
//!
//! Each family extends the shared [`Keys`] (the prefix and the job runtime's keys) with a trait of
//! its own, taking plain ids: bring the family's trait into scope to build its keys. Keys that one
//! script touches together share a hash tag (`{v:3}` for view shard 3, `{ip:…}` for one client's
//! attempt counter), which keeps every script single-slot on Redis Cluster.

mod accounts;
mod articles;
mod documents;
mod feed;
mod likes;
mod views;

pub use crate::redis::keys::{JobShardKeys, Keys};
pub use accounts::AccountKeys;
pub use articles::ArticleKeys;
pub use documents::DocumentKeys;
pub use feed::{FEED_SHARDS, FeedKeys, FeedUserKeys, by_feed_shard, feed_shard};
pub use likes::{LIKE_SHARDS, LikeKeys, LikeShardKeys, like_shard_of};
pub use pulse_votes::keys::{PollKeys, VOTE_SHARDS, VoteKeys, vote_shard_of};
pub use views::{VIEW_SHARDS, ViewKeys, ViewShardKeys, view_shard_of};
