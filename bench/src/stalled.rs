//! `stalled-readers`: issue 22's slow consumers against a real server. K websocket clients
//! subscribe to a leaderboard (a snapshot stream) and K to `articlePublished` (an event stream),
//! get their first message, then stop reading their socket (open, read nothing), beside one client
//! of each that keeps reading (the control). Articles with large bodies are published until every
//! stalled article subscriber is past the server's send budget, then 100,000 votes are cast on the
//! board through the server, while the server's anonymous resident memory is sampled. Then the stalled
//! clients read again: each leaderboard one must end on the board's final snapshot, each article
//! one on a `next` coded `RESYNC_REQUIRED` whose cursor is the last article it received, then
//! `complete`, on a socket still open. The verdict compares the server's growth in memory with
//! what the send budget allows each stalled socket.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use hyper::header::HeaderValue;
use rand::Rng as _;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::StalledArgs;
use crate::cast_votes::{CAST, VoteSender, admin_poll};
use crate::database::BenchDatabase;
use crate::feed_read::{FeedFixture, metric};
use crate::http1::GraphqlConnection;
use crate::load::{self, LoadPlan, LoadResult, Stop};
use crate::proc_stats::{anonymous_memory, memory};
use crate::record_view::graphql;
use crate::report::{MIB, print_table, thousands};
use crate::server::Server;
use crate::subscribers::{
    HANDSHAKES_IN_FLIGHT, RESERVED_DESCRIPTORS, SOCKETS_PER_SOURCE, Socket, SocketLimits, lock,
    message_type, open, receive, send, shorten, subscribe_message,
};

const SMOKE_STALLED: u32 = 20;
const SMOKE_VOTES: u64 = 2_000;
const SMOKE_CLIENTS: u32 = 4;
const SMOKE_VOTERS: u32 = 4;
/// Votes cast before any subscriber connects, so that the HTTP path, the vote script and SQL have
/// taken what they keep before the idle memory is read: a share of the load, within bounds.
const WARM_UP_VOTES_SHARE: u64 = 50;
const MIN_WARM_UP_VOTES: u64 = 500;
const MAX_WARM_UP_VOTES: u64 = 2_000;
/// Articles published before any subscriber connects, for the same reason.
const WARM_UP_ARTICLES: u64 = 2;
/// What the kernel may hold for a stalled client: a small receive buffer (`SO_RCVBUF`; Linux
/// doubles it) and segment size (`TCP_MAXSEG`, IPv4's default of 536 bytes). On loopback the server's
/// kernel sizes a socket's send buffer by the 64 KiB segments there, megabytes that a stalled
/// client would fill before the server's own queue, which is what is measured, holds anything.
pub(crate) const STALLED_LIMITS: SocketLimits = SocketLimits {
    receive_buffer: Some(4 * 1024),
    segment: Some(536),
};
/// How often a stalled client sends an unsolicited `pong`: a client that reads nothing still
/// answers the server's pings at the transport's pace (the server closes a socket silent for
/// `PULSE_WS_PONG_TIMEOUT`, 10 s by default, after a ping), as graphql-ws's heartbeat does.
const HEARTBEAT: Duration = Duration::from_secs(3);
/// The server's websocket write buffer (crates/edge/src/http.rs): what it batches before it
/// writes through, beyond which it holds at most the one message being written.
const SERVER_WRITE_BUFFER: u64 = 8 * 1024;
/// What a stalled event stream's queue holds beyond its budget: the end (a `next` coded
/// `RESYNC_REQUIRED`, about 300 bytes, and a `complete`) and the server's pings (15 bytes each).
const END_ALLOWANCE: u64 = 1024;
/// Per stalled socket, beyond its messages: the queue's entries, the allocator's rounding of each
/// message and the write buffer's growth by doubling.
const SOCKET_OVERHEAD: u64 = 16 * 1024;
/// For the whole process, beyond every stalled socket: what the load itself may leave behind
/// (connection buffers, pages the allocator keeps for busy worker threads, SQLite's page cache),
/// although it ran once before the idle reading.
const PROCESS_ALLOWANCE: u64 = 32 * 1024 * 1024;
/// How long every subscriber may take to get its first message, beyond its connection schedule.
const READY_GRACE: Duration = Duration::from_secs(60);
/// How long the article warm-up waits for every subscriber before publishing another article.
const FIRST_ARTICLE_WAIT: Duration = Duration::from_secs(2);
/// The server's memory counts as settled once its readings, every [`SETTLE_POLL`], stayed within
/// [`SETTLE_SPREAD`] for this long (the allocator hands freed memory back to the system a few
/// seconds after, at times of its own); the wait ends after [`SETTLE_TIMEOUT`] regardless.
const SETTLE_QUIET: Duration = Duration::from_secs(4);
const SETTLE_SPREAD: u64 = 1024 * 1024;
const SETTLE_POLL: Duration = Duration::from_millis(250);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the control leaderboard may take to show the last vote.
const FINAL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the stalled clients may take to read what waited for them.
const READ_AGAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the server may take to hand the last queued bytes to the sockets that read again.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
const PROGRESS_POLL: Duration = Duration::from_millis(10);
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

const BOARD_SELECTION: &str = "subscription($p:ID!){ leaderboardChanged(pollId:$p, period: ALL_TIME, first: 10){ version entries { rank score option { id label } } } }";
const BOARD_QUERY: &str = "query($p:ID!){ leaderboard(pollId:$p, period: ALL_TIME, first: 10){ version entries { score option { id } } } }";
/// The body is selected so that each event is as large as the article.
const ARTICLES_SELECTION: &str = "subscription{ articlePublished{ id title body } }";
const PUBLISH: &str =
    "mutation($t:String!,$b:String!){ publishArticle(input:{title:$t, body:$b}){ id } }";
/// Article k's title ends in k, counted from 1 over the run.
const ARTICLE_TITLE: &str = "stalled article ";
const ARTICLE_ID_FIELD: &str = r#""articlePublished":{"id":""#;
const INIT: &str = r#"{"type":"connection_init","payload":{}}"#;
const PING: &str = r#"{"type":"ping"}"#;
const PONG: &str = r#"{"type":"pong"}"#;
/// The server's metrics read here.
const RESYNCS: &str = "pulse_live_slow_consumer_resyncs_total";
const SLOW_CONSUMER_CLOSES: &str = "pulse_live_slow_consumer_closes_total";
const QUEUED_BYTES: &str = "pulse_live_queued_bytes";
const SNAPSHOTS_REPLACED: &str = "pulse_live_snapshots_replaced_total";
const SOCKETS_OPEN: &str = "pulse_live_sockets_open";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    StalledBoard,
    StalledArticles,
    ControlBoard,
    ControlArticles,
}

impl Role {
    fn stalled(self) -> bool {
        matches!(self, Self::StalledBoard | Self::StalledArticles)
    }

    fn board(self) -> bool {
        matches!(self, Self::StalledBoard | Self::ControlBoard)
    }

    fn name(self) -> &'static str {
        match self {
            Self::StalledBoard => "stalled leaderboard",
            Self::StalledArticles => "stalled articlePublished",
            Self::ControlBoard => "control leaderboard",
            Self::ControlArticles => "control articlePublished",
        }
    }
}

