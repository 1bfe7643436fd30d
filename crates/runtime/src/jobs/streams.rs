//! Stream-level operations of the job runtime: appending, the consumer groups, trimming, and what
//! `pulse jobs status` and `pulse jobs retry-dead` do.

use std::time::Duration;

use redis::streams::{StreamInfoGroup, StreamInfoGroupsReply, StreamPendingReply};
use redis::{AsyncCommands as _, RedisResult};

use super::JobSpec;
use crate::redis::Redis;

/// Most dead letters one script call moves back, so a long dead-letter stream does not block
/// Redis in one call.
const RETRY_DEAD_CHUNK: usize = 100;

/// One shard stream as `pulse jobs status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamStatus {
    pub stream: String,
    /// Entries in the stream: acknowledged ones not trimmed yet included.
    pub length: u64,
    /// Delivered to a consumer and not acknowledged.
    pub pending: u64,
    /// Not delivered yet.
    pub lag: u64,
    pub dead: u64,
}

/// Appends `entry` (the job's payload type) to shard `shard` of `job`; returns its id.
#[tracing::instrument(skip_all, fields(job = spec.name, shard))]
pub async fn enqueue<T: serde::Serialize>(
    redis: &Redis,
    spec: JobSpec,
    shard: u32,
    entry: &T,
) -> anyhow::Result<String> {
    let fields = super::fields::to_fields(entry)?;
    let mut conn = redis.conn.clone();
    let id: String = conn
        .xadd(spec.keys(redis, shard).stream(), "*", &fields)
        .await?;
    redis.bell.ring(spec.name);
    Ok(id)
}

/// Creates the job's consumer group on every shard (and the streams, if missing). The group
/// starts at the beginning of the stream, so entries appended before any consumer ran are read.
pub(super) async fn create_groups(redis: &Redis, spec: JobSpec) -> RedisResult<()> {
    let mut conn = redis.conn.clone();
    for shard in 0..spec.shards {
        let stream = spec.keys(redis, shard).stream();
        let created: RedisResult<()> = conn.xgroup_create_mkstream(&stream, spec.name, "0").await;
        match created {
            Err(err) if err.code() == Some("BUSYGROUP") => {}
            other => other?,
        }
    }
    Ok(())
}

/// The job's group on `stream`, if the stream and the group exist.
async fn group(redis: &Redis, spec: JobSpec, stream: &str) -> RedisResult<Option<StreamInfoGroup>> {
    let mut conn = redis.conn.clone();
    let exists: bool = conn.exists(stream).await?;
    if !exists {
        return Ok(None);
    }
    let groups: StreamInfoGroupsReply = conn.xinfo_groups(stream).await?;
    Ok(groups
        .groups
        .into_iter()
        .find(|group| group.name == spec.name))
}

/// Every shard stream of the job.
#[tracing::instrument(skip_all, fields(job = spec.name))]
pub async fn status(redis: &Redis, spec: JobSpec) -> RedisResult<Vec<StreamStatus>> {
    let mut conn = redis.conn.clone();
    let mut streams = Vec::new();
    for shard in 0..spec.shards {
        let keys = spec.keys(redis, shard);
        let stream = keys.stream();
        let length: u64 = conn.xlen(&stream).await?;
        let dead: u64 = conn.xlen(keys.dead()).await?;
        let (pending, lag) = match group(redis, spec, &stream).await? {
            // Redis cannot always tell the lag (after deletions in the undelivered part); the
            // length is then its upper bound.
            Some(group) => (
                group.pending as u64,
                group.lag.map_or(length, |lag| lag as u64),
            ),
            None => (0, length),
        };
        streams.push(StreamStatus {
            stream,
            length,
            pending,
            lag,
            dead,
        });
    }
    Ok(streams)
}

