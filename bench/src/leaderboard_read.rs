//! `leaderboard-read`: the top 10 of a poll's DAY board with every standing's option ahead, gap
//! and previous period, over HTTP at a fixed rate (1,000 requests/s by default) against a real
//! server, while the board holds votes; reports p50/p99 latency from the scheduled send time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use rand::rngs::StdRng;
use reqwest::Url;
use serde::Deserialize;
use serde_json::json;

use crate::LeaderboardReadArgs;
use crate::cast_votes::{admin_poll, bench_poll};
use crate::database::BenchDatabase;
use crate::load::{self, LoadPlan, Sender, Stop};
use crate::record_view::graphql;
use crate::report::{print_table, thousands};
use crate::server::Server;

const SMOKE_CLIENTS: u32 = 2;
const SMOKE_READS: u64 = 200;
const SMOKE_RATE: f64 = 100.0;
/// Votes cast before the reads, so the board and its previous period are not empty.
const SEED_VOTES: usize = 500;
const SMOKE_SEED_VOTES: usize = 20;

const READ: &str = "query($p:ID!){ leaderboard(pollId:$p, period: DAY, first: 10){ version totalOptions
  entries { rank score option { label } ahead { label } gapToAhead previousPeriod { rank score } } } }";

#[derive(Deserialize)]
struct ReadData {
    leaderboard: Board,
}

#[derive(Deserialize)]
struct Board {
    entries: Vec<serde_json::Value>,
}

struct ReadSender {
    http: reqwest::Client,
    url: Url,
    body: Arc<String>,
    expected: usize,
}

impl Sender for ReadSender {
    async fn send(&mut self, _rng: &mut StdRng) -> Result<bool, String> {
        let request = self.http.post(self.url.clone()).body(self.body.to_string());
        let expected = self.expected;
        load::answer(request, "leaderboard", |data: ReadData| {
            (data.leaderboard.entries.len() == expected).then_some(true)
        })
        .await
    }
}

pub async fn run(args: LeaderboardReadArgs) -> anyhow::Result<()> {
    ensure!(!args.load.duration.is_zero(), "--duration must be positive");
    let smoke = args.common.smoke;
    let clients = if smoke {
        SMOKE_CLIENTS
    } else {
        args.load.clients
    };
    let rate = if smoke { SMOKE_RATE } else { args.rate };
    let stop = if smoke {
        Stop::Requests(SMOKE_READS)
    } else {
        Stop::After(args.load.duration)
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients as usize)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()?;
    let database = BenchDatabase::create(None).await?;
    eprintln!("starting {} ...", args.load.server_bin.display());
    let mut server = Server::on_database(
        &args.load.server_bin,
        &args.common.redis_url,
        &http,
        &database.url,
        &[],
    )
    .await?;
    let measured = async {
        let (poll, options) = admin_poll(
            &http,
            &server,
            &args.load.server_bin,
            &args.common.redis_url,
            &database.url,
            bench_poll(args.options),
        )
        .await?;
        let url = server.url("/graphql");
        let voter = crate::record_view::sign_up(&http, &url).await?;
        let seed = if smoke { SMOKE_SEED_VOTES } else { SEED_VOTES };
        eprintln!("casting {seed} votes ...");
        for index in 0..seed {
            // Skewed, so the top has a clear order with some ties.
            let option = &options[(index * index) % options.len()];
            graphql(
                &http,
                &url,
                Some(&voter),
                "mutation($p:ID!,$o:ID!){ castVotes(input:{ballots:[{pollId:$p,optionId:$o}]}){ results { accepted } } }",
                json!({ "p": poll, "o": option }),
            )
            .await?;
        }
        let body = Arc::new(json!({ "query": READ, "variables": { "p": poll } }).to_string());
        eprintln!("reading the top 10 at {rate} requests/s, {clients} clients ...");
        let result = load::run(
            (0..clients)
                .map(|_| ReadSender {
                    http: http.clone(),
                    url: url.parse().expect("the server's URL parses"),
                    body: body.clone(),
                    expected: options.len().min(10),
                })
                .collect(),
            LoadPlan {
                stop,
                rate: Some(rate),
            },
        )
        .await;
        anyhow::Ok(result)
    }
    .await;
    let stopped = server.stop().await;
    let (_target, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    crate::redis_util::delete_prefix(&mut redis, &server.redis_prefix).await?;
    database.remove().await?;
    let result = measured.context("the leaderboard load failed")?;
    stopped?;

    let seconds = result.elapsed.as_secs_f64();
    let mut rows = vec![
        (
            "reads",
            format!(
                "{} ok, {} errors in {seconds:.2} s at a target of {rate} requests/s",
                thousands(result.ok as f64),
                thousands(result.errors as f64)
            ),
        ),
        (
            "throughput",
            format!("{} reads/s", thousands(result.ok as f64 / seconds)),
        ),
    ];
    rows.extend(result.latency_rows());
    if !result.first_errors.is_empty() {
        rows.push(("first errors", result.first_errors.join("\n")));
    }
    print_table(
        &format!(
            "pulse-bench leaderboard-read: top 10 of {} options with standings, {clients} clients",
            args.options
        ),
        &rows,
    );
    if args.common.json {
        println!(
            "{}",
            json!({
                "scenario": "leaderboard-read",
                "smoke": smoke,
                "clients": clients,
                "rate": rate,
                "ok": result.ok,
                "errors": result.errors,
                "latency_ms": result.latency_json(),
            })
        );
    }
    if result.errors > 0 {
        bail!(
            "{} reads failed; first: {}",
            result.errors,
            result.first_errors.join(" | ")
        );
    }
    Ok(())
}
