//! sea-orm entities: the SQL tables, the system of record. Timestamps are stored as UTC without a
//! zone (the one representation all three backends agree on) and converted at the edge.

pub mod articles;
pub mod comments;
pub mod database_identity;
pub mod feed_publications;
pub mod follow_counts;
pub mod follows;
pub mod like_archive_shards;
pub mod like_events;
pub mod likes;
pub mod search_outbox;
pub mod search_state;
pub mod trusted_documents;
pub mod users;
pub mod view_flush_batches;
pub mod view_flush_shards;

pub use pulse_votes::entities::{poll_options, poll_rules, polls, vote_log};