/// A leaderboard snapshot as compared here: its version and each option's score.
#[derive(Clone, Debug, PartialEq)]
struct Board {
    version: i64,
    /// By option id.
    scores: Vec<(String, f64)>,
}

impl Board {
    /// A `Leaderboard` object's board, from a subscription's `next` or a query.
    fn of(board: &Value) -> Option<Self> {
        let version = board["version"].as_str()?.parse().ok()?;
        let mut scores = board["entries"]
            .as_array()?
            .iter()
            .map(|entry| {
                Some((
                    entry["option"]["id"].as_str()?.to_owned(),
                    entry["score"].as_f64()?,
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        scores.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Self { version, scores })
    }

    fn from_next(text: &str) -> Result<Self, String> {
        let message: Value = serde_json::from_str(text)
            .map_err(|err| format!("not JSON ({err}): {}", shorten(text)))?;
        Self::of(&message["payload"]["data"]["leaderboardChanged"])
            .ok_or_else(|| format!("not a leaderboard snapshot: {}", shorten(text)))
    }

    fn votes(&self) -> f64 {
        self.scores.iter().map(|(_, score)| score).sum()
    }
}

/// An article event as compared here: its number (from its title) and its id, the cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Article {
    number: u64,
    id: String,
}

impl Article {
    /// Read by scanning: the message carries the article's whole body.
    fn from_next(text: &str) -> Option<Self> {
        let id_at = text.find(ARTICLE_ID_FIELD)? + ARTICLE_ID_FIELD.len();
        let id = &text[id_at..][..text[id_at..].find('"')?];
        let number_at = text.find(ARTICLE_TITLE)? + ARTICLE_TITLE.len();
        let digits = &text[number_at..];
        let end = digits.find(|c: char| !c.is_ascii_digit())?;
        Some(Self {
            number: digits[..end].parse().ok()?,
            id: id.to_owned(),
        })
    }
}

/// The end of an event stream fallen behind: a `next` whose only error is coded
/// `RESYNC_REQUIRED`; answers its `extensions.cursor`.
fn resync_cursor(text: &str) -> Result<Option<String>, String> {
    let message: Value =
        serde_json::from_str(text).map_err(|err| format!("not JSON ({err}): {}", shorten(text)))?;
    let payload = &message["payload"];
    let errors = payload["errors"]
        .as_array()
        .ok_or_else(|| format!("a next without data or errors: {}", shorten(text)))?;
    let [error] = errors.as_slice() else {
        return Err(format!(
            "{} errors, not one: {}",
            errors.len(),
            shorten(text)
        ));
    };
    if error["extensions"]["code"] != "RESYNC_REQUIRED" || !payload["data"].is_null() {
        return Err(format!(
            "an error that is not the resync: {}",
            shorten(text)
        ));
    }
    Ok(error["extensions"]["cursor"].as_str().map(str::to_owned))
}

/// What every client and the tool share.
struct Shared {
    /// Article subscribers whose `subscribe` went out (their first message waits for an article).
    subscribed: AtomicU32,
    /// Clients that got their first message, by stream.
    ready_boards: AtomicU32,
    ready_articles: AtomicU32,
    /// Set once the load is over: the stalled clients read again.
    resume: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    /// The board's final state, known before the stalled clients read again.
    final_board: Mutex<Option<Board>>,
    /// The control clients' latest: the board's last snapshot, the last article's number.
    control_board: Mutex<Option<Board>>,
    control_article: AtomicU64,
    /// The largest message of each stream, as the controls received it.
    largest_snapshot: AtomicU64,
    largest_article: AtomicU64,
    /// Stalled clients that read again and found what they must.
    boards_caught_up: AtomicU32,
    articles_resynced: AtomicU32,
    /// What they read again: snapshots, articles (sum and most).
    snapshots_read_again: AtomicU64,
    articles_read_again: AtomicU64,
    most_articles_read_again: AtomicU64,
    failures: AtomicU64,
    first_failures: Mutex<Vec<String>>,
}

impl Shared {
    fn new() -> Self {
        Self {
            subscribed: AtomicU32::new(0),
            ready_boards: AtomicU32::new(0),
            ready_articles: AtomicU32::new(0),
            resume: watch::channel(false).0,
            stop: watch::channel(false).0,
            final_board: Mutex::new(None),
            control_board: Mutex::new(None),
            control_article: AtomicU64::new(0),
            largest_snapshot: AtomicU64::new(0),
            largest_article: AtomicU64::new(0),
            boards_caught_up: AtomicU32::new(0),
            articles_resynced: AtomicU32::new(0),
            snapshots_read_again: AtomicU64::new(0),
            articles_read_again: AtomicU64::new(0),
            most_articles_read_again: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            first_failures: Mutex::new(Vec::new()),
        }
    }

    fn fail(&self, role: Role, client: u32, error: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut first = lock(&self.first_failures);
        if first.len() < 5 {
            first.push(format!("{} client {client}: {error}", role.name()));
        }
    }

    fn failed(&self) -> bool {
        self.failures.load(Ordering::Relaxed) > 0
    }

    fn first_failures(&self) -> String {
        lock(&self.first_failures).join(" | ")
    }
}

struct Clients {
    server: SocketAddr,
    source_octet: u8,
    board_subscribe: String,
    articles_subscribe: String,
    shared: Arc<Shared>,
}

impl Clients {
    /// One client from connect until the tool stops it; a failure is recorded in `shared`.
    async fn run(&self, index: u32, role: Role, permit: OwnedSemaphorePermit) {
        let mut stop = self.shared.stop.subscribe();
        let source = Ipv4Addr::new(
            127,
            self.source_octet,
            0,
            (1 + index / SOCKETS_PER_SOURCE) as u8,
        );
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => {}
            ended = self.session(source, role, permit) => if let Err(error) = ended {
                self.shared.fail(role, index, error);
            },
        }
    }

    async fn session(
        &self,
        source: Ipv4Addr,
        role: Role,
        permit: OwnedSemaphorePermit,
    ) -> Result<(), String> {
        let limits = if role.stalled() {
            STALLED_LIMITS
        } else {
            SocketLimits::default()
        };
        let mut socket = open(self.server, source, limits).await?;
        send(&mut socket, INIT.to_owned()).await?;
        loop {
            let text = receive(&mut socket).await?;
            match message_type(&text).as_ref() {
                "connection_ack" => break,
                "ping" => send(&mut socket, PONG.to_owned()).await?,
                other => return Err(format!("{other} before connection_ack: {}", shorten(&text))),
            }
        }
        let subscribe = if role.board() {
            &self.board_subscribe
        } else {
            &self.articles_subscribe
        };
        send(&mut socket, subscribe.clone()).await?;
        let mut permit = Some(permit);
        if !role.board() {
            // Its first message waits for an article: the next client may connect meanwhile.
            permit = None;
            self.shared.subscribed.fetch_add(1, Ordering::Relaxed);
        }
        let first = next_text(&mut socket).await?;
        drop(permit);
        let shared = &self.shared;
        match role {
            Role::ControlBoard | Role::StalledBoard => {
                let board = Board::from_next(&first)?;
                shared.ready_boards.fetch_add(1, Ordering::Relaxed);
                if role == Role::ControlBoard {
                    return self.control_board(&mut socket, board, first.len()).await;
                }
                self.stall(&mut socket).await?;
                self.read_board_again(&mut socket, board).await?;
                shared.boards_caught_up.fetch_add(1, Ordering::Relaxed);
            }
            Role::ControlArticles | Role::StalledArticles => {
                let article = Article::from_next(&first)
                    .ok_or_else(|| format!("not an article: {}", shorten(&first)))?;
                shared.ready_articles.fetch_add(1, Ordering::Relaxed);
                if role == Role::ControlArticles {
                    return self
                        .control_articles(&mut socket, article, first.len())
                        .await;
                }
                self.stall(&mut socket).await?;
                self.read_articles_again(&mut socket, article).await?;
                shared.articles_resynced.fetch_add(1, Ordering::Relaxed);
            }
        }
        linger(&mut socket).await
    }

    /// Reads nothing until the tool says so; only sends a `pong` now and then.
    async fn stall(&self, socket: &mut Socket) -> Result<(), String> {
        let mut resume = self.shared.resume.subscribe();
        loop {
            let resumed = tokio::time::timeout(HEARTBEAT, async {
                resume.wait_for(|resumed| *resumed).await.map(|_| ())
            })
            .await;
            match resumed {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(_)) => return Err("the tool went away".into()),
                Err(_) => send(socket, PONG.to_owned()).await?,
            }
        }
    }

