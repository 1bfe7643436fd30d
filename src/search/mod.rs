//! Full-text search over articles (Chinese and English), from an embedded index that is a
//! projection of SQL.
//!
//! SQL is the truth. Every change that affects a document (publish, edit, a view flush batch, a
//! likes archive batch) writes the article's id to `search_outbox` in the same transaction
//! ([`outbox::record`]). Each process serving search keeps its own replica (Tantivy, in
//! `PULSE_SEARCH_DIR`) fed by its own [`indexer::Indexer`] from those rows: absolute values read
//! from SQL, committed with the position they reach, so a crash or restart resumes exactly at the
//! last commit. A new replica, one of an older epoch (`pulse rebuild search`) or one that fell
//! behind the outbox's pruning is rebuilt from SQL. Nothing is lost that SQL has; the index may
//! lag by the poll interval (and a view by the flush interval before that). Redis plays no part.

pub mod counts;
pub mod graphql;
pub mod index;
pub mod indexer;
pub mod outbox;
pub mod query;
pub mod service;
pub mod tokenizer;

pub use service::SearchService;
