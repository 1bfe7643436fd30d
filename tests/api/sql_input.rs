//! Valid input works alike on SQLite, PostgreSQL and MariaDB; input no backend can store is refused
//! before any sees it; and a database that fails for a moment answers UNAVAILABLE, never INTERNAL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pulse::articles::service::{MAX_BODY_CHARS, MAX_TITLE_CHARS};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
};
use serde_json::{Value, json};

use crate::helpers::{TestApp, error_code};

const PUBLISH: &str = "mutation($t: String!, $b: String!) { publishArticle(input: { title: $t, body: $b }) { id title body } }";
const EDIT: &str = "mutation($id: ID!, $t: String, $b: String) { editArticle(id: $id, input: { title: $t, body: $b }) { id } }";
const READ: &str = "query($id: ID!) { article(id: $id) { title body author { handle } } }";

fn error_field(response: &Value) -> &str {
    response["errors"][0]["extensions"]["field"]
        .as_str()
        .unwrap_or_else(|| panic!("expected an error naming a field: {response}"))
}

pub(crate) fn backend(app: &TestApp) -> DbBackend {
    app.state.db.get_database_backend()
}

#[tokio::test]
async fn nul_in_a_title_or_body_is_bad_user_input_and_stores_nothing() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("nul_author").await;
    for (title, body, field) in [("a\u{0}b", "body", "title"), ("title", "a\u{0}b", "body")] {
        let response = app
            .graphql_as(Some(&token), PUBLISH, json!({ "t": title, "b": body }))
            .await;
        assert_eq!(error_code(&response), "BAD_USER_INPUT", "{response}");
        assert_eq!(error_field(&response), field);
    }
    assert_eq!(app.count("articles").await, 0);
}

#[tokio::test]
async fn nul_in_a_handle_is_bad_user_input_and_creates_no_user() {
    let app = TestApp::spawn().await;
    let response = app
        .graphql(
            "mutation($h: String!) { signUp(handle: $h, password: \"long enough\") { token } }",
            json!({ "h": "nul\u{0}handle" }),
        )
        .await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT", "{response}");
    assert_eq!(error_field(&response), "handle");
    assert_eq!(app.count("users").await, 0);
}

#[tokio::test]
async fn nul_in_an_edit_is_bad_user_input_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("nul_editor").await;
    let id = app.publish(&token, "untouched").await;
    for (title, body, field) in [
        (Some("a\u{0}b"), None, "title"),
        (None, Some("a\u{0}b"), "body"),
    ] {
        let response = app
            .graphql_as(
                Some(&token),
                EDIT,
                json!({ "id": id, "t": title, "b": body }),
            )
            .await;
        assert_eq!(error_code(&response), "BAD_USER_INPUT", "{response}");
        assert_eq!(error_field(&response), field);
    }
    let stored = app.stored_article(&id).await;
    assert_eq!(
        (stored.title.as_str(), stored.body.as_str()),
        ("untouched", "body")
    );
}

#[tokio::test]
async fn bodies_of_the_maximum_length_in_wide_characters_round_trip_exactly() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("wide_body").await;
    for wide in ["😀", "é"] {
        let body = wide.repeat(MAX_BODY_CHARS);
        let response = app
            .graphql_as(Some(&token), PUBLISH, json!({ "t": wide, "b": body }))
            .await;
        let id = response["data"]["publishArticle"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("publishing {wide} x {MAX_BODY_CHARS} failed: {response}"));
        assert_eq!(response["data"]["publishArticle"]["body"], body.as_str());
        let read = app.graphql(READ, json!({ "id": id })).await;
        assert_eq!(read["data"]["article"]["body"], body.as_str());
        assert_eq!(app.stored_article(id).await.body, body);

        let too_long = wide.repeat(MAX_BODY_CHARS + 1);
        let response = app
            .graphql_as(Some(&token), PUBLISH, json!({ "t": wide, "b": too_long }))
            .await;
        assert_eq!(error_code(&response), "BAD_USER_INPUT", "{wide}");
        assert_eq!(error_field(&response), "body");
    }
    assert_eq!(app.count("articles").await, 2);
}

#[tokio::test]
async fn titles_of_the_maximum_length_in_wide_characters_round_trip_exactly() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("wide_title").await;
    for wide in ["😀", "é"] {
        let title = wide.repeat(MAX_TITLE_CHARS);
        let response = app
            .graphql_as(Some(&token), PUBLISH, json!({ "t": title, "b": "body" }))
            .await;
        let id = response["data"]["publishArticle"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("publishing a title of {wide} failed: {response}"));
        let read = app.graphql(READ, json!({ "id": id })).await;
        assert_eq!(read["data"]["article"]["title"], title.as_str());

        let too_long = wide.repeat(MAX_TITLE_CHARS + 1);
        let response = app
            .graphql_as(Some(&token), PUBLISH, json!({ "t": too_long, "b": "body" }))
            .await;
        assert_eq!(error_code(&response), "BAD_USER_INPUT", "{wide}");
        assert_eq!(error_field(&response), "title");
    }
    assert_eq!(app.count("articles").await, 2);
}