    /// Reads what waited until the board's final snapshot, each snapshot no older than the last.
    async fn read_board_again(&self, socket: &mut Socket, first: Board) -> Result<(), String> {
        let wanted = lock(&self.shared.final_board)
            .clone()
            .ok_or("the final board is unknown")?;
        let mut last = first;
        let mut read = 0;
        while last != wanted {
            if last.version >= wanted.version {
                return Err(format!(
                    "snapshot version {} with scores {:?}; the final one is version {} with {:?}",
                    last.version, last.scores, wanted.version, wanted.scores
                ));
            }
            let board = Board::from_next(&next_text(socket).await?)?;
            if board.version < last.version {
                return Err(format!(
                    "snapshot version {} after version {}",
                    board.version, last.version
                ));
            }
            last = board;
            read += 1;
        }
        self.shared
            .snapshots_read_again
            .fetch_add(read, Ordering::Relaxed);
        Ok(())
    }

    /// Reads what waited: articles in order from the first, then the resync whose cursor is the
    /// last of them, then `complete`; then checks that the socket still answers.
    async fn read_articles_again(&self, socket: &mut Socket, first: Article) -> Result<(), String> {
        let mut last = first;
        let mut read = 0;
        let cursor = loop {
            let text = next_text(socket).await?;
            if text.contains(r#""errors":"#) {
                break resync_cursor(&text)?;
            }
            let article = Article::from_next(&text)
                .ok_or_else(|| format!("not an article: {}", shorten(&text)))?;
            if article.number != last.number + 1 {
                return Err(format!(
                    "article {} after article {}: a gap",
                    article.number, last.number
                ));
            }
            last = article;
            read += 1;
        };
        if cursor.as_deref() != Some(last.id.as_str()) {
            return Err(format!(
                "RESYNC_REQUIRED with cursor {cursor:?}; the last article received was {} ({})",
                last.id, last.number
            ));
        }
        loop {
            let text = receive(socket).await?;
            match message_type(&text).as_ref() {
                "complete" => break,
                "ping" => send(socket, PONG.to_owned()).await?,
                "pong" => {}
                other => {
                    return Err(format!(
                        "{other} after the resync, before complete: {}",
                        shorten(&text)
                    ));
                }
            }
        }
        send(socket, PING.to_owned()).await?;
        loop {
            let text = receive(socket).await?;
            match message_type(&text).as_ref() {
                "pong" => break,
                "ping" => send(socket, PONG.to_owned()).await?,
                other => {
                    return Err(format!(
                        "{other} after complete, before the pong: {}",
                        shorten(&text)
                    ));
                }
            }
        }
        let shared = &self.shared;
        shared
            .articles_read_again
            .fetch_add(read, Ordering::Relaxed);
        shared
            .most_articles_read_again
            .fetch_max(read, Ordering::Relaxed);
        Ok(())
    }

    /// Keeps reading every snapshot, each no older than the last; the latest is the board's.
    async fn control_board(
        &self,
        socket: &mut Socket,
        first: Board,
        bytes: usize,
    ) -> Result<(), String> {
        let shared = &self.shared;
        shared
            .largest_snapshot
            .fetch_max(bytes as u64, Ordering::Relaxed);
        *lock(&shared.control_board) = Some(first);
        loop {
            let text = next_text(socket).await?;
            let board = Board::from_next(&text)?;
            shared
                .largest_snapshot
                .fetch_max(text.len() as u64, Ordering::Relaxed);
            let mut latest = lock(&shared.control_board);
            if let Some(latest) = latest.as_ref()
                && board.version < latest.version
            {
                return Err(format!(
                    "snapshot version {} after version {}",
                    board.version, latest.version
                ));
            }
            *latest = Some(board);
        }
    }

    /// Keeps reading every article, in order without a gap; never falls behind.
    async fn control_articles(
        &self,
        socket: &mut Socket,
        first: Article,
        bytes: usize,
    ) -> Result<(), String> {
        let shared = &self.shared;
        shared
            .largest_article
            .fetch_max(bytes as u64, Ordering::Relaxed);
        shared
            .control_article
            .store(first.number, Ordering::Relaxed);
        let mut last = first.number;
        loop {
            let text = next_text(socket).await?;
            if text.contains(r#""errors":"#) {
                return Err(format!("the reading client got {}", shorten(&text)));
            }
            let article = Article::from_next(&text)
                .ok_or_else(|| format!("not an article: {}", shorten(&text)))?;
            if article.number != last + 1 {
                return Err(format!(
                    "article {} after article {last}: a gap",
                    article.number
                ));
            }
            last = article.number;
            shared
                .largest_article
                .fetch_max(text.len() as u64, Ordering::Relaxed);
            shared.control_article.store(last, Ordering::Relaxed);
        }
    }
}

/// The next `next` message, answering pings on the way; anything else ends the client.
async fn next_text(
    socket: &mut Socket,
) -> Result<tokio_tungstenite::tungstenite::Utf8Bytes, String> {
    loop {
        let text = receive(socket).await?;
        match message_type(&text).as_ref() {
            "next" => return Ok(text),
            "ping" => send(socket, PONG.to_owned()).await?,
            "pong" => {}
            other => return Err(format!("unexpected {other}: {}", shorten(&text))),
        }
    }
}

/// Keeps the socket open and answered until the tool stops; nothing more may arrive.
async fn linger(socket: &mut Socket) -> Result<(), String> {
    loop {
        let text = receive(socket).await?;
        match message_type(&text).as_ref() {
            "ping" => send(socket, PONG.to_owned()).await?,
            "pong" => {}
            other => return Err(format!("{other} once done: {}", shorten(&text))),
        }
    }
}

