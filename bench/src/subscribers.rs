//! `subscribers`: live subscribers at scale against a real server. N websocket clients speaking
//! graphql-transport-ws hold one subscription each, either to one poll's `leaderboardChanged` while
//! votes arrive at a steady rate, or to `feedItemAdded` as followers of one author who publishes at
//! a steady rate. Measured: the server's resident memory per idle subscriber, the latency from a
//! change's request to every client that shows it (every (client, change) pair), the server's CPU
//! per 1,000 messages delivered, the mutation's own latency under that load, the snapshot reads the
//! server made, and this tool's own CPU. `--knee` steps N up until the p99 passes a second.
//!
//! The tool shares the machine's cores with the server, so its clients are lean: one task per
//! socket, tungstenite with a 4 KiB read buffer and no write buffering, and no JSON parse of a
//! snapshot (the message type is read from the envelope's first field, the scores and item
//! numbers by scanning the text).

use std::borrow::Cow;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use hdrhistogram::Histogram;
use hyper::header::HeaderValue;
use rand::Rng as _;
use rand::rngs::StdRng;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{WebSocketStream, client_async_with_config};

use crate::cast_votes::{CastData, admin_poll};
use crate::database::BenchDatabase;
use crate::feed_read::{FeedFixture, metric};
use crate::http1::{Extra, GraphqlConnection};
use crate::load::{self, LoadPlan, LoadResult, Sender, Stop};
use crate::proc_stats::{Cost, CostMeter, clock_ticks_per_second, cpu_ticks, memory};
use crate::report::{MIB, print_table, thousands};
use crate::server::Server;
use crate::{SubscribersArgs, SubscribersMode};

const SMOKE_SUBSCRIBERS: u32 = 20;
const SMOKE_DURATION: Duration = Duration::from_secs(2);
const SMOKE_IDLE: Duration = Duration::from_millis(500);
/// Client sockets bound to one source address. Loopback has 28,000 ephemeral ports per
/// (source, destination) pair here, and sockets of an earlier run linger in TIME_WAIT: spreading
/// the clients over 127.R.0.1, 127.R.0.2, … (R random per run) keeps each address far from that.
pub(crate) const SOCKETS_PER_SOURCE: u32 = 5_000;
/// Descriptors each process keeps for what is not a subscriber socket: the server's listener,
/// Redis and SQL connections, files; the tool's own HTTP and Redis connections.
pub(crate) const RESERVED_DESCRIPTORS: u64 = 200;
/// Websocket handshakes (up to the first snapshot) in flight at once while connecting.
pub(crate) const HANDSHAKES_IN_FLIGHT: usize = 256;
/// How long subscribers may take to be ready, beyond their connection schedule.
const READY_GRACE: Duration = Duration::from_secs(60);
/// How long the feed's warm-up waits for every client before publishing another item.
const WARM_UP_WAIT: Duration = Duration::from_secs(2);
/// How long every client may take to show the last change after the load stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long no message may arrive before the subscribers count as idle: the feed's warm-up items
/// can still be on their way to some clients when the last one is ready.
const QUIET: Duration = Duration::from_secs(1);
/// The longest wait for that quiet.
const QUIET_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the tool checks whether the clients have caught up.
const PROGRESS_POLL: Duration = Duration::from_millis(5);
const CLIENT_READ_BUFFER: usize = 4 * 1024;
/// Latency histograms, each behind its own lock: a client records into the one of its index.
const LATENCY_SHARDS: usize = 32;
const MAX_LATENCY_US: u64 = 600_000_000;
/// The knee's subscriber counts; each step is a fresh server.
const KNEE_STEPS: [u32; 7] = [1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000];
const KNEE_P99: Duration = Duration::from_secs(1);
/// Share of the machine's cores busy above which a step counts as CPU-bound.
const CPU_BOUND_SHARE: f64 = 0.85;

const BOARD_SELECTION: &str = "subscription($p:ID!){ leaderboardChanged(pollId:$p, period: ALL_TIME, first: 10){ version entries { rank score option { id label } } } }";
const FEED_SELECTION: &str =
    "subscription{ feedItemAdded{ cursor node { id title author { handle } } } }";
const CAST: &str = "mutation($p:ID!,$o:ID!){ castVotes(input:{ballots:[{pollId:$p,optionId:$o}]}){ results { accepted } } }";
const PUBLISH: &str =
    "mutation($t:String!){ publishArticle(input:{title:$t, body:\"A live feed item.\"}){ id } }";
/// Titles of the measured items end with their number; warm-up items are told apart by theirs.
const ITEM_TITLE: &str = "subbench item ";
const WARM_UP_TITLE: &str = "subbench warm-up ";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Leaderboard,
    Feed,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Self::Leaderboard => "leaderboard",
            Self::Feed => "feed",
        }
    }

    /// What one change is, for the report.
    fn change(self) -> &'static str {
        match self {
            Self::Leaderboard => "vote",
            Self::Feed => "item",
        }
    }

    fn mutation(self) -> &'static str {
        match self {
            Self::Leaderboard => "castVotes",
            Self::Feed => "publishArticle",
        }
    }
}

/// What one run of one part measured.
struct Outcome {
    part: Part,
    subscribers: u32,
    sources: u32,
    connect_seconds: f64,
    rss_before: u64,
    rss_idle: u64,
    idle_seconds: f64,
    idle_server_cpu: f64,
    open_websockets: f64,
    rate: f64,
    sent: LoadResult,
    latency: Histogram<u64>,
    pairs_seen: u64,
    pairs_expected: u64,
    clients_short: u64,
    duplicates: u64,
    messages: u64,
    phase_seconds: f64,
    cost: Cost,
    /// Leaderboard: the server's snapshot reads; feed: its announcements (PUBLISHes to followers).
    server_work: f64,
    tick: Option<Duration>,
    failures: u64,
    first_failures: Vec<String>,
    /// Feed: whether the author was a celebrity (merged at read time, one channel for everyone).
    celebrity: bool,
    /// The machine's 1-minute load average when the load started and when it ended.
    load_average: (f64, f64),
    /// Cores the whole machine kept busy over the load, every process's work included.
    machine_cores: f64,
}

impl Outcome {
    fn rss_per_subscriber(&self) -> f64 {
        (self.rss_idle as f64 - self.rss_before as f64) / f64::from(self.subscribers)
    }

    fn ms(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }

    fn max_ms(&self) -> f64 {
        self.latency.max() as f64 / 1000.0
    }

