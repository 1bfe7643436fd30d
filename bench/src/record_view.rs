//! `record-view`: start a server, seed it, warm it, load it, check the counts, measure the ceiling.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use rand::distr::{Alphanumeric, SampleString as _};
use serde_json::{Value, json};

use crate::RecordViewArgs;
use crate::ceiling::{self, Ceiling, CeilingPlan, Script};
use crate::http1::GraphqlConnection;
use crate::load::{self, LoadPlan, LoadResult, Stop, ViewSender, WARM_UP_VIEWER};
use crate::proc_stats::{Cost, CostMeter};
use crate::redis_util;
use crate::report::{print_table, thousands};
use crate::server::Server;

const SMOKE_CLIENTS: u32 = 2;
const SMOKE_REQUESTS: u64 = 200;
const SMOKE_ARTICLES: u32 = 10;
/// redis-benchmark calls for the ceiling: a few seconds' worth.
const CEILING_REQUESTS: u64 = 200_000;
const SMOKE_CEILING_REQUESTS: u64 = 2_000;
/// Concurrent requests while seeding and warming up.
const SEED_CONCURRENCY: usize = 8;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Why a run on a Redis Cluster has no ceiling.
const NO_CEILING_ON_A_CLUSTER: &str =
    "Redis is a cluster, and redis-benchmark sends every call to one server";

/// The run's shape once `--smoke` is applied.
struct Shape {
    clients: u32,
    articles: u32,
    viewers: u32,
    stop: Stop,
    rate: Option<f64>,
    ceiling_requests: u64,
}

impl Shape {
    fn of(args: &RecordViewArgs) -> anyhow::Result<Self> {
        if let Some(rate) = args.rate {
            ensure!(
                rate.is_finite() && rate > 0.0,
                "--rate must be a positive number of views/s"
            );
        }
        ensure!(!args.load.duration.is_zero(), "--duration must be positive");
        Ok(if args.common.smoke {
            Self {
                clients: SMOKE_CLIENTS,
                articles: SMOKE_ARTICLES,
                viewers: args.viewers,
                stop: Stop::Requests(SMOKE_REQUESTS),
                rate: args.rate,
                ceiling_requests: SMOKE_CEILING_REQUESTS,
            }
        } else {
            Self {
                clients: args.load.clients,
                articles: args.articles,
                viewers: args.viewers,
                stop: Stop::After(args.load.duration),
                rate: args.rate,
                ceiling_requests: CEILING_REQUESTS,
            }
        })
    }

    fn describe(&self) -> String {
        let stop = match self.stop {
            Stop::After(duration) => humantime::format_duration(duration).to_string(),
            Stop::Requests(requests) => format!("{requests} requests"),
        };
        let mode = match self.rate {
            Some(rate) => format!("open loop at {} views/s offered", thousands(rate)),
            None => "closed loop".into(),
        };
        format!(
            "{} clients, {stop}, {} articles, {} viewers, {mode}",
            self.clients,
            thousands(f64::from(self.articles)),
            thousands(f64::from(self.viewers))
        )
    }
}

/// What the HTTP part measured.
struct Measured {
    warm_up_counted: u64,
    load: LoadResult,
    cost: Cost,
    /// `Σ viewCount` as the API reports it, and on which attempt it matched (if it did).
    api_total: i64,
    articles_listed: usize,
    check_attempts: u32,
}

