//! `like-toggle`: likes and unlikes by many users of many articles over HTTP against a real server,
//! next to the redis-benchmark ceiling of the like script; then how fast the likes archive moves
//! the events into SQL, and whether SQL, Redis and the API agree afterwards.
//!
//! The load runs with the server's jobs off, so the HTTP path is measured alone (as its ceiling
//! is) and every event waits in the streams; a second process with jobs on then drains them, which
//! is the archive's rate on the chosen SQL backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use hyper::header::HeaderValue;
use rand::Rng as _;
use rand::rngs::StdRng;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, Statement};
use serde::Deserialize;
use serde_json::json;

use crate::LikeToggleArgs;
use crate::ceiling::{self, Ceiling, CeilingPlan, Script};
use crate::database::BenchDatabase;
use crate::http1::{Extra, GraphqlConnection};
use crate::load::{self, LoadPlan, LoadResult, Sender, Stop};
use crate::proc_stats::{self, Cost, CostMeter};
use crate::record_view::{seed, sign_up, sum_over_articles};
use crate::redis_util;
use crate::report::{print_table, thousands};
use crate::server::{Launch, Server};

const SMOKE_CLIENTS: u32 = 2;
const SMOKE_USERS: u32 = 4;
const SMOKE_ARTICLES: u32 = 5;
const SMOKE_TOGGLES: u64 = 200;
const CEILING_REQUESTS: u64 = 200_000;
const SMOKE_CEILING_REQUESTS: u64 = 2_000;
/// Random likers the ceiling draws from: far more than its calls, so nearly every call is a
/// first like (a change of state, as every toggle of the HTTP load is).
const CEILING_KEYSPACE: u64 = 100_000_000;
/// Concurrent sign-ups (each hashes a password, on purpose slowly).
const SIGN_UP_CONCURRENCY: usize = 8;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the archive may take to drain before the run gives up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
const DRAIN_POLL: Duration = Duration::from_millis(25);

const LIKE: &str = "mutation($s:ID!){ like(subjectId:$s){ liked likeCount } }";
const UNLIKE: &str = "mutation($s:ID!){ unlike(subjectId:$s){ liked likeCount } }";

/// The run's shape once `--smoke` is applied.
struct Shape {
    clients: u32,
    users: u32,
    articles: u32,
    stop: Stop,
    ceiling_requests: u64,
}

impl Shape {
    fn of(args: &LikeToggleArgs) -> anyhow::Result<Self> {
        ensure!(!args.load.duration.is_zero(), "--duration must be positive");
        let shape = if args.common.smoke {
            Self {
                clients: SMOKE_CLIENTS,
                users: SMOKE_USERS,
                articles: SMOKE_ARTICLES,
                stop: Stop::Requests(SMOKE_TOGGLES),
                ceiling_requests: SMOKE_CEILING_REQUESTS,
            }
        } else {
            Self {
                clients: args.load.clients,
                users: args.users,
                articles: args.articles,
                stop: Stop::After(args.load.duration),
                ceiling_requests: CEILING_REQUESTS,
            }
        };
        // Each client owns its users, so that it knows their relations without asking.
        ensure!(
            shape.users >= shape.clients,
            "--users ({}) must be at least --clients ({})",
            shape.users,
            shape.clients
        );
        Ok(shape)
    }

    fn pairs(&self) -> u64 {
        u64::from(self.users) * u64::from(self.articles)
    }

    fn describe(&self) -> String {
        let stop = match self.stop {
            Stop::After(duration) => humantime::format_duration(duration).to_string(),
            Stop::Requests(requests) => format!("{requests} toggles"),
        };
        format!(
            "{} clients, {stop}, {} users × {} articles",
            self.clients,
            thousands(f64::from(self.users)),
            thousands(f64::from(self.articles))
        )
    }
}

/// The bodies and credentials every sender shares, built once.
struct Requests {
    /// One body per article, shared by every request that sends it.
    like: Vec<Bytes>,
    unlike: Vec<Bytes>,
    /// `Bearer <token>` per user.
    authorizations: Vec<HeaderValue>,
}