    fn server_ms_per_thousand(&self) -> f64 {
        self.cost.server_cpu_seconds * 1000.0 / self.messages.max(1) as f64 * 1000.0
    }

    fn cores(&self, cpu_seconds: f64) -> f64 {
        cpu_seconds / self.phase_seconds
    }

    fn passed(&self) -> bool {
        self.failures == 0
            && self.sent.errors == 0
            && self.duplicates == 0
            && self.pairs_seen == self.pairs_expected
    }

    /// What held this run back, as far as the figures tell: the machine's CPU (and whose work
    /// kept it busy: on a shared machine, other processes' too), or not the CPU.
    fn limit(&self, cores: f64) -> String {
        let server = self.cores(self.cost.server_cpu_seconds);
        let tool = self.cores(self.cost.bench_cpu_seconds);
        let redis = self.cores(self.cost.redis_cpu_seconds);
        let others = (self.machine_cores - server - tool - redis).max(0.0);
        let shares = format!(
            "{:.2} of {cores} cores busy: server {server:.2}, tool {tool:.2}, Redis {redis:.2}, other processes {others:.2}",
            self.machine_cores
        );
        if self.machine_cores >= CPU_BOUND_SHARE * cores {
            format!("CPU, {shares}")
        } else {
            format!("not CPU-bound, {shares}")
        }
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        let change = self.part.change();
        let mut rows = vec![
            (
                "subscribers",
                format!(
                    "{} ready in {:.1} s, from {} source address(es); server saw {} websockets",
                    thousands(f64::from(self.subscribers)),
                    self.connect_seconds,
                    self.sources,
                    thousands(self.open_websockets)
                ),
            ),
            (
                "server RSS",
                format!(
                    "{:.1} MiB before any, {:.1} MiB with every subscriber idle: {:.1} KiB per idle subscriber",
                    self.rss_before as f64 / MIB,
                    self.rss_idle as f64 / MIB,
                    self.rss_per_subscriber() / 1024.0
                ),
            ),
            (
                "server CPU idle",
                format!(
                    "{:.3} cores busy over {:.1} s with every subscriber idle",
                    self.idle_server_cpu / self.idle_seconds,
                    self.idle_seconds
                ),
            ),
            (
                "changes",
                format!(
                    "{} {change}s ({} failed) at {}/s, sequential from one client",
                    thousands(self.sent.ok as f64),
                    thousands(self.sent.errors as f64),
                    self.rate
                ),
            ),
            (
                "change to client p50 / p99",
                format!("{:.1} / {:.1} ms", self.ms(0.50), self.ms(0.99)),
            ),
            (
                "change to client p99.9 / max",
                format!("{:.1} / {:.1} ms", self.ms(0.999), self.max_ms()),
            ),
            (
                "pairs seen / expected",
                format!(
                    "{} / {} ({} clients short, {} duplicates)",
                    thousands(self.pairs_seen as f64),
                    thousands(self.pairs_expected as f64),
                    thousands(self.clients_short as f64),
                    thousands(self.duplicates as f64)
                ),
            ),
            (
                "messages received",
                format!(
                    "{} in {:.1} s ({}/s)",
                    thousands(self.messages as f64),
                    self.phase_seconds,
                    thousands(self.messages as f64 / self.phase_seconds)
                ),
            ),
            (
                "server CPU",
                format!(
                    "{:.2} s = {:.2} ms per 1,000 messages ({:.2} cores busy)",
                    self.cost.server_cpu_seconds,
                    self.server_ms_per_thousand(),
                    self.cores(self.cost.server_cpu_seconds)
                ),
            ),
            (
                "server RSS after",
                format!(
                    "{:.1} MiB (peak {:.1} MiB)",
                    self.cost.rss as f64 / MIB,
                    self.cost.peak_rss as f64 / MIB
                ),
            ),
        ];
        let mutation = self.part.mutation();
        rows.push((
            if self.part == Part::Leaderboard {
                "castVotes p50 / p99"
            } else {
                "publishArticle p50 / p99"
            },
            format!(
                "{:.2} / {:.2} ms ({mutation}, max {:.2} ms)",
                self.sent.ms(0.50),
                self.sent.ms(0.99),
                self.sent.latency.max() as f64 / 1000.0
            ),
        ));
        match self.part {
            Part::Leaderboard => {
                let per_second = self.server_work / self.phase_seconds;
                let per_tick = self.tick.map_or_else(String::new, |tick| {
                    format!(", {:.2} per {tick:?} tick", per_second * tick.as_secs_f64())
                });
                rows.push((
                    "snapshot reads",
                    format!(
                        "{} ({per_second:.1}/s{per_tick})",
                        thousands(self.server_work)
                    ),
                ));
            }
            Part::Feed => rows.push((
                "announcements",
                format!(
                    "{} PUBLISHes to followers ({} path)",
                    thousands(self.server_work),
                    if self.celebrity {
                        "celebrity: one author channel"
                    } else {
                        "fan-out: one channel per follower"
                    }
                ),
            )),
        }
        rows.push((
            "redis CPU",
            format!(
                "{:.2} s ({:.2} cores; every client of this Redis)",
                self.cost.redis_cpu_seconds,
                self.cores(self.cost.redis_cpu_seconds)
            ),
        ));
        rows.push((
            "bench client CPU",
            format!(
                "{:.2} s = {:.2} ms per 1,000 messages ({:.2} cores busy)",
                self.cost.bench_cpu_seconds,
                self.cost.bench_cpu_seconds * 1e6 / self.messages.max(1) as f64,
                self.cores(self.cost.bench_cpu_seconds)
            ),
        ));
        rows.push((
            "machine CPU",
            format!(
                "{:.2} cores busy over the load, every process included",
                self.machine_cores
            ),
        ));
        rows.push((
            "load average",
            format!(
                "{:.1} at the start, {:.1} at the end (1 minute; other work on the machine shows here)",
                self.load_average.0, self.load_average.1
            ),
        ));
        if self.failures > 0 {
            rows.push((
                "client failures",
                format!(
                    "{}; first: {}",
                    thousands(self.failures as f64),
                    self.first_failures.join("\n")
                ),
            ));
        }
        rows
    }

