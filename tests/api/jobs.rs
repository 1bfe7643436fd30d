//! The job runtime on real Redis and real SQL: retries, dead letters, a consumer process killed
//! mid-batch, two consumer processes on one group, trimming under load.
//!
//! The test job records every entry it applies in `job_applied` (keyed by entry, so a replay
//! changes nothing) and every successful handling in `job_deliveries` (no key, so a second
//! handling of one entry shows as a second row), in one transaction.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulse::jobs::{self, Entry, Job, JobRuntime, JobSettings, JobSpec};
use pulse::redis::Redis;
use redis::AsyncCommands as _;
use redis::streams::{StreamInfoConsumersReply, StreamPendingReply, StreamRangeReply};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
    TransactionTrait, Value,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::helpers::{eventually, redis_url, test_config};

const JOB: JobSpec = JobSpec {
    name: "test-recorder",
    shards: 2,
    tag: "t",
};

/// Tells the child test to run a consumer until it is killed, and with what.
const CHILD_ENV: &str = "PULSE_TEST_JOB_CONSUMER";
const CHILD_TEST: &str = "jobs::a_child_process_consumes_until_killed_when_a_parent_test_asks";

fn settings() -> JobSettings {
    JobSettings {
        batch: 10,
        lease: Duration::from_secs(10),
        max_deliveries: 3,
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        poll: Duration::from_millis(10),
        shards_at_once: 4,
        trim_every: Duration::from_millis(50),
    }
}

/// A test's own database (with the test job's tables) and Redis prefix.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Fixture {
    database_url: String,
    redis_prefix: String,
}

impl Fixture {
    async fn new() -> Self {
        let config = test_config(|_| {}).await;
        let fixture = Self {
            database_url: config.database_url(),
            redis_prefix: config.redis_prefix.unwrap(),
        };
        let db = fixture.db().await;
        for table in [
            "CREATE TABLE job_applied (entry VARCHAR(80) PRIMARY KEY, payload VARCHAR(80) NOT NULL, deliveries BIGINT NOT NULL)",
            "CREATE TABLE job_deliveries (entry VARCHAR(80) NOT NULL, consumer VARCHAR(80) NOT NULL)",
        ] {
            db.execute_unprepared(table).await.unwrap();
        }
        db.close().await.unwrap();
        fixture
    }

    async fn db(&self) -> DatabaseConnection {
        pulse::db::connect(&self.database_url, Duration::from_secs(60))
            .await
            .unwrap()
    }

    async fn redis(&self) -> Redis {
        Redis::connect(
            &redis_url(),
            &self.redis_prefix,
            &pulse::services::scripts(),
        )
        .await
        .unwrap()
    }
}

/// The test job. An entry's `fail` field plans its failures: a number of handler calls that fail
/// before it succeeds, or `poison` for every call until the test cures it.
struct Recorder {
    spec: JobSpec,
    db: DatabaseConnection,
    consumer: String,
    calls: Mutex<HashMap<String, u64>>,
    cured: AtomicBool,
}

impl Recorder {
    fn new(db: DatabaseConnection, runtime: &JobRuntime) -> Arc<Self> {
        Self::for_job(JOB, db, runtime)
    }

    fn for_job(spec: JobSpec, db: DatabaseConnection, runtime: &JobRuntime) -> Arc<Self> {
        Arc::new(Self {
            spec,
            db,
            consumer: runtime.consumer().to_owned(),
            calls: Mutex::new(HashMap::new()),
            cured: AtomicBool::new(false),
        })
    }

    fn calls(&self, entry: &str) -> u64 {
        self.calls.lock().unwrap().get(entry).copied().unwrap_or(0)
    }
}

/// The test jobs' entry: a payload and, when set, how the handler fails it (`poison` until cured,
/// or a number of deliveries).
#[derive(serde::Serialize, serde::Deserialize)]
struct Task {
    payload: String,
    fail: Option<String>,
}

fn task(payload: &str) -> Task {
    Task {
        payload: payload.to_owned(),
        fail: None,
    }
}

