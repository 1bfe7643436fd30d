//! `feed-read`: `feed(first: 20)` with every item hydrated (author, counts, liked-by-me) over HTTP
//! against a real server, open loop at a target rate, next to the redis-benchmark ceiling of the
//! inbox read script. Also the fixture both feed scenarios share: users, follows, articles and
//! active inboxes written straight into SQL and Redis, and tokens signed with the server's secret.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use rand::Rng as _;
use rand::rngs::StdRng;
use reqwest::header::AUTHORIZATION;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect,
};

use crate::FeedReadArgs;
use crate::ceiling::{parse_csv, shell_line};
use crate::database::BenchDatabase;
use crate::load::{self, LoadPlan, Sender, Stop};
use crate::report::{print_table, thousands};
use crate::server::Server;
use pulse::entities::{articles, follow_counts, follows, users};
use pulse::keys::FeedKeys;

const PAGE: usize = 20;
const FEED: &str = "query{ feed(first:20){ edges{ cursor node{ id title author{ handle } viewCount likeCount commentCount viewerHasLiked } } pageInfo{ hasNextPage } } }";
const CEILING_REQUESTS: u64 = 200_000;
const SMOKE_CEILING_REQUESTS: u64 = 2_000;

/// Users, follows and inboxes written straight into the server's SQL and Redis, and tokens signed
/// with the secret the server is started with.
pub struct FeedFixture {
    secret: String,
    signer: pulse::accounts::TokenSigner,
    run: String,
}

impl FeedFixture {
    pub fn new() -> Self {
        let secret = format!("bench-feed-secret-{}", crate::random_hex(32));
        let signer = pulse::accounts::TokenSigner::new(
            &pulse::config::Secret::new(secret.clone()),
            Duration::from_secs(86_400),
        )
        .expect("the secret is long enough");
        Self {
            secret,
            signer,
            run: crate::random_hex(6),
        }
    }

    /// The server's environment: the fixture's token secret, then `extra`.
    pub fn server_env(&self, extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        let mut env = vec![("PULSE_TOKEN_SECRET", self.secret.clone())];
        env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        env
    }

    pub fn token(&self, user: i64) -> anyhow::Result<String> {
        Ok(self.signer.issue(user)?)
    }