/// Puts every dead letter of the job back onto its shard stream as a new entry (with its
/// original fields; the id is new, so handlers must not rely on ids across a retry); returns
/// how many.
#[tracing::instrument(skip_all, fields(job = spec.name))]
pub async fn retry_dead(redis: &Redis, spec: JobSpec) -> RedisResult<u64> {
    let mut conn = redis.conn.clone();
    let mut moved = 0;
    for shard in 0..spec.shards {
        let keys = spec.keys(redis, shard);
        loop {
            let chunk: usize = redis
                .scripts
                .job_retry_dead
                .key(keys.dead())
                .key(keys.stream())
                .arg(RETRY_DEAD_CHUNK)
                .invoke_async(&mut conn)
                .await?;
            moved += chunk as u64;
            if chunk < RETRY_DEAD_CHUNK {
                break;
            }
        }
    }
    Ok(moved)
}

/// Trims every shard stream of the job below its oldest unacknowledged entry and updates the
/// job's pending and lag gauges; returns how many entries were removed.
///
/// An entry is safe to remove once the group has delivered it (it is at or below the group's
/// last-delivered id) and acknowledged it (it is not pending). So the trim point is the oldest
/// pending id, or, with nothing pending, the id just after the last delivered one. The group is
/// read before its pending entries: both only move forward, and an entry delivered between the
/// two reads lies above the last-delivered id read first, so it is kept either way.
#[tracing::instrument(skip_all, fields(job = spec.name))]
pub async fn trim(redis: &Redis, spec: JobSpec) -> RedisResult<u64> {
    let mut conn = redis.conn.clone();
    let (mut removed, mut pending, mut lag) = (0, 0, 0);
    for shard in 0..spec.shards {
        let stream = spec.keys(redis, shard).stream();
        let Some(group) = group(redis, spec, &stream).await? else {
            continue;
        };
        lag += group.lag.unwrap_or(0);
        let oldest_pending: StreamPendingReply = conn.xpending(&stream, spec.name).await?;
        pending += oldest_pending.count();
        let min_id = match oldest_pending {
            StreamPendingReply::Data(data) => data.start_id,
            _ => match next_id(&group.last_delivered_id) {
                Some(id) => id,
                None => continue,
            },
        };
        let trimmed: u64 = redis::cmd("XTRIM")
            .arg(&stream)
            .arg("MINID")
            .arg(&min_id)
            .query_async(&mut conn)
            .await?;
        removed += trimmed;
    }
    metrics::gauge!("pulse_job_pending", "job" => spec.name).set(pending as f64);
    metrics::gauge!("pulse_job_lag", "job" => spec.name).set(lag as f64);
    Ok(removed)
}

/// Forgets the consumers of the job's group that hold nothing and have been idle longer than
/// `idle`; returns how many.
#[tracing::instrument(skip_all, fields(job = spec.name))]
pub(super) async fn forget_idle_consumers(
    redis: &Redis,
    spec: JobSpec,
    idle: Duration,
) -> RedisResult<u64> {
    let mut conn = redis.conn.clone();
    let mut forgotten = 0;
    for shard in 0..spec.shards {
        let stream = spec.keys(redis, shard).stream();
        if group(redis, spec, &stream).await?.is_none() {
            continue;
        }
        let count: u64 = redis
            .scripts
            .job_forget_consumers
            .key(stream)
            .arg(spec.name)
            .arg(idle.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        forgotten += count;
    }
    Ok(forgotten)
}

/// The smallest stream id after `id` (`<ms>-<seq>`).
fn next_id(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    Some(match seq.checked_add(1) {
        Some(seq) => format!("{ms}-{seq}"),
        None => format!("{}-0", ms.checked_add(1)?),
    })
}

#[cfg(test)]
mod tests {
    use super::next_id;

    #[test]
    fn the_next_stream_id_follows_the_sequence_then_the_millisecond() {
        assert_eq!(next_id("0-0").as_deref(), Some("0-1"));
        assert_eq!(next_id("1700-41").as_deref(), Some("1700-42"));
        assert_eq!(next_id(&format!("5-{}", u64::MAX)).as_deref(), Some("6-0"));
        assert_eq!(next_id("garbage"), None);
    }
}