/// The server's resident memory and the machine's kernel TCP buffers, sampled until dropped;
/// the highest readings since the last [`Sampler::take_peaks`].
struct Sampler {
    rss_peak: Arc<AtomicU64>,
    tcp_peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let rss_peak = Arc::new(AtomicU64::new(0));
        let tcp_peak = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (rss_peak, tcp_peak) = (rss_peak.clone(), tcp_peak.clone());
            let pid = pid.to_string();
            async move {
                loop {
                    if let Ok(rss) = anonymous_memory(&pid) {
                        rss_peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    if let Some(tcp) = kernel_tcp_bytes() {
                        tcp_peak.fetch_max(tcp, Ordering::Relaxed);
                    }
                    tokio::time::sleep(SAMPLE_EVERY).await;
                }
            }
        });
        Self {
            rss_peak,
            tcp_peak,
            task,
        }
    }

    /// The highest server RSS and kernel TCP memory since the last call (or the start).
    fn take_peaks(&self) -> (u64, u64) {
        (
            self.rss_peak.swap(0, Ordering::Relaxed),
            self.tcp_peak.swap(0, Ordering::Relaxed),
        )
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Memory the kernel holds in TCP buffers, the whole machine's (`/proc/net/sockstat`, in pages).
fn kernel_tcp_bytes() -> Option<u64> {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = sockstat.lines().find(|line| line.starts_with("TCP:"))?;
    let mut fields = line.split_whitespace();
    fields.find(|field| *field == "mem")?;
    let pages: u64 = fields.next()?.parse().ok()?;
    Some(pages * 4096)
}

/// What a stalled socket may cost the server, in bytes, at most.
struct Bounds {
    budget: u64,
    largest_article: u64,
    largest_snapshot: u64,
}

impl Bounds {
    /// An event stream: a full budget of queued articles and its end, the write buffer and the
    /// one message being written past it, and the socket's overhead.
    fn articles_socket(&self) -> u64 {
        self.budget + END_ALLOWANCE + SERVER_WRITE_BUFFER + self.largest_article + SOCKET_OVERHEAD
    }

    /// A snapshot stream: the one unsent snapshot (a newer one replaces it in place), the write
    /// buffer and the snapshot being written past it, and the socket's overhead.
    fn board_socket(&self) -> u64 {
        2 * self.largest_snapshot + SERVER_WRITE_BUFFER + SOCKET_OVERHEAD
    }

    fn total(&self, stalled: u32) -> u64 {
        u64::from(stalled) * (self.articles_socket() + self.board_socket()) + PROCESS_ALLOWANCE
    }
}

/// Everything one run measured.
struct Outcome {
    stalled: u32,
    budget: u64,
    connect_seconds: f64,
    sockets_open: f64,
    rss_before: u64,
    rss_idle: u64,
    /// After the articles, with every stalled article subscriber past its budget.
    rss_articles: u64,
    peak_articles: u64,
    peak_votes: u64,
    /// After the votes, the stalled clients still stalled.
    rss_votes: u64,
    /// Once every stalled client read again.
    rss_after: u64,
    /// `VmHWM`: the highest VmRSS (file pages included) since the server started.
    vm_peak: u64,
    tcp_idle: u64,
    tcp_peak: u64,
    /// Articles published: before any subscriber, for the first messages, then to fill the
    /// stalled subscribers' budgets.
    warm_up_articles: u64,
    first_articles: u64,
    articles: u64,
    articles_seconds: f64,
    largest_article: u64,
    largest_snapshot: u64,
    resyncs: f64,
    slow_consumer_closes: f64,
    queued_articles: f64,
    queued_votes: f64,
    queued_after: f64,
    snapshots_replaced: f64,
    warm_up_votes: LoadResult,
    votes: LoadResult,
    final_board: Board,
    control_board: Option<Board>,
    control_article: u64,
    boards_caught_up: u32,
    articles_resynced: u32,
    snapshots_read_again: u64,
    articles_read_again: u64,
    most_articles_read_again: u64,
    read_again_seconds: f64,
    failures: u64,
    first_failures: Vec<String>,
}

impl Outcome {
    fn bounds(&self) -> Bounds {
        Bounds {
            budget: self.budget,
            largest_article: self.largest_article,
            largest_snapshot: self.largest_snapshot,
        }
    }

    fn peak(&self) -> u64 {
        self.peak_articles.max(self.peak_votes)
    }

    fn growth(&self) -> i64 {
        self.peak() as i64 - self.rss_idle as i64
    }

    /// Per stalled subscriber, both streams counted.
    fn growth_per_stalled(&self) -> f64 {
        self.growth() as f64 / f64::from(2 * self.stalled)
    }

    fn articles_growth_per_stalled(&self) -> f64 {
        (self.rss_articles as f64 - self.rss_idle as f64) / f64::from(self.stalled)
    }

    fn votes_growth_per_stalled(&self) -> f64 {
        (self.peak_votes as f64 - self.rss_articles as f64) / f64::from(self.stalled)
    }

    fn accepted_votes(&self) -> u64 {
        self.warm_up_votes.ok + self.votes.ok
    }

    fn last_article(&self) -> u64 {
        self.warm_up_articles + self.first_articles + self.articles
    }

    /// Each failed check, in words.
    fn failed_checks(&self) -> Vec<String> {
        let mut failed = Vec::new();
        if self.failures > 0 {
            failed.push(format!(
                "{} client failures; first: {}",
                self.failures,
                self.first_failures.join(" | ")
            ));
        }
        if self.votes.errors > 0 || self.warm_up_votes.errors > 0 {
            failed.push(format!(
                "{} votes failed; first: {}",
                self.votes.errors + self.warm_up_votes.errors,
                self.votes
                    .first_errors
                    .iter()
                    .chain(&self.warm_up_votes.first_errors)
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
        if self.final_board.votes() != self.accepted_votes() as f64 {
            failed.push(format!(
                "the board counts {} votes; {} were accepted",
                self.final_board.votes(),
                self.accepted_votes()
            ));
        }
        if self.control_board.as_ref() != Some(&self.final_board) {
            failed.push(format!(
                "the reading client's last snapshot {:?} is not the board's {:?}",
                self.control_board, self.final_board
            ));
        }
        if self.control_article != self.last_article() {
            failed.push(format!(
                "the reading client's last article is {}; {} were published",
                self.control_article,
                self.last_article()
            ));
        }
        if self.boards_caught_up < self.stalled {
            failed.push(format!(
                "{} of {} stalled leaderboard clients got the final snapshot",
                self.boards_caught_up, self.stalled
            ));
        }
        if self.articles_resynced < self.stalled {
            failed.push(format!(
                "{} of {} stalled article clients got RESYNC_REQUIRED with the last cursor, complete and a pong",
                self.articles_resynced, self.stalled
            ));
        }
        if self.slow_consumer_closes > 0.0 {
            failed.push(format!(
                "{} sockets closed with 4413",
                self.slow_consumer_closes
            ));
        }
        let bound = self.bounds().total(self.stalled);
        if self.growth() > bound as i64 {
            failed.push(format!(
                "server RSS grew {:.1} MiB from idle to peak; the bound is {:.1} MiB",
                self.growth() as f64 / MIB,
                bound as f64 / MIB
            ));
        }
        failed
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        let kib = |bytes: f64| bytes / 1024.0;
        let mib = |bytes: u64| bytes as f64 / MIB;
        let bounds = self.bounds();
        let stalled = thousands(f64::from(self.stalled));
        let mut rows = vec![
            (
                "subscribers",
                format!(
                    "{stalled} stalled on the leaderboard, {stalled} on articlePublished, 1 reading each; ready in {:.1} s, server saw {} websockets",
                    self.connect_seconds,
                    thousands(self.sockets_open)
                ),
            ),
            (
                "send budget",
                format!(
                    "{} B per socket (PULSE_WS_SEND_BUDGET), beyond the server's {} KiB write buffer; stalled clients' SO_RCVBUF {} B, TCP_MAXSEG {} B",
                    thousands(self.budget as f64),
                    SERVER_WRITE_BUFFER / 1024,
                    STALLED_LIMITS.receive_buffer.unwrap_or(0),
                    STALLED_LIMITS.segment.unwrap_or(0)
                ),
            ),
            (
                "articles",
                format!(
                    "{} published in {:.1} s ({} B messages) until the server had ended {} stalled streams with RESYNC_REQUIRED; {} before them for the first messages",
                    self.articles,
                    self.articles_seconds,
                    thousands(self.largest_article as f64),
                    thousands(self.resyncs),
                    self.first_articles
                ),
            ),
            (
                "votes",
                format!(
                    "{} accepted, {} failed in {:.1} s ({}/s; p50 {:.1} ms, p99 {:.1} ms), after {} warm-up votes",
                    thousands(self.votes.ok as f64),
                    thousands(self.votes.errors as f64),
                    self.votes.elapsed.as_secs_f64(),
                    thousands(self.votes.ok as f64 / self.votes.elapsed.as_secs_f64()),
                    self.votes.ms(0.50),
                    self.votes.ms(0.99),
                    thousands(self.warm_up_votes.ok as f64)
                ),
            ),
            (
                "server RSS (RssAnon)",
                format!(
                    "{:.1} MiB before the subscribers, {:.1} MiB idle with them\n{:.1} MiB after the articles (peak {:.1} MiB), {:.1} MiB after the votes (peak {:.1} MiB)\n{:.1} MiB once every stalled client read again; VmRSS peak {:.1} MiB",
                    mib(self.rss_before),
                    mib(self.rss_idle),
                    mib(self.rss_articles),
                    mib(self.peak_articles),
                    mib(self.rss_votes),
                    mib(self.peak_votes),
                    mib(self.rss_after),
                    mib(self.vm_peak)
                ),
            ),
            (
                "queued (server's gauge)",
                format!(
                    "{:.1} KiB per stalled article socket after the articles, {:.1} KiB per stalled socket after the votes, {} B once read",
                    kib(self.queued_articles) / f64::from(self.stalled),
                    kib(self.queued_votes) / f64::from(2 * self.stalled),
                    thousands(self.queued_after)
                ),
            ),
            (
                "snapshots replaced",
                format!(
                    "{} unsent snapshots replaced by newer ones",
                    thousands(self.snapshots_replaced)
                ),
            ),
            (
                "growth per stalled article sub",
                format!(
                    "{:.1} KiB (idle to after the articles); bound {:.1} KiB = budget + {} B end + {} KiB write buffer + {} B message + {} KiB overhead",
                    kib(self.articles_growth_per_stalled()),
                    kib(bounds.articles_socket() as f64),
                    END_ALLOWANCE,
                    SERVER_WRITE_BUFFER / 1024,
                    thousands(self.largest_article as f64),
                    SOCKET_OVERHEAD / 1024
                ),
            ),
            (
                "growth per stalled board sub",
                format!(
                    "{:.1} KiB (after the articles to the votes' peak), over {} votes; bound {:.1} KiB = 2 x {} B snapshot + {} KiB write buffer + {} KiB overhead",
                    kib(self.votes_growth_per_stalled()),
                    thousands(self.votes.ok as f64),
                    kib(bounds.board_socket() as f64),
                    thousands(self.largest_snapshot as f64),
                    SERVER_WRITE_BUFFER / 1024,
                    SOCKET_OVERHEAD / 1024
                ),
            ),
            (
                "growth at peak",
                format!(
                    "{:.1} MiB over idle = {:.1} KiB per stalled subscriber; bound {:.1} MiB = {stalled} x ({:.1} + {:.1} KiB) + {} MiB for the process",
                    self.growth() as f64 / MIB,
                    kib(self.growth_per_stalled()),
                    mib(bounds.total(self.stalled)),
                    kib(bounds.articles_socket() as f64),
                    kib(bounds.board_socket() as f64),
                    PROCESS_ALLOWANCE / 1024 / 1024
                ),
            ),
            (
                "kernel TCP buffers",
                format!(
                    "{:.1} MiB idle, {:.1} MiB at peak (whole machine; not the server's RSS)",
                    mib(self.tcp_idle),
                    mib(self.tcp_peak)
                ),
            ),
            (
                "read again: leaderboard",
                format!(
                    "{} of {stalled} ended on the final snapshot (version {}, {} votes) after {:.1} older ones each on average",
                    thousands(f64::from(self.boards_caught_up)),
                    self.final_board.version,
                    thousands(self.final_board.votes()),
                    self.snapshots_read_again as f64 / f64::from(self.boards_caught_up.max(1))
                ),
            ),
            (
                "read again: articles",
                format!(
                    "{} of {stalled} got RESYNC_REQUIRED with the last article's id as cursor, complete, and a pong; {:.1} articles each on average (most {}), in {:.1} s",
                    thousands(f64::from(self.articles_resynced)),
                    self.articles_read_again as f64 / f64::from(self.articles_resynced.max(1)),
                    self.most_articles_read_again,
                    self.read_again_seconds
                ),
            ),
        ];
        let failed = self.failed_checks();
        rows.push((
            "verdict",
            if failed.is_empty() {
                "PASS".to_owned()
            } else {
                format!("FAIL: {}", failed.join("\n"))
            },
        ));
        rows
    }

    fn json(&self, smoke: bool) -> Value {
        let bounds = self.bounds();
        json!({
            "scenario": "stalled-readers",
            "smoke": smoke,
            "stalled_per_stream": self.stalled,
            "send_budget_bytes": self.budget,
            "server_write_buffer_bytes": SERVER_WRITE_BUFFER,
            "stalled_receive_buffer_bytes": STALLED_LIMITS.receive_buffer,
            "stalled_segment_bytes": STALLED_LIMITS.segment,
            "connect_seconds": self.connect_seconds,
            "sockets_open": self.sockets_open,
            "rss_anon_bytes": {
                "before": self.rss_before,
                "idle": self.rss_idle,
                "after_articles": self.rss_articles,
                "peak_articles": self.peak_articles,
                "after_votes": self.rss_votes,
                "peak_votes": self.peak_votes,
                "after_read_again": self.rss_after,
            },
            "vm_rss_peak_bytes": self.vm_peak,
            "kernel_tcp_bytes": { "idle": self.tcp_idle, "peak": self.tcp_peak },
            "articles": {
                "warm_up": self.warm_up_articles,
                "first_messages": self.first_articles,
                "to_fill_budgets": self.articles,
                "seconds": self.articles_seconds,
                "largest_message_bytes": self.largest_article,
                "resyncs": self.resyncs,
            },
            "votes": {
                "warm_up": self.warm_up_votes.ok,
                "accepted": self.votes.ok,
                "errors": self.votes.errors + self.warm_up_votes.errors,
                "seconds": self.votes.elapsed.as_secs_f64(),
                "latency_ms": self.votes.latency_json(),
            },
            "largest_snapshot_bytes": self.largest_snapshot,
            "queued_bytes": {
                "after_articles": self.queued_articles,
                "after_votes": self.queued_votes,
                "after_read_again": self.queued_after,
            },
            "snapshots_replaced": self.snapshots_replaced,
            "slow_consumer_closes": self.slow_consumer_closes,
            "growth_bytes_per_stalled": {
                "articles_phase_per_article_subscriber": self.articles_growth_per_stalled(),
                "votes_phase_per_board_subscriber": self.votes_growth_per_stalled(),
                "peak_per_subscriber": self.growth_per_stalled(),
            },
            "bound_bytes": {
                "per_article_socket": bounds.articles_socket(),
                "per_board_socket": bounds.board_socket(),
                "process_allowance": PROCESS_ALLOWANCE,
                "total": bounds.total(self.stalled),
            },
            "growth_bytes": self.growth(),
            "final_board": { "version": self.final_board.version, "votes": self.final_board.votes() },
            "read_again": {
                "boards_caught_up": self.boards_caught_up,
                "articles_resynced": self.articles_resynced,
                "snapshots_read": self.snapshots_read_again,
                "articles_read": self.articles_read_again,
                "most_articles_read": self.most_articles_read_again,
                "seconds": self.read_again_seconds,
            },
            "failures": self.failures,
            "first_failures": self.first_failures,
            "failed_checks": self.failed_checks(),
            "passed": self.failed_checks().is_empty(),
        })
    }
}

pub async fn run(args: StalledArgs) -> anyhow::Result<()> {
    // The server is spawned by this process and inherits the raised limit.
    let descriptors =
        rlimit::increase_nofile_limit(u64::MAX).context("cannot raise the descriptor limit")?;
    let most = descriptors.saturating_sub(RESERVED_DESCRIPTORS);
    let smoke = args.common.smoke;
    let stalled = if smoke { SMOKE_STALLED } else { args.stalled };
    let sockets = 2 * u64::from(stalled) + 2;
    ensure!(
        sockets <= most,
        "{stalled} stalled subscribers per stream make {sockets} sockets, as many descriptors in \
         the server and in this tool, and the limit here is {descriptors} per process \
         (RLIMIT_NOFILE's hard limit, less {RESERVED_DESCRIPTORS} for everything else)"
    );
    let budget = args
        .send_budget
        .unwrap_or(pulse::Config::defaults().ws_send_budget as u64);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let database = BenchDatabase::create(None).await?;
    let max_connections = (sockets + 256).to_string();
    let budget_setting = budget.to_string();
    let users = FeedFixture::new();
    let env = users.server_env(&[
        ("PULSE_MAX_CONNECTIONS", max_connections.as_str()),
        // Issue 22's cap on sockets per client address; every client here is on loopback.
        ("PULSE_MAX_SOCKETS_PER_IP", "0"),
        ("PULSE_WS_SEND_BUDGET", budget_setting.as_str()),
        // The search replica indexes every article published, its writer taking up to 64 MiB
        // while it does and giving it back after: the run's articles would be indexed in the
        // middle of the measure. Polled hourly, the replica indexes nothing during the run.
        ("PULSE_SEARCH_POLL", "1h"),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    eprintln!(
        "starting {} for {} stalled subscribers per stream ...",
        args.server_bin.display(),
        thousands(f64::from(stalled))
    );
    let mut server = Server::on_database(
        &args.server_bin,
        &args.common.redis_url,
        &http,
        &database.url,
        &env,
    )
    .await?;
    let outcome = measure(&args, stalled, budget, &server, &database, &users, &http).await;
    let stopped = server.stop().await;
    let (_, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    crate::redis_util::delete_prefix(&mut redis, &server.redis_prefix).await?;
    database.remove().await?;
    let outcome = outcome?;
    stopped?;
    print_table(
        &format!(
            "pulse-bench stalled-readers: {} stalled subscribers per stream, {} votes",
            thousands(f64::from(stalled)),
            thousands(outcome.votes.ok as f64)
        ),
        &outcome.rows(),
    );
    if args.common.json {
        println!("{}", outcome.json(smoke));
    }
    let failed = outcome.failed_checks();
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// The poll, its voters and the author, on the running server.
struct Fixture {
    poll: String,
    vote_bodies: Arc<[Bytes]>,
    authorizations: Arc<[HeaderValue]>,
    author: String,
    body: String,
    /// The number of the next article published.
    next_article: u64,
}

impl Fixture {
    async fn publish(&mut self, http: &reqwest::Client, server: &Server) -> anyhow::Result<()> {
        let title = format!("{ARTICLE_TITLE}{}", self.next_article);
        graphql(
            http,
            &server.url("/graphql"),
            Some(&self.author),
            PUBLISH,
            json!({ "t": title, "b": self.body }),
        )
        .await
        .with_context(|| format!("publishing article {}", self.next_article))?;
        self.next_article += 1;
        Ok(())
    }

    async fn vote(&self, server: &Server, clients: u32, votes: u64) -> LoadResult {
        load::run(
            (0..clients)
                .map(|_| VoteSender {
                    connection: GraphqlConnection::new(server.addr),
                    bodies: self.vote_bodies.clone(),
                    authorizations: self.authorizations.clone(),
                })
                .collect(),
            LoadPlan {
                stop: Stop::Requests(votes),
                rate: None,
            },
        )
        .await
    }
}

async fn measure(
    args: &StalledArgs,
    stalled: u32,
    budget: u64,
    server: &Server,
    database: &BenchDatabase,
    users: &FeedFixture,
    http: &reqwest::Client,
) -> anyhow::Result<Outcome> {
    let smoke = args.common.smoke;
    let (votes, clients, voters) = if smoke {
        (SMOKE_VOTES, SMOKE_CLIENTS, SMOKE_VOTERS)
    } else {
        (args.votes, args.clients, args.voters)
    };
    let url = server.url("/graphql");
    let poll = json!({
        "title": "Stalled readers bench",
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
    // Written into SQL with tokens signed by the server's secret: a sign-up's argon2 hash takes
    // 19 MiB, which the allocator gives back to the system at a time of its own.
    let sql = database.connect().await?;
    let voters = users.users(&sql, "voter", voters as usize).await?;
    let author = users.users(&sql, "author", 1).await?[0];
    sql.close().await.ok();
    let mut fixture = Fixture {
        vote_bodies: options
            .iter()
            .map(|option| {
                json!({ "query": CAST, "variables": { "p": poll, "o": option } })
                    .to_string()
                    .into()
            })
            .collect(),
        authorizations: voters
            .iter()
            .map(|&voter| {
                Ok(HeaderValue::from_str(&format!(
                    "Bearer {}",
                    users.token(voter)?
                ))?)
            })
            .collect::<anyhow::Result<_>>()?,
        author: users.token(author)?,
        body: article_body(args.article_bytes as usize),
        poll,
        next_article: 1,
    };
    let warm_up = (votes / WARM_UP_VOTES_SHARE).clamp(MIN_WARM_UP_VOTES, MAX_WARM_UP_VOTES);
    eprintln!("warming up: {warm_up} votes, {WARM_UP_ARTICLES} articles ...");
    let warm_up_votes = fixture.vote(server, clients, warm_up).await;
    for _ in 0..WARM_UP_ARTICLES {
        fixture.publish(http, server).await?;
    }

    let pid = server.pid().to_string();
    eprintln!("waiting for the server's memory to settle ...");
    let rss_before = settle(&pid).await?;
    let shared = Arc::new(Shared::new());
    let clients_of = Arc::new(Clients {
        server: server.addr,
        source_octet: rand::rng().random_range(2..=254),
        board_subscribe: subscribe_message(BOARD_SELECTION, json!({ "p": fixture.poll })),
        articles_subscribe: subscribe_message(ARTICLES_SELECTION, json!({})),
        shared: shared.clone(),
    });
    let roles: Vec<Role> = std::iter::repeat_n(Role::StalledBoard, stalled as usize)
        .chain(std::iter::repeat_n(Role::StalledArticles, stalled as usize))
        .chain([Role::ControlBoard, Role::ControlArticles])
        .collect();
    let total = roles.len() as u32;
    eprintln!(
        "connecting {} clients at up to {}/s ...",
        thousands(f64::from(total)),
        args.connect_per_sec
    );
    let connect_started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT));
    let spacing = Duration::from_secs_f64(1.0 / f64::from(args.connect_per_sec));
    let mut next_connect = tokio::time::Instant::now();
    for (index, role) in roles.into_iter().enumerate() {
        tokio::time::sleep_until(next_connect).await;
        next_connect += spacing;
        let permit = handshakes.clone().acquire_owned().await?;
        let clients_of = clients_of.clone();
        tasks.spawn(async move { clients_of.run(index as u32, role, permit).await });
        if shared.failed() {
            break;
        }
    }
    let ready_by = connect_started
        + READY_GRACE
        + Duration::from_secs_f64(f64::from(total) / f64::from(args.connect_per_sec));
    let each = stalled + 1;
    let connected = wait_until(&shared, ready_by, || {
        shared.ready_boards.load(Ordering::Relaxed) >= each
            && shared.subscribed.load(Ordering::Relaxed) >= each
    })
    .await;
    // A subscription may reach Redis a moment after its `subscribe`: articles are published
    // until every article client has one.
    let first_from = fixture.next_article;
    let mut ready = connected;
    while ready {
        fixture.publish(http, server).await?;
        let wait = (Instant::now() + FIRST_ARTICLE_WAIT).min(ready_by);
        if wait_until(&shared, wait, || {
            shared.ready_articles.load(Ordering::Relaxed) >= each
        })
        .await
        {
            break;
        }
        ready = !shared.failed() && Instant::now() < ready_by;
    }
    let first_articles = fixture.next_article - first_from;
    let connect_seconds = connect_started.elapsed().as_secs_f64();
    if !ready {
        stop_clients(&shared, &mut tasks).await;
        bail!(
            "after {connect_seconds:.1} s, {} of {each} leaderboard and {} of {each} article clients had their first message; {} client failures, first: {}",
            shared.ready_boards.load(Ordering::Relaxed),
            shared.ready_articles.load(Ordering::Relaxed),
            shared.failures.load(Ordering::Relaxed),
            shared.first_failures()
        );
    }

    let rss_idle = settle(&pid).await?;
    let tcp_idle = kernel_tcp_bytes().unwrap_or(0);
    let sockets_open = metric(http, server, SOCKETS_OPEN).await?;
    let sampler = Sampler::start(server.pid());

    eprintln!(
        "publishing articles until {stalled} stalled article streams are past the budget ..."
    );
    let resyncs_before = metric(http, server, RESYNCS).await?;
    let articles_from = fixture.next_article;
    let articles_started = Instant::now();
    let mut resyncs = 0.0;
    while resyncs < f64::from(stalled) && !shared.failed() {
        if fixture.next_article - articles_from >= u64::from(args.max_articles) {
            stop_clients(&shared, &mut tasks).await;
            bail!(
                "after {} articles only {resyncs} of {stalled} stalled article streams were past the budget",
                args.max_articles
            );
        }
        fixture.publish(http, server).await?;
        resyncs = metric(http, server, RESYNCS).await? - resyncs_before;
    }
    let articles = fixture.next_article - articles_from;
    let articles_seconds = articles_started.elapsed().as_secs_f64();
    let last_article = fixture.next_article - 1;
    wait_until(&shared, Instant::now() + FINAL_TIMEOUT, || {
        shared.control_article.load(Ordering::Relaxed) >= last_article
    })
    .await;
    let rss_articles = anonymous_memory(&pid)?;
    let queued_articles = metric(http, server, QUEUED_BYTES).await?;
    let (peak_articles, tcp_peak_articles) = sampler.take_peaks();
    // The sampler reads every 50 ms: the reading just taken may be higher than any of its.
    let peak_articles = peak_articles.max(rss_articles);

    eprintln!("casting {votes} votes: {clients} clients ...");
    let cast = fixture.vote(server, clients, votes).await;
    let accepted = (warm_up_votes.ok + cast.ok) as f64;
    wait_until(&shared, Instant::now() + FINAL_TIMEOUT, || {
        lock(&shared.control_board)
            .as_ref()
            .is_some_and(|board| board.votes() >= accepted)
    })
    .await;
    let rss_votes = anonymous_memory(&pid)?;
    let queued_votes = metric(http, server, QUEUED_BYTES).await?;
    let (peak_votes, tcp_peak_votes) = sampler.take_peaks();
    let peak_votes = peak_votes.max(rss_votes);
    drop(sampler);
    let read = graphql(http, &url, None, BOARD_QUERY, json!({ "p": fixture.poll })).await?;
    let final_board =
        Board::of(&read["data"]["leaderboard"]).context("the leaderboard query's answer")?;
    *lock(&shared.final_board) = Some(final_board.clone());

    eprintln!("the stalled clients read again ...");
    let read_again_started = Instant::now();
    shared.resume.send_replace(true);
    wait_until(&shared, Instant::now() + READ_AGAIN_TIMEOUT, || {
        shared.boards_caught_up.load(Ordering::Relaxed) >= stalled
            && shared.articles_resynced.load(Ordering::Relaxed) >= stalled
    })
    .await;
    let read_again_seconds = read_again_started.elapsed().as_secs_f64();
    let drained_by = Instant::now() + DRAIN_TIMEOUT;
    let mut queued_after = metric(http, server, QUEUED_BYTES).await?;
    while queued_after > 0.0 && Instant::now() < drained_by {
        tokio::time::sleep(PROGRESS_POLL).await;
        queued_after = metric(http, server, QUEUED_BYTES).await?;
    }
    let (rss_after, vm_peak) = (anonymous_memory(&pid)?, memory(&pid)?.1);
    let resyncs = metric(http, server, RESYNCS).await? - resyncs_before;
    let slow_consumer_closes = metric(http, server, SLOW_CONSUMER_CLOSES).await?;
    let snapshots_replaced = metric(http, server, SNAPSHOTS_REPLACED).await?;
    stop_clients(&shared, &mut tasks).await;
    let control_board = lock(&shared.control_board).clone();
    let first_failures = lock(&shared.first_failures).clone();
    Ok(Outcome {
        stalled,
        budget,
        connect_seconds,
        sockets_open,
        rss_before,
        rss_idle,
        rss_articles,
        peak_articles,
        peak_votes,
        rss_votes,
        rss_after,
        vm_peak,
        tcp_idle,
        tcp_peak: tcp_peak_articles.max(tcp_peak_votes),
        warm_up_articles: WARM_UP_ARTICLES,
        first_articles,
        articles,
        articles_seconds,
        largest_article: shared.largest_article.load(Ordering::Relaxed),
        largest_snapshot: shared.largest_snapshot.load(Ordering::Relaxed),
        resyncs,
        slow_consumer_closes,
        queued_articles,
        queued_votes,
        queued_after,
        snapshots_replaced,
        warm_up_votes,
        votes: cast,
        final_board,
        control_board,
        control_article: shared.control_article.load(Ordering::Relaxed),
        boards_caught_up: shared.boards_caught_up.load(Ordering::Relaxed),
        articles_resynced: shared.articles_resynced.load(Ordering::Relaxed),
        snapshots_read_again: shared.snapshots_read_again.load(Ordering::Relaxed),
        articles_read_again: shared.articles_read_again.load(Ordering::Relaxed),
        most_articles_read_again: shared.most_articles_read_again.load(Ordering::Relaxed),
        read_again_seconds,
        failures: shared.failures.load(Ordering::Relaxed),
        first_failures,
    })
}

/// Waits until the server's anonymous memory settles (see [`SETTLE_QUIET`]); answers its last
/// reading.
pub(crate) async fn settle(pid: &str) -> anyhow::Result<u64> {
    let started = Instant::now();
    let mut window = std::collections::VecDeque::new();
    loop {
        let now = Instant::now();
        let reading = anonymous_memory(pid)?;
        window.push_back((now, reading));
        while window
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > SETTLE_QUIET)
        {
            window.pop_front();
        }
        let (low, high) = window
            .iter()
            .fold((u64::MAX, 0), |(low, high), (_, bytes)| {
                (low.min(*bytes), high.max(*bytes))
            });
        let quiet_since = window.front().map_or(now, |(at, _)| *at);
        if high - low <= SETTLE_SPREAD
            && now.duration_since(quiet_since) + SETTLE_POLL >= SETTLE_QUIET
            || started.elapsed() >= SETTLE_TIMEOUT
        {
            return Ok(reading);
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// `bytes` characters of text (ASCII, so as many bytes in a message).
pub(crate) fn article_body(bytes: usize) -> String {
    "Stalled readers hold what they were sent. "
        .chars()
        .cycle()
        .take(bytes)
        .collect()
}

/// Waits until `done` holds, a client fails, or `deadline` passes; answers whether `done` held.
async fn wait_until(shared: &Shared, deadline: Instant, done: impl Fn() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if shared.failed() || Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(PROGRESS_POLL).await;
    }
}

async fn stop_clients(shared: &Shared, tasks: &mut tokio::task::JoinSet<()>) {
    shared.stop.send_replace(true);
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_article_is_read_from_its_event_without_a_parse() {
        let text = r#"{"type":"next","id":"1","payload":{"data":{"articlePublished":{"id":"QXJ0aWNsZTo0Mg","title":"stalled article 42","body":"Stalled readers"}}}}"#;
        assert_eq!(
            Article::from_next(text),
            Some(Article {
                number: 42,
                id: "QXJ0aWNsZTo0Mg".into()
            })
        );
        assert_eq!(Article::from_next(r#"{"type":"next","id":"1"}"#), None);
    }

    #[test]
    fn a_snapshot_is_compared_by_version_and_scores_whatever_the_order() {
        let first = Board::from_next(r#"{"type":"next","id":"1","payload":{"data":{"leaderboardChanged":{"version":"12","entries":[{"score":3.0,"option":{"id":"b"}},{"score":2,"option":{"id":"a"}}]}}}}"#).unwrap();
        assert_eq!(first.version, 12);
        assert_eq!(first.scores, vec![("a".into(), 2.0), ("b".into(), 3.0)]);
        assert_eq!(first.votes(), 5.0);
        let read = Board::of(&json!({ "version": "12", "entries": [
            { "score": 2, "option": { "id": "a" } },
            { "score": 3, "option": { "id": "b" } },
        ] }));
        assert_eq!(read, Some(first));
        assert!(Board::from_next(r#"{"type":"next","id":"1","payload":{"data":null}}"#).is_err());
    }

    #[test]
    fn only_a_lone_resync_error_is_the_resync() {
        let resync = r#"{"type":"next","id":"1","payload":{"data":null,"errors":[{"message":"behind","extensions":{"code":"RESYNC_REQUIRED","cursor":"QXJ0aWNsZTo0Mg"}}]}}"#;
        assert_eq!(resync_cursor(resync), Ok(Some("QXJ0aWNsZTo0Mg".into())));
        let without = r#"{"type":"next","id":"1","payload":{"data":null,"errors":[{"message":"behind","extensions":{"code":"RESYNC_REQUIRED"}}]}}"#;
        assert_eq!(resync_cursor(without), Ok(None));
        let other = r#"{"type":"next","id":"1","payload":{"data":null,"errors":[{"message":"no","extensions":{"code":"INTERNAL"}}]}}"#;
        assert!(resync_cursor(other).is_err());
    }

    #[test]
    fn a_stalled_event_socket_may_hold_its_budget_and_one_message_past_the_write_buffer() {
        let bounds = Bounds {
            budget: 131_072,
            largest_article: 16_500,
            largest_snapshot: 400,
        };
        assert_eq!(
            bounds.articles_socket(),
            131_072 + END_ALLOWANCE + SERVER_WRITE_BUFFER + 16_500 + SOCKET_OVERHEAD
        );
        assert_eq!(
            bounds.board_socket(),
            800 + SERVER_WRITE_BUFFER + SOCKET_OVERHEAD
        );
        assert_eq!(
            bounds.total(10),
            10 * (bounds.articles_socket() + bounds.board_socket()) + PROCESS_ALLOWANCE
        );
    }

    #[test]
    fn article_bodies_have_the_length_asked_for() {
        assert_eq!(article_body(16_384).len(), 16_384);
        assert!(article_body(5).is_ascii());
    }
}
