//! Test harness: every test gets the real app on port 0 with its own database and Redis prefix.
//!
//! The SQL backend comes from `PULSE_TEST_DATABASE` (`sqlite`, the default; `postgres`; `mysql`), so
//! the same suite runs on all three. `TEST_LOG=1` shows the servers' logs (filtered by `RUST_LOG`,
//! default `info`), e.g. `TEST_LOG=1 cargo test -p pulse --test api some_test -- --nocapture`.

use std::net::SocketAddr;
use std::time::Duration;

use pulse::app::AppState;
use pulse::config::{Config, Secret};
use sea_orm::{ConnectionTrait, Database};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub const PASSWORD: &str = "correct horse battery";

/// Polls `condition` every 20 ms until it holds, and fails the test with `what` after 30 s: how a
/// test waits for what the app does in the background, instead of sleeping a guessed while.
pub async fn eventually(what: &str, condition: impl AsyncFnMut() -> bool) {
    eventually_within(Duration::from_secs(30), what, condition).await;
}

/// [`eventually`] with a deadline the app promises (a freshness bound): fails the test with
/// `what` unless `condition` holds when asked before `limit` has passed.
pub async fn eventually_within(
    limit: Duration,
    what: &str,
    mut condition: impl AsyncFnMut() -> bool,
) {
    let started = tokio::time::Instant::now();
    loop {
        assert!(started.elapsed() < limit, "not within {limit:?}: {what}");
        if condition().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many Redis connections listen to `channel`, whichever way it is subscribed: `SUBSCRIBE`
/// (one server, and broadcast channels on a cluster) or `SSUBSCRIBE` (sharded channels on a
/// cluster); on a cluster, the counts of every node added up.
pub async fn redis_subscribers(app: &TestApp, channel: &str) -> i64 {
    let mut conn = app.state.redis.conn.clone();
    let mut subscribed = 0;
    for count in ["NUMSUB", "SHARDNUMSUB"] {
        let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg(count)
            .arg(channel)
            .query_async(&mut conn)
            .await
            .unwrap();
        subscribed += counts.iter().map(|(_, n)| n).sum::<i64>();
    }
    subscribed
}

pub fn redis_url() -> String {
    std::env::var("PULSE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn unique_suffix() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Installs a log subscriber once per test binary when `TEST_LOG` is set; silent otherwise.
fn init_test_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            // The test writer goes through the harness's capture, so a passing test stays quiet
            // unless `--nocapture` is given.
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        }
    });
}

/// The real `pulse` binary, with none of this shell's Pulse settings (`PULSE_*` but `PULSE_TEST_*`,
/// `DATABASE_URL`, `REDIS_URL`, a `.env` in the checkout): the test sets what the process gets.
pub fn pulse_command() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pulse"));
    command.current_dir(std::env::temp_dir());
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if (name.starts_with("PULSE_") && !name.starts_with("PULSE_TEST_"))
            || name == "DATABASE_URL"
            || name == "REDIS_URL"
        {
            command.env_remove(name.as_ref());
        }
    }
    command
}

/// A `redis-server` of the test's own in a fresh directory, for tests that stop it or disturb
/// every client of it.
pub async fn private_redis() -> pulse::redis::embedded::PrivateRedis {
    init_test_logging();
    let dir = std::env::temp_dir().join(format!("pulse-private-redis-{}", unique_suffix()));
    pulse::redis::embedded::find_or_start(std::path::Path::new("redis-server"), &dir)
        .await
        .expect("redis-server is installed on test machines")
}

/// An app on a private Redis, which the test may stop.
pub async fn app_on_a_private_redis() -> (TestApp, pulse::redis::embedded::PrivateRedis) {
    let private = private_redis().await;
    let url = private.url().to_owned();
    let app = TestApp::spawn_with(|config| config.redis_url = Some(url)).await;
    (app, private)
}

/// A `redis-server` of the test's own, stopped and started again on the same port and data.
pub struct OwnRedis {
    port: u16,
    child: Option<tokio::process::Child>,
}