pub async fn run(args: RecordViewArgs) -> anyhow::Result<()> {
    let shape = Shape::of(&args)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(SEED_CONCURRENCY)
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let (target, mut redis) = redis_util::connect(&args.common.redis_url).await?;
    // On a cluster: how many masters hold the keys (and share the Redis CPU). The ceiling needs a
    // single server and is skipped.
    let cluster_masters = match target {
        pulse::redis::Target::Single(_) => None,
        pulse::redis::Target::Cluster { .. } => Some(redis.masters().await?.len()),
    };
    // The dedup window the server will use; the same defaults and environment as the child's.
    let window = pulse::Config::defaults().view_window;

    eprintln!("starting {} ...", args.load.server_bin.display());
    let mut server = Server::start(&args.load.server_bin, &args.common.redis_url, &http).await?;
    let measured = drive(&shape, &http, &server, &mut redis).await;
    let stopped = server.stop().await;
    let cleaned = redis_util::delete_prefix(&mut redis, &server.redis_prefix).await;
    let measured = measured?;
    stopped.context("cannot stop the server")?;
    cleaned.context("cannot delete the server's keys")?;

    let ceiling = if cluster_masters.is_some() {
        eprintln!("skipping the ceiling: {NO_CEILING_ON_A_CLUSTER}");
        None
    } else {
        eprintln!(
            "measuring the ceiling: redis-benchmark, {} calls ...",
            thousands(shape.ceiling_requests as f64)
        );
        Some(
            ceiling::measure(CeilingPlan {
                redis_url: &args.common.redis_url,
                clients: shape.clients,
                requests: shape.ceiling_requests,
                // As many (article, viewer) pairs as the HTTP load draws from, so about as many
                // calls count (the script's longer path) as over HTTP.
                keyspace: u64::from(shape.viewers) * u64::from(shape.articles),
                script: Script::RecordView { window },
            })
            .await?,
        )
    };

    report(&args, &shape, &measured, ceiling.as_ref(), cluster_masters);
    let expected = measured.warm_up_counted + measured.load.counted;
    if measured.load.errors > 0 {
        bail!(
            "{} requests failed; first: {}",
            measured.load.errors,
            measured.load.first_errors.join(" | ")
        );
    }
    if measured.api_total != expected as i64 {
        bail!(
            "count mismatch: the API reports {} views, the load saw {} counted",
            measured.api_total,
            expected
        );
    }
    Ok(())
}