/// A database created with a default character set that cannot hold emoji is converted by the
/// migrations, so 4-byte characters round-trip there too.
#[tokio::test]
async fn a_latin1_mysql_database_is_converted_so_emoji_round_trip() {
    let probe = TestApp::spawn().await;
    if backend(&probe) != DbBackend::MySql {
        eprintln!("MySQL/MariaDB only: other backends have no per-database character set");
        return;
    }
    let url = probe.config.database_url();
    let (server, _) = url.rsplit_once('/').unwrap();
    let name = crate::helpers::database_name();
    probe
        .state
        .db
        .execute_unprepared(&format!("CREATE DATABASE {name} CHARACTER SET latin1"))
        .await
        .unwrap();
    let latin1_url = format!("{server}/{name}");
    let app = TestApp::spawn_with(|config| config.database_url = Some(latin1_url)).await;
    let (token, _) = app.sign_up("emoji").await;
    let (title, body) = ("Grüße 😀", "😀".repeat(MAX_BODY_CHARS));
    let response = app
        .graphql_as(Some(&token), PUBLISH, json!({ "t": title, "b": body }))
        .await;
    let id = response["data"]["publishArticle"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("publishing emoji failed: {response}"));
    let stored = app.stored_article(id).await;
    assert_eq!(
        (stored.title.as_str(), stored.body.as_str()),
        (title, body.as_str())
    );
}

/// One article to read and a token to publish with.
async fn seeded(app: &TestApp) -> (String, String) {
    let (token, _) = app.sign_up("steady").await;
    let id = app.publish(&token, "read me").await;
    (token, id)
}

/// Answers between two rounds that kill every SQL connection of the app: with 64 requests in
/// flight, each round lands on a fresh set of requests, and each retry has time to finish.
const DISRUPTION_EVERY: usize = 24;

/// Which requests answered what while the database kept dropping connections.
#[derive(Debug, Default)]
struct Outcomes {
    reads_ok: usize,
    reads_unavailable: usize,
    writes_ok: usize,
    writes_unavailable: usize,
}

/// Runs `requests` reads and writes, `concurrency` at a time, while `disrupt` keeps killing the
/// app's SQL connections; every answer must be data or UNAVAILABLE. Returns the outcomes and how
/// many connections were killed.
async fn under_disruption<F, Fut>(
    app: Arc<TestApp>,
    requests: usize,
    concurrency: usize,
    disrupt: F,
) -> (Outcomes, usize)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = usize> + Send,
{
    let (token, id) = seeded(&app).await;
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let disruptor = {
        let (stop, killed, answered) = (stop.clone(), killed.clone(), answered.clone());
        tokio::spawn(async move {
            let mut next_round = 0;
            while !stop.load(Ordering::Relaxed) {
                if answered.load(Ordering::Relaxed) < next_round {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                killed.fetch_add(disrupt().await, Ordering::Relaxed);
                // Every round kills every connection of the app: far harsher than production's
                // occasional termination. Rounds are paced by answers, not by the clock: rounds
                // too close together would kill even the fresh connection a retry opens (testing
                // the pool's patience, not the retry), and on a busy machine a clock-paced round
                // comes around before a slowed-down retry has had its chance.
                next_round = answered.load(Ordering::Relaxed) + DISRUPTION_EVERY;
            }
        })
    };
    let next = Arc::new(AtomicUsize::new(0));
    let workers = (0..concurrency).map(|_| {
        let (app, token, id, next) = (app.clone(), token.clone(), id.clone(), next.clone());
        let answered = answered.clone();
        tokio::spawn(async move {
            let mut outcomes = Outcomes::default();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= requests {
                    return outcomes;
                }
                let write = n % 5 == 0;
                let response = if write {
                    app.graphql_as(
                        Some(&token),
                        PUBLISH,
                        json!({ "t": format!("t{n}"), "b": "b" }),
                    )
                    .await
                } else if n % 2 == 0 {
                    app.graphql(READ, json!({ "id": id })).await
                } else {
                    app.graphql("{ articles(first: 5) { nodes { id title } } }", json!({}))
                        .await
                };
                answered.fetch_add(1, Ordering::Relaxed);
                let ok = response["errors"].is_null() && response["data"].is_object();
                if !ok {
                    assert_eq!(error_code(&response), "UNAVAILABLE", "{response}");
                }
                match (write, ok) {
                    (false, true) => outcomes.reads_ok += 1,
                    (false, false) => outcomes.reads_unavailable += 1,
                    (true, true) => outcomes.writes_ok += 1,
                    (true, false) => outcomes.writes_unavailable += 1,
                }
            }
        })
    });
    let mut total = Outcomes::default();
    for worker in futures_util::future::join_all(workers).await {
        let outcomes = worker.expect("every answer is data or UNAVAILABLE");
        total.reads_ok += outcomes.reads_ok;
        total.reads_unavailable += outcomes.reads_unavailable;
        total.writes_ok += outcomes.writes_ok;
        total.writes_unavailable += outcomes.writes_unavailable;
    }
    stop.store(true, Ordering::Relaxed);
    disruptor.await.unwrap();
    (total, killed.load(Ordering::Relaxed))
}

