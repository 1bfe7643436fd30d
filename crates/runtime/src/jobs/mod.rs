//! Durable background jobs on Redis Streams: one file per job, one runtime for all of them.
//!
//! A job is a [`JobSpec`] (its name and how many shard streams it reads), its entry type
//! ([`Job::Payload`], a serde struct of scalar fields) and an idempotent [`Job::handle`] over a
//! batch of decoded [`Entry`]s. Producers append entries to a shard's stream ([`enqueue`], or
//! `XADD` inside a Lua script whose keys share the shard's hash tag, with the same fields); the
//! [`JobRuntime`] reads them through a consumer group named after the job and decodes them
//! ([`fields`]), so no handler reads a stream's strings by hand.
//!
//! Truth: an entry is in its stream until the group has acknowledged it, and it is acknowledged
//! only after the handler returned `Ok`, that is after the handler's SQL transaction committed.
//! Delivery is therefore at-least-once: a consumer that dies between its commit and its `XACK`
//! gets the entry delivered again, so handlers must be idempotent, by an event id the producer puts
//! in the entry's fields (not by stream id: `retry-dead` re-adds an entry under a new one). Nothing is lost while Redis keeps its data: entries a dead consumer held are reclaimed
//! once its lease runs out, a failing entry is retried with backoff and, after
//! [`JobSettings::max_deliveries`], parked on the shard's dead-letter stream with its error until
//! `pulse jobs retry-dead <job>` puts it back; trimming removes only acknowledged entries.
//!
//! Why our own runtime: crates weighed (November 2026) were `apalis` + `apalis-redis` (its queue is
//! Redis lists and sorted sets driven by its own Lua scripts, not streams: no consumer groups, no
//! way for one of our scripts to append an event in its own hash slot, and jobs are serialized
//! task structs acknowledged by the framework, not after our SQL commit), `rsmq_async` (RSMQ, a
//! sorted-set queue with visibility timeouts: no streams, no dead letters), and the stream
//! helpers of `redis` itself (typed replies for `XREADGROUP`, `XPENDING`, `XCLAIM`, `XINFO`,
//! which this runtime uses). None offered consumer groups with a lease, per-entry backoff, dead
//! letters and trimming below the oldest unacknowledged entry over several hash-tagged shard
//! streams; the runtime is the few hundred lines that do, on the `redis` crate we already use.

pub mod fields;
mod runtime;
mod streams;

use std::collections::HashMap;

use anyhow::Context as _;
use serde::de::DeserializeOwned;

use crate::redis::Redis;
use crate::redis::keys::{JobShardKeys, Keys};

pub use crate::bell::Bell;
pub use runtime::{JobRuntime, JobSettings};
pub use streams::{StreamStatus, enqueue, retry_dead, status, trim};

/// What a job is called and where its entries live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobSpec {
    /// Names the consumer group, the metrics' `job` label and the keys (no braces).
    pub name: &'static str,
    /// Shard streams the job reads: `0..shards`.
    pub shards: u32,
    /// Shard `N`'s keys carry the hash tag `{<tag>:N}`: the domain's own shard tag, so that the
    /// domain's scripts can append to the stream of the shard they write in.
    pub tag: &'static str,
}

impl JobSpec {
    /// Shard `shard`'s keys under `redis`' prefix.
    pub fn keys(self, redis: &Redis, shard: u32) -> JobShardKeys<'_> {
        self.keys_in(&redis.keys, shard)
    }

    /// Shard `shard`'s keys under `keys`' prefix.
    pub fn keys_in(self, keys: &Keys, shard: u32) -> JobShardKeys<'_> {
        keys.job_shard(self.name, self.tag, shard)
    }
}

/// A stream entry as the runtime reads it: its fields as strings.
pub type Fields = HashMap<String, String>;

/// One stream entry: as read ([`Fields`]), or decoded as its job's [`Job::Payload`].
#[derive(Clone, Debug)]
pub struct Entry<T = Fields> {
    /// The shard stream the entry came from.
    pub shard: u32,
    /// The stream id (`<ms>-<seq>`), unique within the shard. Not an idempotency key: a dead letter
    /// put back by `retry-dead` comes back under a new id.
    pub id: String,
    pub payload: T,
    /// How many times the entry has been delivered, this delivery included.
    pub deliveries: u64,
}

impl Entry {
    /// The entry with its fields decoded as `T`; an error names the entry.
    pub fn decode<T: DeserializeOwned>(&self) -> anyhow::Result<Entry<T>> {
        let payload = fields::from_fields(&self.payload)
            .with_context(|| format!("entry {} of shard {} is malformed", self.id, self.shard))?;
        Ok(Entry {
            shard: self.shard,
            id: self.id.clone(),
            payload,
            deliveries: self.deliveries,
        })
    }
}

#[async_trait::async_trait]
pub trait Job: Send + Sync + 'static {
    /// What the job's producers append, decoded by the runtime before [`Self::handle`].
    type Payload: DeserializeOwned + Send + Sync + 'static;

    fn spec(&self) -> JobSpec;

    /// Applies a batch of entries from one shard, all or nothing (one SQL transaction), and
    /// idempotently: an entry may come again after a crash between the commit and the
    /// acknowledgement. An error fails the batch; the runtime then retries its entries one by
    /// one, so that one bad entry does not hold the others back.
    async fn handle(&self, batch: &[Entry<Self::Payload>]) -> anyhow::Result<()>;
}

/// A job as the runtime runs it, whatever its entry type: every [`Job`] is one. An entry that does
/// not decode fails its batch like any other error, and so ends in the dead letters.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    fn job_spec(&self) -> JobSpec;

    async fn handle_fields(&self, batch: &[Entry]) -> anyhow::Result<()>;
}

#[async_trait::async_trait]
impl<J: Job> Handler for J {
    fn job_spec(&self) -> JobSpec {
        self.spec()
    }

    async fn handle_fields(&self, batch: &[Entry]) -> anyhow::Result<()> {
        let decoded = batch
            .iter()
            .map(Entry::decode)
            .collect::<anyhow::Result<Vec<Entry<J::Payload>>>>()?;
        self.handle(&decoded).await
    }
}