fn failing(payload: &str, fail: &str) -> Task {
    Task {
        payload: payload.to_owned(),
        fail: Some(fail.to_owned()),
    }
}

fn key(entry: &Entry<Task>) -> String {
    format!("{}/{}", entry.shard, entry.id)
}

/// `sql` with `?` placeholders, numbered for PostgreSQL.
fn statement(backend: DbBackend, sql: &str, values: Vec<Value>) -> Statement {
    let sql = match backend {
        DbBackend::Postgres => {
            let mut numbered = String::new();
            for (index, part) in sql.split('?').enumerate() {
                if index > 0 {
                    numbered.push_str(&format!("${index}"));
                }
                numbered.push_str(part);
            }
            numbered
        }
        _ => sql.to_owned(),
    };
    Statement::from_sql_and_values(backend, sql, values)
}

#[async_trait::async_trait]
impl Job for Recorder {
    type Payload = Task;

    fn spec(&self) -> JobSpec {
        self.spec
    }

    async fn handle(&self, batch: &[Entry<Task>]) -> anyhow::Result<()> {
        for entry in batch {
            let call = {
                let mut calls = self.calls.lock().unwrap();
                let call = calls.entry(key(entry)).or_default();
                *call += 1;
                *call
            };
            match entry.payload.fail.as_deref() {
                Some("poison") if !self.cured.load(Ordering::SeqCst) => {
                    anyhow::bail!("entry {} is poison", entry.id)
                }
                Some(times) if times.parse().is_ok_and(|times: u64| call <= times) => {
                    anyhow::bail!("planned failure {call} of entry {}", entry.id)
                }
                _ => {}
            }
        }
        let backend = self.db.get_database_backend();
        let insert_applied = match backend {
            DbBackend::Sqlite => {
                "INSERT OR IGNORE INTO job_applied (entry, payload, deliveries) VALUES (?, ?, ?)"
            }
            DbBackend::Postgres => {
                "INSERT INTO job_applied (entry, payload, deliveries) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
            }
            _ => "INSERT IGNORE INTO job_applied (entry, payload, deliveries) VALUES (?, ?, ?)",
        };
        let txn = self.db.begin().await?;
        for entry in batch {
            txn.execute_raw(statement(
                backend,
                "INSERT INTO job_deliveries (entry, consumer) VALUES (?, ?)",
                vec![key(entry).into(), self.consumer.clone().into()],
            ))
            .await?;
            txn.execute_raw(statement(
                backend,
                insert_applied,
                vec![
                    key(entry).into(),
                    entry.payload.payload.as_str().into(),
                    (entry.deliveries as i64).into(),
                ],
            ))
            .await?;
        }
        txn.commit().await?;
        Ok(())
    }
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

async fn totals(redis: &Redis) -> jobs::StreamStatus {
    let streams = jobs::status(redis, JOB).await.unwrap();
    streams
        .into_iter()
        .reduce(|a, b| jobs::StreamStatus {
            stream: a.stream,
            length: a.length + b.length,
            pending: a.pending + b.pending,
            lag: a.lag + b.lag,
            dead: a.dead + b.dead,
        })
        .unwrap()
}

#[tokio::test]
async fn an_entry_that_fails_twice_then_succeeds_is_applied_exactly_once() {
    let fixture = Fixture::new().await;
    let (db, redis) = (fixture.db().await, fixture.redis().await);
    let runtime = JobRuntime::new(redis.clone(), settings());
    let job = Recorder::new(db.clone(), &runtime);
    let id = jobs::enqueue(&redis, JOB, 1, &failing("flaky", "2"))
        .await
        .unwrap();

    eventually("the entry to be acknowledged", || async {
        runtime.poll_once(job.as_ref()).await.unwrap();
        totals(&redis).await.pending == 0 && job.calls(&format!("1/{id}")) > 0
    })
    .await;

    assert_eq!(job.calls(&format!("1/{id}")), 3);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM job_applied").await, 1);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM job_deliveries").await, 1);
    assert_eq!(
        count(&db, "SELECT deliveries FROM job_applied").await,
        3,
        "the entry was not redelivered after each failure"
    );
    let status = totals(&redis).await;
    assert_eq!((status.pending, status.lag, status.dead), (0, 0, 0));
    // Nothing comes again once acknowledged.
    for _ in 0..5 {
        assert_eq!(runtime.poll_once(job.as_ref()).await.unwrap(), 0);
    }
    assert_eq!(job.calls(&format!("1/{id}")), 3);
}