    fn json(&self) -> Value {
        json!({
            "part": self.part.name(),
            "subscribers": self.subscribers,
            "source_addresses": self.sources,
            "connect_seconds": self.connect_seconds,
            "open_websockets": self.open_websockets,
            "rss_before_bytes": self.rss_before,
            "rss_idle_bytes": self.rss_idle,
            "rss_per_idle_subscriber_bytes": self.rss_per_subscriber(),
            "idle_server_cores": self.idle_server_cpu / self.idle_seconds,
            "changes": self.sent.ok,
            "change_errors": self.sent.errors,
            "rate_per_s": self.rate,
            "latency_ms": {
                "p50": self.ms(0.50),
                "p90": self.ms(0.90),
                "p99": self.ms(0.99),
                "p999": self.ms(0.999),
                "max": self.max_ms(),
            },
            "pairs_seen": self.pairs_seen,
            "pairs_expected": self.pairs_expected,
            "clients_short": self.clients_short,
            "duplicates": self.duplicates,
            "messages": self.messages,
            "phase_seconds": self.phase_seconds,
            "server_cpu_seconds": self.cost.server_cpu_seconds,
            "server_cpu_ms_per_1k_messages": self.server_ms_per_thousand(),
            "server_cores": self.cores(self.cost.server_cpu_seconds),
            "server_rss_after_bytes": self.cost.rss,
            "server_peak_rss_bytes": self.cost.peak_rss,
            "redis_cpu_seconds": self.cost.redis_cpu_seconds,
            "bench_cpu_seconds": self.cost.bench_cpu_seconds,
            "mutation": self.part.mutation(),
            "mutation_latency_ms": self.sent.latency_json(),
            "snapshot_reads": (self.part == Part::Leaderboard).then_some(self.server_work),
            "tick_ms": self.tick.map(|tick| tick.as_secs_f64() * 1000.0),
            "announcements": (self.part == Part::Feed).then_some(self.server_work),
            "celebrity_path": (self.part == Part::Feed).then_some(self.celebrity),
            "load_average": [self.load_average.0, self.load_average.1],
            "machine_cores_busy": self.machine_cores,
            "failures": self.failures,
            "first_failures": self.first_failures,
            "passed": self.passed(),
        })
    }
}

