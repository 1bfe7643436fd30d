//! Every setting Pulse reads, each both a `--flag` and an environment variable (see `.env.example`).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;

use crate::documents::PersistedMode;

#[derive(Debug, Parser)]
#[command(
    name = "pulse",
    version,
    about = "GraphQL engagement API: views, votes, likes, follow feed"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP/GraphQL server (the default).
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Print the GraphQL schema (SDL) to stdout.
    PrintSchema,
    /// Create demo users and articles (idempotent).
    SeedDemo,
    /// Recompute Redis state from SQL.
    Rebuild {
        #[command(subcommand)]
        target: RebuildTarget,
    },
    /// Administrative actions.
    Admin {
        #[command(subcommand)]
        action: AdminAction,
    },
    /// Inspect the background jobs' streams, or retry their dead letters.
    Jobs {
        #[command(subcommand)]
        action: JobsAction,
    },
    /// Manage the trusted documents (`PULSE_PERSISTED_QUERIES=trusted`).
    Documents {
        #[command(subcommand)]
        action: DocumentsAction,
    },
    /// Upkeep of the follow feed's Redis keys.
    Feed {
        #[command(subcommand)]
        action: FeedAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum DocumentsAction {
    /// Register documents: each file one GraphQL document, or with `--manifest`, the operations of
    /// a persisted query manifest (Apollo's `persisted-query-manifest.json`, or a JSON object of
    /// hash to document, as Relay and GraphQL Codegen write).
    Add {
        files: Vec<PathBuf>,
        #[arg(long)]
        manifest: bool,
    },
    /// Every registered document: hash, name, when.
    List,
    /// Unregister a document by its SHA-256.
    Remove { sha256: String },
}

#[derive(Debug, Subcommand)]
pub enum FeedAction {
    /// Remove feed keys nothing will read again: those of deleted users, and what crashed
    /// rebuilds and expired inboxes left behind.
    Vacuum,
}

#[derive(Debug, Subcommand)]
pub enum JobsAction {
    /// Per stream of every job: length, pending, lag and dead letters.
    Status,
    /// Put a job's dead letters back onto its streams.
    RetryDead { job: String },
}

#[derive(Debug, Subcommand)]
pub enum RebuildTarget {
    /// View counts and the all-time view ranking, from `articles.view_count` plus pending views.
    Views,
    /// Like counts and the all-time like ranking from SQL plus the changes not archived yet; the
    /// relation cache is dropped, to be read again from SQL as needed.
    Likes,
    /// Every poll's boards, participant counts, vote sequence and closed flag, from the SQL vote
    /// log and the poll configuration.
    Votes,
    /// Every cached feed outbox, reloaded from SQL (inboxes rebuild on their next read).
    Feed,
    /// Every process's search replica, from SQL: raises the search epoch, which each replica
    /// sees at its next poll (a stopped one at its start).
    Search,
}

#[derive(Debug, Subcommand)]
pub enum AdminAction {
    /// Give a user the admin role.
    Grant { handle: String },
    /// Take the admin role away from a user.
    Revoke { handle: String },
}

#[derive(Debug, Clone, Args)]
pub struct Config {
    /// SQL database URL: sqlite://, postgres:// or mysql://. Default: a SQLite file in the data dir.
    #[arg(long, global = true, env = "DATABASE_URL")]
    pub database_url: Option<String>,

    /// How long a SQLite write waits for the file's write lock before the request answers UNAVAILABLE
    /// (and, past 5 s, how long a request waits for a pool connection, which queued writers hold).
    #[arg(long, global = true, env = "PULSE_SQLITE_BUSY_TIMEOUT", default_value = "3s", value_parser = humantime::parse_duration)]
    pub sqlite_busy_timeout: Duration,

    /// Redis URL. Unset: use the Redis at PULSE_REDIS_PROBE when it answers, else the private
    /// redis-server of the data dir (started if none runs).
    #[arg(long, global = true, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Where to look for a local Redis when REDIS_URL is unset, before using a private one.
    #[arg(
        long,
        global = true,
        env = "PULSE_REDIS_PROBE",
        default_value = "127.0.0.1:6379"
    )]
    pub redis_probe: SocketAddr,

    /// Prefix of every Redis key, so several deployments (or tests) can share one Redis; one
    /// database owns a prefix, and a process of another refuses to start on it. Unset: `pulse:`,
    /// except on the local Redis found at PULSE_REDIS_PROBE, where each database gets its own
    /// (`pulse:<12 hex digits of its id>:`), so two data dirs never mix their data.
    #[arg(long, global = true, env = "PULSE_REDIS_PREFIX")]
    pub redis_prefix: Option<String>,

    /// The redis-server binary started when no Redis is configured or reachable.
    #[arg(
        long,
        global = true,
        env = "PULSE_REDIS_SERVER",
        default_value = "redis-server"
    )]
    pub redis_server: PathBuf,

    /// Address the HTTP server listens on.
    #[arg(
        long,
        global = true,
        env = "PULSE_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,

    /// Directory for the embedded SQLite file, the private Redis's data and the dev token secret.
    #[arg(long, global = true, env = "PULSE_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// Secret that signs session tokens (at least 32 bytes). Required unless --dev.
    #[arg(
        long,
        global = true,
        env = "PULSE_TOKEN_SECRET",
        hide_env_values = true
    )]
    pub token_secret: Option<Secret>,

    /// How long a session token stays valid.
    #[arg(long, global = true, env = "PULSE_TOKEN_TTL", default_value = "7d", value_parser = humantime::parse_duration)]
    pub token_ttl: Duration,

    /// Development mode: without PULSE_TOKEN_SECRET, a secret is generated and kept in the data dir.
    #[arg(long, global = true, env = "PULSE_DEV")]
    pub dev: bool,

    /// Handles given the admin role at start-up (comma-separated).
    #[arg(long, global = true, env = "PULSE_ADMINS", value_delimiter = ',')]
    pub admins: Vec<String>,

    /// Proxies (CIDRs, comma-separated) whose X-Forwarded-For is believed. Empty: never believed.
    #[arg(
        long,
        global = true,
        env = "PULSE_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<IpNet>,

    /// Browser origins allowed to call the API cross-origin (comma-separated, e.g.
    /// `https://app.example.com`; `*` for any). Empty: no CORS headers, same-origin only.
    #[arg(long, global = true, env = "PULSE_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Log format.
    #[arg(long, global = true, env = "PULSE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Whether schema introspection (and so GraphiQL's docs) is served.
    #[arg(long, global = true, env = "PULSE_INTROSPECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub introspection: bool,

    /// Deepest selection nesting a query may have.
    #[arg(
        long,
        global = true,
        env = "PULSE_MAX_QUERY_DEPTH",
        default_value_t = 15
    )]
    pub max_query_depth: usize,

    /// Largest complexity a query may have (each field 1, connections multiplied by their page size).
    #[arg(
        long,
        global = true,
        env = "PULSE_MAX_QUERY_COMPLEXITY",
        default_value_t = 5000
    )]
    pub max_query_complexity: usize,

    /// Largest request body, and largest message a websocket client may send, in bytes.
    #[arg(long, global = true, env = "PULSE_MAX_BODY_BYTES", default_value_t = 256 * 1024)]
    pub max_body_bytes: usize,

    /// How long a client may take to send a request's headers; an idle keep-alive connection is
    /// closed after as long again.
    #[arg(long, global = true, env = "PULSE_HTTP_HEADER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub http_header_timeout: Duration,

    /// How long a client may take to send a request's body once its headers are in (408 after).
    #[arg(long, global = true, env = "PULSE_HTTP_BODY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub http_body_timeout: Duration,

    /// Connections served at once, websockets included; further ones wait in the kernel's backlog.
    #[arg(long, global = true, env = "PULSE_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// How long a websocket may take to send `connection_init` before it is closed (4408).
    #[arg(long, global = true, env = "PULSE_WS_INIT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub ws_init_timeout: Duration,

    /// How often the server pings an open websocket (`ping` on graphql-transport-ws; `ka` and a
    /// websocket Ping frame on the legacy protocol); `0s`: never.
    #[arg(long, global = true, env = "PULSE_WS_PING_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    pub ws_ping_interval: Duration,

    /// How long after a ping a websocket may stay silent before it is closed (3008).
    #[arg(long, global = true, env = "PULSE_WS_PONG_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub ws_pong_timeout: Duration,

    /// Operations one websocket may run at once; one more closes it (1008).
    #[arg(
        long,
        global = true,
        env = "PULSE_WS_MAX_SUBSCRIPTIONS",
        default_value_t = 100
    )]
    pub ws_max_subscriptions: u32,

    /// Bytes of messages that may wait for a websocket that does not keep up. Past it, a
    /// snapshot (leaderboardChanged, articleStatsChanged) replaces its unsent one; an event
    /// stream's socket is closed with 4413.
    #[arg(
        long,
        global = true,
        env = "PULSE_WS_SEND_BUDGET",
        default_value_t = 128 * 1024
    )]
    pub ws_send_budget: usize,

    /// Websockets one client address may hold open at once (`0`: no cap); one more is refused
    /// before the upgrade with 429 `RATE_LIMITED`.
    #[arg(
        long,
        global = true,
        env = "PULSE_MAX_SOCKETS_PER_IP",
        default_value_t = 512
    )]
    pub max_sockets_per_ip: u32,

    /// Sign-in and sign-up attempts allowed per client IP per minute (0: unlimited).
    #[arg(
        long,
        global = true,
        env = "PULSE_AUTH_ATTEMPTS_PER_MINUTE",
        default_value_t = 30
    )]
    pub auth_attempts_per_minute: u32,

    /// A viewer's repeat views of one article within this window count once.
    #[arg(long, global = true, env = "PULSE_VIEW_WINDOW", default_value = "1h", value_parser = humantime::parse_duration)]
    pub view_window: Duration,

    /// How often pending view counts are moved from Redis to SQL.
    #[arg(long, global = true, env = "PULSE_VIEW_FLUSH_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub view_flush_interval: Duration,

    /// How long a flusher owns a batch it took; a batch left by a dead flusher is re-driven after it.
    #[arg(long, global = true, env = "PULSE_VIEW_FLUSH_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub view_flush_lease: Duration,

    /// IANA time zone whose days and ISO weeks bound the DAY and WEEK rankings.
    #[arg(long, global = true, env = "PULSE_TIMEZONE", default_value = "UTC")]
    pub timezone: chrono_tz::Tz,

    /// A file of extra crawler User-Agent patterns (one regex per line, `#` comments), added to the
    /// shipped list.
    #[arg(long, global = true, env = "PULSE_CRAWLER_PATTERNS_FILE")]
    pub crawler_patterns_file: Option<PathBuf>,

    /// How long Redis keeps a user's cached relation to a liked subject after its last change or
    /// read; a relation it has forgotten is read from SQL (liking stays idempotent either way).
    #[arg(long, global = true, env = "PULSE_LIKE_RELATION_TTL", default_value = "7d", value_parser = humantime::parse_duration)]
    pub like_relation_ttl: Duration,

    /// How often an article's featured (most liked) comments are recomputed from SQL, at most.
    #[arg(long, global = true, env = "PULSE_FEATURED_REFRESH", default_value = "60s", value_parser = humantime::parse_duration)]
    pub featured_refresh: Duration,

    /// How often, at most, an article's live counters are read and pushed to its
    /// `articleStatsChanged` subscribers (per process, however many subscribers and changes).
    #[arg(long, global = true, env = "PULSE_STATS_TICK", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub stats_tick: Duration,

    /// Whether this process consumes the background jobs' streams. `false` makes an API-only
    /// process, for deployments that run the jobs in separate worker processes.
    #[arg(long, global = true, env = "PULSE_RUN_JOBS", default_value_t = true, action = clap::ArgAction::Set)]
    pub run_jobs: bool,

    /// Most entries a background job handles in one batch (one SQL transaction).
    #[arg(long, global = true, env = "PULSE_JOB_BATCH", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub job_batch: u32,

    /// How many shards of a background job one process handles at once (one SQL transaction
    /// each). More drains faster into PostgreSQL or MySQL; SQLite serializes writers anyway.
    #[arg(long, global = true, env = "PULSE_JOB_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub job_concurrency: u32,

    /// How long a job's consumer may hold entries before another process takes them over; longer
    /// than the slowest batch.
    #[arg(long, global = true, env = "PULSE_JOB_LEASE", default_value = "60s", value_parser = humantime::parse_duration)]
    pub job_lease: Duration,

    /// How long a job's consumer waits after a round that found nothing to do.
    #[arg(long, global = true, env = "PULSE_JOB_POLL", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub job_poll: Duration,

    /// How long in-flight requests may take to finish after a shutdown signal.
    #[arg(long, global = true, env = "PULSE_SHUTDOWN_GRACE", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Which documents the server runs: `apq` (any, and Apollo's automatic persisted queries by
    /// hash, shared through Redis), `trusted` (only those registered with `pulse documents add`) or
    /// `off` (any, always in full).
    #[arg(long, global = true, env = "PULSE_PERSISTED_QUERIES", value_enum, default_value_t = PersistedMode::Apq)]
    pub persisted_queries: PersistedMode,

    /// How long an automatic persisted query stays registered after its last use.
    #[arg(long, global = true, env = "PULSE_APQ_TTL", default_value = "7days", value_parser = humantime::parse_duration)]
    pub apq_ttl: Duration,

    /// How long a past period's vote boards (hour, day, week, month) stay queryable with `at:`
    /// after the period ends; the SQL vote log keeps every vote regardless.
    #[arg(long, global = true, env = "PULSE_VOTE_BUCKET_RETENTION", default_value = "400d", value_parser = humantime::parse_duration)]
    pub vote_bucket_retention: Duration,

    /// How often, at most, a watched leaderboard is read and pushed to its `leaderboardChanged`
    /// subscribers (per board per process, however many subscribers and votes). Each tick sends every
    /// subscriber a message, so it trades latency for CPU: with 10,000 subscribers of one board
    /// under 20 votes/s on two cores, 150 ms kept the vote-to-screen p99 under 250 ms (250 ms gave
    /// 336 ms) while 100 ms took both cores with the load tool (BENCHMARKS.md, `subscribers`).
    #[arg(long, global = true, env = "PULSE_LEADERBOARD_TICK", default_value = "150ms", value_parser = humantime::parse_duration)]
    pub leaderboard_tick: Duration,

    /// Most events a resumed `feedItemAdded` or `articlePublished` (`after:` a cursor) replays; a
    /// client further behind is sent `RESYNC_REQUIRED` and re-reads instead.
    #[arg(long, global = true, env = "PULSE_REPLAY_LIMIT", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub replay_limit: u32,
    /// Most items a feed inbox (and an author's outbox) keeps; trimmed on every write. Reads past
    /// it continue from SQL.
    #[arg(long, global = true, env = "PULSE_FEED_CAP", default_value_t = 800, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub feed_cap: u32,

    /// How long an unread inbox lives; every read restarts it. An expired inbox is rebuilt on the
    /// next read, and only users with an inbox get fan-out writes.
    #[arg(long, global = true, env = "PULSE_FEED_INBOX_TTL", default_value = "7d", value_parser = humantime::parse_duration)]
    pub feed_inbox_ttl: Duration,

    /// Most followers per fan-out job: a publish is split by feed shard into chunks of at most this
    /// many followers, handled by any process's workers, one Redis script call each.
    #[arg(long, global = true, env = "PULSE_FEED_FANOUT_CHUNK", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub feed_fanout_chunk: u32,

    /// Authors with at least this many followers are not fanned out: their followers' feeds merge
    /// their recent articles at read time.
    #[arg(
        long,
        global = true,
        env = "PULSE_FEED_CELEBRITY_FOLLOWERS",
        default_value_t = 10_000
    )]
    pub feed_celebrity_followers: u64,

    /// Most of a followee's recent articles a `follow` adds to the follower's inbox.
    #[arg(long, global = true, env = "PULSE_FEED_FOLLOW_BACKFILL", default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub feed_follow_backfill: u32,

    /// How often the publish outbox in SQL is checked for articles not yet relayed to the fan-out
    /// stream (published while Redis was unreachable).
    #[arg(long, global = true, env = "PULSE_FEED_RELAY_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub feed_relay_interval: Duration,

    /// Where this process keeps its search replica (an embedded Tantivy index, rebuilt from SQL
    /// when missing): the first `replica-N` in it that no other process holds. Unset: `search`
    /// in the data dir.
    #[arg(long, global = true, env = "PULSE_SEARCH_DIR")]
    pub search_dir: Option<PathBuf>,

    /// How often a search replica polls the SQL outbox for changes when idle.
    #[arg(long, global = true, env = "PULSE_SEARCH_POLL", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub search_poll: Duration,

    /// Most outbox rows a search replica applies in one commit.
    #[arg(long, global = true, env = "PULSE_SEARCH_BATCH", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub search_batch: u64,

    /// How long a search replica waits for an outbox id it stepped over (a transaction that
    /// commits after a later one) before it gives up on it as rolled back.
    #[arg(long, global = true, env = "PULSE_SEARCH_GAP_WINDOW", default_value = "60s", value_parser = humantime::parse_duration)]
    pub search_gap_window: Duration,

    /// How long search outbox rows are kept; a replica that had not applied a pruned row
    /// rebuilds from SQL.
    #[arg(long, global = true, env = "PULSE_SEARCH_OUTBOX_RETENTION", default_value = "1d", value_parser = humantime::parse_duration)]
    pub search_outbox_retention: Duration,
}

