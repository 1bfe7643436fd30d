use std::sync::Arc;
use std::time::Duration;

use pulse::graphql::ids;
use pulse::keys::ViewKeys;
use pulse::views::ViewFlusher;
use serde_json::{Value, json};

use crate::helpers::{TestApp, error_code, eventually, stored_article};

const RECORD: &str = "mutation($a: ID!) { recordView(articleId: $a) { counted skipReason viewCount article { id } } }";
pub(crate) const BROWSER: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36";
const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

/// An app that believes X-Forwarded-For from loopback, so a test can be many viewers at once.
pub(crate) async fn app_behind_proxy() -> Arc<TestApp> {
    Arc::new(
        TestApp::spawn_with(|config| {
            config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()]
        })
        .await,
    )
}

pub(crate) async fn record(
    app: &TestApp,
    article: &str,
    client_ip: &str,
    user_agent: &str,
) -> Value {
    let body = json!({ "query": RECORD, "variables": { "a": article } }).to_string();
    let headers = [("x-forwarded-for", client_ip), ("user-agent", user_agent)];
    app.post_with_headers(body, None, &headers).await.1
}

pub(crate) async fn view_count(app: &TestApp, article: &str) -> i64 {
    let response = app
        .graphql(
            "query($a: ID!) { article(id: $a) { viewCount } }",
            json!({ "a": article }),
        )
        .await;
    response["data"]["article"]["viewCount"]
        .as_i64()
        .unwrap_or_else(|| panic!("{response}"))
}

pub(crate) async fn sql_view_count(app: &TestApp, article: &str) -> i64 {
    app.stored_article(article).await.view_count
}

pub(crate) fn flusher(app: &TestApp) -> ViewFlusher {
    ViewFlusher::new(
        app.state.db.clone(),
        app.state.redis.clone(),
        Duration::from_secs(30),
    )
}

pub(crate) async fn publish_one(app: &TestApp) -> String {
    let (token, _) = app.sign_up("author").await;
    app.publish(&token, "viewed").await
}

/// Fires `views` concurrently, viewer `i` being `viewer(i)`; returns how many were counted.
pub(crate) async fn concurrent_views(
    app: &Arc<TestApp>,
    article: &str,
    views: usize,
    viewer: fn(usize) -> String,
) -> usize {
    let calls = (0..views).map(|i| {
        let (app, article) = (app.clone(), article.to_owned());
        tokio::spawn(async move { record(&app, &article, &viewer(i), BROWSER).await })
    });
    let mut counted = 0;
    for response in futures_util::future::join_all(calls).await {
        let response = response.unwrap();
        let payload = &response["data"]["recordView"];
        assert!(payload.is_object(), "{response}");
        if payload["counted"] == true {
            assert!(payload["skipReason"].is_null());
            counted += 1;
        } else {
            assert_eq!(payload["skipReason"], "DUPLICATE");
        }
    }
    counted
}

/// `views` concurrent views by distinct viewers, view `i` of article `i % articles` sent to app
/// `i % apps`; returns how many were counted.
async fn spread_views(apps: &[Arc<TestApp>], articles: &[String], views: usize) -> usize {
    let calls = (0..views).map(|i| {
        let app = apps[i % apps.len()].clone();
        let article = articles[i % articles.len()].clone();
        tokio::spawn(async move {
            let response = record(&app, &article, &distinct_ip(i), BROWSER).await;
            response["data"]["recordView"]["counted"] == true
        })
    });
    let answers = futures_util::future::join_all(calls).await;
    answers
        .into_iter()
        .filter(|counted| *counted.as_ref().unwrap())
        .count()
}

pub(crate) fn distinct_ip(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

#[tokio::test]
async fn five_hundred_concurrent_views_from_one_viewer_count_once() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    let counted = concurrent_views(&app, &article, 500, |_| "198.51.100.1".to_owned()).await;
    assert_eq!(counted, 1);
    assert_eq!(view_count(&app, &article).await, 1);
}

