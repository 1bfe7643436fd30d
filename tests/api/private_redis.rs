//! One private `redis-server` per data dir, shared by every `pulse` process on it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use pulse::redis::embedded::find_or_start;
use sea_orm::{ConnectionTrait, Database};
use serde_json::{Value, json};

use crate::helpers::{eventually, private_redis, pulse_command, redis_url, test_config};

/// The `redis-server` processes working in `dir` (a server chdirs to its `--dir`; its command line
/// is rewritten to its address, so the working directory is what names its data dir).
fn redis_servers_in(dir: &Path) -> usize {
    redis_server_pids(dir).len()
}

fn redis_server_pids(dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| {
            let process = entry.path();
            let is_redis = std::fs::read_to_string(process.join("comm"))
                .is_ok_and(|comm| comm.trim() == "redis-server");
            is_redis && std::fs::read_link(process.join("cwd")).is_ok_and(|cwd| cwd == dir)
        })
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Kills what is left running in a test's Redis dir when the test fails half-way: a private server
/// outlives the processes that used it, by design.
struct KillsLeftoverServers(PathBuf);

impl Drop for KillsLeftoverServers {
    fn drop(&mut self) {
        for pid in redis_server_pids(&self.0) {
            let _ = std::process::Command::new("kill").arg(pid).status();
        }
    }
}

/// A `pulse` process on `data_dir`, with no Redis configured and `probe` as the address to look
/// for one at.
fn pulse_on(data_dir: &Path, database_url: &str, probe: &str) -> tokio::process::Command {
    let mut command = pulse_command();
    command
        .env("PULSE_DATA_DIR", data_dir)
        .env("DATABASE_URL", database_url)
        .env("PULSE_REDIS_PROBE", probe)
        .env("PULSE_DEV", "true")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn run_to_success(mut command: tokio::process::Command, what: &str) {
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap_or_else(|_| panic!("`pulse {what}` did not finish within 60 s"))
        .unwrap();
    assert!(
        output.status.success(),
        "`pulse {what}` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn graphql(port: u16, query: &str) -> Value {
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/graphql"))
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn commands_beside_a_running_server_use_its_private_redis_and_start_no_other() {
    let config = test_config(|_| {}).await;
    let data_dir = config.data_dir.clone();
    let database_url = config.database_url();
    // The shared test machine runs a Redis on 127.0.0.1:6379, so the processes probe a port this
    // test holds open and never answers on: to them nothing Redis is there.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let probe = silent.local_addr().unwrap().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    let redis_dir = data_dir.join("redis");
    let _cleanup = KillsLeftoverServers(redis_dir.clone());
    let mut serve = pulse_on(&data_dir, &database_url, &probe);
    serve
        .arg("serve")
        .env("PULSE_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null());
    let mut server = serve.spawn().expect("the pulse binary starts");
    let http = reqwest::Client::new();
    eventually("the server is ready", async || {
        let ready = http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await;
        ready.is_ok_and(|response| response.status() == 200)
    })
    .await;
    assert_eq!(
        redis_servers_in(&redis_dir),
        1,
        "serve started its private Redis"
    );

    let mut seed = pulse_on(&data_dir, &database_url, &probe);
    seed.arg("seed-demo");
    run_to_success(seed, "seed-demo").await;
    let latest = graphql(port, "{ articles(first: 50) { edges { node { title } } } }").await;
    let titles = latest["data"]["articles"]["edges"].to_string();
    assert!(titles.contains("Running Pulse on a laptop"), "{latest}");
    assert_eq!(
        redis_servers_in(&redis_dir),
        1,
        "seed-demo started another Redis"
    );

    // A count only SQL knows, far above the seeded views; rebuilding puts it into the all-time
    // ranking, which the server reads from its Redis.
    let db = Database::connect(&database_url).await.unwrap();
    db.execute_unprepared(
        "UPDATE articles SET view_count = 100000 WHERE title = 'Leaderboards that do not lie'",
    )
    .await
    .unwrap();
    db.close().await.unwrap();
    let ranking = "{ topArticles(window: ALL_TIME, first: 1) { score article { title } } }";
    let top = |answer: Value| answer["data"]["topArticles"][0].clone();
    let before = top(graphql(port, ranking).await);
    assert!(
        before["score"].as_f64().unwrap() < 100_000.0,
        "the ranking knew the SQL count before the rebuild: {before}"
    );
    let mut rebuild = pulse_on(&data_dir, &database_url, &probe);
    rebuild.args(["rebuild", "views"]);
    run_to_success(rebuild, "rebuild views").await;
    let after = top(graphql(port, ranking).await);
    assert_eq!(
        after["article"]["title"], "Leaderboards that do not lie",
        "the rebuild did not reach the server's Redis: {after}"
    );
    assert!(after["score"].as_f64().unwrap() >= 100_000.0, "{after}");
    assert_eq!(
        redis_servers_in(&redis_dir),
        1,
        "rebuild started another Redis"
    );

    let terminated = std::process::Command::new("kill")
        .args(["-TERM", &server.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(terminated.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), server.wait())
        .await
        .expect("the server stops within 30 s")
        .unwrap();
    assert!(exit.success(), "{exit}");
    assert_eq!(
        redis_servers_in(&redis_dir),
        0,
        "the server, the last user, did not stop the private Redis"
    );
    drop(silent);
}

#[tokio::test]
async fn the_last_process_to_leave_a_private_redis_stops_it() {
    let first = private_redis().await;
    let second = find_or_start(Path::new("redis-server"), first.dir())
        .await
        .unwrap();
    assert_eq!(second.url(), first.url(), "a second server on one data dir");
    let dir = first.dir().to_owned();
    let address = first.url().trim_start_matches("redis://").to_owned();

    first.stop().await;
    assert!(
        tokio::net::TcpStream::connect(&address).await.is_ok(),
        "stopped while another user was still on it"
    );
    assert_eq!(redis_servers_in(&dir), 1);
    second.stop().await;
    assert!(
        tokio::net::TcpStream::connect(&address).await.is_err(),
        "still up after its last user left"
    );
    assert_eq!(redis_servers_in(&dir), 0);
}

fn fresh_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pulse-stale-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn an_address_left_by_a_crash_does_not_block_a_start() {
    // A dead port, and a live Redis that is not this dir's (the shared test Redis): neither is
    // adopted.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for stale in [format!("redis://127.0.0.1:{dead_port}"), redis_url()] {
        let dir = fresh_dir();
        std::fs::write(dir.join("address"), format!("{stale}\nsome-run-id\n")).unwrap();
        let private = find_or_start(Path::new("redis-server"), &dir)
            .await
            .unwrap();
        assert_ne!(private.url(), stale);
        assert_eq!(redis_servers_in(&dir), 1);
        let recorded = std::fs::read_to_string(dir.join("address")).unwrap();
        assert!(recorded.starts_with(private.url()), "{recorded}");
        private.stop().await;
    }
}
