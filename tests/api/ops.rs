use serde_json::json;

use crate::helpers::{TestApp, app_on_a_private_redis, eventually, private_redis, series};

#[tokio::test]
async fn health_and_readiness_answer() {
    let app = TestApp::spawn().await;
    let health = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(
        body,
        json!({ "status": "ready", "sql": "ok", "redis": "ok" })
    );
}

#[tokio::test]
async fn metrics_count_requests_by_operation_name() {
    let app = TestApp::spawn().await;
    let body =
        json!({ "query": "query LatestArticlesForMetrics { articles { edges { cursor } } }" })
            .to_string();
    app.post_raw(body, None).await;
    let metrics = app.metrics().await;
    let line = metrics
        .lines()
        .find(|line| {
            line.starts_with("pulse_graphql_requests_total")
                && line.contains("operation=\"LatestArticlesForMetrics\"")
                && line.contains("outcome=\"ok\"")
        })
        .unwrap_or_else(|| panic!("no request counter for the operation in:\n{metrics}"));
    let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 1.0);
    assert!(metrics.contains("pulse_graphql_request_duration_seconds_bucket"));
}

#[tokio::test]
async fn invented_operation_names_cannot_grow_the_metrics_without_bound() {
    let app = TestApp::spawn().await;
    for i in 0..205 {
        let body =
            json!({ "query": format!("query Invented{i} {{ viewer {{ id }} }}") }).to_string();
        app.post_raw(body, None).await;
    }
    let metrics = app.metrics().await;
    assert!(metrics.contains("operation=\"other\""), "no overflow label");
    assert!(metrics.contains("operation=\"Invented0\""));
    assert!(
        !metrics.contains("operation=\"Invented204\""),
        "a label past the bound was kept"
    );
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let app = TestApp::spawn().await;
    let (http, url) = (app.http.clone(), app.url("/graphql"));
    // Sign-ups hash a password on the blocking pool: slow enough to still be running at the stop.
    let in_flight: Vec<_> = (0..16)
        .map(|i| {
            let body = json!({
                "query": "mutation($h: String!) { signUp(handle: $h, password: \"long enough password\") { token } }",
                "variables": { "h": format!("drain_{i}") },
            });
            tokio::spawn(http.post(url.clone()).json(&body).send())
        })
        .collect();
    // Stop once the server has taken every request (working on it, or done with it), rather than
    // after a guessed delay. A finished client is no longer in flight, so none counts twice.
    eventually("the server has taken every sign-up", async || {
        let done = in_flight
            .iter()
            .filter(|request| request.is_finished())
            .count();
        app.state.connections.requests_in_flight() + done >= in_flight.len()
    })
    .await;
    let state = app.state.clone();
    app.stop().await.expect("a clean shutdown");

    let requests = in_flight.len() as u64;
    for request in in_flight {
        let response = request
            .await
            .unwrap()
            .expect("an in-flight request is answered");
        let body: serde_json::Value = response
            .json()
            .await
            .expect("a whole answer, not a cut connection");
        assert!(body["data"]["signUp"]["token"].is_string(), "{body}");
    }
    use sea_orm::{EntityTrait, PaginatorTrait};
    let users = pulse::entities::users::Entity::find()
        .count(&state.db)
        .await
        .unwrap();
    assert_eq!(users, requests, "every answered sign-up is committed");
}

#[tokio::test]
async fn shutdown_is_orderly() {
    let app = TestApp::spawn().await;
    let addr = app.addr;
    app.stop().await.expect("a clean shutdown");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
}

#[tokio::test]
async fn a_missing_redis_server_binary_is_explained() {
    let dir = std::env::temp_dir().join(format!("pulse-no-redis-{}", rand::random::<u32>()));
    let missing = std::path::Path::new("/nonexistent/redis-server");
    let err = pulse::redis::embedded::find_or_start(missing, &dir)
        .await
        .err()
        .expect("it cannot start");
    let message = err.to_string();
    assert!(
        message.contains("REDIS_URL") && message.contains("install"),
        "{message}"
    );
}