#[derive(Deserialize)]
struct LikeData {
    #[serde(alias = "unlike")]
    like: LikeAnswer,
}

#[derive(Deserialize)]
struct LikeAnswer {
    liked: bool,
    #[serde(rename = "likeCount")]
    like_count: i64,
}

/// Likes (`like`) or unlikes one article as one user; the answer must show the relation asked
/// for, with a count that allows it.
async fn send_like(
    connection: &mut GraphqlConnection,
    requests: &Requests,
    user: usize,
    article: usize,
    like: bool,
) -> Result<(), String> {
    let body = if like {
        &requests.like[article]
    } else {
        &requests.unlike[article]
    };
    let extra = Extra {
        authorization: Some(&requests.authorizations[user]),
        ..Extra::default()
    };
    let (status, answer) = connection.post(body.clone(), extra).await?;
    load::judge(status, &answer, "like", |data: LikeData| {
        let answer = data.like;
        (answer.liked == like && answer.like_count >= i64::from(like)).then_some(())
    })
}

/// First likes: every (user, article) pair once, taken in turn from a shared counter.
struct FirstLikeSender {
    connection: GraphqlConnection,
    requests: Arc<Requests>,
    next_pair: Arc<AtomicU64>,
}

impl Sender for FirstLikeSender {
    async fn send(&mut self, _rng: &mut StdRng) -> Result<bool, String> {
        let pair = self.next_pair.fetch_add(1, Ordering::Relaxed);
        let articles = self.requests.like.len() as u64;
        let (user, article) = (pair / articles, pair % articles);
        send_like(
            &mut self.connection,
            &self.requests,
            user as usize,
            article as usize,
            true,
        )
        .await?;
        Ok(true)
    }
}

/// Toggles: a random user of this client's own and a random article; likes what the user does not
/// like and unlikes what it does, so every request changes state.
struct ToggleSender {
    connection: GraphqlConnection,
    requests: Arc<Requests>,
    /// The users this client alone drives (their indexes).
    users: Vec<usize>,
    /// `liked[u * articles + a]` for this client's `u`-th user.
    liked: Vec<bool>,
    /// Liked pairs over all clients, kept in step with each answer.
    liked_total: Arc<AtomicI64>,
}

impl Sender for ToggleSender {
    async fn send(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        let articles = self.requests.like.len();
        let local = rng.random_range(0..self.users.len());
        let article = rng.random_range(0..articles);
        let slot = local * articles + article;
        let like = !self.liked[slot];
        send_like(
            &mut self.connection,
            &self.requests,
            self.users[local],
            article,
            like,
        )
        .await?;
        self.liked[slot] = like;
        self.liked_total
            .fetch_add(if like { 1 } else { -1 }, Ordering::Relaxed);
        Ok(true)
    }
}

/// What the archive did once a process with jobs on started.
struct Drain {
    events: u64,
    /// From the last sample before the archive took anything to the first that found nothing
    /// left (so at most one poll interval more than the archive took).
    seconds: f64,
    worker_cpu_seconds: f64,
}

/// What SQL and the API hold after the drain.
struct Settled {
    sql_events: i64,
    sql_liked_rows: i64,
    sql_like_count_sum: i64,
    api_sum_after_drain: i64,
}

/// What the HTTP phases measured.
struct Loaded {
    first_likes: LoadResult,
    toggles: LoadResult,
    cost: Cost,
    expected_liked: i64,
    api_sum_after_load: i64,
}

struct Measured {
    backend: &'static str,
    loaded: Loaded,
    stream_events: u64,
    drain: Drain,
    settled: Settled,
}

impl Measured {
    fn expected_events(&self) -> u64 {
        self.loaded.first_likes.ok + self.loaded.toggles.ok
    }

    fn counts_agree(&self) -> bool {
        let liked = self.loaded.expected_liked;
        let events = self.expected_events();
        self.loaded.api_sum_after_load == liked
            && self.stream_events == events
            && self.settled.sql_events == events as i64
            && self.settled.sql_liked_rows == liked
            && self.settled.sql_like_count_sum == liked
            && self.settled.api_sum_after_drain == liked
    }
}

