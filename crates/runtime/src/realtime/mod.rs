//! Realtime fan-out through Redis pub/sub, shared per process.
//!
//! Nothing here is durable: a message published while no process listens is gone, and subscribers
//! see only what is published after they subscribed. Everything sent is derivable from SQL/Redis
//! state, so a client that reconnects re-reads and loses nothing that matters; event streams resume
//! from a client's position through [`resume`], or tell it to re-read.

pub mod coalesce;
mod hub;
pub mod resume;

pub use coalesce::{Coalesced, Coalescer, CoalescerConfig, Snapshot};
pub use hub::{Hub, HubSubscription, Sharding};
pub use resume::{Confirmations, REPLAY_CHUNK, Replay, Resume, resumable};