#[tokio::test]
async fn five_hundred_concurrent_viewers_count_five_hundred() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    let counted = concurrent_views(&app, &article, 500, distinct_ip).await;
    assert_eq!(counted, 500);
    assert_eq!(view_count(&app, &article).await, 500);

    flusher(&app).flush_all().await.unwrap();
    assert_eq!(sql_view_count(&app, &article).await, 500);
    assert_eq!(
        view_count(&app, &article).await,
        500,
        "the flush changed the visible count"
    );
}

#[tokio::test]
async fn the_answer_shows_the_new_count_at_once() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    for expected in 1..=3 {
        let response = record(&app, &article, &distinct_ip(expected), BROWSER).await;
        assert_eq!(response["data"]["recordView"]["viewCount"], expected as i64);
        assert_eq!(
            response["data"]["recordView"]["article"]["id"],
            article.as_str()
        );
    }
    let repeat = record(&app, &article, &distinct_ip(1), BROWSER).await;
    assert_eq!(repeat["data"]["recordView"]["counted"], false);
    assert_eq!(repeat["data"]["recordView"]["viewCount"], 3);
}

#[tokio::test]
async fn signed_in_viewers_are_deduplicated_by_user_not_address() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    let (reader, _) = app.sign_up("reader").await;
    let body = json!({ "query": RECORD, "variables": { "a": article } }).to_string();
    for ip in ["203.0.113.1", "203.0.113.2"] {
        app.post_with_headers(body.clone(), Some(&reader), &[("x-forwarded-for", ip)])
            .await;
    }
    assert_eq!(
        view_count(&app, &article).await,
        1,
        "one user on two networks is one viewer"
    );
    let anonymous = record(&app, &article, "203.0.113.1", BROWSER).await;
    assert_eq!(
        anonymous["data"]["recordView"]["counted"], true,
        "the address itself was not yet counted"
    );
}

#[tokio::test]
async fn crawlers_are_not_counted() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    record(&app, &article, "198.51.100.7", BROWSER).await;
    for (i, agent) in [GOOGLEBOT, "curl/8.5.0", "python-requests/2.31"]
        .into_iter()
        .enumerate()
    {
        let response = record(&app, &article, &distinct_ip(i + 100), agent).await;
        let payload = &response["data"]["recordView"];
        assert_eq!(payload["counted"], false, "{agent}");
        assert_eq!(payload["skipReason"], "CRAWLER");
        assert_eq!(payload["viewCount"], 1);
    }
    assert_eq!(view_count(&app, &article).await, 1);
}

#[tokio::test]
async fn a_rendering_server_behind_a_trusted_address_forwards_the_browsers_user_agent() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    let body = json!({ "query": RECORD, "variables": { "a": article } }).to_string();
    let rendered = [
        ("x-forwarded-for", "198.51.100.30"),
        ("user-agent", "node-fetch/3.3"),
        ("x-forwarded-user-agent", BROWSER),
    ];
    let response = app.post_with_headers(body.clone(), None, &rendered).await.1;
    assert_eq!(
        response["data"]["recordView"]["counted"], true,
        "{response}"
    );

    // Without the forwarded header, the server's own HTTP library is what asks: a crawler.
    let unforwarded = [
        ("x-forwarded-for", "198.51.100.31"),
        ("user-agent", "node-fetch/3.3"),
    ];
    let response = app
        .post_with_headers(body.clone(), None, &unforwarded)
        .await
        .1;
    assert_eq!(response["data"]["recordView"]["skipReason"], "CRAWLER");

    // From an address that is not a trusted proxy the header is the client's own word: ignored.
    let untrusted = TestApp::spawn().await;
    let article = publish_one(&untrusted).await;
    let body = json!({ "query": RECORD, "variables": { "a": article } }).to_string();
    let claimed = [
        ("user-agent", "curl/8.5.0"),
        ("x-forwarded-user-agent", BROWSER),
    ];
    let response = untrusted.post_with_headers(body, None, &claimed).await.1;
    assert_eq!(response["data"]["recordView"]["skipReason"], "CRAWLER");
    assert_eq!(view_count(&untrusted, &article).await, 0);
}

