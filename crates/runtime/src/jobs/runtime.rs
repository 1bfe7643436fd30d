//! The consumer side: read, handle, acknowledge; reclaim, retry, dead-letter; trim.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use redis::streams::{StreamClaimReply, StreamId, StreamPendingCountReply, StreamReadReply};
use redis::{AsyncCommands as _, RedisResult};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Entry, Handler, JobSpec, streams};
use crate::redis::Redis;

#[derive(Clone, Debug)]
pub struct JobSettings {
    /// Most entries one handler call gets.
    pub batch: usize,
    /// How long an entry may stay with a consumer before another takes it over: longer than the
    /// slowest batch, since a live consumer's entry looks exactly like a dead one's.
    pub lease: Duration,
    /// Deliveries after which a failing entry goes to the dead letters.
    pub max_deliveries: u64,
    /// Wait before the first retry of a failed entry; it doubles with every further delivery.
    pub backoff: Duration,
    /// Longest wait between retries.
    pub max_backoff: Duration,
    /// Pause after a round that found nothing to do.
    pub poll: Duration,
    /// Shards handled at once. A job's batches of different shards touch different rows, so a
    /// server database commits them side by side and the drain rate grows with this until the
    /// database or the CPU is busy; SQLite takes one writer at a time whatever it says.
    pub shards_at_once: usize,
    /// How often the consumer trims the job's streams, refreshes its gauges and forgets the
    /// consumers (stopped processes) that have held nothing for longer than the lease.
    pub trim_every: Duration,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            batch: 100,
            lease: Duration::from_secs(60),
            max_deliveries: 5,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            poll: Duration::from_millis(200),
            shards_at_once: 4,
            trim_every: Duration::from_secs(10),
        }
    }
}

impl JobSettings {
    /// How long an entry delivered `deliveries` times waits before its next delivery.
    fn backoff(&self, deliveries: u64) -> Duration {
        let doublings = deliveries.saturating_sub(1).min(20) as u32;
        self.backoff
            .saturating_mul(2u32.pow(doublings))
            .min(self.max_backoff)
    }
}

/// One consumer (a name in every job's consumer group) running any number of jobs.
#[derive(Clone)]
pub struct JobRuntime {
    redis: Redis,
    consumer: Arc<str>,
    settings: JobSettings,
}

impl JobRuntime {
    /// A runtime with a consumer name of its own: two runtimes, in one process or two, never
    /// share entries.
    pub fn new(redis: Redis, settings: JobSettings) -> Self {
        let consumer = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        Self {
            redis,
            consumer: consumer.into(),
            settings,
        }
    }

    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Runs every job on `tasks` until `shutdown`.
    pub fn start(
        &self,
        jobs: Vec<Arc<dyn Handler>>,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) {
        for job in jobs {
            tasks.spawn(self.clone().run(job, shutdown.clone()));
        }
    }

