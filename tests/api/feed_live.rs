//! Live feed items: `feedItemAdded` across processes, only online users announced to, and
//! publishes made while Redis was down reaching inboxes and subscribers exactly once after.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::crash::{free_port, spawn_server_process};
use crate::feed::{bulk_follow, feed_page, in_inbox, publish, token, users};
use crate::helpers::{
    OwnRedis, TestApp, article_row, eventually, process_series, redis_subscribers, test_config,
};
use crate::subscriptions::{Socket, next_message, open_socket_at, send, subscribed_as};
use pulse::keys::{ArticleKeys, FeedKeys};

const FEED_ITEMS: &str = "subscription { feedItemAdded { cursor node { id title } } }";

/// An anonymous websocket subscribed to `articlePublished`.
async fn publications(app: &TestApp) -> Socket {
    let query = "subscription { articlePublished { id title } }";
    subscribed_as(app, json!({}), query, json!({})).await
}

/// The title of the article an `articlePublished` message carries.
fn published_title(message: &Value) -> &str {
    message["payload"]["data"]["articlePublished"]["title"]
        .as_str()
        .unwrap_or_else(|| panic!("not an article: {message}"))
}

/// A websocket of `user` subscribed to `feedItemAdded`, once the subscription reached Redis and
/// the user shows as online.
pub(crate) async fn subscribed(app: &TestApp, user: i64) -> Socket {
    subscribed_with(app, user, FEED_ITEMS).await
}

/// As [`subscribed`], with `query`'s selection.
async fn subscribed_with(app: &TestApp, user: i64, query: &str) -> Socket {
    let socket = subscribed_as(app, json!({ "token": token(app, user) }), query, json!({})).await;
    let channel = app.state.redis.keys.feed_channel(user);
    let online = app.state.redis.keys.feed_user(user).online();
    let mut conn = app.state.redis.conn.clone();
    eventually("the subscription reaches Redis", async || {
        let listening = redis_subscribers(app, &channel).await;
        let present: bool = redis::cmd("EXISTS")
            .arg(&online)
            .query_async(&mut conn)
            .await
            .unwrap_or(false);
        listening > 0 && present
    })
    .await;
    socket
}

pub(crate) fn item_id(message: &Value) -> i64 {
    assert_eq!(message["type"], "next", "{message}");
    let id = message["payload"]["data"]["feedItemAdded"]["node"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("not a feed item: {message}"));
    article_row(id)
}

fn announcements(apps: &[&TestApp]) -> u64 {
    apps.iter()
        .map(|app| {
            let counters = &app.state.services.feed.store().counters;
            counters.announcements.load(Ordering::Relaxed)
        })
        .sum()
}

#[tokio::test]
async fn a_subscriber_on_one_process_gets_what_an_author_publishes_through_another_and_offline_followers_cost_no_publish()
 {
    let config = test_config(|_| {}).await;
    let a = TestApp::start(config.clone()).await;
    let b = TestApp::start(config).await;
    let people = users(&a, "live", 3).await;
    let (author, online, offline) = (people[0], people[1], people[2]);
    bulk_follow(&a, &[online, offline], author).await;
    // Both are active (they have read their feeds); only one is subscribed.
    feed_page(&b, &token(&b, offline), 5, None).await;
    let mut socket = subscribed(&a, online).await;

    let article = publish(&b, &token(&b, author), "across processes").await;
    let message = next_message(&mut socket).await.unwrap();
    assert_eq!(item_id(&message), article);
    assert_eq!(
        message["payload"]["data"]["feedItemAdded"]["node"]["title"],
        "across processes"
    );
    let cursor = message["payload"]["data"]["feedItemAdded"]["cursor"]
        .as_str()
        .unwrap();
    let older = crate::feed::feed_response(&a, Some(&token(&a, online)), 5, Some(cursor)).await;
    assert!(older["data"]["feed"]["edges"].is_array(), "{older}");

    eventually("the offline follower's inbox has it too", async || {
        in_inbox(&a, offline, article).await
    })
    .await;
    assert_eq!(
        announcements(&[&a, &b]),
        1,
        "an offline follower was announced to"
    );
}

