//! A server process killed (SIGKILL) in the middle of a view flush loses and doubles nothing.

use std::process::Stdio;
use std::time::Duration;

use pulse::config::Config;
use pulse::graphql::ids;
use pulse::keys::ViewKeys;
use pulse::views::ViewFlusher;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection};
use serde_json::{Value, json};

use crate::helpers::{PASSWORD, TestApp, eventually, pulse_command, test_config};

const VIEWS: usize = 50;

/// Holds SQL's write lock on a table (on SQLite, on the whole file), so that a writer of it blocks:
/// the view flusher right after taking a batch and before committing it, the like archiver in the
/// middle of its batch.
pub(crate) struct SqlLock {
    conn: DatabaseConnection,
    table: &'static str,
    release: &'static str,
}

impl SqlLock {
    pub(crate) async fn take(url: &str, table: &'static str) -> Self {
        let mut options = ConnectOptions::new(url);
        options.max_connections(1).min_connections(1);
        let conn = Database::connect(options).await.unwrap();
        let (statements, release) = match conn.get_database_backend() {
            sea_orm::DbBackend::Sqlite => (vec!["BEGIN EXCLUSIVE".to_owned()], "ROLLBACK"),
            sea_orm::DbBackend::Postgres => (
                vec![
                    "BEGIN".to_owned(),
                    format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
                ],
                "ROLLBACK",
            ),
            _ => (vec![format!("LOCK TABLES {table} WRITE")], "UNLOCK TABLES"),
        };
        for statement in statements {
            conn.execute_unprepared(&statement).await.unwrap();
        }
        Self {
            conn,
            table,
            release,
        }
    }

    /// Waits until another connection waits for this lock (PostgreSQL and MariaDB list their
    /// waiters; on SQLite it returns at once).
    pub(crate) async fn wait_for_a_waiter(&self) {
        let waiters = match self.conn.get_database_backend() {
            sea_orm::DbBackend::Sqlite => return,
            sea_orm::DbBackend::Postgres => format!(
                "SELECT COUNT(*) AS n FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 WHERE NOT l.granted AND c.relname = '{}' \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                self.table
            ),
            _ => "SELECT COUNT(*) AS n FROM information_schema.processlist \
                 WHERE db = DATABASE() AND state LIKE 'Waiting for table%lock'"
                .to_owned(),
        };
        eventually("another connection waits for the lock", async || {
            let row = self
                .conn
                .query_one_raw(sea_orm::Statement::from_string(
                    self.conn.get_database_backend(),
                    waiters.clone(),
                ))
                .await
                .unwrap()
                .unwrap();
            row.try_get::<i64>("", "n").unwrap() > 0
        })
        .await;
    }

    pub(crate) async fn release(self) {
        self.conn.execute_unprepared(self.release).await.unwrap();
        self.conn.close().await.unwrap();
    }
}

/// A loopback port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The real `pulse` binary, configured like `config` (and `extra` settings), as a separate process
/// that can be killed.
pub(crate) async fn spawn_server_process(
    config: &Config,
    port: u16,
    extra: &[(&str, &str)],
) -> tokio::process::Child {
    let child = pulse_command()
        .arg("serve")
        .env("DATABASE_URL", config.database_url())
        .env("REDIS_URL", config.redis_url.as_deref().unwrap())
        .env(
            "PULSE_REDIS_PREFIX",
            config.redis_prefix.as_deref().unwrap(),
        )
        .env("PULSE_LISTEN", format!("127.0.0.1:{port}"))
        .env("PULSE_DATA_DIR", &config.data_dir)
        .env(
            "PULSE_TOKEN_SECRET",
            config.token_secret.as_ref().unwrap().expose(),
        )
        .env("PULSE_TRUSTED_PROXIES", "127.0.0.1/32")
        .env("PULSE_AUTH_ATTEMPTS_PER_MINUTE", "0")
        .env("PULSE_VIEW_FLUSH_INTERVAL", "200ms")
        .env("PULSE_VIEW_FLUSH_LEASE", "1s")
        // The process's stderr is the test run's: on a loaded machine sqlx warns of every slow
        // pool wait, thousands of lines that would bury a failing test's message.
        .env("RUST_LOG", "warn,sqlx::pool=error")
        .envs(extra.iter().copied())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the pulse binary starts");
    let http = reqwest::Client::new();
    eventually("the server process is ready", async || {
        http.get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .is_ok_and(|response| response.status() == 200)
    })
    .await;
    child
}

