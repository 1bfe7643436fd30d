//! Persisted documents: Apollo's automatic persisted queries, shared by every process through Redis,
//! and the trusted documents a locked-down deployment runs, registered ahead of time in SQL.

mod service;

pub use pulse_edge::persisted::{PersistedMode, sha256_hex};
pub use service::{DocumentStore, RegisteredDocument};
