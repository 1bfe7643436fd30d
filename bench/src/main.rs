//! `pulse-bench`: Pulse's load tool. See `bench/README.md`.
//!
//! - `record-view`: HTTP `recordView` throughput, latency and server cost against a real `pulse`
//!   process, checked for exact counts, next to a `redis-benchmark` ceiling of the same Lua script.
//! - `like-toggle`: HTTP `like`/`unlike` throughput and latency by many users on many articles,
//!   next to a `redis-benchmark` ceiling of the like script, then the likes archive's drain rate
//!   into SQL; checked for exact counts in the API, the streams and SQL.
//! - `dedup-memory`: Redis bytes per dedup ("seen") marker, written exactly as the script does.
//! - `like-memory`: Redis bytes per cached like relation, per like counter and per change waiting
//!   for the archive, written exactly as the scripts do.
//! - `feed-read`: `feed(first: 20)` with hydrated items over HTTP at a target rate, next to the
//!   redis-benchmark ceiling of the inbox read script.
//! - `publish-fanout`: publish latency for 10 to 100,000 followers and the fan-out's inbox writes/s.
//! - `fuzz`: generated, hostile and mutated GraphQL requests over HTTP and websockets against a
//!   real `pulse` process, for a bounded time; fails on an exit, a 5xx or an uncoded error.
//! - `cast-votes`: HTTP `castVotes` throughput and latency on a poll with 5 periods, HLLs and 3
//!   rules, next to a `redis-benchmark` ceiling of the vote script; checked for exact counts.
//! - `leaderboard-read`: the top 10 with standings at a fixed rate; p50/p99 latency.
//! - `subscribers`: N websocket subscribers of a live leaderboard under a vote stream, and N
//!   followers under a publish stream: server memory per idle subscriber, change-to-client latency
//!   over every (client, change) pair, server CPU per 1,000 messages; `--knee` steps N up.
//! - `fanout-floor`: one small frame to each of N websocket sockets per tick from a bare
//!   broadcaster that does nothing else: the fan-out latency no server can beat on this machine.
//! - `stalled-readers`: K websocket subscribers of a leaderboard and K of `articlePublished` that
//!   stop reading while 100,000 votes and enough articles go through the server: its RSS growth
//!   per stalled subscriber against the send budget, then what each gets when it reads again.
//! - `resumed-readers`: K anonymous subscribers resume `articlePublished` far back (a replay of N
//!   large articles each) and read nothing: the server's peak memory per stalled reader while it
//!   cuts them off at their send budget, beside one that reads the whole replay.