async fn post(
    port: u16,
    token: Option<&str>,
    client_ip: &str,
    query: &str,
    variables: Value,
) -> Value {
    let mut request = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/graphql"))
        .header("x-forwarded-for", client_ip)
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().json().await.unwrap()
}

async fn batches_in_flight(config: &Config) -> usize {
    let mut conn = pulse::redis::Target::parse(config.redis_url.as_deref().unwrap())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let keys = pulse::redis::Keys::new(config.redis_prefix.clone().unwrap());
    let mut in_flight = 0;
    for shard in 0..pulse::keys::VIEW_SHARDS {
        let exists: bool = redis::cmd("EXISTS")
            .arg(keys.view_shard_by_index(shard).in_flight())
            .query_async(&mut conn)
            .await
            .unwrap();
        in_flight += usize::from(exists);
    }
    in_flight
}

#[tokio::test]
async fn a_process_killed_between_taking_and_committing_views_loses_and_doubles_nothing() {
    let config = test_config(|_| {}).await;
    let port = free_port();
    let mut server = spawn_server_process(&config, port, &[]).await;

    let signed_up = post(
        port,
        None,
        "192.0.2.1",
        "mutation($p: String!) { signUp(handle: \"victim\", password: $p) { token } }",
        json!({ "p": PASSWORD }),
    )
    .await;
    let token = signed_up["data"]["signUp"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let published = post(
        port,
        Some(&token),
        "192.0.2.1",
        "mutation { publishArticle(input: { title: \"crash\", body: \"test\" }) { id } }",
        json!({}),
    )
    .await;
    let article = published["data"]["publishArticle"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let lock = SqlLock::take(&config.database_url(), "view_flush_batches").await;
    let mut counted = 0;
    for viewer in 0..VIEWS {
        let response = post(
            port,
            None,
            &format!("10.9.0.{viewer}"),
            "mutation($a: ID!) { recordView(articleId: $a) { counted } }",
            json!({ "a": article }),
        )
        .await;
        counted += usize::from(response["data"]["recordView"]["counted"] == true);
    }
    assert_eq!(counted, VIEWS);
    eventually("the flusher takes the views", async || {
        batches_in_flight(&config).await > 0
    })
    .await;
    assert_eq!(
        batches_in_flight(&config).await,
        1,
        "the flusher never took the views"
    );
    // Kill it once it waits for the lock to commit, where the server can show it (SQLite's wait is
    // inside the process: there the batch in flight is all there is to see).
    lock.wait_for_a_waiter().await;
    server.kill().await.unwrap();
    lock.release().await;
    let row = ids::decode(&article.clone().into(), pulse::articles::ARTICLE, "id").unwrap();
    let db = Database::connect(config.database_url()).await.unwrap();
    let before_restart = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!("SELECT view_count FROM articles WHERE id = {row}"),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "view_count")
        .unwrap();
    assert_eq!(
        before_restart, 0,
        "the killed process had committed already: not the crash under test"
    );
    db.close().await.unwrap();

    let restarted = TestApp::start(Config {
        view_flush_interval: Duration::from_millis(200),
        view_flush_lease: Duration::from_secs(1),
        ..config
    })
    .await;
    eventually(
        "the batch left by the killed process is re-driven",
        async || {
            let in_sql = restarted.stored_article(&article).await.view_count;
            in_sql >= VIEWS as i64 && batches_in_flight(&restarted.config).await == 0
        },
    )
    .await;
    let in_sql = restarted.stored_article(&article).await.view_count;
    assert_eq!(
        in_sql, VIEWS as i64,
        "the batch left by the killed process was not re-driven exactly once"
    );
    assert_eq!(batches_in_flight(&restarted.config).await, 0);

    // Nothing more arrives later: Redis holds none of the views pending, so another flush adds none.
    let another = ViewFlusher::new(
        restarted.state.db.clone(),
        restarted.state.redis.clone(),
        Duration::from_secs(1),
    )
    .flush_all()
    .await
    .unwrap();
    assert_eq!(
        another.views, 0,
        "views were still pending after the re-drive"
    );
    let response = restarted
        .graphql(
            "query($a: ID!) { article(id: $a) { viewCount } }",
            json!({ "a": article }),
        )
        .await;
    assert_eq!(response["data"]["article"]["viewCount"], VIEWS as i64);
    assert_eq!(
        restarted.stored_article(&article).await.view_count,
        VIEWS as i64
    );
}