async fn drive(
    shape: &Shape,
    http: &reqwest::Client,
    server: &Server,
    redis: &mut pulse::redis::Link,
) -> anyhow::Result<Measured> {
    let graphql_url = server.url("/graphql");

    eprintln!("seeding {} articles ...", shape.articles);
    let ids = seed(http, &graphql_url, shape.articles).await?;
    let bodies: Arc<[Bytes]> = ids.iter().map(|id| load::record_view_body(id)).collect();

    eprintln!("warming up ...");
    let warm_up_counted = warm_up(server.addr, &bodies).await?;

    let meter = CostMeter::start(server.pid(), redis).await?;
    eprintln!("load: {} ...", shape.describe());
    let senders = (0..shape.clients)
        .map(|_| ViewSender {
            connection: GraphqlConnection::new(server.addr),
            bodies: bodies.clone(),
            viewers: shape.viewers,
        })
        .collect();
    let load = load::run(
        senders,
        LoadPlan {
            stop: shape.stop,
            rate: shape.rate,
        },
    )
    .await;
    let cost = meter.stop(redis).await?;

    // The flusher may be moving a batch while the totals are read; a total read across a flush is
    // retried rather than reported as lost views.
    let expected = (warm_up_counted + load.counted) as i64;
    let mut check_attempts = 0;
    let (api_total, articles_listed) = loop {
        check_attempts += 1;
        let (total, listed) = sum_over_articles(http, &graphql_url, "viewCount").await?;
        if total == expected || check_attempts == 3 {
            break (total, listed);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    ensure!(
        articles_listed == ids.len(),
        "the API lists {articles_listed} articles; {} were published",
        ids.len()
    );
    Ok(Measured {
        warm_up_counted,
        load,
        cost,
        api_total,
        articles_listed,
        check_attempts,
    })
}

/// One GraphQL operation; any transport, status or GraphQL error is an error.
pub(crate) async fn graphql(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    query: &str,
    variables: Value,
) -> anyhow::Result<Value> {
    let mut request = http
        .post(url)
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await?;
    let status = response.status();
    let body: Value = response.json().await.context("a non-JSON GraphQL answer")?;
    if status != reqwest::StatusCode::OK || body.get("errors").is_some() {
        bail!("GraphQL request failed ({status}): {body}");
    }
    Ok(body)
}

/// Signs a fresh user up; returns its token.
pub(crate) async fn sign_up(http: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let handle = format!("bench_{}", crate::random_hex(12));
    let password = Alphanumeric.sample_string(&mut rand::rng(), 24);
    let signed_up = graphql(
        http,
        url,
        None,
        "mutation($h:String!,$p:String!){ signUp(handle:$h,password:$p){ token } }",
        json!({ "h": handle, "p": password }),
    )
    .await
    .context("sign-up")?;
    signed_up["data"]["signUp"]["token"]
        .as_str()
        .map(str::to_owned)
        .context("signUp returned no token")
}

/// Signs a user up and publishes `articles` articles; returns their global ids.
pub(crate) async fn seed(
    http: &reqwest::Client,
    url: &str,
    articles: u32,
) -> anyhow::Result<Vec<String>> {
    let token: Arc<str> = sign_up(http, url).await?.into();
    let limit = Arc::new(tokio::sync::Semaphore::new(SEED_CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..articles {
        let (http, url, token, limit) =
            (http.clone(), url.to_owned(), token.clone(), limit.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await?;
            let published = graphql(
                &http,
                &url,
                Some(&token),
                r#"mutation($t:String!){ publishArticle(input:{title:$t, body:"bench"}){ id } }"#,
                json!({ "t": format!("Bench article {index}") }),
            )
            .await
            .context("publishArticle")?;
            published["data"]["publishArticle"]["id"]
                .as_str()
                .map(str::to_owned)
                .context("publishArticle returned no id")
        });
    }
    let mut ids = Vec::with_capacity(articles as usize);
    while let Some(joined) = tasks.join_next().await {
        ids.push(joined??);
    }
    Ok(ids)
}

/// Views every article once from a viewer outside the measured set, so that the load never pays
/// the first view's SQL read. Returns how many counted (all of them, on a fresh prefix).
async fn warm_up(addr: SocketAddr, bodies: &Arc<[Bytes]>) -> anyhow::Result<u64> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..SEED_CONCURRENCY {
        let (bodies, next) = (bodies.clone(), next.clone());
        tasks.spawn(async move {
            let mut connection = GraphqlConnection::new(addr);
            let mut counted = 0;
            while let Some(body) = bodies.get(next.fetch_add(1, Ordering::Relaxed)) {
                let view = load::send_view(&mut connection, body, WARM_UP_VIEWER).await;
                counted += u64::from(view.map_err(|err| anyhow::anyhow!("warm-up view: {err}"))?);
            }
            anyhow::Ok(counted)
        });
    }
    let mut counted = 0;
    while let Some(joined) = tasks.join_next().await {
        counted += joined??;
    }
    Ok(counted)
}

/// `Σ field` (an integer field of `Article`) over every article, as the API reports it, and how
/// many articles it listed.
pub(crate) async fn sum_over_articles(
    http: &reqwest::Client,
    url: &str,
    field: &str,
) -> anyhow::Result<(i64, usize)> {
    let query = format!(
        "query($c:String){{ articles(first:100, after:$c){{ edges{{ node{{ {field} }} }} pageInfo{{ hasNextPage endCursor }} }} }}"
    );
    let mut after = Value::Null;
    let (mut total, mut listed) = (0, 0);
    loop {
        let page = graphql(http, url, None, &query, json!({ "c": after })).await?;
        let connection = &page["data"]["articles"];
        let edges = connection["edges"]
            .as_array()
            .context("articles has no edges")?;
        for edge in edges {
            total += edge["node"][field]
                .as_i64()
                .with_context(|| format!("an article without {field}"))?;
        }
        listed += edges.len();
        if connection["pageInfo"]["hasNextPage"].as_bool() != Some(true) {
            return Ok((total, listed));
        }
        after = connection["pageInfo"]["endCursor"].clone();
        ensure!(after.is_string(), "hasNextPage without an endCursor");
    }
}

/// Prints the table (and the JSON object with `--json`). `ceiling` is `None` on a Redis Cluster of
/// `cluster_masters` masters.
fn report(
    args: &RecordViewArgs,
    shape: &Shape,
    measured: &Measured,
    ceiling: Option<&Ceiling>,
    cluster_masters: Option<usize>,
) {
    let load = &measured.load;
    let seconds = load.elapsed.as_secs_f64();
    let throughput = load.ok as f64 / seconds;
    let counted_share = |counted: u64, of: u64| 100.0 * counted as f64 / of.max(1) as f64;
    let expected = measured.warm_up_counted + load.counted;
    let ratio = ceiling.map(|ceiling| 100.0 * throughput / ceiling.calls_per_second);
    let verdict = if measured.api_total == expected as i64 {
        format!("OK (attempt {})", measured.check_attempts)
    } else {
        "MISMATCH".into()
    };

    let mut rows = Vec::new();
    if let Some(masters) = cluster_masters {
        rows.push((
            "redis",
            format!(
                "cluster of {masters} masters ({}); redis CPU below is their sum, replicas not counted",
                redis_util::redacted(&args.common.redis_url)
            ),
        ));
    }
    rows.extend([
        (
            "requests",
            format!(
                "{} ok, {} errors in {seconds:.2} s; {} counted ({:.1}%)",
                thousands(load.ok as f64),
                thousands(load.errors as f64),
                thousands(load.counted as f64),
                counted_share(load.counted, load.ok)
            ),
        ),
        ("throughput", format!("{} views/s", thousands(throughput))),
    ]);
    rows.extend(load.latency_rows());
    rows.extend(measured.cost.rows("views", load.ok, seconds));
    rows.extend([
        (
            "ceiling",
            match ceiling {
                Some(ceiling) => format!(
                    "{} calls/s (redis-benchmark, same script, {} conns, {} calls, {:.1}% counted; p50 {:.3} ms, p99 {:.3} ms)",
                    thousands(ceiling.calls_per_second),
                    shape.clients,
                    thousands(ceiling.requests as f64),
                    counted_share(ceiling.counted, ceiling.requests),
                    ceiling.p50_ms,
                    ceiling.p99_ms
                ),
                None => format!("skipped: {NO_CEILING_ON_A_CLUSTER}"),
            },
        ),
        (
            "ratio",
            match ratio {
                Some(ratio) if shape.rate.is_some() => {
                    format!("{ratio:.1}% of the ceiling (at the offered rate, not a peak)")
                }
                Some(ratio) => format!("{ratio:.1}% of the ceiling"),
                None => "n/a (no ceiling)".into(),
            },
        ),
        (
            "counts",
            format!(
                "{verdict}: sum of viewCount over {} articles = {}; warm-up {} + load {} = {}",
                thousands(measured.articles_listed as f64),
                thousands(measured.api_total as f64),
                thousands(measured.warm_up_counted as f64),
                thousands(load.counted as f64),
                thousands(expected as f64)
            ),
        ),
    ]);
    if !load.first_errors.is_empty() {
        rows.push(("first errors", load.first_errors.join("\n")));
    }
    print_table(
        &format!("pulse-bench record-view: {}", shape.describe()),
        &rows,
    );
    match ceiling {
        Some(ceiling) => println!("ceiling command: {}", ceiling.command_line),
        None => println!("ceiling command: none (skipped: {NO_CEILING_ON_A_CLUSTER})"),
    }
    if args.common.json {
        let mut report = json!({
            "scenario": "record-view",
            "smoke": args.common.smoke,
            "clients": shape.clients,
            "articles": shape.articles,
            "viewers": shape.viewers,
            "offered_rate": shape.rate,
            "elapsed_s": seconds,
            "ok": load.ok,
            "errors": load.errors,
            "counted": load.counted,
            "warm_up_counted": measured.warm_up_counted,
            "throughput_views_per_s": throughput,
            "latency_ms": load.latency_json(),
            "ceiling_calls_per_s": ceiling.map(|ceiling| ceiling.calls_per_second),
            "ceiling_requests": ceiling.map(|ceiling| ceiling.requests),
            "ceiling_counted": ceiling.map(|ceiling| ceiling.counted),
            "ceiling_p50_ms": ceiling.map(|ceiling| ceiling.p50_ms),
            "ceiling_p99_ms": ceiling.map(|ceiling| ceiling.p99_ms),
            "ratio_percent": ratio,
            "api_total_views": measured.api_total,
            "expected_total_views": expected,
            "counts_match": measured.api_total == expected as i64,
            "redis_benchmark_command": ceiling.map(|ceiling| ceiling.command_line.clone()),
        });
        if let Some(fields) = report.as_object_mut() {
            fields.extend(measured.cost.json("views", load.ok));
            // On a cluster only, so a single server's object stays as it was.
            if let Some(masters) = cluster_masters {
                fields.insert("redis_cluster_masters".into(), masters.into());
                fields.insert("ceiling".into(), Value::Null);
                fields.insert("ceiling_skipped".into(), NO_CEILING_ON_A_CLUSTER.into());
            }
        }
        println!("{report}");
    }
}