mod cast_votes;
mod ceiling;
mod database;
mod dedup_memory;
mod fanout_floor;
mod feed_read;
mod fuzz;
mod http1;
mod leaderboard_read;
mod like_memory;
mod like_toggle;
mod load;
mod proc_stats;
mod publish_fanout;
mod record_view;
mod redis_util;
mod report;
mod resumed;
mod search;
mod server;
mod stalled;
mod subscribers;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "pulse-bench",
    version,
    about = "Load and memory benchmarks for Pulse"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive `recordView` over HTTP against a freshly started server; compare with the
    /// redis-benchmark ceiling of the same script; check that the counts add up.
    RecordView(RecordViewArgs),
    /// Drive `like`/`unlike` over HTTP (every request a change) against a freshly started server;
    /// compare with the redis-benchmark ceiling of the same script; then time the likes archive
    /// draining into SQL and check that the API, the streams and SQL agree.
    LikeToggle(LikeToggleArgs),
    /// Measure Redis bytes per dedup marker (one per viewer per article per window).
    DedupMemory(DedupMemoryArgs),
    /// Measure Redis bytes per cached like relation, per like counter and per change not yet
    /// archived.
    LikeMemory(LikeMemoryArgs),
    /// Throw generated, hostile and mutated GraphQL requests at a freshly started server over
    /// HTTP and websockets; fail on an exit, a 5xx, an uncoded error, a slow answer or too much
    /// memory.
    Fuzz(FuzzArgs),
    /// Drive `castVotes` over HTTP (5 periods, carry-over, HLLs, 3 rules) against a freshly
    /// started server; compare with the redis-benchmark ceiling of the same script; check that
    /// the REAL all-time board counts every accepted ballot.
    CastVotes(CastVotesArgs),
    /// Read the top 10 of a board with every standing's option ahead and previous period at a
    /// fixed rate; report p50/p99 latency.
    LeaderboardRead(LeaderboardReadArgs),
    /// Read `feed(first: 20)` with hydrated items over HTTP at a target rate against a freshly
    /// started server; compare with the redis-benchmark ceiling of the inbox read script.
    FeedRead(FeedReadArgs),
    /// Publish as authors with 10 to 100,000 followers (a tenth active): publish latency per size
    /// and the fan-out's inbox writes per second, checked for exact write counts.
    PublishFanout(PublishFanoutArgs),
    /// Hold N websocket subscribers of one live leaderboard under a vote stream, and N followers'
    /// feeds under a publish stream: server RSS per idle subscriber, change-to-client latency over
    /// every (client, change) pair, server CPU per 1,000 messages; `--knee` steps N up.
    Subscribers(SubscribersArgs),
    /// Hand one small stamped frame to each of N websocket sockets per tick from a bare
    /// broadcaster (a separate process that does nothing else): the fan-out's own latency and CPU
    /// on this machine, the floor under `subscribers`' vote-to-client latency.
    FanoutFloor(fanout_floor::FanoutFloorArgs),
    /// The broadcaster `fanout-floor` starts.
    #[command(hide = true)]
    FanoutFloorBroadcaster(fanout_floor::BroadcasterArgs),
    /// Hold K websocket subscribers of a leaderboard and K of `articlePublished` that stop reading
    /// (and one of each that reads) while articles fill their send budgets and 100,000 votes go
    /// through the server: server RSS per stalled subscriber against the budget; then each must
    /// read the board's final snapshot, or the event stream's RESYNC_REQUIRED and `complete`.
    StalledReaders(StalledArgs),
    /// Resume K anonymous `articlePublished` subscribers far back (a replay of N large articles
    /// each) that read nothing, beside one that reads it all: the server's peak memory per stalled
    /// reader while it cuts them off at their send budget.
    ResumedReaders(ResumedArgs),
    /// Load articles into SQL and build an embedded search replica from them (time, size); query
    /// it at a fixed rate (p50/p99), then again while view flush batches stream in through the
    /// outbox (rows applied per second, freshness); check that the replica equals SQL.
    Search(search::SearchArgs),
}

