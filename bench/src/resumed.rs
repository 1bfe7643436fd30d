//! `resumed-readers`: what a resume from far back costs the server. N articles with large bodies
//! are published; then K anonymous websocket clients subscribe to `articlePublished` after the
//! first of them (so each asks for a replay of the other N-1) and read nothing, beside one client
//! that reads the whole replay (the control). While the server cuts the stalled streams off at
//! their send budget, its anonymous memory is sampled: the peak over its settled baseline, per
//! stalled client, is what a replay holds while it is sent. The control must get every article
//! after the first, once, in order.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use crate::ResumedArgs;
use crate::database::BenchDatabase;
use crate::feed_read::{FeedFixture, metric};
use crate::proc_stats::anonymous_memory;
use crate::record_view::graphql;
use crate::report::{MIB, print_table, thousands};
use crate::server::Server;
use crate::stalled::{STALLED_LIMITS, article_body, settle};
use crate::subscribers::{
    RESERVED_DESCRIPTORS, Socket, SocketLimits, message_type, open, receive, send,
    subscribe_message,
};

const SMOKE_READERS: u32 = 4;
const SMOKE_ARTICLES: u32 = 80;
const SMOKE_ARTICLE_BYTES: u32 = 4_096;
/// Articles published at once while the history is written.
const PUBLISHERS: usize = 8;
const PUBLISH: &str =
    "mutation($t:String!,$b:String!){ publishArticle(input:{title:$t, body:$b}){ id } }";
/// The body is selected, so that each event is as large as its article.
const RESUMED: &str = "subscription($a:String){ articlePublished(after:$a){ id title body } }";
const INIT: &str = r#"{"type":"connection_init","payload":{}}"#;
/// Article k's title ends in k, counted from 1.
const TITLE: &str = "resumed article ";
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// How long the stalled streams may take to be cut off, and the control to read its replay.
const DONE_TIMEOUT: Duration = Duration::from_secs(120);
const RESYNCS: &str = "pulse_live_slow_consumer_resyncs_total";
const REPLAYED: &str = "pulse_live_replayed_total";