#[tokio::test]
async fn an_article_published_while_redis_is_down_reaches_inboxes_and_both_streams_once_after() {
    let port = free_port();
    let dir =
        std::env::temp_dir().join(format!("pulse-feed-redis-{port}-{}", rand::random::<u32>()));
    let mut own = OwnRedis::start(port, dir.clone()).await;
    let url = own.url();
    let app = TestApp::spawn_with(|config| {
        config.redis_url = Some(url);
        config.feed_relay_interval = Duration::from_millis(200);
    })
    .await;
    let people = users(&app, "outage", 3).await;
    let (author, watcher, reader) = (people[0], people[1], people[2]);
    bulk_follow(&app, &[watcher, reader], author).await;
    feed_page(&app, &token(&app, reader), 5, None).await;
    let mut socket = subscribed(&app, watcher).await;
    let mut announced = publications(&app).await;
    let channel = app.state.redis.keys.articles_published_channel();
    eventually("articlePublished reaches Redis", async || {
        redis_subscribers(&app, &channel).await > 0
    })
    .await;

    own.stop().await;
    let published = app
        .graphql_as(
            Some(&token(&app, author)),
            "mutation { publishArticle(input: { title: \"in the dark\", body: \"b\" }) { id } }",
            json!({}),
        )
        .await;
    let article = article_row(
        published["data"]["publishArticle"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("the publish failed without Redis: {published}")),
    );
    assert_eq!(
        app.count("feed_publications WHERE relayed_at IS NULL")
            .await,
        1,
        "the publication was not kept for the relay"
    );

    assert_eq!(
        app.count("feed_publications WHERE announced_at IS NULL")
            .await,
        1,
        "the announcement was not kept for the relay loop"
    );

    let mut own = OwnRedis::start(port, dir).await;
    let message = next_message(&mut socket).await.unwrap();
    assert_eq!(item_id(&message), article, "{message}");
    let message = next_message(&mut announced).await.unwrap();
    assert_eq!(published_title(&message), "in the dark");
    eventually("the reader's inbox has the article", async || {
        in_inbox(&app, reader, article).await
    })
    .await;
    eventually("the publication is dispatched", async || {
        app.count("feed_publications WHERE dispatched_at IS NULL")
            .await
            == 0
    })
    .await;
    eventually("the publication is announced", async || {
        app.count("feed_publications WHERE announced_at IS NULL")
            .await
            == 0
    })
    .await;
    // Exactly once: the next item each subscriber gets is the next article, not the first again.
    let next = publish(&app, &token(&app, author), "after the outage").await;
    let message = next_message(&mut socket).await.unwrap();
    assert_eq!(item_id(&message), next, "the outage's article came twice");
    let message = next_message(&mut announced).await.unwrap();
    assert_eq!(
        published_title(&message),
        "after the outage",
        "the outage's article was announced twice"
    );
    let page = feed_page(&app, &token(&app, reader), 5, None).await;
    assert_eq!(page.ids, vec![next, article]);
    drop((socket, announced));
    app.stop().await.unwrap();
    own.stop().await;
}

#[tokio::test]
async fn an_announcement_made_but_not_recorded_is_made_again_without_a_second_event() {
    use sea_orm::ConnectionTrait as _;
    let app =
        TestApp::spawn_with(|config| config.feed_relay_interval = Duration::from_millis(200)).await;
    let people = users(&app, "unrecorded", 1).await;
    let author = token(&app, people[0]);
    let mut announced = publications(&app).await;
    let first = publish(&app, &author, "announced, then forgotten").await;
    let message = next_message(&mut announced).await.unwrap();
    assert_eq!(published_title(&message), "announced, then forgotten");
    // As if the process died after Redis took the announcement, before SQL recorded it.
    app.state
        .db
        .execute_unprepared(&format!(
            "UPDATE feed_publications SET announced_at = NULL WHERE article_id = {first}"
        ))
        .await
        .unwrap();
    eventually("the relay loop announces it again", async || {
        app.count("feed_publications WHERE announced_at IS NULL")
            .await
            == 0
    })
    .await;
    publish(&app, &author, "the next").await;
    let message = next_message(&mut announced).await.unwrap();
    assert_eq!(
        published_title(&message),
        "the next",
        "the journaled article was announced twice"
    );
}