    /// Creates `n` users; returns their ids in order.
    pub async fn users(
        &self,
        sql: &DatabaseConnection,
        role: &str,
        n: usize,
    ) -> anyhow::Result<Vec<i64>> {
        let prefix = format!("{}{role}", self.run);
        let now = pulse::db::now();
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let rows = chunk.iter().map(|i| users::ActiveModel {
                handle: Set(format!("{prefix}{i}")),
                password_hash: Set("unusable".into()),
                is_admin: Set(false),
                created_at: Set(now),
                ..Default::default()
            });
            users::Entity::insert_many(rows)
                .exec_without_returning(sql)
                .await?;
        }
        let rows: Vec<(i64, String)> = users::Entity::find()
            .select_only()
            .column(users::Column::Id)
            .column(users::Column::Handle)
            .filter(users::Column::Handle.starts_with(&prefix))
            .into_tuple()
            .all(sql)
            .await?;
        let by_handle: std::collections::HashMap<String, i64> =
            rows.into_iter().map(|(id, handle)| (handle, id)).collect();
        (0..n)
            .map(|i| {
                by_handle
                    .get(&format!("{prefix}{i}"))
                    .copied()
                    .context("a bench user is missing")
            })
            .collect()
    }

    /// Makes every one of `followers` follow `author`, with the author's follower count.
    pub async fn follow_all(
        &self,
        sql: &DatabaseConnection,
        followers: &[i64],
        author: i64,
    ) -> anyhow::Result<()> {
        let now = pulse::db::now();
        for chunk in followers.chunks(1000) {
            let rows = chunk.iter().map(|&follower| follows::ActiveModel {
                follower_id: Set(follower),
                followee_id: Set(author),
                created_at: Set(now),
                ..Default::default()
            });
            follows::Entity::insert_many(rows)
                .exec_without_returning(sql)
                .await?;
        }
        follow_counts::Entity::insert(follow_counts::ActiveModel {
            user_id: Set(author),
            followers: Set(followers.len() as i64),
            following: Set(0),
        })
        .exec_without_returning(sql)
        .await?;
        Ok(())
    }

    /// Writes `n` articles by each of `authors`, interleaved; returns how many.
    pub async fn articles(
        &self,
        sql: &DatabaseConnection,
        authors: &[i64],
        n: usize,
    ) -> anyhow::Result<usize> {
        let now = pulse::db::now();
        let all: Vec<(usize, i64)> = (0..n)
            .flat_map(|i| authors.iter().map(move |&author| (i, author)))
            .collect();
        for chunk in all.chunks(500) {
            let rows = chunk.iter().map(|&(i, author)| articles::ActiveModel {
                author_id: Set(author),
                title: Set(format!("article {i} by {author}")),
                body: Set("A feed benchmark article.".into()),
                view_count: Set(0),
                like_count: Set(0),
                created_at: Set(now),
                updated_at: Set(now),
                ..Default::default()
            });
            articles::Entity::insert_many(rows)
                .exec_without_returning(sql)
                .await?;
        }
        Ok(all.len())
    }

    /// Makes `users` active as a read does when `authors`, whom they follow, have published
    /// nothing yet: their inboxes exist (the anchor only, floor 0: the whole history), and they
    /// are in the audiences of `authors`.
    pub async fn activate(
        &self,
        conn: &mut pulse::redis::Link,
        keys: &pulse::redis::Keys,
        users: &[i64],
        authors: &[i64],
    ) -> anyhow::Result<()> {
        for chunk in users.chunks(1000) {
            let mut pipe = redis::pipe();
            for &user in chunk {
                let inbox = keys.feed_user(user).inbox();
                pipe.zadd(&inbox, 0, -1)
                    .ignore()
                    .expire(&inbox, 86_400)
                    .ignore();
                pulse::feed::store::add_audience_joins(&mut pipe, keys, user, authors);
            }
            let () = pipe.query_async(conn).await?;
        }
        Ok(())
    }

    /// How many items each of `users`' inboxes holds.
    pub async fn inbox_sizes(
        &self,
        conn: &mut pulse::redis::Link,
        keys: &pulse::redis::Keys,
        users: &[i64],
    ) -> anyhow::Result<Vec<u64>> {
        let mut pipe = redis::pipe();
        for &user in users {
            pipe.zcard(keys.feed_user(user).inbox());
        }
        let sizes: Vec<u64> = pipe.query_async(conn).await?;
        Ok(sizes
            .into_iter()
            .map(|size| size.saturating_sub(1))
            .collect())
    }
}

