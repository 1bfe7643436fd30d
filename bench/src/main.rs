//! `pulse-bench`: Pulse's load tool. See `bench/README.md`.
//!
//! - `record-view`: HTTP `recordView` throughput, latency and server cost against a real `pulse`
//!   process, checked for exact counts, next to a `redis-benchmark` ceiling of the same Lua script.
//! - `dedup-memory`: Redis bytes per dedup ("seen") marker, written exactly as the script does.

mod ceiling;
mod dedup_memory;
mod load;
mod proc_stats;
mod record_view;
mod redis_util;
mod report;
mod server;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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
    /// Measure Redis bytes per dedup marker (one per viewer per article per window).
    DedupMemory(DedupMemoryArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RecordViewArgs {
    /// The pulse binary to start (`<server-bin> serve`).
    #[arg(long, default_value = "target/release/pulse")]
    pub server_bin: PathBuf,
    /// Concurrent HTTP clients (and redis-benchmark connections for the ceiling).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub clients: u32,
    /// How long the load phase runs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
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
pub struct DedupMemoryArgs {
    /// Dedup markers to write.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..=load::MAX_VIEWERS as i64))]
    pub entries: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Flags every scenario takes.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Redis to run against (record-view: the server's and the ceiling's; dedup-memory: the one
    /// measured).
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
            Command::DedupMemory(args) => dedup_memory::run(args).await,
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
