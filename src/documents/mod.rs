//! Persisted documents: Apollo's automatic persisted queries, shared by every process through Redis,
//! and the trusted documents a locked-down deployment runs, registered ahead of time in SQL.

mod service;

pub use service::{DocumentStore, PersistedMode, RegisteredDocument, is_sha256_hex, sha256_hex};