#[tokio::test]
async fn a_poison_entry_is_dead_lettered_after_its_last_delivery_and_retry_dead_brings_it_back() {
    let fixture = Fixture::new().await;
    let (db, redis) = (fixture.db().await, fixture.redis().await);
    let runtime = JobRuntime::new(redis.clone(), settings());
    let job = Recorder::new(db.clone(), &runtime);
    let poison = jobs::enqueue(&redis, JOB, 0, &failing("bad", "poison"))
        .await
        .unwrap();
    for n in 0..5 {
        let payload = format!("good{n}");
        jobs::enqueue(&redis, JOB, 0, &task(&payload))
            .await
            .unwrap();
    }

    eventually("the poison entry to reach the dead letters", || async {
        runtime.poll_once(job.as_ref()).await.unwrap();
        totals(&redis).await.dead == 1
    })
    .await;

    // The good entries of its batch were applied without it.
    assert_eq!(count(&db, "SELECT COUNT(*) FROM job_applied").await, 5);
    let status = totals(&redis).await;
    assert_eq!((status.pending, status.lag), (0, 0));
    // First the batch of six, then the entry alone: two calls on its first delivery, one on each
    // of the next two.
    assert_eq!(job.calls(&format!("0/{poison}")), 4);
    let mut conn = redis.conn.clone();
    let dead: StreamRangeReply = conn
        .xrange_all(redis.keys.job_shard(JOB.name, JOB.tag, 0).dead())
        .await
        .unwrap();
    let letter = &dead.ids[0];
    let field = |name: &str| letter.get::<String>(name).unwrap();
    assert_eq!(field("origin"), poison);
    assert_eq!(field("deliveries"), "3");
    assert!(field("error").contains("is poison"), "{}", field("error"));

    job.cured.store(true, Ordering::SeqCst);
    assert_eq!(jobs::retry_dead(&redis, JOB).await.unwrap(), 1);
    assert_eq!(totals(&redis).await.dead, 0);
    eventually("the retried entry to be applied", || async {
        runtime.poll_once(job.as_ref()).await.unwrap();
        count(
            &db,
            "SELECT COUNT(*) FROM job_applied WHERE payload = 'bad'",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM job_applied").await, 6);
    assert_eq!(jobs::retry_dead(&redis, JOB).await.unwrap(), 0);
}

/// What a child consumer process runs with.
#[derive(Serialize, Deserialize)]
struct ChildConsumer {
    fixture: Fixture,
    lease_ms: u64,
}

fn spawn_child(fixture: &Fixture, lease: Duration) -> tokio::process::Child {
    let child = ChildConsumer {
        fixture: fixture.clone(),
        lease_ms: lease.as_millis() as u64,
    };
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, serde_json::to_string(&child).unwrap())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the test binary starts again")
}

/// Not a test of its own: the body of the consumer processes that other tests start (and kill).
/// Without [`CHILD_ENV`] it does nothing.
#[tokio::test]
async fn a_child_process_consumes_until_killed_when_a_parent_test_asks() {
    let Ok(child) = std::env::var(CHILD_ENV) else {
        return;
    };
    let child: ChildConsumer = serde_json::from_str(&child).unwrap();
    let redis = child.fixture.redis().await;
    let runtime = JobRuntime::new(
        redis.clone(),
        JobSettings {
            lease: Duration::from_millis(child.lease_ms),
            backoff: Duration::from_secs(3600),
            ..settings()
        },
    );
    let job = Recorder::new(child.fixture.db().await, &runtime);
    runtime.poll_once(job.as_ref()).await.unwrap();
    // Tells the parent this consumer is ready: Redis lists a consumer only once it has been
    // delivered something, or created by hand.
    let mut conn = redis.conn.clone();
    for shard in 0..JOB.shards {
        redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(redis.keys.job_shard(JOB.name, JOB.tag, shard).stream())
            .arg(JOB.name)
            .arg(runtime.consumer())
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }
    runtime.run(job, CancellationToken::new()).await;
}

/// The consumers of the job's group on `shard` and how many entries each holds.
async fn consumers(redis: &Redis, shard: u32) -> HashMap<String, usize> {
    let mut conn = redis.conn.clone();
    let stream = redis.keys.job_shard(JOB.name, JOB.tag, shard).stream();
    let exists: bool = conn.exists(&stream).await.unwrap();
    if !exists {
        return HashMap::new();
    }
    let reply: redis::RedisResult<StreamInfoConsumersReply> =
        conn.xinfo_consumers(&stream, JOB.name).await;
    reply
        .map(|reply| {
            reply
                .consumers
                .into_iter()
                .map(|consumer| (consumer.name, consumer.pending))
                .collect()
        })
        .unwrap_or_default()
}

/// Holds SQL's write lock on `job_applied`, so that a consumer blocks inside its handler.
struct SqlLock {
    conn: DatabaseConnection,
    release: &'static str,
}

impl SqlLock {
    async fn take(url: &str) -> Self {
        let mut options = ConnectOptions::new(url);
        options.max_connections(1).min_connections(1);
        let conn = Database::connect(options).await.unwrap();
        let (statements, release): (&[&str], _) = match conn.get_database_backend() {
            DbBackend::Sqlite => (&["BEGIN EXCLUSIVE"], "ROLLBACK"),
            DbBackend::Postgres => (
                &["BEGIN", "LOCK TABLE job_applied IN ACCESS EXCLUSIVE MODE"],
                "ROLLBACK",
            ),
            _ => (&["LOCK TABLES job_applied WRITE"], "UNLOCK TABLES"),
        };
        for statement in statements {
            conn.execute_unprepared(statement).await.unwrap();
        }
        Self { conn, release }
    }

    async fn release(self) {
        self.conn.execute_unprepared(self.release).await.unwrap();
        self.conn.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_consumer_killed_mid_batch_has_its_entries_reclaimed_and_applied_exactly_once() {
    const PER_SHARD: usize = 10;
    let fixture = Fixture::new().await;
    let redis = fixture.redis().await;
    let mut child = spawn_child(&fixture, Duration::from_secs(3600));
    eventually("the child consumer to join the group", || async {
        !consumers(&redis, 0).await.is_empty()
    })
    .await;
    let child_name = consumers(&redis, 0).await.into_keys().next().unwrap();

    let lock = SqlLock::take(&fixture.database_url).await;
    for shard in 0..2 {
        for n in 0..PER_SHARD {
            let payload = format!("s{shard}n{n}");
            jobs::enqueue(&redis, JOB, shard, &task(&payload))
                .await
                .unwrap();
        }
    }
    // The child takes a first batch from whichever shard it reads first, with however many
    // entries were there by then, and blocks in its handler with them; its round may still read
    // the other shard until it is killed. What it holds is counted once it is dead, when the
    // count can no longer change (counting at its first batch raced with its taking a second).
    let held_by_child = || async {
        let mut held = 0;
        for shard in 0..JOB.shards {
            let consumers = consumers(&redis, shard).await;
            held += consumers.get(&child_name).copied().unwrap_or(0);
        }
        held as i64
    };
    eventually("the child to hold a batch", || async {
        held_by_child().await > 0
    })
    .await;
    child.kill().await.unwrap();
    let held = held_by_child().await;
    lock.release().await;

    let db = fixture.db().await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM job_deliveries").await,
        0,
        "the child committed before it was killed: not the crash under test"
    );
    let survivor = JobRuntime::new(
        redis.clone(),
        JobSettings {
            lease: Duration::from_millis(300),
            ..settings()
        },
    );
    let job = Recorder::new(db.clone(), &survivor);
    let stop = CancellationToken::new();
    let running = tokio::spawn(survivor.clone().run(job, stop.clone()));
    eventually("every entry to be applied and acknowledged", || async {
        count(&db, "SELECT COUNT(*) FROM job_applied").await == 2 * PER_SHARD as i64
            && totals(&redis).await.pending == 0
    })
    .await;
    eventually("the killed child's name to leave the group", || async {
        let mut listed = false;
        for shard in 0..JOB.shards {
            listed |= consumers(&redis, shard).await.contains_key(&child_name);
        }
        !listed
    })
    .await;
    stop.cancel();
    running.await.unwrap();

    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM job_deliveries").await,
        2 * PER_SHARD as i64,
        "an entry was handled twice"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM job_applied WHERE deliveries = 2").await,
        held,
        "the killed child's entries were not reclaimed from it"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM job_applied WHERE deliveries = 1").await,
        2 * PER_SHARD as i64 - held
    );
}

#[tokio::test]
async fn two_consumer_processes_on_one_group_never_apply_an_entry_twice() {
    const ENTRIES: usize = 400;
    let fixture = Fixture::new().await;
    let redis = fixture.redis().await;
    let _children = [
        spawn_child(&fixture, Duration::from_secs(3600)),
        spawn_child(&fixture, Duration::from_secs(3600)),
    ];
    eventually("both children to join the group", || async {
        consumers(&redis, 0).await.len() == 2 && consumers(&redis, 1).await.len() == 2
    })
    .await;

    for n in 0..ENTRIES {
        let payload = format!("n{n}");
        jobs::enqueue(&redis, JOB, (n % 2) as u32, &task(&payload))
            .await
            .unwrap();
    }
    let db = fixture.db().await;
    eventually("every entry to be applied and acknowledged", || async {
        let status = totals(&redis).await;
        status.pending == 0
            && status.lag == 0
            && count(&db, "SELECT COUNT(*) FROM job_applied").await == ENTRIES as i64
    })
    .await;

    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM job_deliveries").await,
        ENTRIES as i64,
        "an entry was handled by both consumers"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(DISTINCT consumer) FROM job_deliveries").await,
        2,
        "one consumer did all the work: the test shows nothing about sharing"
    );
}

#[tokio::test]
async fn trimming_under_load_never_removes_an_unacknowledged_entry() {
    const PRODUCERS: usize = 3;
    const PER_PRODUCER: usize = 200;
    let fixture = Fixture::new().await;
    let (db, redis) = (fixture.db().await, fixture.redis().await);
    let runtime = JobRuntime::new(redis.clone(), settings());
    let job = Recorder::new(db.clone(), &runtime);
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(runtime.clone().run(job, stop.clone()));

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|producer| {
            let redis = redis.clone();
            tokio::spawn(async move {
                for n in 0..PER_PRODUCER {
                    let payload = format!("p{producer}n{n}");
                    // Every seventh entry fails once, so entries stay pending behind acknowledged
                    // ones while the trimmer runs.
                    let fail = if n % 7 == 0 { "1" } else { "0" };
                    let shard = (n % 2) as u32;
                    jobs::enqueue(&redis, JOB, shard, &failing(&payload, fail))
                        .await
                        .unwrap();
                    if n % 20 == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect();
    let trimmer = {
        let redis = redis.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut trimmed = 0;
            while !stop.is_cancelled() {
                trimmed += jobs::trim(&redis, JOB).await.unwrap();
                tokio::task::yield_now().await;
            }
            trimmed
        })
    };
    for producer in producers {
        producer.await.unwrap();
    }
    let total = (PRODUCERS * PER_PRODUCER) as i64;
    eventually("every entry to be applied and acknowledged", || async {
        let status = totals(&redis).await;
        status.pending == 0
            && status.lag == 0
            && count(&db, "SELECT COUNT(*) FROM job_applied").await == total
    })
    .await;
    stop.cancel();
    let trimmed = trimmer.await.unwrap();
    consumer.await.unwrap();

    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM job_deliveries").await,
        total
    );
    // An entry that fails once in a batch usually succeeds on its own in the same delivery; some
    // fail alone and wait pending for their backoff, behind acknowledged entries.
    assert!(
        count(&db, "SELECT COUNT(*) FROM job_applied WHERE deliveries = 2").await > 0,
        "no entry waited pending for a retry while the trimmer ran"
    );
    assert!(trimmed > 0, "the trimmer never removed anything");
    jobs::trim(&redis, JOB).await.unwrap();
    let status = totals(&redis).await;
    assert_eq!(
        (status.length, status.dead),
        (0, 0),
        "acknowledged entries were left behind"
    );
    let mut conn = redis.conn.clone();
    let pending: StreamPendingReply = conn
        .xpending(
            redis.keys.job_shard(JOB.name, JOB.tag, 0).stream(),
            JOB.name,
        )
        .await
        .unwrap();
    assert_eq!(pending.count(), 0);
}

/// The test job behind a gate: it reports each batch it starts, then waits to be let through.
struct Gated {
    inner: Arc<Recorder>,
    entered: tokio::sync::mpsc::UnboundedSender<usize>,
    release: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl Job for Gated {
    type Payload = Task;

    fn spec(&self) -> JobSpec {
        JOB
    }

    async fn handle(&self, batch: &[Entry<Task>]) -> anyhow::Result<()> {
        self.entered.send(batch.len()).unwrap();
        self.release.notified().await;
        self.inner.handle(batch).await
    }
}

#[tokio::test]
async fn a_stopping_consumer_finishes_and_acknowledges_the_batch_in_hand_and_takes_no_other() {
    let fixture = Fixture::new().await;
    let (db, redis) = (fixture.db().await, fixture.redis().await);
    for n in 0..25 {
        let payload = format!("n{n}");
        jobs::enqueue(&redis, JOB, 0, &task(&payload))
            .await
            .unwrap();
    }
    let runtime = JobRuntime::new(redis.clone(), settings());
    let (entered, mut batches) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let job = Arc::new(Gated {
        inner: Recorder::new(db.clone(), &runtime),
        entered,
        release: release.clone(),
    });
    let stop = CancellationToken::new();
    let running = tokio::spawn(runtime.run(job, stop.clone()));

    assert_eq!(batches.recv().await, Some(10));
    stop.cancel();
    release.notify_one();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the consumer stops once its batch is done")
        .unwrap();

    assert_eq!(count(&db, "SELECT COUNT(*) FROM job_applied").await, 10);
    let status = totals(&redis).await;
    assert_eq!(
        (status.pending, status.lag),
        (0, 15),
        "the batch in hand was not acknowledged, or another was taken"
    );
    assert!(batches.try_recv().is_err(), "a second batch was started");
}

#[tokio::test]
async fn the_runtime_counts_processed_failed_retried_and_dead_lettered_entries_and_gauges_pending_and_lag()
 {
    // A job of its own: the metrics recorder is one per process, shared by every test.
    const METERED: JobSpec = JobSpec {
        name: "test-metered",
        shards: 1,
        tag: "m",
    };
    let metrics = pulse::telemetry::metrics_handle();
    let fixture = Fixture::new().await;
    let (db, redis) = (fixture.db().await, fixture.redis().await);
    let runtime = JobRuntime::new(
        redis.clone(),
        JobSettings {
            max_deliveries: 2,
            ..settings()
        },
    );
    let job = Recorder::for_job(METERED, db.clone(), &runtime);
    for (payload, fail) in [
        ("a", "0"),
        ("b", "0"),
        ("c", "0"),
        ("d", "1"),
        ("e", "poison"),
    ] {
        jobs::enqueue(&redis, METERED, 0, &failing(payload, fail))
            .await
            .unwrap();
    }
    eventually("the poison entry to reach the dead letters", || async {
        runtime.poll_once(job.as_ref()).await.unwrap();
        jobs::status(&redis, METERED).await.unwrap()[0].dead == 1
    })
    .await;
    for payload in ["f", "g"] {
        jobs::enqueue(&redis, METERED, 0, &task(payload))
            .await
            .unwrap();
    }
    jobs::trim(&redis, METERED).await.unwrap();

    let rendered = metrics.render();
    let value = |name: &str| {
        let series = format!("{name}{{job=\"test-metered\"}} ");
        rendered
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in:\n{rendered}"))
            .trim()
            .parse::<f64>()
            .unwrap()
    };
    // The batch of five fails on d; alone, a, b, c and d succeed and e fails; e's second
    // delivery fails too, and it is its last.
    assert_eq!(value("pulse_job_processed_total"), 4.0);
    assert_eq!(value("pulse_job_failed_total"), 2.0);
    assert_eq!(value("pulse_job_retried_total"), 1.0);
    assert_eq!(value("pulse_job_dead_lettered_total"), 1.0);
    assert_eq!(value("pulse_job_pending"), 0.0);
    assert_eq!(value("pulse_job_lag"), 2.0);
}

/// A job that only watches how its batches overlap: how many run at once in all, and per shard.
struct OverlapWatcher {
    in_flight: Mutex<(usize, HashMap<u32, usize>)>,
    most_at_once: Mutex<(usize, usize)>,
    handled: Mutex<HashMap<String, usize>>,
}

const OVERLAP_JOB: JobSpec = JobSpec {
    name: "test-overlap",
    shards: 8,
    tag: "o",
};

#[async_trait::async_trait]
impl Job for OverlapWatcher {
    type Payload = Task;

    fn spec(&self) -> JobSpec {
        OVERLAP_JOB
    }

    async fn handle(&self, batch: &[Entry<Task>]) -> anyhow::Result<()> {
        let shard = batch[0].shard;
        {
            let mut in_flight = self.in_flight.lock().unwrap();
            in_flight.0 += 1;
            let of_shard = in_flight.1.entry(shard).or_default();
            *of_shard += 1;
            let of_shard = *of_shard;
            let mut most = self.most_at_once.lock().unwrap();
            *most = (most.0.max(in_flight.0), most.1.max(of_shard));
        }
        // Long enough for the other shards' batches to start meanwhile if the runtime lets them.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for entry in batch {
            *self.handled.lock().unwrap().entry(key(entry)).or_default() += 1;
        }
        let mut in_flight = self.in_flight.lock().unwrap();
        in_flight.0 -= 1;
        *in_flight.1.entry(shard).or_default() -= 1;
        Ok(())
    }
}

#[tokio::test]
async fn a_runtime_handles_as_many_shards_at_once_as_it_is_told_and_one_batch_per_shard() {
    let fixture = Fixture::new().await;
    let redis = fixture.redis().await;
    let mut ids = Vec::new();
    for shard in 0..OVERLAP_JOB.shards {
        for n in 0..3 {
            let payload = format!("{shard}-{n}");
            let id = jobs::enqueue(&redis, OVERLAP_JOB, shard, &task(&payload))
                .await
                .unwrap();
            ids.push(format!("{shard}/{id}"));
        }
    }
    let runtime = JobRuntime::new(
        redis.clone(),
        JobSettings {
            batch: 1,
            shards_at_once: 3,
            ..settings()
        },
    );
    let job = OverlapWatcher {
        in_flight: Mutex::default(),
        most_at_once: Mutex::default(),
        handled: Mutex::default(),
    };
    let mut rounds = 0;
    while job.handled.lock().unwrap().len() < ids.len() {
        rounds += 1;
        assert!(
            rounds <= 10,
            "the entries were not all handled in 10 rounds"
        );
        runtime.poll_once(&job).await.unwrap();
    }

    let (most, most_of_one_shard) = *job.most_at_once.lock().unwrap();
    assert_eq!(most, 3, "batches of different shards at once");
    assert_eq!(most_of_one_shard, 1, "batches of one shard at once");
    let handled = job.handled.lock().unwrap().clone();
    for id in &ids {
        assert_eq!(handled.get(id), Some(&1), "entry {id} handled once");
    }
    let streams = jobs::status(&redis, OVERLAP_JOB).await.unwrap();
    assert!(
        streams
            .iter()
            .all(|stream| stream.pending == 0 && stream.lag == 0)
    );
}
