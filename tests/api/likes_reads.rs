//! Reading likes: a page costs a constant number of Redis round trips, and `pulse rebuild likes`
//! puts back what Redis lost.

use std::time::Duration;

use futures_util::future::join_all;
use redis::AsyncCommands as _;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::likes::{app_archiving_on_demand, drain, set_like, users};
use crate::subscriptions::{Socket, connect, next_message, send};

const PAGE: &str = "query($first: Int) { articles(first: $first) { edges { node { id likeCount viewerHasLiked } } } }";

/// Round trips the app's Redis connection makes while `request` runs, once the app is quiet.
async fn round_trips_of(app: &TestApp, token: &str, first: usize) -> (u64, Value) {
    settle(app).await;
    let before = app.state.redis.conn.round_trips();
    let page = app
        .graphql_as(Some(token), PAGE, json!({ "first": first }))
        .await;
    // Relations read from SQL are cached by a task the request leaves behind: count it too.
    settle(app).await;
    (app.state.redis.conn.round_trips() - before, page)
}

/// Waits until the app's connection has been idle for a while (the request's left-over caching).
async fn settle(app: &TestApp) {
    let mut last = app.state.redis.conn.round_trips();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = app.state.redis.conn.round_trips();
        if now == last {
            return;
        }
        last = now;
    }
}