pub async fn run(args: LikeToggleArgs) -> anyhow::Result<()> {
    redis_util::require_single_server(
        &args.common.redis_url,
        "like-toggle",
        "its ceiling runs redis-benchmark of like_set.lua against one server",
    )?;
    let shape = Shape::of(&args)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(SIGN_UP_CONCURRENCY)
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let database = BenchDatabase::create(args.database_url.as_deref()).await?;
    let measured = drive(&args, &shape, &http, &database).await;
    let removed = database.remove().await;
    let measured = measured?;
    removed.context("cannot remove the run's database")?;

    eprintln!(
        "measuring the ceiling: redis-benchmark, {} calls ...",
        thousands(shape.ceiling_requests as f64)
    );
    let ceiling = ceiling::measure(CeilingPlan {
        redis_url: &args.common.redis_url,
        clients: shape.clients,
        requests: shape.ceiling_requests,
        keyspace: CEILING_KEYSPACE,
        script: Script::LikeSet {
            relation_ttl: pulse::Config::defaults().like_relation_ttl,
        },
    })
    .await?;

    report(&args, &shape, &measured, &ceiling);
    for (phase, load) in [
        ("first likes", &measured.loaded.first_likes),
        ("toggles", &measured.loaded.toggles),
    ] {
        if load.errors > 0 {
            bail!(
                "{} {phase} failed; first: {}",
                load.errors,
                load.first_errors.join(" | ")
            );
        }
    }
    if !measured.counts_agree() {
        bail!("the counts do not agree (see the table)");
    }
    Ok(())
}

async fn drive(
    args: &LikeToggleArgs,
    shape: &Shape,
    http: &reqwest::Client,
    database: &BenchDatabase,
) -> anyhow::Result<Measured> {
    eprintln!("starting {} (jobs off) ...", args.load.server_bin.display());
    let mut server = Server::on_database(
        &args.load.server_bin,
        &args.common.redis_url,
        http,
        &database.url,
        &[("PULSE_RUN_JOBS", "false")],
    )
    .await?;
    let prefix = server.redis_prefix.clone();
    let loaded = load_phases(shape, http, &server, &args.common.redis_url).await;
    let stopped = server.stop().await;
    let drained = match (&loaded, stopped) {
        (Ok(_), Ok(())) => drain(args, http, database, &prefix).await,
        (_, Err(err)) => Err(err.context("cannot stop the server")),
        (Err(_), Ok(())) => Err(anyhow::anyhow!("the load failed")),
    };
    let (_target, mut redis) = redis_util::connect(&args.common.redis_url).await?;
    let cleaned = redis_util::delete_prefix(&mut redis, &prefix).await;
    let loaded = loaded?;
    let (stream_events, drain, settled) = drained?;
    cleaned.context("cannot delete the server's keys")?;
    Ok(Measured {
        backend: database.backend(),
        loaded,
        stream_events,
        drain,
        settled,
    })
}