/// The value of an unlabelled counter on the server's `/metrics`, 0 before it is first counted.
pub async fn metric(http: &reqwest::Client, server: &Server, name: &str) -> anyhow::Result<f64> {
    let text = http
        .get(server.url("/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0))
}

struct FeedSender {
    http: reqwest::Client,
    url: reqwest::Url,
    authorizations: Arc<Vec<String>>,
}

impl Sender for FeedSender {
    async fn send(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        let reader = rng.random_range(0..self.authorizations.len());
        let request = self
            .http
            .post(self.url.clone())
            .header(AUTHORIZATION, &self.authorizations[reader])
            .header("content-type", "application/json")
            .body(serde_json::json!({ "query": FEED }).to_string());
        load::answer(request, "feed", |data: serde_json::Value| {
            let edges = data["feed"]["edges"].as_array()?;
            let hydrated = edges.iter().all(|edge| {
                edge["node"]["author"]["handle"].is_string() && edge["node"]["likeCount"].is_i64()
            });
            (edges.len() == PAGE && hydrated).then_some(())
        })
        .await?;
        Ok(true)
    }
}

pub async fn run(args: FeedReadArgs) -> anyhow::Result<()> {
    crate::redis_util::require_single_server(
        &args.common.redis_url,
        "feed-read",
        "its ceiling runs redis-benchmark of feed_read.lua against one server",
    )?;
    let smoke = args.common.smoke;
    let (readers, authors, follows, per_author) = if smoke {
        (20, 10, 5, 8)
    } else {
        (
            args.readers,
            args.authors,
            args.follows,
            args.articles_per_author,
        )
    };
    ensure!(follows <= authors, "--follows must not exceed --authors");
    ensure!(
        u64::from(follows) * u64::from(per_author) >= PAGE as u64,
        "readers need at least {PAGE} articles in their feeds"
    );
    let database = BenchDatabase::create(None).await?;
    let http = reqwest::Client::new();
    let fixture = FeedFixture::new();
    let env = fixture.server_env(&[]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut server = Server::on_database(
        &args.load.server_bin,
        &args.common.redis_url,
        &http,
        &database.url,
        &env,
    )
    .await?;
    let result = measure(
        &args,
        &fixture,
        &server,
        &database,
        (readers, authors, follows, per_author),
    )
    .await;
    server.stop().await?;
    // The server's own keys (inboxes, outboxes, job streams) go with it.
    let (_, mut redis) = crate::redis_util::connect(&args.common.redis_url).await?;
    crate::redis_util::delete_prefix(&mut redis, &server.redis_prefix).await?;
    database.remove().await?;
    result
}

async fn measure(
    args: &FeedReadArgs,
    fixture: &FeedFixture,
    server: &Server,
    database: &BenchDatabase,
    (readers, authors, follows, per_author): (u32, u32, u32, u32),
) -> anyhow::Result<()> {
    let smoke = args.common.smoke;
    let sql = database.connect().await?;
    let reader_ids = fixture.users(&sql, "reader", readers as usize).await?;
    let author_ids = fixture.users(&sql, "writer", authors as usize).await?;
    let mut followers_of: Vec<Vec<i64>> = vec![Vec::new(); author_ids.len()];
    for (i, &reader) in reader_ids.iter().enumerate() {
        for k in 0..follows as usize {
            followers_of[(i * 7 + k) % author_ids.len()].push(reader);
        }
    }
    for (author, followers) in author_ids.iter().zip(&followers_of) {
        fixture.follow_all(&sql, followers, *author).await?;
    }
    let articles = fixture
        .articles(&sql, &author_ids, per_author as usize)
        .await?;
    let authorizations: Vec<String> = reader_ids
        .iter()
        .map(|&reader| Ok(format!("Bearer {}", fixture.token(reader)?)))
        .collect::<anyhow::Result<_>>()?;
    let authorizations = Arc::new(authorizations);
    let url: reqwest::Url = server.url("/graphql").parse()?;
    let http = reqwest::Client::new();

    // Every reader's first read rebuilds their inbox; the measured load reads warm inboxes.
    let warm_up = load::run(
        (0..8)
            .map(|_| FeedSender {
                http: http.clone(),
                url: url.clone(),
                authorizations: authorizations.clone(),
            })
            .collect(),
        LoadPlan {
            stop: Stop::Requests(u64::from(readers) * 2),
            rate: None,
        },
    )
    .await;
    if warm_up.errors > 0 {
        bail!("warm-up reads failed: {:?}", warm_up.first_errors);
    }
    let (clients, stop, rate) = if smoke {
        (2, Stop::Requests(100), Some(50.0))
    } else {
        (
            args.load.clients,
            Stop::After(args.load.duration),
            Some(args.rate),
        )
    };
    let senders = (0..clients)
        .map(|_| FeedSender {
            http: http.clone(),
            url: url.clone(),
            authorizations: authorizations.clone(),
        })
        .collect();
    let result = load::run(senders, LoadPlan { stop, rate }).await;
    if result.errors > 0 {
        bail!(
            "{} of {} feed reads failed: {:?}",
            result.errors,
            result.ok + result.errors,
            result.first_errors
        );
    }
    let ceiling_requests = if smoke {
        SMOKE_CEILING_REQUESTS
    } else {
        CEILING_REQUESTS
    };
    let (ceiling_rate, ceiling_p50, ceiling_p99, command_line) =
        ceiling(&args.common.redis_url, clients, ceiling_requests).await?;
    let achieved = result.ok as f64 / result.elapsed.as_secs_f64();
    let mut rows = vec![
        (
            "shape",
            format!(
                "{readers} readers × {follows} followees of {authors} authors, {} articles",
                thousands(articles as f64)
            ),
        ),
        (
            "reads",
            format!(
                "{} in {:.1} s = {}/s (target {}/s), 20 hydrated items each",
                thousands(result.ok as f64),
                result.elapsed.as_secs_f64(),
                thousands(achieved),
                thousands(rate.unwrap_or(0.0)),
            ),
        ),
    ];
    rows.extend(result.latency_rows().map(|(k, v)| (k, v)));
    rows.push((
        "ceiling: feed_read.lua",
        format!(
            "{}/s, p50 {ceiling_p50:.2} ms, p99 {ceiling_p99:.2} ms",
            thousands(ceiling_rate)
        ),
    ));
    rows.push(("ceiling command", command_line));
    print_table("feed-read", &rows);
    if args.common.json {
        println!(
            "{}",
            serde_json::json!({
                "reads_per_second": achieved,
                "latency_ms": result.latency_json(),
                "ceiling_calls_per_second": ceiling_rate,
            })
        );
    }
    sql.close().await.ok();
    Ok(())
}

/// redis-benchmark calling `lua/feed_read.lua` on one full inbox (the cap's 800 ids), as the
/// server calls it for a first page.
async fn ceiling(
    redis_url: &str,
    clients: u32,
    requests: u64,
) -> anyhow::Result<(f64, f64, f64, String)> {
    let (target, mut conn) = crate::redis_util::connect(redis_url).await?;
    let mut args = crate::redis_util::benchmark_target_args(&target)?;
    let prefix = format!("pulse-bench-ceiling:{}:", crate::random_hex(12));
    let keys = pulse::redis::Keys::new(prefix.clone());
    let user = keys.feed_user(1);
    let mut pipe = redis::pipe();
    // The anchor, scored -(floor + 1): the inbox is exact from its lowest id, 1, up.
    pipe.zadd(user.inbox(), 0, -2).ignore();
    for id in 1..=800 {
        pipe.zadd(user.inbox(), id, id).ignore();
    }
    let () = pipe.query_async(&mut conn).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(include_str!("../../lua/feed_read.lua"))
        .query_async(&mut conn)
        .await?;
    args.extend([
        "-c".to_owned(),
        clients.to_string(),
        "-n".into(),
        requests.to_string(),
        "--csv".into(),
        "EVALSHA".into(),
        sha,
        "2".into(),
        user.inbox(),
        user.journal(),
        "+inf".into(),
        (PAGE + 5).to_string(),
        "604800000".into(),
    ]);
    let command_line = shell_line("redis-benchmark", &args);
    let output = tokio::process::Command::new("redis-benchmark")
        .args(&args)
        .output()
        .await
        .context("cannot run redis-benchmark (is it installed?)")?;
    crate::redis_util::delete_prefix(&mut conn, &prefix).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "redis-benchmark failed: {stdout}");
    let (rate, p50, p99) = parse_csv(&stdout)
        .with_context(|| format!("cannot parse redis-benchmark's output: {stdout}"))?;
    Ok((rate, p50, p99, command_line))
}