fn liked_flags(page: &Value) -> Vec<(String, i64, bool)> {
    page["data"]["articles"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{page}"))
        .iter()
        .map(|edge| {
            let node = &edge["node"];
            (
                node["id"].as_str().unwrap().to_owned(),
                node["likeCount"].as_i64().unwrap(),
                node["viewerHasLiked"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_page_of_likes_costs_the_same_round_trips_for_ten_articles_as_for_fifty() {
    // No job consumer: nothing but the requests uses the app's Redis connection.
    let app = app_archiving_on_demand().await;
    let people = users(&app, 3).await;
    let (author, viewer, cold_viewer) = (&people[0].1, &people[1].1, &people[2].1);
    let articles = app.publish_many(author, "page", 50).await;
    // The viewer likes every third article; half of those likes are archived, half not yet.
    for article in articles.iter().step_by(3).take(8) {
        set_like(&app, Some(viewer), article, true).await;
    }
    drain(&app).await;
    for article in articles.iter().step_by(3).skip(8) {
        set_like(&app, Some(viewer), article, true).await;
    }

    // Warm: every relation is cached or unarchived.
    let mut warm = Vec::new();
    for first in [50, 10, 50] {
        let (trips, page) = round_trips_of(&app, viewer, first).await;
        let flags = liked_flags(&page);
        assert_eq!(flags.len(), first);
        for (id, count, liked) in flags {
            let expected = articles.iter().position(|a| *a == id).unwrap() % 3 == 0;
            assert_eq!((count, liked), (i64::from(expected), expected), "{id}");
        }
        warm.push(trips);
    }
    // The first read cached the relations SQL had to answer (one more round trip); the later ones
    // found them: like counts and relations, one pipeline each, whatever the page size.
    assert_eq!(warm, vec![3, 2, 2]);

    // Cold: a viewer whose relations no cache holds costs one more round trip, to cache them.
    let (ten, _) = round_trips_of(&app, cold_viewer, 10).await;
    let cold = users(&app, 1).await.remove(0).1;
    let (fifty, page) = round_trips_of(&app, &cold, 50).await;
    assert_eq!(ten, fifty);
    assert_eq!(fifty, 3);
    assert!(liked_flags(&page).iter().all(|(_, _, liked)| !liked));
}

#[tokio::test]
async fn rebuilding_likes_from_sql_matches_the_live_state() {
    let app = app_archiving_on_demand().await;
    let people = users(&app, 6).await;
    let author = &people[0].1;
    let articles = app.publish_many(author, "rebuilt", 4).await;
    let comment = crate::likes::comment(&app, author, &articles[0], "liked comment").await;
    for (index, (_, token)) in people.iter().enumerate() {
        for article in &articles[..index % 4 + 1] {
            set_like(&app, Some(token), article, true).await;
        }
        set_like(&app, Some(token), &comment, index % 2 == 0).await;
    }
    drain(&app).await;
    // Some changes stay unarchived through the rebuild.
    set_like(&app, Some(&people[5].1), &articles[3], true).await;
    set_like(&app, Some(&people[1].1), &articles[0], false).await;

    let snapshot = || async {
        let mut seen = Vec::new();
        for (_, token) in &people {
            for subject in articles.iter().chain([&comment]) {
                seen.push(crate::likes::like_state(&app, Some(token), subject).await);
            }
        }
        let top = app
            .graphql(
                "{ topArticles(by: LIKES) { score article { id } } }",
                json!({}),
            )
            .await["data"]["topArticles"]
            .clone();
        (seen, top)
    };
    let before = snapshot().await;
    assert!(
        before.1.as_array().is_some_and(|top| top.len() == 4),
        "{:?}",
        before.1
    );

    // Redis loses every cache: relations, bases, rankings.
    let mut redis = app.state.redis.conn.clone();
    let keys = app.keys_under_prefix().await;
    let caches: Vec<&String> = keys
        .iter()
        .filter(|key| {
            key.contains(":lr:")
                || key.contains(":base:")
                || key.contains(":basever:")
                || key.contains(":rank:all:")
        })
        .collect();
    assert!(!caches.is_empty());
    let _: () = redis.del(&caches).await.unwrap();
    let empty_top = app
        .graphql("{ topArticles(by: LIKES) { score } }", json!({}))
        .await;
    assert_eq!(empty_top["data"]["topArticles"], json!([]));

    let rebuilt = app.state.services.likes.rebuild_all().await.unwrap();
    assert_eq!(rebuilt.subjects, 5);
    assert_eq!(snapshot().await, before);

    // And once the rest is archived, SQL agrees with the counts shown.
    drain(&app).await;
    for article in &articles {
        let shown = crate::likes::like_state(&app, None, article).await.0;
        assert_eq!(app.stored_article(article).await.like_count, shown);
    }
}

#[tokio::test]
async fn the_rebuild_command_drops_cached_relations_and_keeps_counts() {
    let app = app_archiving_on_demand().await;
    let people = users(&app, 2).await;
    let articles = app.publish_many(&people[0].1, "cmd", 2).await;
    join_all(
        articles
            .iter()
            .map(|article| set_like(&app, Some(&people[1].1), article, true)),
    )
    .await;
    let rebuilt = app.state.services.likes.rebuild_all().await.unwrap();
    assert_eq!(rebuilt.relations_dropped, 2);
    for article in &articles {
        assert_eq!(
            crate::likes::like_state(&app, Some(&people[1].1), article).await,
            (1, true),
            "the unarchived like was forgotten"
        );
    }
}

/// Subscribes to `articleStatsChanged` on `app`; returns the socket once acknowledged.
pub(crate) async fn watch_stats(app: &TestApp, article: &str) -> Socket {
    let mut socket = connect(app, "graphql-transport-ws", json!({})).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    send(
        &mut socket,
        json!({ "id": "stats", "type": "subscribe", "payload": {
            "query": "subscription($a: ID!) { articleStatsChanged(articleId: $a) { articleId version viewCount likeCount commentCount } }",
            "variables": { "a": article } } }),
    )
    .await;
    socket
}

/// The next stats pushed on `socket`: `(views, likes, comments)`.
pub(crate) async fn next_stats(socket: &mut Socket) -> (i64, i64, i64) {
    next_versioned_stats(socket).await.0
}

/// The next stats pushed on `socket`, and their version.
pub(crate) async fn next_versioned_stats(socket: &mut Socket) -> ((i64, i64, i64), i64) {
    let message = next_message(socket)
        .await
        .expect("the subscription goes on");
    let stats = &message["payload"]["data"]["articleStatsChanged"];
    assert!(stats.is_object(), "{message}");
    let version = stats["version"]
        .as_str()
        .and_then(|version| version.parse().ok())
        .unwrap_or_else(|| panic!("no version: {message}"));
    let counts = (
        stats["viewCount"].as_i64().unwrap(),
        stats["likeCount"].as_i64().unwrap(),
        stats["commentCount"].as_i64().unwrap(),
    );
    (counts, version)
}

/// Reads pushes until one equals `expected`; every push on the way must differ from the one before.
async fn until_stats(socket: &mut Socket, mut last: (i64, i64, i64), expected: (i64, i64, i64)) {
    while last != expected {
        let next = next_stats(socket).await;
        assert_ne!(next, last, "a push that changed nothing");
        last = next;
    }
}

#[tokio::test]
async fn a_subscriber_on_one_process_sees_views_likes_and_comments_made_through_another() {
    let config = crate::helpers::test_config(|config| {
        config.stats_tick = Duration::from_millis(100);
        config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    let watched = TestApp::start(config.clone()).await;
    let acting = TestApp::start(config).await;
    let people = users(&acting, 3).await;
    let article = acting.publish(&people[0].1, "watched").await;

    let mut socket = watch_stats(&watched, &article).await;
    assert_eq!(next_stats(&mut socket).await, (0, 0, 0));

    set_like(&acting, Some(&people[1].1), &article, true).await;
    until_stats(&mut socket, (0, 0, 0), (0, 1, 0)).await;
    crate::likes::comment(&acting, &people[2].1, &article, "seen live").await;
    until_stats(&mut socket, (0, 1, 0), (0, 1, 1)).await;
    let view = acting
        .post_with_headers(
            json!({ "query": "mutation($a: ID!) { recordView(articleId: $a) { counted } }", "variables": { "a": article } }).to_string(),
            None,
            &[("x-forwarded-for", "198.51.100.40"), ("user-agent", "Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0")],
        )
        .await
        .1;
    assert_eq!(view["data"]["recordView"]["counted"], true, "{view}");
    until_stats(&mut socket, (0, 1, 1), (1, 1, 1)).await;
    set_like(&acting, Some(&people[1].1), &article, false).await;
    until_stats(&mut socket, (1, 1, 1), (1, 0, 1)).await;
}

#[tokio::test]
async fn stats_versions_grow_with_every_change_and_two_processes_agree_on_their_order() {
    let config = crate::helpers::test_config(|config| {
        config.stats_tick = Duration::from_millis(50);
        config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    let first = TestApp::start(config.clone()).await;
    let second = TestApp::start(config).await;
    let people = users(&first, 2).await;
    let article = first.publish(&people[0].1, "versioned").await;
    let mut sockets = [
        watch_stats(&first, &article).await,
        watch_stats(&second, &article).await,
    ];
    // Each change made through either process in turn, some of them back to counts seen before
    // (an unlike, a deleted comment): the version still moves on.
    let mut state = (0, 0, 0);
    let mut floor = i64::MIN;
    let mut comment = None;
    for step in 0..6 {
        let acting = if step % 2 == 0 { &first } else { &second };
        if step > 0 {
            state = match step {
                1 => {
                    set_like(acting, Some(&people[1].1), &article, true).await;
                    (state.0, 1, state.2)
                }
                2 => {
                    set_like(acting, Some(&people[1].1), &article, false).await;
                    (state.0, 0, state.2)
                }
                3 => {
                    comment =
                        Some(crate::likes::comment(acting, &people[1].1, &article, "c").await);
                    (state.0, state.1, 1)
                }
                4 => {
                    let id = comment.take().unwrap();
                    let deleted = acting
                        .graphql_as(
                            Some(&people[1].1),
                            "mutation($id: ID!) { deleteComment(id: $id) }",
                            json!({ "id": id }),
                        )
                        .await;
                    assert!(deleted["errors"].is_null(), "{deleted}");
                    (state.0, state.1, 0)
                }
                _ => {
                    let view = acting
                        .post_with_headers(
                            json!({ "query": "mutation($a: ID!) { recordView(articleId: $a) { counted } }", "variables": { "a": article } }).to_string(),
                            None,
                            &[("x-forwarded-for", "198.51.100.41"), ("user-agent", "Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0")],
                        )
                        .await
                        .1;
                    assert_eq!(view["data"]["recordView"]["counted"], true, "{view}");
                    (state.0 + 1, state.1, state.2)
                }
            };
        }
        // Both processes' snapshots of this state have versions above every version either sent
        // for an earlier state, each socket's growing.
        let mut versions = Vec::new();
        for socket in &mut sockets {
            let mut last = i64::MIN;
            loop {
                let (counts, version) = next_versioned_stats(socket).await;
                assert!(version > last, "{version} after {last} on one socket");
                last = version;
                if counts == state {
                    break;
                }
                assert!(
                    version > floor,
                    "{version} for {counts:?} is below an earlier state's"
                );
            }
            assert!(last > floor, "step {step}: {last} is not above {floor}");
            versions.push(last);
        }
        // Read after the same change, the same state has the same version on both (a clock's
        // would differ).
        assert_eq!(versions[0], versions[1], "step {step}");
        floor = versions[0];
    }
}

#[tokio::test]
async fn many_changes_and_subscribers_cost_one_read_per_tick_and_nothing_when_nothing_changed() {
    let app = TestApp::spawn_with(|config| config.stats_tick = Duration::from_millis(200)).await;
    let people = users(&app, 101).await;
    let article = app.publish(&people[0].1, "busy").await;
    let mut sockets = Vec::new();
    for _ in 0..20 {
        let mut socket = watch_stats(&app, &article).await;
        assert_eq!(next_stats(&mut socket).await, (0, 0, 0));
        sockets.push(socket);
    }
    let reads = app.state.services.stats.reads();
    let started = tokio::time::Instant::now();
    join_all(
        people[1..]
            .iter()
            .map(|(_, token)| set_like(&app, Some(token), &article, true)),
    )
    .await;
    for socket in &mut sockets {
        until_stats(socket, (0, 0, 0), (0, 100, 0)).await;
    }
    let ticks = started.elapsed().as_millis() as u64 / 200 + 2;
    let made = app.state.services.stats.reads() - reads;
    assert!(made <= ticks, "{made} reads in {ticks} ticks");

    // Announcements of the burst may still arrive after the read that showed its end (a read per
    // tick, no push): wait until the reads stop.
    let mut quiet = app.state.services.stats.reads();
    loop {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = app.state.services.stats.reads();
        if now == quiet {
            break;
        }
        quiet = now;
    }
    // A repeat like moves nothing: no read is announced, no push is sent.
    set_like(&app, Some(&people[1].1), &article, true).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(app.state.services.stats.reads(), quiet);
    for socket in &mut sockets {
        let silent = tokio::time::timeout(Duration::from_millis(100), next_message(socket)).await;
        assert!(silent.is_err(), "a push with nothing changed: {silent:?}");
    }
}

#[tokio::test]
async fn watching_an_unknown_article_is_not_found() {
    let app = TestApp::spawn().await;
    let missing = pulse::graphql::ids::encode(pulse::articles::ARTICLE, 987_654);
    let mut socket = watch_stats(&app, &missing).await;
    let message = next_message(&mut socket).await.unwrap();
    assert_eq!(message["type"], "next", "{message}");
    assert_eq!(
        message["payload"]["errors"][0]["extensions"]["code"],
        "NOT_FOUND"
    );
    assert_eq!(next_message(&mut socket).await.unwrap()["type"], "complete");
}