#[tokio::test]
async fn extra_crawler_patterns_come_from_the_config_file() {
    let patterns =
        std::env::temp_dir().join(format!("pulse-crawlers-{}.txt", rand::random::<u32>()));
    std::fs::write(&patterns, "# our uptime monitor\nAcmeMonitor/\\d+\n").unwrap();
    let app = Arc::new(
        TestApp::spawn_with(|config| {
            config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            config.crawler_patterns_file = Some(patterns);
        })
        .await,
    );
    let article = publish_one(&app).await;
    let response = record(&app, &article, "198.51.100.8", "AcmeMonitor/2").await;
    assert_eq!(response["data"]["recordView"]["skipReason"], "CRAWLER");
}

#[tokio::test]
async fn unknown_articles_are_not_found_and_count_nothing() {
    let app = app_behind_proxy().await;
    let missing = ids::encode(pulse::articles::ARTICLE, 987_654).0;
    let response = record(&app, &missing, "198.51.100.9", BROWSER).await;
    assert_eq!(error_code(&response), "NOT_FOUND");

    let keys = app.keys_under_prefix().await;
    // The job runtime creates its (empty) streams at start-up, and the owner key is the start's.
    let owner = app.state.redis.keys.owner();
    assert!(
        keys.iter()
            .all(|key| key.contains("ratelimit") || key.contains(":job:") || *key == owner),
        "an unknown article left state: {keys:?}"
    );
}

#[tokio::test]
async fn malformed_article_ids_are_bad_input() {
    let app = app_behind_proxy().await;
    let (_, user_id) = app.sign_up("someone").await;
    for bad in ["not-an-id", user_id.as_str()] {
        let response = record(&app, bad, "198.51.100.10", BROWSER).await;
        assert_eq!(error_code(&response), "BAD_USER_INPUT", "{bad}");
    }
}

#[tokio::test]
async fn flushing_moves_counts_to_sql_exactly_once() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    concurrent_views(&app, &article, 40, distinct_ip).await;

    let flusher = flusher(&app);
    let first = flusher.flush_all().await.unwrap();
    assert_eq!(first.views, 40);
    let again = flusher.flush_all().await.unwrap();
    assert_eq!(again.views, 0, "a flushed view was flushed again");
    assert_eq!(sql_view_count(&app, &article).await, 40);

    let pending_keys = pending_entries(&app).await;
    assert_eq!(pending_keys, 0, "flushed entries must not linger in Redis");
}

pub(crate) async fn pending_entries(app: &TestApp) -> i64 {
    let mut conn = app.state.redis.conn.clone();
    let mut total = 0;
    for shard in 0..pulse::keys::VIEW_SHARDS {
        let len: i64 = redis::cmd("HLEN")
            .arg(app.state.redis.keys.view_shard_by_index(shard).pending())
            .query_async(&mut conn)
            .await
            .unwrap();
        total += len;
    }
    total
}

/// A batch committed to SQL whose process died before clearing Redis is re-driven later; its batch
/// id must make that replay a no-op.
#[tokio::test]
async fn replaying_a_committed_batch_changes_nothing() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    concurrent_views(&app, &article, 25, distinct_ip).await;
    let row = ids::decode(&article.clone().into(), pulse::articles::ARTICLE, "id").unwrap();
    let shard = app.state.redis.keys.view_shard(row);
    let mut conn = app.state.redis.conn.clone();

    flusher(&app).flush_all().await.unwrap();
    assert_eq!(sql_view_count(&app, &article).await, 25);

    // Put Redis back as it was between commit and clear: the batch in flight with an expired
    // lease, its views still pending.
    use sea_orm::EntityTrait as _;
    let batch = pulse::entities::view_flush_batches::Entity::find()
        .one(&app.state.db)
        .await
        .unwrap()
        .unwrap();
    let () = redis::pipe()
        .hset_multiple(
            shard.in_flight(),
            &[
                ("batch".to_owned(), batch.batch_id.clone()),
                ("lease".into(), "0".into()),
                (row.to_string(), "25".into()),
            ],
        )
        .hincr(shard.pending(), row, 25)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    let replay = flusher(&app).flush_all().await.unwrap();
    assert_eq!(replay.batches, 1, "the batch left in flight was re-driven");
    assert_eq!(
        sql_view_count(&app, &article).await,
        25,
        "the replay counted twice"
    );
    assert_eq!(pending_entries(&app).await, 0);
    assert_eq!(view_count(&app, &article).await, 25);
}