    /// Consumes `job` until `shutdown`. A stop lets the batch in hand finish and be acknowledged,
    /// and takes no new one.
    pub async fn run(self, job: Arc<dyn Handler>, shutdown: CancellationToken) {
        let spec = job.job_spec();
        let bell = self.redis.bell.of(spec.name);
        let mut ready = false;
        let mut last_trim: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            // After a Redis error, wait a backoff rather than a poll: the error is logged each time.
            let mut pause = self.settings.poll;
            if !ready {
                match streams::create_groups(&self.redis, spec).await {
                    Ok(()) => ready = true,
                    Err(err) => {
                        pause = self.settings.backoff;
                        tracing::warn!(job = spec.name, error = %err, "cannot create the job's consumer groups; retrying")
                    }
                }
            }
            let handled = if ready {
                match self.round(job.as_ref(), &shutdown).await {
                    Ok(handled) => handled,
                    Err(err) => {
                        // A Redis that restarted empty has lost the groups with the streams.
                        ready = err.code() != Some("NOGROUP");
                        pause = self.settings.backoff;
                        tracing::warn!(job = spec.name, error = %err, "job round failed; retrying");
                        0
                    }
                }
            } else {
                0
            };
            if ready && last_trim.is_none_or(|at| at.elapsed() >= self.settings.trim_every) {
                last_trim = Some(Instant::now());
                if let Err(err) = streams::trim(&self.redis, spec).await {
                    tracing::warn!(job = spec.name, error = %err, "cannot trim the job's streams");
                }
                let forgotten =
                    streams::forget_idle_consumers(&self.redis, spec, self.settings.lease).await;
                if let Err(err) = forgotten {
                    tracing::warn!(job = spec.name, error = %err, "cannot forget stopped consumers");
                }
            }
            if handled == 0 {
                // Not after an error: the backoff holds whatever is queued meanwhile.
                let idle = ready && pause == self.settings.poll;
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = bell.notified(), if idle => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }

    /// One round over the job's shards, creating its consumer groups first: what [`Self::run`]
    /// does between pauses, for callers that drive the runtime step by step. Returns how many
    /// entries were handled, successfully or not.
    pub async fn poll_once(&self, job: &dyn Handler) -> RedisResult<usize> {
        streams::create_groups(&self.redis, job.job_spec()).await?;
        self.round(job, &CancellationToken::new()).await
    }

    /// Per shard, [`JobSettings::shards_at_once`] shards at a time: first the entries due again
    /// (failed ones past their backoff, and those of a consumer whose lease ran out), then new
    /// ones. Stops between batches once `stop` fires.
    async fn round(&self, job: &dyn Handler, stop: &CancellationToken) -> RedisResult<usize> {
        let spec = job.job_spec();
        let results: Vec<RedisResult<usize>> = futures_util::stream::iter(0..spec.shards)
            .map(|shard| self.round_of_shard(job, shard, stop))
            .buffer_unordered(self.settings.shards_at_once.max(1))
            .collect()
            .await;
        results.into_iter().sum()
    }

    async fn round_of_shard(
        &self,
        job: &dyn Handler,
        shard: u32,
        stop: &CancellationToken,
    ) -> RedisResult<usize> {
        let spec = job.job_spec();
        let mut handled = 0;
        for due in [true, false] {
            if stop.is_cancelled() {
                break;
            }
            let entries = if due {
                self.reclaim(spec, shard).await?
            } else {
                self.read_new(spec, shard).await?
            };
            if !entries.is_empty() {
                handled += entries.len();
                self.process(job, shard, entries).await?;
            }
        }
        Ok(handled)
    }

    #[tracing::instrument(skip_all, fields(job = spec.name, shard))]
    async fn read_new(&self, spec: JobSpec, shard: u32) -> RedisResult<Vec<Entry>> {
        let stream = spec.keys(&self.redis, shard).stream();
        let mut conn = self.redis.conn.clone();
        // No BLOCK: the connection is shared, and a blocked read would hold up every other command.
        let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(spec.name)
            .arg(&*self.consumer)
            .arg("COUNT")
            .arg(self.settings.batch)
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut conn)
            .await?;
        let ids = reply
            .into_iter()
            .flat_map(|reply| reply.keys)
            .flat_map(|key| key.ids);
        Ok(ids.map(|id| entry(shard, id, 1)).collect())
    }

    /// Claims the shard's entries that are due for another delivery: this consumer's failed ones
    /// once their backoff has passed, another consumer's once its lease has run out too.
    #[tracing::instrument(skip_all, fields(job = spec.name, shard))]
    async fn reclaim(&self, spec: JobSpec, shard: u32) -> RedisResult<Vec<Entry>> {
        let stream = spec.keys(&self.redis, shard).stream();
        let mut conn = self.redis.conn.clone();
        let pending = |idle: Duration| {
            let mut cmd = redis::cmd("XPENDING");
            cmd.arg(&stream)
                .arg(spec.name)
                .arg("IDLE")
                .arg(idle.as_millis() as u64)
                .arg("-")
                .arg("+")
                .arg(self.settings.batch);
            cmd
        };
        // Two lists, so that another consumer's entries still within their lease never hide this
        // consumer's own retries, nor the other way round.
        let (mine, expired): (StreamPendingCountReply, StreamPendingCountReply) = redis::pipe()
            .add_command(pending(self.settings.backoff).arg(&*self.consumer).clone())
            .add_command(pending(self.settings.lease))
            .query_async(&mut conn)
            .await?;
        let mut candidates = mine.ids;
        candidates.extend(expired.ids);
        let mut listed = HashSet::new();
        candidates.retain(|pending| listed.insert(pending.id.clone()));
        let mut claims = redis::pipe();
        let mut deliveries = HashMap::new();
        for pending in candidates {
            let before = pending.times_delivered as u64;
            let mut idle_at_least = self.settings.backoff(before);
            if pending.consumer != *self.consumer {
                idle_at_least = idle_at_least.max(self.settings.lease);
            }
            if Duration::from_millis(pending.last_delivered_ms as u64) < idle_at_least {
                continue;
            }
            // The minimum idle time makes the claim conditional: if another consumer claimed the
            // entry since XPENDING, its idle time restarted and this claim takes nothing.
            claims
                .cmd("XCLAIM")
                .arg(&stream)
                .arg(spec.name)
                .arg(&*self.consumer)
                .arg(idle_at_least.as_millis() as u64)
                .arg(&pending.id);
            deliveries.insert(pending.id, before + 1);
        }
        if deliveries.is_empty() {
            return Ok(Vec::new());
        }
        let claimed: Vec<StreamClaimReply> = claims.query_async(&mut conn).await?;
        let entries: Vec<Entry> = claimed
            .into_iter()
            .flat_map(|reply| reply.ids)
            .map(|id| {
                let count = deliveries.get(&id.id).copied().unwrap_or(2);
                entry(shard, id, count)
            })
            .collect();
        metrics::counter!("pulse_job_retried_total", "job" => spec.name)
            .increment(entries.len() as u64);
        Ok(entries)
    }