#[tokio::test]
async fn a_private_redis_server_starts_and_stops() {
    let private = private_redis().await;
    let client = redis::Client::open(private.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
    let address = private.url().trim_start_matches("redis://").to_owned();
    let dir = private.dir().to_owned();

    private.stop().await;
    assert!(
        tokio::net::TcpStream::connect(address).await.is_err(),
        "the private redis is still up"
    );
    assert!(
        dir.join("appendonlydir").exists() || dir.join("dump.rdb").exists(),
        "nothing persisted in the data dir"
    );
}

#[tokio::test]
async fn only_configured_origins_may_call_cross_origin() {
    let app =
        TestApp::spawn_with(|config| config.cors_origins = vec!["https://app.example".into()])
            .await;
    let preflight = |origin: &'static str| {
        app.http
            .request(reqwest::Method::OPTIONS, app.url("/graphql"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    let allowed = preflight("https://app.example").await.unwrap();
    assert_eq!(
        allowed.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(
        allowed
            .headers()
            .get("access-control-allow-credentials")
            .is_none()
    );
    let refused = preflight("https://evil.example").await.unwrap();
    assert!(
        refused
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );

    let same_origin_only = TestApp::spawn().await;
    let response = same_origin_only
        .http
        .post(same_origin_only.url("/graphql"))
        .header("origin", "https://app.example")
        .header("content-type", "application/json")
        .body(json!({ "query": "{ viewer { id } }" }).to_string())
        .send()
        .await
        .unwrap();
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
}

#[tokio::test]
async fn losing_redis_makes_the_hot_path_unavailable_not_broken() {
    let (app, private) = app_on_a_private_redis().await;
    let (token, _) = app.sign_up("redisless").await;
    let article = app.publish(&token, "still here").await;

    private.stop().await;
    let view = app
        .graphql(
            "mutation($a: ID!) { recordView(articleId: $a) { counted } }",
            json!({ "a": article }),
        )
        .await;
    assert_eq!(crate::helpers::error_code(&view), "UNAVAILABLE", "{view}");
    assert!(
        !view.to_string().contains("refused"),
        "internal detail leaked: {view}"
    );
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["redis"], "unreachable");
    assert_eq!(body["sql"], "ok");
}

#[tokio::test]
async fn an_article_published_while_redis_is_down_is_kept_and_its_deferred_announcement_counted() {
    let (app, private) = app_on_a_private_redis().await;
    let (token, _) = app.sign_up("announcer").await;
    let deferred_before = series(
        &app.metrics().await,
        "pulse_article_announcements_deferred_total",
    );

    private.stop().await;
    let article = app.publish(&token, "committed without Redis").await;

    assert_eq!(
        app.stored_article(&article).await.title,
        "committed without Redis"
    );
    let deferred_after = series(
        &app.metrics().await,
        "pulse_article_announcements_deferred_total",
    );
    assert!(
        deferred_after >= deferred_before + 1.0,
        "the deferred announcement was not counted: {deferred_before} -> {deferred_after}"
    );
}

/// The metric names written in the source: every `"pulse_…"` string literal under `src/` and the
/// workspace crates' `crates/*/src/`.
fn metric_names_in_the_source() -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut directories = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        directories.push(entry.unwrap().path().join("src"));
    }
    while let Some(directory) = directories.pop() {
        for entry in std::fs::read_dir(directory).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                directories.push(path);
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            for (at, _) in source.match_indices("\"pulse_") {
                let name: String = source[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

#[tokio::test]
async fn every_metric_is_described_and_present_from_start_up() {
    let app = TestApp::spawn().await;
    let catalogue: std::collections::BTreeSet<String> = pulse::telemetry::METRICS
        .iter()
        .map(|metric| metric.name.to_owned())
        .collect();
    let in_source = metric_names_in_the_source();
    assert!(
        in_source.len() >= 20,
        "the source scan finds the metrics: {in_source:?}"
    );
    let missing: Vec<_> = in_source.difference(&catalogue).collect();
    assert!(
        missing.is_empty(),
        "metrics missing from telemetry::METRICS: {missing:?}"
    );

    // No request has been made: the scrape is the first thing this server answers.
    let scrape = app.metrics().await;
    for metric in pulse::telemetry::METRICS {
        let kind = match metric.kind {
            pulse::telemetry::MetricKind::Counter => "counter",
            pulse::telemetry::MetricKind::Gauge => "gauge",
            pulse::telemetry::MetricKind::Histogram => "histogram",
        };
        assert!(
            scrape.contains(&format!("# HELP {} ", metric.name)),
            "no HELP for {}",
            metric.name
        );
        assert!(
            scrape.contains(&format!("# TYPE {} {kind}\n", metric.name)),
            "no TYPE {kind} for {}",
            metric.name
        );
    }
}

#[tokio::test]
async fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let directory =
        std::env::temp_dir().join(format!("pulse-logs-{}", crate::helpers::unique_suffix()));
    std::fs::create_dir_all(&directory).unwrap();
    let database = format!("sqlite://{}/logs.db?mode=rwc", directory.display());
    let output = crate::helpers::pulse_command()
        .args(["--database-url", &database, "migrate"])
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let logs = String::from_utf8(output.stderr).unwrap();
    assert!(logs.contains("INFO"), "the command logged: {logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "escape codes in piped logs: {logs:?}"
    );
}