#[tokio::test]
async fn concurrent_flushers_never_double_count() {
    let app = app_behind_proxy().await;
    let (token, _) = app.sign_up("prolific").await;
    let articles = app.publish_many(&token, "a", 20).await;
    let stop = tokio_util::sync::CancellationToken::new();
    // A short lease: a batch whose commit failed (or is merely slow) on a busy machine is soon
    // re-driven by another flusher instead of waiting out the default lease.
    let flusher = ViewFlusher::new(
        app.state.db.clone(),
        app.state.redis.clone(),
        Duration::from_secs(2),
    );
    let flushers: Vec<_> = (0..6)
        .map(|_| {
            let (flusher, stop) = (flusher.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    // Six flushers contend for SQLite's one writer; one that waits too long on a
                    // busy machine fails as the real loop's would, and tries again next round.
                    if let Err(err) = flusher.flush_all().await {
                        assert_eq!(err.code(), "UNAVAILABLE", "{err}");
                    }
                }
            })
        })
        .collect();
    let counted = spread_views(std::slice::from_ref(&app), &articles, 600).await;
    stop.cancel();
    for flusher in flushers {
        flusher.await.unwrap();
    }
    eventually("every pending view reaches SQL", async || {
        flusher
            .flush_all()
            .await
            .is_ok_and(|report| report.busy_shards == 0)
            && pending_entries(&app).await == 0
    })
    .await;

    assert_eq!(counted, 600);
    let mut in_sql = 0;
    for article in &articles {
        in_sql += sql_view_count(&app, article).await;
        assert_eq!(
            view_count(&app, article).await,
            sql_view_count(&app, article).await
        );
    }
    assert_eq!(in_sql, 600);
    assert_eq!(pending_entries(&app).await, 0);
}