impl OwnRedis {
    pub async fn start(port: u16, dir: std::path::PathBuf) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let child = tokio::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .arg("--dir")
            .arg(&dir)
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is installed on test machines");
        let url = format!("redis://127.0.0.1:{port}");
        eventually("the test's redis-server answers", async || {
            let Ok(client) = redis::Client::open(url.as_str()) else {
                return false;
            };
            match client.get_multiplexed_async_connection().await {
                Ok(mut conn) => redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok(),
                Err(_) => false,
            }
        })
        .await;
        Self {
            port,
            child: Some(child),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Shuts the server down with its data saved.
    pub async fn stop(&mut self) {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut conn).await;
        self.child.take().unwrap().wait().await.unwrap();
    }
}

/// A new PostgreSQL or MariaDB database name. `scripts/test-all.sh` sets PULSE_TEST_RUN and drops
/// this run's `pulse_t_<run>_*` databases after each backend.
pub fn database_name() -> String {
    let run = std::env::var("PULSE_TEST_RUN").unwrap_or_default();
    format!("pulse_t_{run}_{}", unique_suffix())
}

/// The PostgreSQL database the tests' own databases are created from.
pub fn postgres_admin_url() -> String {
    std::env::var("PULSE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A fresh, empty database on the backend under test.
pub async fn fresh_database_url(data_dir: &std::path::Path) -> String {
    let backend = std::env::var("PULSE_TEST_DATABASE").unwrap_or_else(|_| "sqlite".into());
    let name = database_name();
    let admin_url = match backend.as_str() {
        "sqlite" => {
            return format!(
                "sqlite://{}?mode=rwc",
                data_dir.join("pulse.sqlite").display()
            );
        }
        "postgres" => postgres_admin_url(),
        "mysql" => std::env::var("PULSE_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
        other => panic!("PULSE_TEST_DATABASE={other}: expected sqlite, postgres or mysql"),
    };
    let admin = Database::connect(&admin_url)
        .await
        .expect("the test database server answers");
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    admin.close().await.ok();
    let (base, _) = admin_url
        .rsplit_once('/')
        .expect("the admin URL names a database");
    format!("{base}/{name}")
}

/// A configuration with its own fresh database, data dir and Redis prefix.
pub async fn test_config(adjust: impl FnOnce(&mut Config)) -> Config {
    let data_dir = std::env::temp_dir().join(format!("pulse-test-{}", unique_suffix()));
    std::fs::create_dir_all(&data_dir).unwrap();
    let mut config = Config::defaults();
    config.database_url = Some(fresh_database_url(&data_dir).await);
    config.redis_url = Some(redis_url());
    config.redis_prefix = Some(format!("pulse-test:{}:", unique_suffix()));
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = data_dir;
    config.token_secret = Some(Secret::new(format!(
        "test-secret-{}-padding-padding",
        unique_suffix()
    )));
    config.auth_attempts_per_minute = 0;
    config.shutdown_grace = Duration::from_secs(5);
    // Tests flush views themselves, with flushers they control.
    config.view_flush_interval = Duration::from_secs(3600);
    adjust(&mut config);
    config
}

pub struct TestApp {
    pub addr: SocketAddr,
    pub state: AppState,
    pub config: Config,
    pub http: reqwest::Client,
    stop: CancellationToken,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    pub async fn spawn_with(adjust: impl FnOnce(&mut Config)) -> Self {
        Self::start(test_config(adjust).await).await
    }

    /// Every key matching `pattern`, by `SCAN` steps: `KEYS` blocks the shared Redis for the whole
    /// keyspace of every test running beside this one, and timed out under CI's load.
    pub async fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let mut keys = self.state.redis.scan(pattern).collect().await.unwrap();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Every key under the app's prefix.
    pub async fn keys_under_prefix(&self) -> Vec<String> {
        self.keys_matching(&format!("{}*", self.state.redis.keys.prefix()))
            .await
    }

    /// Starts an app on `config` as it is (a restart reuses the same database and prefix).
    pub async fn start(config: Config) -> Self {
        init_test_logging();
        let app = pulse::App::build(config.clone())
            .await
            .expect("the app builds");
        let addr = app.local_addr();
        let state = app.state().clone();
        let stop = CancellationToken::new();
        let server = tokio::spawn(app.run_until(stop.clone().cancelled_owned()));
        Self {
            addr,
            state,
            config,
            http: reqwest::Client::new(),
            stop,
            server: Some(server),
        }
    }

    /// Stops the server and waits for its orderly shutdown.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        let server = self.server.take().expect("stopped once");
        tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .expect("shutdown is prompt")?
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn post_raw(
        &self,
        body: impl Into<reqwest::Body>,
        token: Option<&str>,
    ) -> (u16, Value) {
        self.post_with_headers(body, token, &[]).await
    }

    pub async fn post_with_headers(
        &self,
        body: impl Into<reqwest::Body>,
        token: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut request = self
            .http
            .post(self.url("/graphql"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    /// Runs a GraphQL operation and returns the whole response body.
    pub async fn graphql(&self, query: &str, variables: Value) -> Value {
        self.graphql_as(None, query, variables).await
    }

    pub async fn graphql_as(&self, token: Option<&str>, query: &str, variables: Value) -> Value {
        let body = json!({ "query": query, "variables": variables }).to_string();
        self.post_raw(body, token).await.1
    }

    /// Signs a new user up; returns its token and global id.
    pub async fn sign_up(&self, handle: &str) -> (String, String) {
        let response = self
            .graphql(
                "mutation($h: String!, $p: String!) { signUp(handle: $h, password: $p) { token user { id } } }",
                json!({ "h": handle, "p": PASSWORD }),
            )
            .await;
        let payload = &response["data"]["signUp"];
        assert!(payload.is_object(), "sign-up failed: {response}");
        (
            payload["token"].as_str().unwrap().to_owned(),
            payload["user"]["id"].as_str().unwrap().to_owned(),
        )
    }

    /// Publishes an article as `token`; returns its global id.
    pub async fn publish(&self, token: &str, title: &str) -> String {
        let response = self
            .graphql_as(
                Some(token),
                "mutation($t: String!) { publishArticle(input: { title: $t, body: \"body\" }) { id } }",
                json!({ "t": title }),
            )
            .await;
        response["data"]["publishArticle"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("publish failed: {response}"))
            .to_owned()
    }

    /// Publishes `n` articles titled `<prefix>0`, `<prefix>1`, …; returns their global ids in order.
    pub async fn publish_many(&self, token: &str, prefix: &str, n: usize) -> Vec<String> {
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            ids.push(self.publish(token, &format!("{prefix}{i}")).await);
        }
        ids
    }

    pub async fn stored_article(&self, global: &str) -> pulse::entities::articles::Model {
        stored_article(&self.state, global).await
    }

    /// The text of `GET /metrics`.
    pub async fn metrics(&self) -> String {
        let response = self.http.get(self.url("/metrics")).send().await.unwrap();
        response.text().await.unwrap()
    }

    pub async fn count(&self, table: &str) -> i64 {
        let row = self
            .state
            .db
            .query_one_raw(sea_orm::Statement::from_string(
                self.state.db.get_database_backend(),
                format!("SELECT COUNT(*) AS n FROM {table}"),
            ))
            .await
            .unwrap()
            .unwrap();
        row.try_get::<i64>("", "n").unwrap()
    }
}

/// The row id behind an article's global id.
pub fn article_row(global: &str) -> i64 {
    pulse::graphql::ids::decode(&global.to_owned().into(), pulse::articles::ARTICLE, "id").unwrap()
}

/// An article as SQL holds it, by global id.
pub async fn stored_article(state: &AppState, global: &str) -> pulse::entities::articles::Model {
    let row = article_row(global);
    state
        .services
        .articles
        .get(row)
        .await
        .unwrap()
        .expect("the article exists")
}

/// Casts two votes for `option` and reads the dashboard on `socket` until its leader has both,
/// returning that snapshot: the two announcements may come as one coalesced snapshot or as two.
pub async fn two_votes_lead(
    app: &TestApp,
    socket: &mut crate::subscriptions::Socket,
    poll: i64,
    option: i64,
) -> Value {
    use crate::votes_live::{snapshot, vote};
    vote(app, poll, option).await;
    vote(app, poll, option).await;
    loop {
        let update = snapshot(socket).await;
        if update["entries"][0]["score"] == 2.0 {
            return update;
        }
    }
}

/// The `extensions.code` of a response's first error.
/// A series of the `/metrics` of the server process listening on `port` (as [`series`] reads it).
pub async fn process_series(http: &reqwest::Client, port: u16, series_name: &str) -> f64 {
    let scrape = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    series(&scrape, series_name)
}

/// A series of a `/metrics` scrape, by its name and labels as written there; 0 when the scrape
/// has none (a counter never incremented).
pub fn series(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| {
            line.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

pub fn error_code(response: &Value) -> &str {
    response["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("expected an error with a code: {response}"))
}