/// Seeds the server, then runs the first likes and the toggles against it.
async fn load_phases(
    shape: &Shape,
    http: &reqwest::Client,
    server: &Server,
    redis_url: &str,
) -> anyhow::Result<Loaded> {
    let graphql_url = server.url("/graphql");
    eprintln!(
        "seeding {} articles and {} users ...",
        shape.articles, shape.users
    );
    let articles = seed(http, &graphql_url, shape.articles).await?;
    let tokens = sign_up_many(http, &graphql_url, shape.users).await?;
    let body = |query: &str, id: &str| -> Bytes {
        json!({ "query": query, "variables": { "s": id } })
            .to_string()
            .into()
    };
    let requests = Arc::new(Requests {
        like: articles.iter().map(|id| body(LIKE, id)).collect(),
        unlike: articles.iter().map(|id| body(UNLIKE, id)).collect(),
        authorizations: tokens
            .iter()
            .map(|token| HeaderValue::from_str(&format!("Bearer {token}")))
            .collect::<Result<_, _>>()?,
    });

    eprintln!(
        "first likes: {} pairs, each reading its relation from SQL ...",
        thousands(shape.pairs() as f64)
    );
    let next_pair = Arc::new(AtomicU64::new(0));
    let first_likes = load::run(
        (0..shape.clients)
            .map(|_| FirstLikeSender {
                connection: GraphqlConnection::new(server.addr),
                requests: requests.clone(),
                next_pair: next_pair.clone(),
            })
            .collect(),
        LoadPlan {
            stop: Stop::Requests(shape.pairs()),
            rate: None,
        },
    )
    .await;

    let (_target, mut redis) = redis_util::connect(redis_url).await?;
    let meter = CostMeter::start(server.pid(), &mut redis).await?;
    eprintln!("toggles: {} ...", shape.describe());
    let liked_total = Arc::new(AtomicI64::new(first_likes.ok as i64));
    let senders = (0..shape.clients as usize)
        .map(|client| {
            let users: Vec<usize> = (client..shape.users as usize)
                .step_by(shape.clients as usize)
                .collect();
            ToggleSender {
                connection: GraphqlConnection::new(server.addr),
                requests: requests.clone(),
                liked: vec![true; users.len() * articles.len()],
                users,
                liked_total: liked_total.clone(),
            }
        })
        .collect();
    let toggles = load::run(
        senders,
        LoadPlan {
            stop: shape.stop,
            rate: None,
        },
    )
    .await;
    let cost = meter.stop(&mut redis).await?;
    let (api_sum_after_load, listed) = sum_over_articles(http, &graphql_url, "likeCount").await?;
    ensure!(
        listed == articles.len(),
        "the API lists {listed} articles; {} were published",
        articles.len()
    );
    Ok(Loaded {
        first_likes,
        toggles,
        cost,
        expected_liked: liked_total.load(Ordering::Relaxed),
        api_sum_after_load,
    })
}

