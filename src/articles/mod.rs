//! Articles: publishing, editing and listing, and their live counters (`stats.rs`: an article's
//! views, likes and comments pushed to `articleStatsChanged` subscribers as they move).
//!
//! SQL is the truth for articles. Edits write only the edited columns (title, body, updated_at), so
//! they can never overwrite counters that flushers and archivers add to concurrently. Publishing
//! announces the new article on pub/sub; that announcement is best-effort (the article is already
//! committed) and may be missed by clients that were not listening.

pub mod graphql;
pub mod loader;
pub mod service;
pub mod stats;

pub use service::ArticleService;
pub use stats::ArticleStatsService;

/// An article's global id names this type.
pub const ARTICLE: pulse_kit::ids::NodeType = pulse_kit::ids::NodeType::named("Article");
