//! Article views: deduplicated per viewer and window, crawler-filtered, counted in Redis and
//! flushed to SQL exactly once.
//!
//! Truth: `articles.view_count` in SQL plus the pending deltas in Redis. Pending deltas are the only
//! views not yet in SQL; losing Redis loses at most the views counted since the last flush (one
//! flush interval, or less with Redis persistence). Cache, rebuildable from SQL (`pulse rebuild
//! views`): the base counts and the all-time ranking. Allowed to expire: dedup markers (after the
//! window) and the DAY/WEEK rankings (a few periods after their last view).
//!
//! A Redis that comes back older than SQL (an old snapshot or AOF, a promoted replica) never makes
//! a view count twice: flush sequences tell it apart and the flusher repairs the shard before its
//! next batch (see [`flush`]). Views counted after such a restart and before the repair (one flush
//! interval at most, or the flush lease when the snapshot held a batch in flight) on an article
//! flushed after the snapshot are lost: they cannot be told from the stale pending views dropped
//! with them.

pub mod buckets;
pub mod crawler;
pub mod flush;
pub mod graphql;
pub mod loader;
pub mod rebuild;
pub mod service;

pub use flush::ViewFlusher;
pub use service::ViewService;