pub async fn run(args: SubscribersArgs) -> anyhow::Result<()> {
    // The server is spawned by this process and inherits the raised limit.
    let descriptors =
        rlimit::increase_nofile_limit(u64::MAX).context("cannot raise the descriptor limit")?;
    let most = descriptors.saturating_sub(RESERVED_DESCRIPTORS);
    ensure!(
        args.votes_per_sec > 0.0 && args.publish_per_sec > 0.0,
        "--votes-per-sec and --publish-per-sec must be positive"
    );
    ensure!(!args.duration.is_zero(), "--duration must be positive");
    let parts: &[Part] = match args.mode {
        SubscribersMode::Leaderboard => &[Part::Leaderboard],
        SubscribersMode::Feed => &[Part::Feed],
        SubscribersMode::Both => &[Part::Leaderboard, Part::Feed],
    };
    if args.knee {
        return knee(&args, parts, most, descriptors).await;
    }
    let subscribers = if args.common.smoke {
        SMOKE_SUBSCRIBERS
    } else {
        args.subscribers
    };
    ensure!(
        u64::from(subscribers) <= most,
        "{subscribers} subscribers need as many descriptors in the server and in this tool, and \
         the limit here is {descriptors} per process (RLIMIT_NOFILE's hard limit, less \
         {RESERVED_DESCRIPTORS} for everything else): at most {most}"
    );
    let mut outcomes = Vec::new();
    for &part in parts {
        let outcome = run_part(&args, part, subscribers).await?;
        print_table(&title(&args, part, subscribers), &outcome.rows());
        outcomes.push(outcome);
    }
    if args.common.json {
        println!(
            "{}",
            json!({
                "scenario": "subscribers",
                "smoke": args.common.smoke,
                "descriptor_limit": descriptors,
                "parts": outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
            })
        );
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|outcome| !outcome.passed())
        .map(|outcome| {
            format!(
                "{}: {} of {} pairs seen, {} duplicates, {} {} failed, {} client failures{}",
                outcome.part.name(),
                outcome.pairs_seen,
                outcome.pairs_expected,
                outcome.duplicates,
                outcome.sent.errors,
                outcome.part.mutation(),
                outcome.failures,
                outcome
                    .first_failures
                    .first()
                    .map(|first| format!(" (first: {first})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

fn title(args: &SubscribersArgs, part: Part, subscribers: u32) -> String {
    let (rate, unit) = match part {
        Part::Leaderboard => (args.votes_per_sec, "votes"),
        Part::Feed => (args.publish_per_sec, "items"),
    };
    format!(
        "pulse-bench subscribers ({}): {} subscribers, {rate} {unit}/s for {:?}",
        part.name(),
        thousands(f64::from(subscribers)),
        if args.common.smoke {
            SMOKE_DURATION
        } else {
            args.duration
        }
    )
}

/// Steps the subscriber count up, a fresh server each time, until the p99 passes a second, a run
/// fails, or the descriptor limit is reached; then prints the table.
async fn knee(
    args: &SubscribersArgs,
    parts: &[Part],
    most: u64,
    descriptors: u64,
) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let mut steps: Vec<u32> = KNEE_STEPS
        .iter()
        .copied()
        .filter(|&n| u64::from(n) <= most)
        .collect();
    if KNEE_STEPS.iter().any(|&n| u64::from(n) > most) {
        steps.push(u32::try_from(most).unwrap_or(u32::MAX));
    }
    let mut json_parts = Vec::new();
    for &part in parts {
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut runs = Vec::new();
        let mut stopped_by = format!(
            "the descriptor limit: {descriptors} per process allows at most {most} subscribers"
        );
        for &subscribers in &steps {
            eprintln!("knee ({}): {subscribers} subscribers ...", part.name());
            let outcome = match run_part(args, part, subscribers).await {
                Ok(outcome) => outcome,
                Err(err) => {
                    stopped_by = format!("{subscribers} subscribers failed: {err:#}");
                    break;
                }
            };
            rows.push((
                thousands(f64::from(subscribers)),
                format!(
                    "{:.1} KiB/sub | {:.0} / {:.0} / {:.0} ms | {:.2} ms CPU/1k msgs | server {:.2}, tool {:.2} cores | {} p99 {:.1} ms | {}/{} pairs",
                    outcome.rss_per_subscriber() / 1024.0,
                    outcome.ms(0.50),
                    outcome.ms(0.99),
                    outcome.max_ms(),
                    outcome.server_ms_per_thousand(),
                    outcome.cores(outcome.cost.server_cpu_seconds),
                    outcome.cores(outcome.cost.bench_cpu_seconds),
                    part.mutation(),
                    outcome.sent.ms(0.99),
                    thousands(outcome.pairs_seen as f64),
                    thousands(outcome.pairs_expected as f64),
                ),
            ));
            let p99 = Duration::from_micros(outcome.latency.value_at_quantile(0.99));
            let passed = outcome.passed();
            let limit = outcome.limit(cores);
            runs.push(outcome.json());
            if !passed {
                stopped_by = format!(
                    "{subscribers} subscribers: not every change reached every client ({limit})"
                );
                break;
            }
            if p99 > KNEE_P99 {
                stopped_by = format!(
                    "{subscribers} subscribers: p99 {:.0} ms passed {} ms ({limit})",
                    p99.as_secs_f64() * 1000.0,
                    KNEE_P99.as_millis()
                );
                break;
            }
        }
        rows.push(("stopped by".into(), stopped_by.clone()));
        let table: Vec<(&str, String)> =
            rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        print_table(
            &format!(
                "pulse-bench subscribers --knee ({}): N | RSS per idle subscriber | change to client p50 / p99 / max | server CPU per 1,000 messages | cores busy | mutation p99 | pairs",
                part.name()
            ),
            &table,
        );
        json_parts.push(json!({ "part": part.name(), "steps": runs, "stopped_by": stopped_by }));
    }
    if args.common.json {
        println!(
            "{}",
            json!({ "scenario": "subscribers", "knee": json_parts, "descriptor_limit": descriptors })
        );
    }
    Ok(())
}

/// One part at one size on a server of its own; the server, its keys and its database are gone
/// afterwards, whatever happened.
async fn run_part(args: &SubscribersArgs, part: Part, subscribers: u32) -> anyhow::Result<Outcome> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let database = BenchDatabase::create(None).await?;
    let fixture = FeedFixture::new();
    let max_connections = (subscribers + 256).to_string();
    let celebrity_followers = if args.celebrity { "1" } else { "1000000000" };
    let env = fixture.server_env(&[
        ("PULSE_MAX_CONNECTIONS", max_connections.as_str()),
        // Issue 22's cap on sockets per client address; every client here is on loopback.
        ("PULSE_MAX_SOCKETS_PER_IP", "0"),
        // The feed's path is chosen, not left to the follower count: see --celebrity.
        ("PULSE_FEED_CELEBRITY_FOLLOWERS", celebrity_followers),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    eprintln!(
        "starting {} for {} subscribers ({}) ...",
        args.server_bin.display(),
        thousands(f64::from(subscribers)),
        part.name()
    );
    let mut server = Server::on_database(
        &args.server_bin,
        &args.common.redis_url,
        &http,
        &database.url,
        &env,
    )
    .await?;
    let outcome = measure(args, part, subscribers, &server, &database, &fixture, &http).await;
    let stopped = server.stop().await;
    let (_, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    crate::redis_util::delete_prefix(&mut redis, &server.redis_prefix).await?;
    database.remove().await?;
    let outcome = outcome?;
    stopped?;
    Ok(outcome)
}

/// What the clients of a part subscribe with and what the load sends.
struct Plan {
    /// Per client: its `connection_init` message.
    inits: Vec<String>,
    subscribe: String,
    watch: Watch,
    sender: ChangeSender,
}

async fn measure(
    args: &SubscribersArgs,
    part: Part,
    subscribers: u32,
    server: &Server,
    database: &BenchDatabase,
    fixture: &FeedFixture,
    http: &reqwest::Client,
) -> anyhow::Result<Outcome> {
    let smoke = args.common.smoke;
    let duration = if smoke { SMOKE_DURATION } else { args.duration };
    let idle = if smoke { SMOKE_IDLE } else { args.idle };
    let url = server.url("/graphql");
    let (_, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    let rate = match part {
        Part::Leaderboard => args.votes_per_sec,
        Part::Feed => args.publish_per_sec,
    };
    // Every change the load can send, numbered from 1.
    let capacity = (rate * duration.as_secs_f64()).ceil() as usize + 2;
    let shared = Arc::new(Shared::new(capacity));
    let plan = match part {
        Part::Leaderboard => {
            let poll = json!({
                "title": "Subscribers bench",
                "options": (0..args.options).map(|index| json!({ "label": format!("Option {index}"), "bonus": 1 })).collect::<Vec<_>>(),
            });
            let (poll, options) = admin_poll(
                http,
                server,
                &args.server_bin,
                &args.common.redis_url,
                &database.url,
                poll,
            )
            .await?;
            let voter = crate::record_view::sign_up(http, &url).await?;
            let bodies = options
                .iter()
                .map(|option| {
                    Bytes::from(
                        json!({ "query": CAST, "variables": { "p": poll, "o": option } })
                            .to_string(),
                    )
                })
                .collect();
            Plan {
                inits: vec![json!({ "type": "connection_init", "payload": {} }).to_string()],
                subscribe: subscribe_message(BOARD_SELECTION, json!({ "p": poll })),
                watch: Watch::Board {
                    entries: options.len(),
                },
                sender: ChangeSender::new(server, &voter, Changes::Votes(bodies), &shared)?,
            }
        }
        Part::Feed => {
            let sql = database.connect().await?;
            eprintln!(
                "writing {} followers and their follows ...",
                thousands(f64::from(subscribers))
            );
            let followers = fixture
                .users(&sql, "follower", subscribers as usize)
                .await?;
            let author = fixture.users(&sql, "author", 1).await?[0];
            fixture.follow_all(&sql, &followers, author).await?;
            sql.close().await.ok();
            let keys = pulse::redis::Keys::new(server.redis_prefix.clone());
            // Each follower's inbox exists and they are in the author's audience, as after a read:
            // the fan-out then writes and announces to them.
            fixture
                .activate(&mut redis, &keys, &followers, &[author])
                .await?;
            let inits = followers
                .iter()
                .map(|&follower| {
                    Ok(json!({ "type": "connection_init", "payload": { "token": fixture.token(follower)? } })
                        .to_string())
                })
                .collect::<anyhow::Result<_>>()?;
            Plan {
                inits,
                subscribe: subscribe_message(FEED_SELECTION, json!({})),
                watch: Watch::Feed,
                sender: ChangeSender::new(
                    server,
                    &fixture.token(author)?,
                    Changes::Items,
                    &shared,
                )?,
            }
        }
    };

    let pid = server.pid().to_string();
    let (rss_before, _) = memory(&pid)?;
    let source_octet: u8 = rand::rng().random_range(2..=254);
    let sources = subscribers.div_ceil(SOCKETS_PER_SOURCE);
    eprintln!(
        "connecting {} subscribers at up to {}/s from {sources} source address(es) 127.{source_octet}.0.1… ...",
        thousands(f64::from(subscribers)),
        args.connect_per_sec
    );
    let connect_started = Instant::now();
    let clients = Clients {
        server: server.addr,
        source_octet,
        subscribe: plan.subscribe,
        watch: plan.watch,
        shared: shared.clone(),
    };
    let clients = Arc::new(clients);
    let mut tasks = tokio::task::JoinSet::new();
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT));
    let spacing = Duration::from_secs_f64(1.0 / f64::from(args.connect_per_sec));
    let mut next_connect = tokio::time::Instant::now();
    for index in 0..subscribers {
        tokio::time::sleep_until(next_connect).await;
        next_connect += spacing;
        let permit = handshakes.clone().acquire_owned().await?;
        let init = plan.inits[index as usize % plan.inits.len()].clone();
        let clients = clients.clone();
        tasks.spawn(async move { clients.run(index, init, permit).await });
        if shared.failures.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    let ready_by = connect_started
        + READY_GRACE
        + Duration::from_secs_f64(f64::from(subscribers) / f64::from(args.connect_per_sec));
    let mut sender = plan.sender;
    let ready = match part {
        Part::Leaderboard => {
            wait_until(&shared, ready_by, || {
                shared.ready.load(Ordering::Relaxed) >= subscribers
            })
            .await
        }
        Part::Feed => {
            wait_until(&shared, ready_by, || {
                shared.subscribed.load(Ordering::Relaxed) >= subscribers
            })
            .await
                && warm_up(&mut sender, &shared, subscribers, ready_by).await?
        }
    };
    let connect_seconds = connect_started.elapsed().as_secs_f64();
    if !ready {
        let outcome = shared.stop_clients(&mut tasks).await;
        bail!(
            "{} of {subscribers} subscribers were ready after {connect_seconds:.1} s; {} client failures, first: {}",
            shared.ready.load(Ordering::Relaxed),
            outcome.failures,
            outcome.first_failures.join(" | ")
        );
    }

    let quiet_by = Instant::now() + QUIET_TIMEOUT;
    let quiet = QUIET.as_micros() as u64;
    if !wait_until(&shared, quiet_by, || {
        shared.now_us() - shared.last_message.load(Ordering::Relaxed) >= quiet
    })
    .await
    {
        shared.stop_clients(&mut tasks).await;
        bail!("the subscribers still received messages {QUIET_TIMEOUT:?} after they were ready");
    }
    eprintln!("idle for {idle:?} ...");
    let ticks = clock_ticks_per_second();
    let idle_ticks = cpu_ticks(&pid)?;
    tokio::time::sleep(idle).await;
    let idle_server_cpu = (cpu_ticks(&pid)? - idle_ticks) as f64 / ticks;
    let (rss_idle, _) = memory(&pid)?;
    let open_websockets = metric(http, server, "pulse_live_sockets_open").await?;

    eprintln!("{} at {rate}/s for {duration:?} ...", part.mutation());
    let work_metric = match part {
        Part::Leaderboard => snapshot_reads(http, server).await?,
        Part::Feed => metric(http, server, "pulse_feed_announcements_total").await?,
    };
    let messages_before = shared.messages.load(Ordering::Relaxed);
    let load_at_start = load_average();
    let machine_at_start = machine_ticks()?;
    let meter = CostMeter::start(server.pid(), &mut redis).await?;
    let phase_started = Instant::now();
    let sent = run_apart(
        sender,
        LoadPlan {
            stop: Stop::After(duration),
            rate: Some(rate),
        },
    )
    .await?;
    let expected = u64::from(subscribers) * sent.ok;
    wait_until(&shared, Instant::now() + DRAIN_TIMEOUT, || {
        shared.delivered.load(Ordering::Relaxed) >= expected
    })
    .await;
    let phase_seconds = phase_started.elapsed().as_secs_f64();
    let cost = meter.stop(&mut redis).await?;
    let load_at_end = load_average();
    let machine_cores = machine_cores(machine_at_start, machine_ticks()?);
    let messages = shared.messages.load(Ordering::Relaxed) - messages_before;
    let pairs_seen = shared.delivered.load(Ordering::Relaxed);
    let server_work = match part {
        Part::Leaderboard => snapshot_reads(http, server).await?,
        Part::Feed => metric(http, server, "pulse_feed_announcements_total").await?,
    } - work_metric;
    let ended = shared.stop_clients(&mut tasks).await;
    let clients_short = ended
        .delivered
        .iter()
        .filter(|&&delivered| delivered < sent.ok)
        .count() as u64;
    let latency = shared.latency()?;
    Ok(Outcome {
        part,
        subscribers,
        sources,
        connect_seconds,
        rss_before,
        rss_idle,
        idle_seconds: idle.as_secs_f64(),
        idle_server_cpu,
        open_websockets,
        rate,
        pairs_seen,
        pairs_expected: expected,
        sent,
        latency,
        clients_short,
        duplicates: shared.duplicates.load(Ordering::Relaxed),
        messages,
        phase_seconds,
        cost,
        server_work,
        tick: (part == Part::Leaderboard).then(leaderboard_tick),
        failures: ended.failures,
        first_failures: ended.first_failures,
        celebrity: args.celebrity,
        load_average: (load_at_start, load_at_end),
        machine_cores,
    })
}

/// The feed sends nothing until an item arrives, and a follower's subscription may reach Redis a
/// moment after the client's `subscribe`: warm-up items are published until every client has
/// received one, so the measured items find every subscription in place.
async fn warm_up(
    sender: &mut ChangeSender,
    shared: &Shared,
    subscribers: u32,
    deadline: Instant,
) -> anyhow::Result<bool> {
    for round in 1.. {
        sender
            .publish_warm_up(round)
            .await
            .map_err(anyhow::Error::msg)?;
        let wait = (Instant::now() + WARM_UP_WAIT).min(deadline);
        if wait_until(shared, wait, || {
            shared.ready.load(Ordering::Relaxed) >= subscribers
        })
        .await
        {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Ok(false)
}

/// Waits until `done` holds, a client fails, or `deadline` passes; answers whether `done` held.
async fn wait_until(shared: &Shared, deadline: Instant, done: impl Fn() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if shared.failures.load(Ordering::Relaxed) > 0 || Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(PROGRESS_POLL).await;
    }
}

pub(crate) fn subscribe_message(query: &str, variables: Value) -> String {
    json!({ "id": "1", "type": "subscribe", "payload": { "query": query, "variables": variables } })
        .to_string()
}

/// The server's tick for live boards: its setting if this environment gives one (the server
/// inherits it), else the default.
fn leaderboard_tick() -> Duration {
    std::env::var("PULSE_LEADERBOARD_TICK")
        .ok()
        .and_then(|value| humantime::parse_duration(&value).ok())
        .unwrap_or_else(|| pulse::Config::defaults().leaderboard_tick)
}

/// The machine's 1-minute load average (`/proc/loadavg`), NaN where there is none.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The machine's busy and total CPU time so far, in clock ticks summed over its cores (the first
/// line of `/proc/stat`: idle and iowait are not busy; guest time, already in user time, is left
/// out).
fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let times: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .context("/proc/stat has no cpu line")?
        .split_whitespace()
        .map(|field| field.parse().context("a /proc/stat field is not a number"))
        .collect::<anyhow::Result<_>>()?;
    ensure!(times.len() >= 5, "/proc/stat's cpu line is short");
    let total: u64 = times.iter().take(8).sum();
    Ok((total - times[3] - times[4], total))
}

/// Cores busy between two [`machine_ticks`] readings.
fn machine_cores((busy_before, total_before): (u64, u64), (busy, total): (u64, u64)) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    (busy - busy_before) as f64 / (total - total_before).max(1) as f64 * cores
}

async fn snapshot_reads(http: &reqwest::Client, server: &Server) -> anyhow::Result<f64> {
    let text = http
        .get(server.url("/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .filter(|line| {
            // The name before issue 22 too, so a server built before it can be compared.
            (line.starts_with("pulse_live_snapshot_reads_total{")
                || line.starts_with("pulse_realtime_snapshot_reads_total{"))
                && line.contains("kind=\"leaderboard\"")
        })
        .find_map(|line| line.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0.0))
}

/// What every client and the load share: when each change was sent, and what the clients saw.
struct Shared {
    epoch: Instant,
    /// Change k's send time in µs since `epoch`, plus one (0: not sent).
    sent_at: Box<[AtomicU64]>,
    latency: Box<[Mutex<Histogram<u64>>]>,
    /// (client, change) pairs shown so far.
    delivered: AtomicU64,
    /// `next` messages received.
    messages: AtomicU64,
    /// When the last `next` message arrived, in µs since `epoch`.
    last_message: AtomicU64,
    subscribed: AtomicU32,
    ready: AtomicU32,
    duplicates: AtomicU64,
    failures: AtomicU64,
    first_failures: Mutex<Vec<String>>,
    stop: watch::Sender<bool>,
}

/// What the clients left behind once stopped.
struct Ended {
    delivered: Vec<u64>,
    failures: u64,
    first_failures: Vec<String>,
}

impl Shared {
    fn new(capacity: usize) -> Self {
        Self {
            epoch: Instant::now(),
            sent_at: (0..=capacity).map(|_| AtomicU64::new(0)).collect(),
            latency: (0..LATENCY_SHARDS)
                .map(|_| {
                    Mutex::new(
                        Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                            .expect("valid histogram bounds"),
                    )
                })
                .collect(),
            delivered: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            last_message: AtomicU64::new(0),
            subscribed: AtomicU32::new(0),
            ready: AtomicU32::new(0),
            duplicates: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            first_failures: Mutex::new(Vec::new()),
            stop: watch::channel(false).0,
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    fn fail(&self, client: u32, error: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut first = lock(&self.first_failures);
        if first.len() < 5 {
            first.push(format!("client {client}: {error}"));
        }
    }

    async fn stop_clients(&self, tasks: &mut tokio::task::JoinSet<u64>) -> Ended {
        self.stop.send_replace(true);
        let mut delivered = Vec::with_capacity(tasks.len());
        while let Some(joined) = tasks.join_next().await {
            delivered.push(joined.unwrap_or(0));
        }
        Ended {
            delivered,
            failures: self.failures.load(Ordering::Relaxed),
            first_failures: lock(&self.first_failures).clone(),
        }
    }

    fn latency(&self) -> anyhow::Result<Histogram<u64>> {
        let mut all = Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?;
        for shard in &self.latency {
            all.add(&*lock(shard))?;
        }
        Ok(all)
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How a client reads its subscription's messages.
#[derive(Clone, Copy)]
enum Watch {
    /// Every option is in the top 10 and each vote adds 1 (bonus 1): the sum of a snapshot's
    /// scores is the number of votes it includes, and votes are cast one after another, so a
    /// snapshot summing to S shows votes 1..=S.
    Board { entries: usize },
    /// Each item's title carries its number.
    Feed,
}

struct Clients {
    server: SocketAddr,
    source_octet: u8,
    subscribe: String,
    watch: Watch,
    shared: Arc<Shared>,
}

pub(crate) type Socket = WebSocketStream<TcpStream>;

impl Clients {
    /// One subscriber from connect to stop; answers how many changes it saw. The permit is held
    /// through the handshake and up to the first snapshot (the feed: the `subscribe`).
    async fn run(
        &self,
        index: u32,
        init: String,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> u64 {
        let mut stop = self.shared.stop.subscribe();
        let source = Ipv4Addr::new(
            127,
            self.source_octet,
            0,
            (1 + index / SOCKETS_PER_SOURCE) as u8,
        );
        let mut client = Client {
            index,
            watch: self.watch,
            shared: &self.shared,
            permit: Some(permit),
            seen_votes: 0,
            seen_items: Vec::new(),
            delivered: 0,
            first: true,
        };
        let session = async {
            let mut socket = open(self.server, source, SocketLimits::default()).await?;
            client.converse(&mut socket, init, &self.subscribe).await
        };
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => {}
            ended = session => if let Err(error) = ended {
                self.shared.fail(index, error);
            },
        }
        client.delivered
    }
}

/// What the kernel may hold for a client socket; unset: its defaults.
#[derive(Clone, Copy, Default)]
pub(crate) struct SocketLimits {
    /// `SO_RCVBUF` (Linux doubles it), which otherwise grows with what the client reads.
    pub receive_buffer: Option<u32>,
    /// `TCP_MAXSEG`: the segment size the client announces, which the server's kernel sizes its
    /// send buffer by (loopback's is 64 KiB, an Ethernet path's 1,460 bytes).
    pub segment: Option<u32>,
}

/// A graphql-transport-ws client socket from `source`.
pub(crate) async fn open(
    server: SocketAddr,
    source: Ipv4Addr,
    limits: SocketLimits,
) -> Result<Socket, String> {
    let socket = TcpSocket::new_v4().map_err(|err| format!("socket: {err}"))?;
    if let Some(bytes) = limits.receive_buffer {
        socket
            .set_recv_buffer_size(bytes)
            .map_err(|err| format!("SO_RCVBUF: {err}"))?;
    }
    if let Some(bytes) = limits.segment {
        socket2::SockRef::from(&socket)
            .set_tcp_mss(bytes)
            .map_err(|err| format!("TCP_MAXSEG: {err}"))?;
    }
    socket
        .bind(SocketAddr::new(source.into(), 0))
        .map_err(|err| format!("binding {source}: {err}"))?;
    socket
        .set_nodelay(true)
        .map_err(|err| format!("TCP_NODELAY: {err}"))?;
    let stream = socket
        .connect(server)
        .await
        .map_err(|err| format!("connecting from {source}: {err}"))?;
    let mut request = format!("ws://{server}/graphql/ws")
        .into_client_request()
        .map_err(|err| format!("request: {err}"))?;
    request.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_static("graphql-transport-ws"),
    );
    let config = WebSocketConfig::default()
        .read_buffer_size(CLIENT_READ_BUFFER)
        .write_buffer_size(0);
    let (socket, _) = client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|err| format!("websocket handshake: {err}"))?;
    Ok(socket)
}

struct Client<'a> {
    index: u32,
    watch: Watch,
    shared: &'a Shared,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    seen_votes: u64,
    /// Feed: which items arrived, a bit each.
    seen_items: Vec<u64>,
    delivered: u64,
    first: bool,
}

impl Client<'_> {
    /// The protocol up to the subscription, then its messages until the socket ends (an error:
    /// only the tool ends a subscriber).
    async fn converse(
        &mut self,
        socket: &mut Socket,
        init: String,
        subscribe: &str,
    ) -> Result<(), String> {
        send(socket, init).await?;
        loop {
            let text = receive(socket).await?;
            match message_type(&text).as_ref() {
                "connection_ack" => break,
                "ping" => send(socket, r#"{"type":"pong"}"#.to_owned()).await?,
                other => return Err(format!("{other} before connection_ack: {text}")),
            }
        }
        send(socket, subscribe.to_owned()).await?;
        self.shared.subscribed.fetch_add(1, Ordering::Relaxed);
        if matches!(self.watch, Watch::Feed) {
            self.permit = None;
        }
        loop {
            let text = receive(socket).await?;
            match message_type(&text).as_ref() {
                "next" => self.next(&text)?,
                "ping" => send(socket, r#"{"type":"pong"}"#.to_owned()).await?,
                "pong" => {}
                other => return Err(format!("unexpected {other}: {}", shorten(&text))),
            }
        }
    }

    fn next(&mut self, text: &str) -> Result<(), String> {
        if text.contains(r#""errors":"#) {
            return Err(format!("errors: {}", shorten(text)));
        }
        self.shared.messages.fetch_add(1, Ordering::Relaxed);
        let now = self.shared.now_us();
        self.shared.last_message.fetch_max(now, Ordering::Relaxed);
        match self.watch {
            Watch::Board { entries } => {
                let (votes, found) = score_sum(text)
                    .ok_or_else(|| format!("unreadable scores: {}", shorten(text)))?;
                if found != entries {
                    return Err(format!(
                        "a snapshot with {found} entries, not {entries}: {}",
                        shorten(text)
                    ));
                }
                if self.first {
                    self.first = false;
                    self.permit = None;
                    self.shared.ready.fetch_add(1, Ordering::Relaxed);
                    self.seen_votes = votes;
                    return Ok(());
                }
                if votes < self.seen_votes {
                    return Err(format!(
                        "a snapshot of {votes} votes after one of {}",
                        self.seen_votes
                    ));
                }
                let shown = self.seen_votes + 1..=votes;
                self.seen_votes = votes;
                self.record(shown, now)
            }
            Watch::Feed => match item(text) {
                Some(Item::WarmUp) => {
                    if self.first {
                        self.first = false;
                        self.shared.ready.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                }
                Some(Item::Measured(number)) => {
                    let (word, bit) = (number as usize / 64, 1u64 << (number % 64));
                    if self.seen_items.len() <= word {
                        self.seen_items.resize(word + 1, 0);
                    }
                    if self.seen_items[word] & bit != 0 {
                        self.shared.duplicates.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    self.seen_items[word] |= bit;
                    self.record(number..=number, now)
                }
                None => Err(format!(
                    "an item the tool did not publish: {}",
                    shorten(text)
                )),
            },
        }
    }

    /// Records the changes in `shown` as delivered at `now`.
    fn record(&mut self, shown: std::ops::RangeInclusive<u64>, now: u64) -> Result<(), String> {
        let count = shown.clone().count() as u64;
        if count == 0 {
            return Ok(());
        }
        let mut histogram = lock(&self.shared.latency[self.index as usize % LATENCY_SHARDS]);
        for change in shown {
            let sent = self
                .shared
                .sent_at
                .get(change as usize)
                .map_or(0, |sent| sent.load(Ordering::Relaxed));
            if sent == 0 {
                return Err(format!("change {change} shown before the tool sent it"));
            }
            histogram.saturating_record(now.saturating_sub(sent).max(1));
        }
        drop(histogram);
        self.delivered += count;
        self.shared.delivered.fetch_add(count, Ordering::Relaxed);
        Ok(())
    }
}

pub(crate) async fn send(socket: &mut Socket, text: String) -> Result<(), String> {
    socket
        .send(Message::Text(text.into()))
        .await
        .map_err(|err| format!("sending: {err}"))
}

/// The next text message; control frames are answered by tungstenite as it reads.
pub(crate) async fn receive(socket: &mut Socket) -> Result<tungstenite::Utf8Bytes, String> {
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => return Ok(text),
            Some(Ok(Message::Close(frame))) => {
                return Err(match frame {
                    Some(frame) => format!("closed by the server: {} {}", frame.code, frame.reason),
                    None => "closed by the server without a code".into(),
                });
            }
            Some(Ok(Message::Binary(_))) => return Err("a binary message".into()),
            Some(Ok(_)) => {}
            Some(Err(err)) => return Err(format!("reading: {err}")),
            None => return Err("the connection ended without a close frame".into()),
        }
    }
}

/// The envelope's `type`. async-graphql writes it first, so a prefix check serves every message
/// without parsing the payload; anything else is parsed.
pub(crate) fn message_type(text: &str) -> Cow<'_, str> {
    if let Some(rest) = text.strip_prefix(r#"{"type":""#)
        && let Some(end) = rest.find('"')
    {
        return Cow::Borrowed(&rest[..end]);
    }
    #[derive(Deserialize)]
    struct Envelope {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Envelope>(text)
        .map(|envelope| Cow::Owned(envelope.kind))
        .unwrap_or(Cow::Borrowed("(not a protocol message)"))
}

/// The sum of a snapshot's `score` fields (rounded: scores are whole here) and how many there are.
fn score_sum(text: &str) -> Option<(u64, usize)> {
    const FIELD: &str = r#""score":"#;
    let mut sum = 0.0;
    let mut found = 0;
    for (at, _) in text.match_indices(FIELD) {
        let rest = &text[at + FIELD.len()..];
        let end = rest.find([',', '}'])?;
        sum += rest[..end].trim().parse::<f64>().ok()?;
        found += 1;
    }
    Some((sum.round() as u64, found))
}

enum Item {
    WarmUp,
    Measured(u64),
}

fn item(text: &str) -> Option<Item> {
    if text.contains(WARM_UP_TITLE) {
        return Some(Item::WarmUp);
    }
    let at = text.find(ITEM_TITLE)? + ITEM_TITLE.len();
    let digits = &text[at..];
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok().map(Item::Measured)
}

pub(crate) fn shorten(text: &str) -> &str {
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What the load sends: votes on the poll's options in turn, or articles by the author.
enum Changes {
    Votes(Vec<Bytes>),
    Items,
}

/// The load's one client: sends change k (numbered from 1) and notes when, one after another.
struct ChangeSender {
    connection: GraphqlConnection,
    authorization: HeaderValue,
    changes: Changes,
    shared: Arc<Shared>,
    next: u64,
}

impl ChangeSender {
    fn new(
        server: &Server,
        token: &str,
        changes: Changes,
        shared: &Arc<Shared>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            connection: GraphqlConnection::new(server.addr),
            authorization: HeaderValue::from_str(&format!("Bearer {token}"))?,
            changes,
            shared: shared.clone(),
            next: 0,
        })
    }

    async fn post(&mut self, body: Bytes, what: &str) -> Result<(), String> {
        let extra = Extra {
            authorization: Some(&self.authorization),
            ..Extra::default()
        };
        let (status, answer) = self.connection.post(body, extra).await?;
        match what {
            "castVotes" => load::judge(status, &answer, what, |data: CastData| {
                data.cast_votes
                    .results
                    .first()
                    .is_some_and(|result| result.accepted)
                    .then_some(())
            }),
            _ => load::judge(status, &answer, what, |data: PublishData| {
                (!data.publish_article.id.is_empty()).then_some(())
            }),
        }
    }

    async fn publish_warm_up(&mut self, round: u32) -> Result<(), String> {
        let body =
            json!({ "query": PUBLISH, "variables": { "t": format!("{WARM_UP_TITLE}{round}") } });
        self.post(Bytes::from(body.to_string()), "publishArticle")
            .await
    }
}

/// Sends the changes from a thread and a runtime of their own. On the runtime of the subscribers'
/// clients, each answer would wait behind thousands of their reads, and the mutation's latency
/// would be the tool's own queue rather than the server's: a client sending a vote is not
/// the machine of ten thousand dashboards. The sender's connection is opened afresh there, since
/// one opened by the warm-up is driven by the runtime it was opened on.
async fn run_apart(mut sender: ChangeSender, plan: LoadPlan) -> anyhow::Result<LoadResult> {
    sender.connection = GraphqlConnection::new(sender.connection.addr());
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("change-sender".to_owned())
        .spawn(move || {
            let sent = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|runtime| runtime.block_on(load::run(vec![sender], plan)));
            let _ = done.send(sent);
        })?;
    Ok(result.await.context("the change sender's thread ended")??)
}

impl Sender for ChangeSender {
    async fn send(&mut self, _rng: &mut StdRng) -> Result<bool, String> {
        self.next += 1;
        let change = self.next;
        let Some(sent_at) = self.shared.sent_at.get(change as usize) else {
            return Err(format!(
                "change {change} is past the planned {}",
                self.shared.sent_at.len() - 1
            ));
        };
        let (body, what) = match &self.changes {
            Changes::Votes(bodies) => (
                bodies[(change as usize - 1) % bodies.len()].clone(),
                "castVotes",
            ),
            Changes::Items => (
                Bytes::from(
                    json!({ "query": PUBLISH, "variables": { "t": format!("{ITEM_TITLE}{change}") } })
                        .to_string(),
                ),
                "publishArticle",
            ),
        };
        sent_at.store(self.shared.now_us(), Ordering::Relaxed);
        self.post(body, what).await.map(|()| true)
    }
}

#[derive(Deserialize)]
struct PublishData {
    #[serde(rename = "publishArticle")]
    publish_article: Published,
}

#[derive(Deserialize)]
struct Published {
    id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_type_is_read_without_a_parse_and_with_one() {
        assert_eq!(
            message_type(r#"{"type":"next","id":"1","payload":{}}"#),
            "next"
        );
        assert_eq!(
            message_type(r#"{ "id":"1", "type":"complete"}"#),
            "complete"
        );
        assert_eq!(message_type("garbage"), "(not a protocol message)");
    }

    #[test]
    fn a_snapshot_s_scores_add_up_to_the_votes_it_shows() {
        let text = r#"{"type":"next","id":"1","payload":{"data":{"leaderboardChanged":{"version":"7","entries":[{"rank":1,"score":4.0,"option":{"id":"a","label":"x"}},{"rank":2,"score":3,"option":{"id":"b","label":"y"}},{"rank":3,"score":0.0}]}}}}"#;
        assert_eq!(score_sum(text), Some((7, 3)));
        assert_eq!(score_sum(r#"{"score":nope}"#), None);
    }

    #[test]
    fn items_are_told_apart_by_their_titles() {
        assert!(matches!(
            item(r#"{"node":{"title":"subbench item 12","id":"x"}}"#),
            Some(Item::Measured(12))
        ));
        assert!(matches!(
            item(r#"{"title":"subbench warm-up 3"}"#),
            Some(Item::WarmUp)
        ));
        assert!(item(r#"{"title":"someone else's"}"#).is_none());
    }
}