    /// Hands `entries` to the job as one batch; if it fails, one by one. Acknowledges what
    /// succeeded; a failure stays pending for a retry, or goes to the dead letters.
    #[tracing::instrument(skip_all, fields(job = job.job_spec().name, shard, entries = entries.len()))]
    async fn process(&self, job: &dyn Handler, shard: u32, entries: Vec<Entry>) -> RedisResult<()> {
        match job.handle_fields(&entries).await {
            Ok(()) => self.ack(job.job_spec(), shard, &entries).await,
            Err(err) if entries.len() == 1 => self.failed(job.job_spec(), &entries[0], &err).await,
            Err(err) => {
                tracing::debug!(job = job.job_spec().name, error = %format!("{err:#}"), "batch failed; handling its entries one by one");
                for entry in entries {
                    let one = std::slice::from_ref(&entry);
                    match job.handle_fields(one).await {
                        Ok(()) => self.ack(job.job_spec(), shard, one).await?,
                        Err(err) => self.failed(job.job_spec(), &entry, &err).await?,
                    }
                }
                Ok(())
            }
        }
    }

    #[tracing::instrument(skip_all, fields(job = spec.name, shard, entries = entries.len()))]
    async fn ack(&self, spec: JobSpec, shard: u32, entries: &[Entry]) -> RedisResult<()> {
        let stream = spec.keys(&self.redis, shard).stream();
        let ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
        let mut conn = self.redis.conn.clone();
        let _: u64 = conn.xack(&stream, spec.name, &ids).await?;
        metrics::counter!("pulse_job_processed_total", "job" => spec.name)
            .increment(entries.len() as u64);
        Ok(())
    }

    /// Leaves a failed entry pending for a retry, or, after its last allowed delivery, moves it
    /// to the dead letters with its error and acknowledges it, in one transaction.
    #[tracing::instrument(skip_all, fields(job = spec.name, entry.id = %entry.id))]
    async fn failed(&self, spec: JobSpec, entry: &Entry, err: &anyhow::Error) -> RedisResult<()> {
        metrics::counter!("pulse_job_failed_total", "job" => spec.name).increment(1);
        let error = format!("{err:#}");
        if entry.deliveries < self.settings.max_deliveries {
            tracing::warn!(
                job = spec.name,
                entry.id = %entry.id,
                entry.deliveries,
                error,
                "job entry failed; it will be retried"
            );
            return Ok(());
        }
        let keys = spec.keys(&self.redis, entry.shard);
        let fields = serde_json::json!(entry.payload).to_string();
        let deliveries = entry.deliveries.to_string();
        let mut conn = self.redis.conn.clone();
        let _: () = redis::pipe()
            .atomic()
            .xadd(
                keys.dead(),
                "*",
                &[
                    ("origin", entry.id.as_str()),
                    ("error", error.as_str()),
                    ("deliveries", deliveries.as_str()),
                    ("fields", fields.as_str()),
                ],
            )
            .ignore()
            .xack(keys.stream(), spec.name, &[&entry.id])
            .ignore()
            .query_async(&mut conn)
            .await?;
        metrics::counter!("pulse_job_dead_lettered_total", "job" => spec.name).increment(1);
        tracing::error!(
            job = spec.name,
            entry.id = %entry.id,
            entry.deliveries,
            error,
            "job entry failed its last delivery; moved to the dead letters"
        );
        Ok(())
    }
}

fn entry(shard: u32, id: StreamId, deliveries: u64) -> Entry {
    let fields = id
        .map
        .iter()
        .filter_map(|(name, value)| {
            redis::from_redis_value_ref::<String>(value)
                .ok()
                .map(|value| (name.clone(), value))
        })
        .collect();
    Entry {
        shard,
        id: id.id,
        payload: fields,
        deliveries,
    }
}