async fn sign_up_many(
    http: &reqwest::Client,
    url: &str,
    users: u32,
) -> anyhow::Result<Vec<String>> {
    let limit = Arc::new(tokio::sync::Semaphore::new(SIGN_UP_CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..users {
        let (http, url, limit) = (http.clone(), url.to_owned(), limit.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await?;
            sign_up(&http, &url).await
        });
    }
    let mut tokens = Vec::with_capacity(users as usize);
    while let Some(joined) = tasks.join_next().await {
        tokens.push(joined??);
    }
    Ok(tokens)
}

/// Starts a second process with jobs on, on the same database and prefix, and times the archive
/// until no event is left undelivered or unacknowledged; then reads what SQL and the API hold.
async fn drain(
    args: &LikeToggleArgs,
    http: &reqwest::Client,
    database: &BenchDatabase,
    prefix: &str,
) -> anyhow::Result<(u64, Drain, Settled)> {
    let redis =
        pulse::redis::Redis::connect(&args.common.redis_url, prefix, &pulse::services::scripts())
            .await?;
    let (events, remaining) = archive_backlog(&redis).await?;
    ensure!(
        remaining == events,
        "{remaining} of {events} events were taken before the archive started"
    );

    eprintln!(
        "draining {} events into {} ...",
        thousands(events as f64),
        database.backend()
    );
    let ticks = proc_stats::clock_ticks_per_second();
    let watcher = {
        let redis = redis.clone();
        tokio::spawn(async move { time_drain(&redis, events).await })
    };
    let launched = Server::launch(
        &args.load.server_bin,
        &args.common.redis_url,
        http,
        Launch {
            database_url: Some(&database.url),
            redis_prefix: Some(prefix),
            ..Launch::default()
        },
    )
    .await;
    let mut worker = match launched {
        Ok(worker) => worker,
        Err(err) => {
            watcher.abort();
            return Err(err);
        }
    };
    let pid = worker.pid().to_string();
    let settled = async {
        let cpu_before = proc_stats::cpu_ticks(&pid)?;
        let seconds = watcher.await??;
        let worker_cpu_seconds = (proc_stats::cpu_ticks(&pid)? - cpu_before) as f64 / ticks;
        let sql = database.connect().await?;
        let settled = Settled {
            sql_events: count(&sql, "SELECT COUNT(*) FROM like_events").await?,
            sql_liked_rows: count(&sql, "SELECT COUNT(*) FROM likes WHERE liked").await?,
            sql_like_count_sum: sum_like_counts(&sql).await?,
            api_sum_after_drain: sum_over_articles(http, &worker.url("/graphql"), "likeCount")
                .await?
                .0,
        };
        sql.close().await.ok();
        anyhow::Ok((
            Drain {
                events,
                seconds,
                worker_cpu_seconds,
            },
            settled,
        ))
    }
    .await;
    let stopped = worker.stop().await;
    let (drain, settled) = settled?;
    stopped.context("cannot stop the worker")?;
    Ok((events, drain, settled))
}

/// Events in the likes archive's streams, and how many of them are not archived yet (undelivered
/// or delivered and not acknowledged).
async fn archive_backlog(redis: &pulse::redis::Redis) -> anyhow::Result<(u64, u64)> {
    let streams = pulse::jobs::status(redis, pulse::likes::archive::SPEC).await?;
    Ok(streams.iter().fold((0, 0), |(events, remaining), stream| {
        (
            events + stream.length,
            remaining + stream.lag + stream.pending,
        )
    }))
}

/// Polls the backlog until it is empty; answers the seconds from the last sample that showed no
/// progress (the archive had not started: process start-up is left out) to the empty one.
async fn time_drain(redis: &pulse::redis::Redis, events: u64) -> anyhow::Result<f64> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut untouched = Instant::now();
    loop {
        let (_, remaining) = archive_backlog(redis).await?;
        let now = Instant::now();
        if remaining == events {
            untouched = now;
        }
        if remaining == 0 {
            return Ok(now.duration_since(untouched).as_secs_f64());
        }
        ensure!(
            now < deadline,
            "{remaining} events were still not archived after {} s",
            DRAIN_TIMEOUT.as_secs()
        );
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

async fn count(sql: &DatabaseConnection, query: &str) -> anyhow::Result<i64> {
    let row = sql
        .query_one_raw(Statement::from_string(sql.get_database_backend(), query))
        .await?
        .with_context(|| format!("{query} returned no row"))?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// `Σ articles.like_count`, added up here: `SUM` of a BIGINT is a decimal on PostgreSQL.
async fn sum_like_counts(sql: &DatabaseConnection) -> anyhow::Result<i64> {
    let rows = sql
        .query_all_raw(Statement::from_string(
            sql.get_database_backend(),
            "SELECT like_count FROM articles",
        ))
        .await?;
    rows.iter()
        .map(|row| row.try_get_by_index::<i64>(0).map_err(anyhow::Error::from))
        .sum()
}

fn report(args: &LikeToggleArgs, shape: &Shape, measured: &Measured, ceiling: &Ceiling) {
    let loaded = &measured.loaded;
    let toggles = &loaded.toggles;
    let seconds = toggles.elapsed.as_secs_f64();
    let throughput = toggles.ok as f64 / seconds;
    let first_seconds = loaded.first_likes.elapsed.as_secs_f64();
    let first_throughput = loaded.first_likes.ok as f64 / first_seconds;
    let ratio = 100.0 * throughput / ceiling.calls_per_second;
    let drain = &measured.drain;
    let drain_rate = drain.events as f64 / drain.seconds.max(f64::EPSILON);
    let settled = &measured.settled;
    let verdict = if measured.counts_agree() {
        "OK"
    } else {
        "MISMATCH"
    };

    let mut rows = vec![
        (
            "first likes",
            format!(
                "{} in {first_seconds:.2} s: {} likes/s, p50 {:.2} ms, p99 {:.2} ms (each reads its relation from SQL once)",
                thousands(loaded.first_likes.ok as f64),
                thousands(first_throughput),
                loaded.first_likes.ms(0.50),
                loaded.first_likes.ms(0.99)
            ),
        ),
        (
            "toggles",
            format!(
                "{} ok, {} errors in {seconds:.2} s (every one a change)",
                thousands(toggles.ok as f64),
                thousands(toggles.errors as f64)
            ),
        ),
        ("throughput", format!("{} toggles/s", thousands(throughput))),
    ];
    rows.extend(toggles.latency_rows());
    rows.extend(loaded.cost.rows("toggles", toggles.ok, seconds));
    rows.extend([
        (
            "ceiling",
            format!(
                "{} calls/s (redis-benchmark, like_set.lua, {} conns, {} calls, {} changed; p50 {:.3} ms, p99 {:.3} ms)",
                thousands(ceiling.calls_per_second),
                shape.clients,
                thousands(ceiling.requests as f64),
                thousands(ceiling.counted as f64),
                ceiling.p50_ms,
                ceiling.p99_ms
            ),
        ),
        ("ratio", format!("{ratio:.1}% of the ceiling")),
        (
            "archive drain",
            format!(
                "{} events into {}: {} events/s over {:.2} s ({:.3} s worker CPU per 1k events)",
                thousands(drain.events as f64),
                measured.backend,
                thousands(drain_rate),
                drain.seconds,
                drain.worker_cpu_seconds / drain.events.max(1) as f64 * 1000.0
            ),
        ),
        (
            "counts",
            format!(
                "{verdict}: liked pairs {}; API after the load {}; events {} (streams {}, \
                 like_events {}); SQL likes rows {}, Σ like_count {}; API after the drain {}",
                loaded.expected_liked,
                loaded.api_sum_after_load,
                measured.expected_events(),
                measured.stream_events,
                settled.sql_events,
                settled.sql_liked_rows,
                settled.sql_like_count_sum,
                settled.api_sum_after_drain
            ),
        ),
    ]);
    for load in [&loaded.first_likes, toggles] {
        if !load.first_errors.is_empty() {
            rows.push(("first errors", load.first_errors.join("\n")));
        }
    }
    print_table(
        &format!("pulse-bench like-toggle: {}", shape.describe()),
        &rows,
    );
    println!("ceiling command: {}", ceiling.command_line);
    if args.common.json {
        let mut report = json!({
            "scenario": "like-toggle",
            "smoke": args.common.smoke,
            "clients": shape.clients,
            "users": shape.users,
            "articles": shape.articles,
            "backend": measured.backend,
            "first_likes": loaded.first_likes.ok,
            "first_likes_per_s": first_throughput,
            "first_likes_p99_ms": loaded.first_likes.ms(0.99),
            "elapsed_s": seconds,
            "ok": toggles.ok,
            "errors": toggles.errors + loaded.first_likes.errors,
            "throughput_toggles_per_s": throughput,
            "latency_ms": toggles.latency_json(),
            "ceiling_calls_per_s": ceiling.calls_per_second,
            "ceiling_requests": ceiling.requests,
            "ceiling_changed": ceiling.counted,
            "ratio_percent": ratio,
            "drain_events": drain.events,
            "drain_events_per_s": drain_rate,
            "drain_seconds": drain.seconds,
            "drain_worker_cpu_s": drain.worker_cpu_seconds,
            "expected_liked": loaded.expected_liked,
            "api_sum_after_load": loaded.api_sum_after_load,
            "stream_events": measured.stream_events,
            "sql_like_events": settled.sql_events,
            "sql_liked_rows": settled.sql_liked_rows,
            "sql_like_count_sum": settled.sql_like_count_sum,
            "api_sum_after_drain": settled.api_sum_after_drain,
            "counts_match": measured.counts_agree(),
            "redis_benchmark_command": ceiling.command_line,
        });
        if let Some(fields) = report.as_object_mut() {
            fields.extend(loaded.cost.json("toggles", toggles.ok));
        }
        println!("{report}");
    }
}