#[tokio::test]
async fn views_keep_counting_while_the_author_edits() {
    // Forty edits and a looping flusher queue on SQLite's one writer beside 300 views: on a busy
    // machine an edit can wait longer than the default busy timeout, and this test is about the
    // counts, not about how long a write may queue.
    let app = Arc::new(
        TestApp::spawn_with(|config| {
            config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            config.sqlite_busy_timeout = Duration::from_secs(60);
        })
        .await,
    );
    let (token, _) = app.sign_up("editor").await;
    let article = app.publish(&token, "draft").await;
    let flusher = flusher(&app);
    let flushing = {
        let flusher = flusher.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                flusher.flush_all().await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let edits = (0..40).map(|i| {
        let (app, token, article) = (app.clone(), token.clone(), article.clone());
        tokio::spawn(async move {
            let response = app
                .graphql_as(
                    Some(&token),
                    "mutation($id: ID!, $t: String) { editArticle(id: $id, input: { title: $t }) { id } }",
                    json!({ "id": article, "t": format!("rev {i}") }),
                )
                .await;
            assert!(response["errors"].is_null(), "{response}");
        })
    });
    let (counted, edits, flushed) = tokio::join!(
        concurrent_views(&app, &article, 300, distinct_ip),
        futures_util::future::join_all(edits),
        flushing,
    );
    edits.into_iter().for_each(|edit| edit.unwrap());
    flushed.unwrap();
    flusher.flush_all().await.unwrap();

    assert_eq!(counted, 300);
    assert_eq!(sql_view_count(&app, &article).await, 300);
    assert_eq!(view_count(&app, &article).await, 300);
}

#[tokio::test]
async fn rankings_order_articles_by_views_per_window() {
    let app = app_behind_proxy().await;
    let (token, _) = app.sign_up("ranked").await;
    let articles = app.publish_many(&token, "r", 5).await;
    // Article i gets i + 1 views.
    for (i, article) in articles.iter().enumerate() {
        for viewer in 0..=i {
            record(&app, article, &distinct_ip(viewer), BROWSER).await;
        }
    }
    for window in ["ALL_TIME", "DAY", "WEEK"] {
        let response = app
            .graphql(
                "query($w: RankingWindow!) { topArticles(window: $w, first: 3) { rank score article { id viewCount } } }",
                json!({ "w": window }),
            )
            .await;
        let top = response["data"]["topArticles"]
            .as_array()
            .unwrap_or_else(|| panic!("{response}"));
        let ids: Vec<&str> = top
            .iter()
            .map(|entry| entry["article"]["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            vec![
                articles[4].as_str(),
                articles[3].as_str(),
                articles[2].as_str()
            ],
            "{window}"
        );
        assert_eq!(top[0]["rank"], 1);
        assert_eq!(top[0]["score"], 5.0);
    }

    flusher(&app).flush_all().await.unwrap();
    let after_flush = app
        .graphql("{ topArticles(first: 1) { score } }", json!({}))
        .await;
    assert_eq!(
        after_flush["data"]["topArticles"][0]["score"], 5.0,
        "a flush must not move the ranking"
    );
    let too_many = app
        .graphql("{ topArticles(first: 1000) { score } }", json!({}))
        .await;
    assert_eq!(error_code(&too_many), "BAD_USER_INPUT");
}

#[tokio::test]
async fn rebuilding_restores_counts_and_ranking_from_sql() {
    let app = app_behind_proxy().await;
    let (token, _) = app.sign_up("rebuilt").await;
    let quiet = app.publish(&token, "quiet").await;
    let popular = app.publish(&token, "popular").await;
    concurrent_views(&app, &popular, 12, distinct_ip).await;
    record(&app, &quiet, "198.51.100.20", BROWSER).await;
    flusher(&app).flush_all().await.unwrap();
    record(&app, &popular, "198.51.100.21", BROWSER).await;

    // Lose every cached structure (but not the pending view).
    let mut conn = app.state.redis.conn.clone();
    for shard in 0..pulse::keys::VIEW_SHARDS {
        let keys = app.state.redis.keys.view_shard_by_index(shard);
        let () = redis::pipe()
            .del(keys.base())
            .ignore()
            .del(keys.rank_all_time())
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert_eq!(
        app.graphql("{ topArticles { score } }", json!({})).await["data"]["topArticles"],
        json!([])
    );

    let rebuilt = app.state.services.views.rebuild_all().await.unwrap();
    assert_eq!(rebuilt, 2);
    let top = app
        .graphql(
            "{ topArticles(first: 2) { score article { id viewCount } } }",
            json!({}),
        )
        .await;
    assert_eq!(
        top["data"]["topArticles"][0]["article"]["id"],
        popular.as_str()
    );
    assert_eq!(top["data"]["topArticles"][0]["score"], 13.0);
    assert_eq!(top["data"]["topArticles"][0]["article"]["viewCount"], 13);
    assert_eq!(top["data"]["topArticles"][1]["score"], 1.0);
}

#[tokio::test]
async fn a_clean_shutdown_flushes_what_is_pending() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    concurrent_views(&app, &article, 30, distinct_ip).await;
    let state = app.state.clone();
    let app = Arc::try_unwrap(app)
        .ok()
        .expect("the viewers are done with the app");
    app.stop().await.unwrap();

    assert_eq!(stored_article(&state, &article).await.view_count, 30);
}

/// Two servers on one database and one Redis prefix, both flushing every 50 ms while views arrive
/// through both.
#[tokio::test]
async fn two_servers_flushing_at_once_never_double_count() {
    let config = crate::helpers::test_config(|config| {
        config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        config.view_flush_interval = Duration::from_millis(50);
    })
    .await;
    let first = Arc::new(TestApp::start(config.clone()).await);
    let second = Arc::new(TestApp::start(config).await);
    let (token, _) = first.sign_up("shared").await;
    let articles = first.publish_many(&token, "s", 8).await;

    let counted = spread_views(&[first.clone(), second.clone()], &articles, 400).await;
    assert_eq!(counted, 400);

    let in_sql = async || {
        let mut in_sql = 0;
        for article in &articles {
            in_sql += sql_view_count(&first, article).await;
        }
        in_sql
    };
    eventually("every view is flushed", async || {
        in_sql().await >= 400 && pending_entries(&first).await == 0
    })
    .await;
    assert_eq!(in_sql().await, 400);
    assert_eq!(pending_entries(&first).await, 0);
    for article in &articles {
        assert_eq!(
            view_count(&second, article).await,
            sql_view_count(&first, article).await
        );
    }
}