#[derive(Debug, Clone, Args)]
pub struct SubscribersArgs {
    /// The pulse binary to start (`<server-bin> serve`).
    #[arg(long, default_value = "target/release/pulse")]
    pub server_bin: PathBuf,
    /// Websocket clients, one subscription each (limited by RLIMIT_NOFILE's hard limit).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub subscribers: u32,
    /// Which live path: a leaderboard under votes, followers' feeds under publishes, or both (two
    /// servers, two tables).
    #[arg(long, value_enum, default_value_t = SubscribersMode::Both)]
    pub mode: SubscribersMode,
    /// Votes per second during the leaderboard's load, cast one after another.
    #[arg(long, default_value_t = 20.0)]
    pub votes_per_sec: f64,
    /// Articles per second the followed author publishes during the feed's load.
    #[arg(long, default_value_t = 2.0)]
    pub publish_per_sec: f64,
    /// How long votes or publishes are sent.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// How long every subscriber sits idle before the server's memory is read.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub idle: Duration,
    /// Highest rate at which subscribers connect.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub connect_per_sec: u32,
    /// The poll's options, every one of them within the top 10 shown.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub options: u32,
    /// Make the feed's author a celebrity (followers merge its articles at read time and listen on
    /// one author channel) instead of an author whose articles are fanned out to each follower.
    #[arg(long)]
    pub celebrity: bool,
    /// Step the subscriber count up (1,000, 2,000, 5,000, 10,000, 20,000, …, capped by the
    /// descriptor limit), a fresh server each, until the p99 passes 1 s; print the table.
    #[arg(long)]
    pub knee: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ResumedArgs {
    /// The pulse binary to start (`<server-bin> serve`).
    #[arg(long, default_value = "target/release/pulse")]
    pub server_bin: PathBuf,
    /// Stalled readers, a socket each, all resuming after the first article.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub readers: u32,
    /// Articles published before they subscribe (the server's PULSE_REPLAY_LIMIT is set to it,
    /// so that each replay carries every one after the first).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub articles: u32,
    /// Characters of each article's body, which the subscription selects.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u32).range(1..=50_000))]
    pub article_bytes: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct StalledArgs {
    /// The pulse binary to start (`<server-bin> serve`).
    #[arg(long, default_value = "target/release/pulse")]
    pub server_bin: PathBuf,
    /// Stalled subscribers of each stream: this many of the leaderboard and as many of
    /// `articlePublished`, a socket each (limited by RLIMIT_NOFILE's hard limit).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub stalled: u32,
    /// Votes cast on the board while they are stalled.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub votes: u64,
    /// Concurrent HTTP clients casting them.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub clients: u32,
    /// Voters signed up; each ballot is by one of them at random.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub voters: u32,
    /// The poll's options, every one of them within the top 10 shown.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub options: u32,
    /// Characters of each article's body, which the subscription selects: larger articles fill a
    /// stalled socket's budget sooner.
    #[arg(long, default_value_t = 16_384, value_parser = clap::value_parser!(u32).range(1..=50_000))]
    pub article_bytes: u32,
    /// Most articles published while waiting for every stalled article subscriber to be past its
    /// budget (the run fails past it).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_articles: u32,
    /// The server's `PULSE_WS_SEND_BUDGET` in bytes; unset: its default.
    #[arg(long)]
    pub send_budget: Option<u64>,
    /// Highest rate at which subscribers connect.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub connect_per_sec: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SubscribersMode {
    Leaderboard,
    Feed,
    Both,
}

#[derive(Debug, Clone, Args)]
pub struct CastVotesArgs {
    #[command(flatten)]
    pub load: HttpLoadArgs,
    /// Voters signed up; each ballot is by one of them at random.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub users: u32,
    /// Options of the poll; each ballot is for one of them at random.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub options: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct LeaderboardReadArgs {
    #[command(flatten)]
    pub load: HttpLoadArgs,
    /// Options of the poll.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub options: u32,
    /// Open-loop target in reads/s over all clients.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct FeedReadArgs {
    #[command(flatten)]
    pub load: HttpLoadArgs,
    /// Open-loop target in reads/s over all clients.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Readers (signed-in users reading their feeds, picked at random).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub readers: u32,
    /// Authors.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub authors: u32,
    /// Authors each reader follows.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub follows: u32,
    /// Articles per author.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub articles_per_author: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct PublishFanoutArgs {
    /// The pulse binary to start (`<server-bin> serve`).
    #[arg(long, default_value = "target/release/pulse")]
    pub server_bin: PathBuf,
    /// The largest follower count measured (of 10, 1,000, 10,000 and 100,000).
    #[arg(long, default_value_t = 100_000)]
    pub max_followers: u32,
    /// Publishes timed per follower count.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub publishes: u32,
    /// Articles published back to back by the largest author to time the fan-out.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub burst: u32,
    /// `PULSE_FEED_FANOUT_CHUNK` of the server.
    #[arg(long, default_value_t = 1000)]
    pub chunk: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Flags of the scenarios that load a server over HTTP.
#[derive(Debug, Clone, Args)]
pub struct HttpLoadArgs {
    /// The pulse binary to start (`<server-bin> serve`).
    #[arg(long, default_value = "target/release/pulse")]
    pub server_bin: PathBuf,
    /// Concurrent HTTP clients (and redis-benchmark connections for the ceiling).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub clients: u32,
    /// How long the measured load runs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct RecordViewArgs {
    #[command(flatten)]
    pub load: HttpLoadArgs,
    /// Articles published and viewed (uniformly at random).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub articles: u32,
    /// Distinct viewer addresses (10.x.y.z, sent as X-Forwarded-For), picked uniformly at random.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=load::MAX_VIEWERS as i64))]
    pub viewers: u32,
    /// Open-loop target in views/s over all clients: each client sends on a fixed schedule and
    /// latency is measured from the scheduled send time when the previous answer came too late for
    /// it, else from the actual send. Unset: closed loop, as fast as possible.
    #[arg(long)]
    pub rate: Option<f64>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct LikeToggleArgs {
    #[command(flatten)]
    pub load: HttpLoadArgs,
    /// Users signed up (at least --clients: each client drives users of its own).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub users: u32,
    /// Articles published; each user first likes every one of them.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub articles: u32,
    /// A PostgreSQL or MariaDB database to create the run's own database beside (e.g.
    /// `postgres://postgres@127.0.0.1:5432/test`); unset: a SQLite file.
    #[arg(long)]
    pub database_url: Option<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct DedupMemoryArgs {
    /// Dedup markers to write.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..=load::MAX_VIEWERS as i64))]
    pub entries: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct LikeMemoryArgs {
    /// Likes written (one relation and one unarchived change each).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub likes: u32,
    /// Articles they spread over evenly (one counter each).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub articles: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args)]
pub struct FuzzArgs {
    /// How long to send new cases, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Seed of the run; random when unset. Printed at the start and with every failure.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The pulse binary to start (`<server-bin> serve`). A debug build has deeper stack frames,
    /// which makes it the harsher target.
    #[arg(long, default_value = "target/debug/pulse")]
    pub server_bin: PathBuf,
    /// The server's resident memory may not exceed this many MiB.
    #[arg(long, default_value_t = 512)]
    pub max_rss_mib: u64,
    /// Cases in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Input classes to leave out, comma-separated (e.g. `nesting,fragments`).
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<fuzz::Class>,
    /// Send only this case (`<worker>:<number>`, as printed with a failure; needs the same --seed
    /// and --skip).
    #[arg(long)]
    pub case: Option<fuzz::CaseId>,
    /// Redis for the server (`redis+cluster://host:port,…` for a Redis Cluster).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

/// Flags every scenario takes.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Redis to run against (record-view: the server's and the ceiling's; dedup-memory: the one
    /// measured). A Redis Cluster as `redis+cluster://host:port,host:port,…`: record-view then
    /// skips its redis-benchmark ceiling; like-toggle, cast-votes, feed-read, dedup-memory and
    /// like-memory refuse one.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Tiny run for CI (record-view: 2 clients, 200 requests, 10 articles, every check still
    /// applies; dedup-memory: 10,000 entries).
    #[arg(long)]
    pub smoke: bool,
    /// Also print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::RecordView(args) => record_view::run(args).await,
            Command::LikeToggle(args) => like_toggle::run(args).await,
            Command::DedupMemory(args) => dedup_memory::run(args).await,
            Command::LikeMemory(args) => like_memory::run(args).await,
            Command::Fuzz(args) => fuzz::run(args).await,
            Command::CastVotes(args) => cast_votes::run(args).await,
            Command::LeaderboardRead(args) => leaderboard_read::run(args).await,
            Command::FeedRead(args) => feed_read::run(args).await,
            Command::PublishFanout(args) => publish_fanout::run(args).await,
            Command::Subscribers(args) => subscribers::run(args).await,
            Command::FanoutFloor(args) => fanout_floor::run(args).await,
            Command::FanoutFloorBroadcaster(args) => fanout_floor::broadcast(args).await,
            Command::StalledReaders(args) => stalled::run(args).await,
            Command::ResumedReaders(args) => resumed::run(args).await,
            Command::Search(args) => search::run(args).await,
        }
    })
}

/// A random lowercase hex string, for prefixes and names that must not collide between runs.
pub fn random_hex(len: usize) -> String {
    use rand::Rng as _;
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).expect("a hex digit"))
        .collect()
}