impl Config {
    /// The configuration a process gets with no flags and no environment: what tests start from.
    pub fn defaults() -> Self {
        // Clap reads each setting's environment variable while parsing; a developer's exported
        // `PULSE_*` must not change what a test starts from, so the variables are detached first.
        let command = <Cli as clap::CommandFactory>::command().mut_args(|arg| arg.env(None));
        let matches = command.get_matches_from(["pulse"]);
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
            .expect("the defaults parse")
            .config
    }

    pub fn search_dir(&self) -> PathBuf {
        self.search_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("search"))
    }

    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!(
                "sqlite://{}?mode=rwc",
                self.data_dir.join("pulse.sqlite").display()
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A secret string that never shows itself in Debug output or logs.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

pub use pulse_runtime::redacted_url;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_in_debug_output() {
        let mut config = Config::defaults();
        config.token_secret = Some(Secret::new("hunter2-hunter2-hunter2-hunter2-x"));
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn defaults_match_the_documented_names() {
        let config = Config::defaults();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.redis_prefix, None);
        assert_eq!(crate::ownership::DEFAULT_PREFIX, "pulse:");
        assert!(config.database_url().starts_with("sqlite://"));
        assert_eq!(config.http_header_timeout, Duration::from_secs(10));
        assert_eq!(config.http_body_timeout, Duration::from_secs(30));
        assert_eq!(config.max_connections, 4096);
        assert_eq!(config.ws_init_timeout, Duration::from_secs(10));
        assert_eq!(config.ws_ping_interval, Duration::from_secs(15));
        assert_eq!(config.max_sockets_per_ip, 512);
        assert_eq!(config.redis_probe.to_string(), "127.0.0.1:6379");
    }
}