/// A connection of the test's own to the app's database, not in the app's pool.
async fn side_connection(app: &TestApp) -> DatabaseConnection {
    let mut options = ConnectOptions::new(app.config.database_url());
    options
        .max_connections(1)
        .min_connections(1)
        .sqlx_logging(false);
    Database::connect(options).await.unwrap()
}

fn assert_reads_survive(outcomes: &Outcomes, killed: usize) {
    eprintln!("{outcomes:?}, {killed} connections killed");
    assert!(killed > 0, "nothing was disrupted: the test tested nothing");
    let reads = outcomes.reads_ok + outcomes.reads_unavailable;
    assert!(
        // Measured with rounds every 24 answers on PostgreSQL: 1 to 8 of 480 reads fail with the
        // retry, 36 without it.
        outcomes.reads_ok * 100 >= reads * 97,
        "reads should survive a killed connection by retrying: {outcomes:?}"
    );
    assert!(outcomes.writes_ok > 0, "no write got through: {outcomes:?}");
}

#[tokio::test]
async fn terminated_postgres_backends_answer_unavailable_never_internal() {
    let app = Arc::new(TestApp::spawn().await);
    if backend(&app) != DbBackend::Postgres {
        eprintln!("PostgreSQL only: pg_terminate_backend is PostgreSQL's");
        return;
    }
    let killer = side_connection(&app).await;
    let terminate = Statement::from_string(
        DbBackend::Postgres,
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    let (outcomes, killed) = under_disruption(app, 600, 64, move || {
        let (killer, terminate) = (killer.clone(), terminate.clone());
        async move {
            let row = killer.query_one_raw(terminate).await.unwrap().unwrap();
            row.try_get::<i64>("", "n").unwrap() as usize
        }
    })
    .await;
    assert_reads_survive(&outcomes, killed);
}

#[tokio::test]
async fn killed_mysql_connections_answer_unavailable_never_internal() {
    let app = Arc::new(TestApp::spawn().await);
    if backend(&app) != DbBackend::MySql {
        eprintln!("MySQL/MariaDB only: KILL of a connection is theirs");
        return;
    }
    let killer = side_connection(&app).await;
    let connections = Statement::from_string(
        DbBackend::MySql,
        "SELECT ID AS id FROM information_schema.PROCESSLIST \
         WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
    );
    let (outcomes, killed) = under_disruption(app, 600, 64, move || {
        let (killer, connections) = (killer.clone(), connections.clone());
        async move {
            let mut killed = 0;
            for row in killer.query_all_raw(connections).await.unwrap() {
                let id = row.try_get::<i64>("", "id").unwrap();
                // A connection may have gone on its own since it was listed.
                if killer
                    .execute_unprepared(&format!("KILL {id}"))
                    .await
                    .is_ok()
                {
                    killed += 1;
                }
            }
            killed
        }
    })
    .await;
    assert_reads_survive(&outcomes, killed);
}

#[tokio::test]
async fn a_locked_sqlite_file_answers_unavailable_and_is_not_ready_until_released() {
    let app = TestApp::spawn().await;
    if backend(&app) != DbBackend::Sqlite {
        eprintln!("SQLite only: the other servers have no whole-database write lock");
        return;
    }
    let (token, id) = seeded(&app).await;
    let lock = side_connection(&app).await;
    lock.execute_unprepared("BEGIN EXCLUSIVE").await.unwrap();

    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let started = Instant::now();
    let response = app
        .graphql_as(Some(&token), PUBLISH, json!({ "t": "blocked", "b": "b" }))
        .await;
    let waited = started.elapsed();
    assert_eq!(error_code(&response), "UNAVAILABLE", "{response}");
    assert!(waited < Duration::from_secs(6), "answered after {waited:?}");
    let read = app.graphql(READ, json!({ "id": id })).await;
    assert_eq!(read["data"]["article"]["title"], "read me", "{read}");

    lock.execute_unprepared("ROLLBACK").await.unwrap();
    lock.close().await.unwrap();
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let response = app
        .graphql_as(Some(&token), PUBLISH, json!({ "t": "unblocked", "b": "b" }))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    assert_eq!(app.count("articles").await, 2);
}