#[tokio::test]
async fn publications_older_than_their_announcement_record_count_as_announced() {
    use migrations::{Migrator, MigratorTrait as _};
    use sea_orm::ConnectionTrait as _;
    let app = TestApp::spawn().await;
    let people = users(&app, "older", 1).await;
    publish(&app, &token(&app, people[0]), "before the record").await;
    let url = app.config.database_url();
    app.stop().await.unwrap();
    // The database as it was before `announced_at`, with a publication, migrated again.
    let db = pulse::db::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    Migrator::down(&db, Some(1)).await.unwrap();
    Migrator::up(&db, None).await.unwrap();
    let count = async |condition: &str| -> i64 {
        db.query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!("SELECT COUNT(*) AS n FROM feed_publications WHERE {condition}"),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get("", "n")
        .unwrap()
    };
    assert_eq!(count("announced_at = created_at").await, 1);
    assert_eq!(count("announced_at IS NULL").await, 0);
    db.close().await.unwrap();
}

/// Milliseconds `user`'s online marker has left to live.
async fn online_for(app: &TestApp, user: i64) -> i64 {
    let mut conn = app.state.redis.conn.clone();
    redis::cmd("PTTL")
        .arg(app.state.redis.keys.feed_user(user).online())
        .query_async(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_users_online_marker_is_renewed_while_any_of_their_subscriptions_lives_and_left_to_expire_after()
 {
    let app = TestApp::spawn().await;
    let user = users(&app, "presence", 1).await[0];
    let first = subscribed(&app, user).await;
    let second = subscribed(&app, user).await;
    // The process renews every marker a third of its 30 s life after the first subscriber, then
    // as often again: 12 s on, a marker set when the second subscribed (and not renewed since)
    // would have 18 s left, a renewed one more than 20.
    drop(first);
    tokio::time::sleep(Duration::from_secs(12)).await;
    let held = online_for(&app, user).await;
    assert!(
        held > 20_000,
        "the user of a live subscription was not renewed: {held} ms left"
    );

    drop(second);
    let channel = app.state.redis.keys.feed_channel(user);
    eventually("the last subscription has ended", async || {
        redis_subscribers(&app, &channel).await == 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let left = online_for(&app, user).await;
    assert!(
        (0..=20_000).contains(&left),
        "the marker of a user with no subscription was renewed, or is gone early: {left} ms left"
    );
}

/// Subscribes `socket` (acknowledged) to the feed as operation "feed".
async fn subscribe_feed(socket: &mut Socket) {
    send(
        socket,
        json!({ "id": "feed", "type": "subscribe", "payload": { "query": FEED_ITEMS } }),
    )
    .await;
}

/// The ids of the next `n` items on `socket`, which must all be feed items.
async fn next_items(socket: &mut Socket, n: usize) -> Vec<i64> {
    let mut items = Vec::new();
    for _ in 0..n {
        let message = next_message(socket).await.expect("the socket stays open");
        assert_eq!(message["id"], "feed", "{message}");
        items.push(item_id(&message));
    }
    items
}

/// Between items a feed subscription is held by the websocket's driver, not by an async-graphql
/// stream (see `pulse_edge::detached`): each item is resolved by an execution of its own. The
/// server runs as a process of its own, so that its metrics are this test's alone.
#[tokio::test]
async fn feed_subscribers_wait_detached_between_items_and_get_each_item_once() {
    const FOLLOWERS: usize = 20;
    let config = test_config(|_| {}).await;
    let app = TestApp::start(config.clone()).await;
    let port = free_port();
    let _server = spawn_server_process(&config, port, &[]).await;
    let address = format!("127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let detached = async || process_series(&http, port, "pulse_live_detached_operations").await;
    let people = users(&app, "detached", FOLLOWERS + 1).await;
    let (author, followers) = (people[0], &people[1..]);
    bulk_follow(&app, followers, author).await;

    let mut sockets = Vec::new();
    for &follower in followers {
        let mut socket = open_socket_at(&address, "graphql-transport-ws").await;
        send(
            &mut socket,
            json!({ "type": "connection_init", "payload": { "token": token(&app, follower) } }),
        )
        .await;
        assert_eq!(
            next_message(&mut socket).await.unwrap()["type"],
            "connection_ack"
        );
        subscribe_feed(&mut socket).await;
        sockets.push(socket);
    }
    let all_listening = async |followers: &[i64]| {
        for &follower in followers {
            let channel = app.state.redis.keys.feed_channel(follower);
            if redis_subscribers(&app, &channel).await == 0 {
                return false;
            }
        }
        true
    };
    eventually("every subscription is detached and listening", async || {
        detached().await == FOLLOWERS as f64 && all_listening(followers).await
    })
    .await;

    let mut published = Vec::new();
    for title in ["one", "two", "three"] {
        published.push(publish(&app, &token(&app, author), title).await);
    }
    published.sort_unstable();
    for socket in &mut sockets {
        let mut items = next_items(socket, published.len()).await;
        items.sort_unstable();
        assert_eq!(items, published, "each item once");
    }
    eventually(
        "every subscription is detached again after its items",
        async || detached().await == FOLLOWERS as f64,
    )
    .await;

    // A stop between items is answered at once and releases the operation; its id is free again.
    send(&mut sockets[0], json!({ "id": "feed", "type": "complete" })).await;
    assert_eq!(
        next_message(&mut sockets[0]).await.unwrap(),
        json!({ "type": "complete", "id": "feed" })
    );
    eventually("the stopped subscription is released", async || {
        detached().await == (FOLLOWERS - 1) as f64
    })
    .await;
    subscribe_feed(&mut sockets[0]).await;
    eventually("the new subscription is detached", async || {
        detached().await == FOLLOWERS as f64 && all_listening(&followers[..1]).await
    })
    .await;

    let fourth = publish(&app, &token(&app, author), "four").await;
    for socket in &mut sockets {
        assert_eq!(next_items(socket, 1).await, vec![fourth]);
    }
    for socket in &mut sockets {
        let nothing_more = tokio::time::timeout(Duration::from_millis(300), next_message(socket));
        assert!(nothing_more.await.is_err(), "an item came twice");
    }
    drop(sockets);
    eventually("closed sockets release their operations", async || {
        detached().await == 0.0
    })
    .await;
}

/// A feed item shows its author as the item is resolved, not as the subscriber's first item did:
/// the items load through the process's shared loaders, which are never older than
/// `SHARED_LOADERS_FOR`, where a subscriber's own kept the first reading for its life.
#[tokio::test]
async fn a_feed_item_shows_its_authors_counts_as_they_are_when_it_arrives() {
    const WITH_AUTHOR: &str =
        "subscription { feedItemAdded { node { id author { handle followerCount } } } }";
    let app = TestApp::spawn().await;
    let people = users(&app, "fresh", 3).await;
    let (author, follower, fan) = (people[0], people[1], people[2]);
    bulk_follow(&app, &[follower], author).await;
    let mut socket = subscribed_with(&app, follower, WITH_AUTHOR).await;
    let followers_shown = async |socket: &mut Socket, article: i64| {
        let message = next_message(socket).await.expect("the socket stays open");
        assert_eq!(item_id(&message), article);
        message["payload"]["data"]["feedItemAdded"]["node"]["author"]["followerCount"]
            .as_i64()
            .unwrap_or_else(|| panic!("no follower count: {message}"))
    };

    let first = publish(&app, &token(&app, author), "before the fan").await;
    assert_eq!(followers_shown(&mut socket, first).await, 1);
    let followed = app
        .graphql_as(
            Some(&token(&app, fan)),
            "mutation($u: ID!) { follow(userId: $u) { following } }",
            json!({ "u": crate::feed::user_id(author) }),
        )
        .await;
    assert_eq!(followed["data"]["follow"]["following"], true, "{followed}");
    tokio::time::sleep(pulse_kit::context::SHARED_LOADERS_FOR * 2).await;
    let second = publish(&app, &token(&app, author), "after the fan").await;
    assert_eq!(followers_shown(&mut socket, second).await, 2);
}