pub async fn run(args: ResumedArgs) -> anyhow::Result<()> {
    let descriptors =
        rlimit::increase_nofile_limit(u64::MAX).context("cannot raise the descriptor limit")?;
    let smoke = args.common.smoke;
    let (readers, articles, bytes) = if smoke {
        (SMOKE_READERS, SMOKE_ARTICLES, SMOKE_ARTICLE_BYTES)
    } else {
        (args.readers, args.articles, args.article_bytes)
    };
    ensure!(
        u64::from(readers) < descriptors.saturating_sub(RESERVED_DESCRIPTORS),
        "{readers} readers need as many descriptors, and the limit here is {descriptors}"
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let database = BenchDatabase::create(None).await?;
    let users = FeedFixture::new();
    let replay_limit = articles.to_string();
    let env = users.server_env(&[
        ("PULSE_MAX_SOCKETS_PER_IP", "0"),
        // Every article after the first is replayed, none is a resync for want of history.
        ("PULSE_REPLAY_LIMIT", replay_limit.as_str()),
        // The stalled clients answer no ping: the server must cut them for their budget alone.
        ("PULSE_WS_PING_INTERVAL", "1h"),
        // The search replica would index the run's articles in the middle of the measure.
        ("PULSE_SEARCH_POLL", "1h"),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    eprintln!("starting {} ...", args.server_bin.display());
    let mut server = Server::on_database(
        &args.server_bin,
        &args.common.redis_url,
        &http,
        &database.url,
        &env,
    )
    .await?;
    let outcome = measure(&server, &database, &users, &http, readers, articles, bytes).await;
    let stopped = server.stop().await;
    let (_, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    crate::redis_util::delete_prefix(&mut redis, &server.redis_prefix).await?;
    database.remove().await?;
    let outcome = outcome?;
    stopped?;
    print_table(
        &format!(
            "pulse-bench resumed-readers: {} stalled readers resuming after 1 of {} articles of {} bytes",
            thousands(f64::from(readers)),
            thousands(f64::from(articles)),
            thousands(f64::from(bytes))
        ),
        &outcome.rows(),
    );
    if args.common.json {
        println!("{}", outcome.json());
    }
    if outcome.control != u64::from(articles) - 1 {
        bail!(
            "the control read {} of the {} articles after the first",
            outcome.control,
            articles - 1
        );
    }
    Ok(())
}

struct Outcome {
    readers: u32,
    baseline: u64,
    peak: u64,
    cut_off_seconds: f64,
    replayed: f64,
    control: u64,
}

impl Outcome {
    fn peak_per_reader(&self) -> f64 {
        self.peak.saturating_sub(self.baseline) as f64 / f64::from(self.readers)
    }

    fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "server memory",
                format!(
                    "{:.1} MiB settled before; peak {:.1} MiB while the replays were sent",
                    self.baseline as f64 / MIB,
                    self.peak as f64 / MIB
                ),
            ),
            (
                "peak per stalled reader",
                format!("{:.2} MiB", self.peak_per_reader() / MIB),
            ),
            (
                "cut off",
                format!(
                    "every stalled reader within {:.1} s (RESYNC_REQUIRED at its send budget)",
                    self.cut_off_seconds
                ),
            ),
            (
                "replayed events",
                format!(
                    "{} counted by the server ({} per stalled reader beyond the control's)",
                    thousands(self.replayed),
                    thousands((self.replayed - self.control as f64) / f64::from(self.readers))
                ),
            ),
            (
                "control",
                format!(
                    "{} articles after the first, each once",
                    thousands(self.control as f64)
                ),
            ),
        ]
    }

    fn json(&self) -> Value {
        json!({
            "readers": self.readers,
            "baseline_bytes": self.baseline,
            "peak_bytes": self.peak,
            "peak_per_reader_bytes": self.peak_per_reader(),
            "cut_off_seconds": self.cut_off_seconds,
            "replayed": self.replayed,
            "control_articles": self.control,
        })
    }
}

async fn measure(
    server: &Server,
    database: &BenchDatabase,
    users: &FeedFixture,
    http: &reqwest::Client,
    readers: u32,
    articles: u32,
    bytes: u32,
) -> anyhow::Result<Outcome> {
    let sql = database.connect().await?;
    let author = users.token(users.users(&sql, "author", 1).await?[0])?;
    sql.close().await.ok();
    eprintln!("publishing {} articles ...", thousands(f64::from(articles)));
    let body = Arc::new(article_body(bytes as usize));
    let first = publish(http, &server.url("/graphql"), &author, 1, &body).await?;
    let next = Arc::new(AtomicU64::new(2));
    let mut publishers = tokio::task::JoinSet::new();
    for _ in 0..PUBLISHERS {
        let (http, url, author, body, next) = (
            http.clone(),
            server.url("/graphql"),
            author.clone(),
            body.clone(),
            next.clone(),
        );
        publishers.spawn(async move {
            loop {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number > u64::from(articles) {
                    return anyhow::Ok(());
                }
                publish(&http, &url, &author, number, &body).await?;
            }
        });
    }
    while let Some(published) = publishers.join_next().await {
        published??;
    }

    let pid = server.pid().to_string();
    eprintln!("waiting for the server's memory to settle ...");
    let baseline = settle(&pid).await?;
    let resyncs_before = metric(http, server, RESYNCS).await?;
    let replayed_before = metric(http, server, REPLAYED).await?;
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (pid, sampling) = (pid.clone(), sampling.clone());
        async move {
            let mut peak = 0;
            while sampling.load(Ordering::Relaxed) {
                peak = peak.max(anonymous_memory(&pid).unwrap_or(0));
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            peak
        }
    });
    let subscribe = subscribe_message(RESUMED, json!({ "a": first }));
    let started = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..readers {
        stalled.push(subscribed(server, STALLED_LIMITS, &subscribe).await?);
    }
    let control = read_replay(server, &subscribe, articles);
    let cut_off = async {
        while metric(http, server, RESYNCS).await? < resyncs_before + f64::from(readers) {
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        anyhow::Ok(started.elapsed())
    };
    let (control, cut_off) =
        tokio::time::timeout(DONE_TIMEOUT, async { tokio::join!(control, cut_off) })
            .await
            .context(
                "the stalled readers were not all cut off, or the control did not read its replay",
            )?;
    let (control, cut_off) = (control?, cut_off?);
    sampling.store(false, Ordering::Relaxed);
    let peak = sampler.await?;
    let replayed = metric(http, server, REPLAYED).await? - replayed_before;
    drop(stalled);
    Ok(Outcome {
        readers,
        baseline,
        peak,
        cut_off_seconds: cut_off.as_secs_f64(),
        replayed,
        control,
    })
}

/// Publishes article `number`; answers its id.
async fn publish(
    http: &reqwest::Client,
    url: &str,
    author: &str,
    number: u64,
    body: &str,
) -> anyhow::Result<String> {
    let answer = graphql(
        http,
        url,
        Some(author),
        PUBLISH,
        json!({ "t": format!("{TITLE}{number}"), "b": body }),
    )
    .await
    .with_context(|| format!("publishing article {number}"))?;
    answer["data"]["publishArticle"]["id"]
        .as_str()
        .map(str::to_owned)
        .context("publishArticle answered no id")
}

/// A socket to `server` that has sent `subscribe` once the connection was acknowledged.
async fn subscribed(
    server: &Server,
    limits: SocketLimits,
    subscribe: &str,
) -> anyhow::Result<Socket> {
    let mut socket = open(server.addr, Ipv4Addr::LOCALHOST, limits)
        .await
        .map_err(anyhow::Error::msg)?;
    send(&mut socket, INIT.to_owned())
        .await
        .map_err(anyhow::Error::msg)?;
    let text = receive(&mut socket).await.map_err(anyhow::Error::msg)?;
    ensure!(
        message_type(&text) == "connection_ack",
        "expected connection_ack, got {text}"
    );
    send(&mut socket, subscribe.to_owned())
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(socket)
}

/// The control: subscribes as the stalled readers do and reads the replay; answers how many
/// articles came, each checked to be one of those after the first, not seen before (they come in
/// the order they were announced, which concurrent publishers need not keep).
async fn read_replay(server: &Server, subscribe: &str, articles: u32) -> anyhow::Result<u64> {
    let limits = SocketLimits {
        receive_buffer: None,
        segment: None,
    };
    let mut socket = subscribed(server, limits, subscribe).await?;
    let mut seen = vec![false; articles as usize + 1];
    let mut read = 0;
    while read + 1 < u64::from(articles) {
        let text = receive(&mut socket).await.map_err(anyhow::Error::msg)?;
        ensure!(message_type(&text) == "next", "the control got {text:.300}");
        let message: Value = serde_json::from_str(&text)?;
        let title = message["payload"]["data"]["articlePublished"]["title"]
            .as_str()
            .with_context(|| format!("not an article: {text:.300}"))?;
        let number: u64 = title
            .strip_prefix(TITLE)
            .and_then(|number| number.parse().ok())
            .with_context(|| format!("not one of the run's titles: {title}"))?;
        ensure!(
            (2..=u64::from(articles)).contains(&number) && !seen[number as usize],
            "the control got article {number} after {read} others"
        );
        seen[number as usize] = true;
        read += 1;
    }
    Ok(read)
}
