//! `cast-votes`: `castVotes` over HTTP by many users on a poll with 5 periods, carry-over, HLLs
//! and 3 rate-limit rules, against a real server, next to the redis-benchmark ceiling of the vote
//! script (the very call the server builds); then checks that the REAL all-time board counts
//! exactly the accepted ballots.
//!
//! The load runs with the server's jobs off, so the HTTP path is measured alone, as its ceiling
//! is.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use hyper::header::HeaderValue;
use rand::Rng as _;
use rand::rngs::StdRng;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::CastVotesArgs;
use crate::ceiling::{self, CeilingPlan, Script};
use crate::database::BenchDatabase;
use crate::http1::{Extra, GraphqlConnection};
use crate::load::{self, LoadPlan, Sender, Stop};
use crate::record_view::graphql;
use crate::report::{print_table, thousands};
use crate::server::Server;

const SMOKE_CLIENTS: u32 = 2;
const SMOKE_USERS: u32 = 4;
const SMOKE_VOTES: u64 = 200;
const CEILING_REQUESTS: u64 = 200_000;
const SMOKE_CEILING_REQUESTS: u64 = 2_000;
/// Random voters the ceiling draws from.
const CEILING_KEYSPACE: u64 = 100_000_000;
const SIGN_UP_CONCURRENCY: usize = 8;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) const CAST: &str = "mutation($p:ID!,$o:ID!){ castVotes(input:{ballots:[{pollId:$p,optionId:$o}]}){ results { accepted } } }";

/// The poll every vote scenario loads: every period, carry-over 0.1, bonus 3, and three rules
/// loose enough never to refuse the load (so every call does the full work, as the ceiling's).
pub(crate) fn bench_poll(options: u32) -> Value {
    json!({
        "title": "Bench poll",
        "timezone": "Europe/Paris",
        "periods": ["HOUR", "DAY", "WEEK", "MONTH", "ALL_TIME"],
        "carryOver": 0.1,
        "rules": [
            { "scope": "VOTER", "window": "SECOND", "limit": 1_000_000 },
            { "scope": "VOTER", "window": "DAY", "limit": 1_000_000_000 },
            { "scope": "OPTION", "window": "MINUTE", "limit": 1_000_000_000 },
        ],
        "options": (0..options).map(|index| json!({ "label": format!("Option {index}"), "bonus": 3 }))
            .collect::<Vec<_>>(),
    })
}

/// Signs up a user with a known handle, makes it an admin through `pulse admin grant` on the
/// server's database, and creates `poll`; answers the poll's id and its options' ids.
pub(crate) async fn admin_poll(
    http: &reqwest::Client,
    server: &Server,
    server_bin: &Path,
    redis_url: &str,
    database_url: &str,
    poll: Value,
) -> anyhow::Result<(String, Vec<String>)> {
    let url = server.url("/graphql");
    let handle = format!("bench_admin_{}", crate::random_hex(8));
    let signed_up = graphql(
        http,
        &url,
        None,
        "mutation($h:String!,$p:String!){ signUp(handle:$h,password:$p){ token } }",
        json!({ "h": handle, "p": crate::random_hex(24) }),
    )
    .await?;
    let token = signed_up["data"]["signUp"]["token"]
        .as_str()
        .context("signUp returned no token")?
        .to_owned();
    let granted = tokio::process::Command::new(server_bin)
        .args(["admin", "grant", &handle])
        .env("DATABASE_URL", database_url)
        .env("REDIS_URL", redis_url)
        .env("PULSE_REDIS_PREFIX", &server.redis_prefix)
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    ensure!(
        granted.status.success(),
        "pulse admin grant failed: {}",
        String::from_utf8_lossy(&granted.stderr)
    );
    let created = graphql(
        http,
        &url,
        Some(&token),
        "mutation($i:CreatePollInput!){ createPoll(input:$i){ id options { id } } }",
        json!({ "i": poll }),
    )
    .await?;
    let poll = &created["data"]["createPoll"];
    let id = poll["id"].as_str().context("createPoll returned no id")?;
    let options = poll["options"]
        .as_array()
        .context("createPoll returned no options")?
        .iter()
        .filter_map(|option| option["id"].as_str().map(str::to_owned))
        .collect();
    Ok((id.to_owned(), options))
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
            crate::record_view::sign_up(&http, &url).await
        });
    }
    let mut tokens = Vec::with_capacity(users as usize);
    while let Some(joined) = tasks.join_next().await {
        tokens.push(joined??);
    }
    Ok(tokens)
}

