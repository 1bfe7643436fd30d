//! Article views: deduplicated per viewer and window, crawler-filtered, counted in Redis and
//! flushed to SQL exactly once.
//!
//! Truth: `articles.view_count` in SQL plus the pending deltas in Redis. Pending deltas are the only
//! views not yet in SQL; losing Redis loses at most the views counted since the last flush (one
//! flush interval, or less with Redis persistence). Cache, rebuildable from SQL (`pulse rebuild
//! views`): the base counts and the all-time ranking. Allowed to expire: dedup markers (after the
//! window) and the DAY/WEEK rankings (a few periods after their last view).

pub mod buckets;
pub mod crawler;
pub mod graphql;
pub mod loader;
pub mod rebuild;
pub mod service;
pub mod worker;

pub use service::ViewService;
pub use worker::ViewFlusher;
