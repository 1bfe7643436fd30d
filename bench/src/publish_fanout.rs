//! `publish-fanout`: the follow feed's push side against a real server. For authors with 10 to
//! 100,000 followers (a tenth of them active, i.e. with an inbox), how long the `publishArticle`
//! mutation takes (it must not grow with the followers: fan-out is a job), and how many inbox
//! writes per second the fan-out jobs sustain; checked for exact write counts.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use reqwest::header::AUTHORIZATION;
use serde_json::json;

use crate::PublishFanoutArgs;
use crate::database::BenchDatabase;
use crate::feed_read::{FeedFixture, metric};
use crate::report::{print_table, thousands};
use crate::server::Server;

const SMOKE_SIZES: [u32; 2] = [10, 100];
const SMOKE_PUBLISHES: u32 = 3;
const ACTIVE_EVERY: usize = 10;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
const PUBLISH: &str =
    "mutation($t:String!){ publishArticle(input:{title:$t, body:\"fan-out\"}){ id } }";

pub async fn run(args: PublishFanoutArgs) -> anyhow::Result<()> {
    let (sizes, publishes, burst) = if args.common.smoke {
        (SMOKE_SIZES.to_vec(), SMOKE_PUBLISHES, SMOKE_PUBLISHES)
    } else {
        let mut sizes = vec![10, 1_000, 10_000, 100_000];
        sizes.retain(|&n| n <= args.max_followers);
        (sizes, args.publishes, args.burst)
    };
    let largest = *sizes.last().context("no follower count to run")?;
    let database = BenchDatabase::create(None).await?;
    let http = reqwest::Client::new();
    let fixture = FeedFixture::new();
    let chunk = args.chunk.to_string();
    let env = fixture.server_env(&[
        ("PULSE_FEED_CELEBRITY_FOLLOWERS", "100000000"),
        ("PULSE_FEED_FANOUT_CHUNK", chunk.as_str()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut server = Server::on_database(
        &args.server_bin,
        &args.common.redis_url,
        &http,
        &database.url,
        &env,
    )
    .await?;
    let result = measure(
        &args, &fixture, &server, &database, &sizes, publishes, burst, largest,
    )
    .await;
    server.stop().await?;
    // The server's own keys (inboxes, outboxes, job streams) go with it.
    let (_, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    crate::redis_util::delete_prefix(&mut redis, &server.redis_prefix).await?;
    database.remove().await?;
    result
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &PublishFanoutArgs,
    fixture: &FeedFixture,
    server: &Server,
    database: &BenchDatabase,
    sizes: &[u32],
    publishes: u32,
    burst: u32,
    largest: u32,
) -> anyhow::Result<()> {
    let sql = database.connect().await?;
    let keys = pulse::redis::Keys::new(server.redis_prefix.clone());
    let (_, mut conn) = crate::redis_util::connect(&args.common.redis_url).await?;
    let followers = fixture.users(&sql, "follower", largest as usize).await?;
    let active: Vec<i64> = followers.iter().copied().step_by(ACTIVE_EVERY).collect();
    let authors = fixture.users(&sql, "author", sizes.len() + 1).await?;
    let http = reqwest::Client::new();
    let mut rows = Vec::new();
    let mut expected_writes = 0u64;
    for (&size, &author) in sizes.iter().zip(&authors) {
        fixture
            .follow_all(&sql, &followers[..size as usize], author)
            .await?;
        let active_here: Vec<i64> = followers[..size as usize]
            .iter()
            .copied()
            .step_by(ACTIVE_EVERY)
            .collect();
        fixture
            .activate(&mut conn, &keys, &active_here, &[author])
            .await?;
        let active_here = active_here.len() as u64;
        let token = fixture.token(author)?;
        let mut latencies = Vec::new();
        for i in 0..publishes {
            let started = Instant::now();
            publish(&http, server, &token, &format!("n{size}-{i}")).await?;
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            expected_writes += active_here;
        }
        wait_for_writes(&http, server, expected_writes).await?;
        latencies.sort_by(f64::total_cmp);
        let quantile = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        rows.push((
            format!(
                "publish p50 / p99, {} followers",
                thousands(f64::from(size))
            ),
            format!("{:.2} / {:.2} ms", quantile(0.5), quantile(0.99)),
        ));
    }

    // The burst: articles by the largest author back to back; the clock runs from the first
    // publish until the last inbox write.
    let author = authors[sizes.len() - 1];
    let token = fixture.token(author)?;
    let active_largest = followers.iter().step_by(ACTIVE_EVERY).count() as u64;
    let started = Instant::now();
    for i in 0..burst {
        publish(&http, server, &token, &format!("burst-{i}")).await?;
        expected_writes += active_largest;
    }
    wait_for_writes(&http, server, expected_writes).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let writes = u64::from(burst) * active_largest;
    let rate = writes as f64 / elapsed;
    // The first follower follows every author: their inbox holds every article.
    let held = fixture.inbox_sizes(&mut conn, &keys, &active[..1]).await?;
    let cap = 800u64;
    let published_to_first = u64::from(publishes) * sizes.len() as u64 + u64::from(burst);
    ensure!(
        held.iter().all(|&size| size == published_to_first.min(cap)),
        "the first follower's inbox holds {held:?} items, not {}",
        published_to_first.min(cap)
    );
    rows.push((
        "fan-out burst".into(),
        format!(
            "{burst} articles × {} active of {} followers",
            thousands(active_largest as f64),
            thousands(f64::from(largest))
        ),
    ));
    rows.push((
        "inbox writes/s".into(),
        format!(
            "{} ({} writes in {elapsed:.2} s)",
            thousands(rate),
            thousands(writes as f64)
        ),
    ));
    rows.push((
        "exact".into(),
        format!(
            "{} inbox writes counted, as expected",
            thousands(expected_writes as f64)
        ),
    ));
    let table: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_table("publish-fanout", &table);
    if args.common.json {
        let object: serde_json::Map<String, serde_json::Value> = rows
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect();
        println!("{}", serde_json::Value::Object(object));
    }
    sql.close().await.ok();
    Ok(())
}

async fn publish(
    http: &reqwest::Client,
    server: &Server,
    token: &str,
    title: &str,
) -> anyhow::Result<()> {
    let response: serde_json::Value = http
        .post(server.url("/graphql"))
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .json(&json!({ "query": PUBLISH, "variables": { "t": title } }))
        .send()
        .await?
        .json()
        .await?;
    ensure!(
        response["data"]["publishArticle"]["id"].is_string(),
        "publish failed: {response}"
    );
    Ok(())
}

/// Waits until the server has counted `expected` inbox writes; more is an error (a write twice).
async fn wait_for_writes(
    http: &reqwest::Client,
    server: &Server,
    expected: u64,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let writes = metric(http, server, "pulse_feed_inbox_writes_total").await? as u64;
        ensure!(
            writes <= expected,
            "{writes} inbox writes, expected {expected}"
        );
        if writes == expected {
            return Ok(());
        }
        ensure!(
            started.elapsed() < DRAIN_TIMEOUT,
            "fan-out stalled at {writes} of {expected} inbox writes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