/// What the tool reads of a `castVotes` answer (`subscribers` reads it too).
#[derive(Deserialize)]
pub(crate) struct CastData {
    #[serde(rename = "castVotes")]
    pub cast_votes: CastAnswer,
}

#[derive(Deserialize)]
pub(crate) struct CastAnswer {
    pub results: Vec<BallotAnswer>,
}

#[derive(Deserialize)]
pub(crate) struct BallotAnswer {
    pub accepted: bool,
}

/// One ballot by a random user for a random option; it must be accepted.
pub(crate) struct VoteSender {
    pub connection: GraphqlConnection,
    pub bodies: Arc<[Bytes]>,
    pub authorizations: Arc<[HeaderValue]>,
}

impl Sender for VoteSender {
    async fn send(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        let body = &self.bodies[rng.random_range(0..self.bodies.len())];
        let user = &self.authorizations[rng.random_range(0..self.authorizations.len())];
        let extra = Extra {
            authorization: Some(user),
            ..Extra::default()
        };
        let (status, answer) = self.connection.post(body.clone(), extra).await?;
        load::judge(status, &answer, "castVotes", |data: CastData| {
            let result = data.cast_votes.results.first()?;
            result.accepted.then_some(true)
        })
    }
}

pub async fn run(args: CastVotesArgs) -> anyhow::Result<()> {
    crate::redis_util::require_single_server(
        &args.common.redis_url,
        "cast-votes",
        "its ceiling runs redis-benchmark of vote_cast.lua against one server",
    )?;
    ensure!(!args.load.duration.is_zero(), "--duration must be positive");
    let smoke = args.common.smoke;
    let clients = if smoke {
        SMOKE_CLIENTS
    } else {
        args.load.clients
    };
    let users = if smoke { SMOKE_USERS } else { args.users };
    let stop = if smoke {
        Stop::Requests(SMOKE_VOTES)
    } else {
        Stop::After(args.load.duration)
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(SIGN_UP_CONCURRENCY)
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let database = BenchDatabase::create(None).await?;
    eprintln!("starting {} (jobs off) ...", args.load.server_bin.display());
    let mut server = Server::on_database(
        &args.load.server_bin,
        &args.common.redis_url,
        &http,
        &database.url,
        &[("PULSE_RUN_JOBS", "false")],
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
        eprintln!("signing up {users} voters ...");
        let tokens = sign_up_many(&http, &url, users).await?;
        let bodies: Arc<[Bytes]> = options
            .iter()
            .map(|option| {
                json!({ "query": CAST, "variables": { "p": poll, "o": option } })
                    .to_string()
                    .into()
            })
            .collect();
        let authorizations: Arc<[HeaderValue]> = tokens
            .iter()
            .map(|token| HeaderValue::from_str(&format!("Bearer {token}")))
            .collect::<Result<_, _>>()?;
        eprintln!("casting votes: {clients} clients ...");
        let result = load::run(
            (0..clients)
                .map(|_| VoteSender {
                    connection: GraphqlConnection::new(server.addr),
                    bodies: bodies.clone(),
                    authorizations: authorizations.clone(),
                })
                .collect(),
            LoadPlan { stop, rate: None },
        )
        .await;
        let board = graphql(
            &http,
            &url,
            None,
            "query($p:ID!){ leaderboard(pollId:$p, period: ALL_TIME, board: REAL, first: 100){ entries { score } } }",
            json!({ "p": poll }),
        )
        .await?;
        let counted: f64 = board["data"]["leaderboard"]["entries"]
            .as_array()
            .context("no leaderboard")?
            .iter()
            .filter_map(|entry| entry["score"].as_f64())
            .sum();
        anyhow::Ok((result, counted))
    }
    .await;
    let stopped = server.stop().await;
    let (_target, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    crate::redis_util::delete_prefix(&mut redis, &server.redis_prefix).await?;
    database.remove().await?;
    let (result, counted) = measured?;
    stopped?;

    eprintln!("measuring the ceiling: redis-benchmark ...");
    let ceiling_poll = ceiling_poll(args.options)?;
    let ceiling = ceiling::measure(CeilingPlan {
        redis_url: &args.common.redis_url,
        clients,
        requests: if smoke {
            SMOKE_CEILING_REQUESTS
        } else {
            CEILING_REQUESTS
        },
        keyspace: CEILING_KEYSPACE,
        script: Script::VoteCast {
            poll: Box::new(ceiling_poll),
            retention: pulse::Config::defaults().vote_bucket_retention,
        },
    })
    .await?;

    let seconds = result.elapsed.as_secs_f64();
    let throughput = result.ok as f64 / seconds;
    let ratio = 100.0 * throughput / ceiling.calls_per_second;
    let exact = counted == result.ok as f64;
    let mut rows = vec![
        (
            "votes",
            format!(
                "{} accepted, {} errors in {seconds:.2} s",
                thousands(result.ok as f64),
                thousands(result.errors as f64)
            ),
        ),
        ("throughput", format!("{} votes/s", thousands(throughput))),
    ];
    rows.extend(result.latency_rows());
    rows.extend([
        (
            "ceiling",
            format!(
                "{} calls/s (redis-benchmark, vote_cast.lua: 18 boards, 2 HLLs, 3 rules, {clients} conns, {} calls, {} accepted; p50 {:.3} ms, p99 {:.3} ms)",
                thousands(ceiling.calls_per_second),
                thousands(ceiling.requests as f64),
                thousands(ceiling.counted as f64),
                ceiling.p50_ms,
                ceiling.p99_ms
            ),
        ),
        ("ratio", format!("{ratio:.1}% of the ceiling")),
        (
            "counts",
            format!(
                "{}: REAL all-time board {counted}, accepted {}",
                if exact { "OK" } else { "MISMATCH" },
                result.ok
            ),
        ),
    ]);
    if !result.first_errors.is_empty() {
        rows.push(("first errors", result.first_errors.join("\n")));
    }
    print_table(
        &format!(
            "pulse-bench cast-votes: {clients} clients, {users} voters, {} options",
            args.options
        ),
        &rows,
    );
    println!("ceiling command: {}", ceiling.command_line);
    if args.common.json {
        println!(
            "{}",
            json!({
                "scenario": "cast-votes",
                "smoke": smoke,
                "clients": clients,
                "ok": result.ok,
                "errors": result.errors,
                "throughput_votes_per_s": throughput,
                "latency_ms": result.latency_json(),
                "ceiling_calls_per_s": ceiling.calls_per_second,
                "ratio_percent": ratio,
                "counts_match": exact,
                "redis_benchmark_command": ceiling.command_line,
            })
        );
    }
    if result.errors > 0 {
        bail!(
            "{} votes failed; first: {}",
            result.errors,
            result.first_errors.join(" | ")
        );
    }
    ensure!(
        exact,
        "the board counts {counted} votes; {} were accepted",
        result.ok
    );
    Ok(())
}

/// The bench poll as the server would hold it, for the ceiling's call.
fn ceiling_poll(options: u32) -> anyhow::Result<pulse::votes::config::PollConfig> {
    use pulse::votes::board::TiePolicy;
    use pulse::votes::config::{OptionConfig, PollConfig};
    use pulse::votes::periods::Period;
    use pulse::votes::rules::{LimitScope, LimitWindow, Rule};
    let rule = |scope, window, limit| Rule {
        scope,
        window,
        limit,
        channel: None,
        device: None,
    };
    Ok(PollConfig {
        id: 1,
        title: "Bench poll".into(),
        zone: "Europe/Paris".parse().map_err(anyhow::Error::msg)?,
        periods: Period::ALL.to_vec(),
        carry_over: 0.1,
        tie_policy: TiePolicy::Competition,
        starts_at: None,
        ends_at: None,
        closed_at: None,
        created_at: chrono::Utc::now(),
        options: (1..=i64::from(options))
            .map(|id| OptionConfig {
                id,
                poll_id: 1,
                label: format!("Option {id}"),
                bonus: 3,
                initial_votes: 0,
            })
            .collect(),
        rules: vec![
            rule(LimitScope::Voter, LimitWindow::Second, 1_000_000),
            rule(LimitScope::Voter, LimitWindow::Day, 1_000_000_000),
            rule(LimitScope::Option, LimitWindow::Minute, 1_000_000_000),
        ],
    })
}
