//! Resumable event streams: `feedItemAdded(after:)` and `articlePublished(after:)` replay what a
//! client missed while away, then go on live with no gap and no duplicate, or end with
//! `RESYNC_REQUIRED` when they cannot.

use serde_json::{Value, json};

use crate::feed::{bulk_follow, feed_page, in_inbox, publish, token, user_id, users};
use crate::helpers::{TestApp, article_row, error_code, eventually};
use crate::subscriptions::{Socket, next_message, subscribed_as};

const FEED_ITEMS: &str = "subscription($after: String) {
    feedItemAdded(after: $after) { cursor node { id title } }
}";

const PUBLISHED: &str = "subscription($after: String, $author: ID) {
    articlePublished(after: $after, authorId: $author) { id title }
}";

/// A websocket of `user` that has sent `query` with `variables` as subscription "1".
async fn subscription(app: &TestApp, user: i64, query: &str, variables: Value) -> Socket {
    subscribed_as(app, json!({ "token": token(app, user) }), query, variables).await
}

async fn feed_items(app: &TestApp, user: i64, after: Option<&str>) -> Socket {
    subscription(app, user, FEED_ITEMS, json!({ "after": after })).await
}

async fn published(app: &TestApp, user: i64, after: Option<&str>, author: Option<i64>) -> Socket {
    let author = author.map(user_id);
    let variables = json!({ "after": after, "author": author });
    subscription(app, user, PUBLISHED, variables).await
}

/// A feed item's article row id and cursor.
fn feed_item(message: &Value) -> (i64, String) {
    assert_eq!(message["type"], "next", "{message}");
    let edge = &message["payload"]["data"]["feedItemAdded"];
    let id = edge["node"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("not a feed item: {message}"));
    (article_row(id), edge["cursor"].as_str().unwrap().to_owned())
}

/// A published article's global id.
fn published_id(message: &Value) -> String {
    assert_eq!(message["type"], "next", "{message}");
    message["payload"]["data"]["articlePublished"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("not an article: {message}"))
        .to_owned()
}

/// The stream's error, with `code`, and then its end.
async fn ends_with(socket: &mut Socket, code: &str) -> Value {
    let message = next_message(socket).await.unwrap();
    assert_eq!(message["type"], "next", "{message}");
    assert!(message["payload"]["data"].is_null(), "{message}");
    assert_eq!(error_code(&message["payload"]), code, "{message}");
    let end = next_message(socket).await.unwrap();
    assert_eq!(end["type"], "complete", "the stream went on: {end}");
    message
}

#[tokio::test]
async fn a_feed_subscriber_back_after_missing_50_items_gets_exactly_those_in_order_then_live_ones_and_past_its_history_a_resync()
 {
    // An inbox of 20: most of the 50 missed are replayed from SQL, below the inbox's floor.
    let app = TestApp::spawn_with(|config| {
        config.feed_cap = 20;
        config.replay_limit = 60;
    })
    .await;
    let people = users(&app, "resume", 3).await;
    let (author, reader, other) = (people[0], people[1], people[2]);
    let author_token = token(&app, author);
    bulk_follow(&app, &[reader, other], author).await;
    let first = publish(&app, &author_token, "first").await;
    let page = feed_page(&app, &token(&app, reader), 1, None).await;
    assert_eq!(page.ids, vec![first]);
    let start = page.end_cursor.unwrap();

    // Resumed from the page's cursor, the subscription misses nothing published as it starts.
    let mut socket = feed_items(&app, reader, Some(&start)).await;
    let live = publish(&app, &author_token, "live").await;
    let (id, cursor) = feed_item(&next_message(&mut socket).await.unwrap());
    assert_eq!(id, live);
    drop(socket);

    let mut missed = Vec::new();
    for i in 0..50 {
        missed.push(publish(&app, &author_token, &format!("missed {i}")).await);
    }
    eventually("the 50 reached the reader's inbox", async || {
        in_inbox(&app, reader, missed[49]).await
    })
    .await;
    let mut socket = feed_items(&app, reader, Some(&cursor)).await;
    let mut replayed = Vec::new();
    for _ in 0..50 {
        replayed.push(feed_item(&next_message(&mut socket).await.unwrap()).0);
    }
    assert_eq!(replayed, missed);
    let next = publish(&app, &author_token, "back live").await;
    assert_eq!(
        feed_item(&next_message(&mut socket).await.unwrap()).0,
        next,
        "the first item after the replay is not the next one published"
    );
    drop(socket);

    let mut socket = feed_items(&app, other, Some(&cursor)).await;
    let refused = ends_with(&mut socket, "RESYNC_REQUIRED").await;
    assert!(
        refused.to_string().contains("query `feed` again"),
        "{refused}"
    );

    let mut more = 0;
    for i in 0..10 {
        more = publish(&app, &author_token, &format!("more {i}")).await;
    }
    eventually("the 10 more reached the reader's inbox", async || {
        in_inbox(&app, reader, more).await
    })
    .await;
    // 62 items above the first: more than a replay carries.
    let mut socket = feed_items(&app, reader, Some(&start)).await;
    ends_with(&mut socket, "RESYNC_REQUIRED").await;

    let mut socket = feed_items(&app, reader, Some("not a cursor")).await;
    ends_with(&mut socket, "BAD_USER_INPUT").await;
}

#[tokio::test]
async fn an_article_subscriber_back_after_missing_50_gets_exactly_those_in_order_then_live_ones_and_past_its_history_a_resync()
 {
    let app = TestApp::spawn_with(|config| config.replay_limit = 60).await;
    let people = users(&app, "resumed", 3).await;
    let (writer, bystander, reader) = (people[0], people[1], people[2]);
    let (writer_token, bystander_token) = (token(&app, writer), token(&app, bystander));
    let first = app.publish(&writer_token, "first").await;

    let mut socket = published(&app, reader, Some(&first), None).await;
    let live = app.publish(&writer_token, "live").await;
    assert_eq!(
        published_id(&next_message(&mut socket).await.unwrap()),
        live
    );
    drop(socket);

    let (mut missed, mut everything) = (Vec::new(), Vec::new());
    for i in 0..50 {
        if i % 10 == 0 {
            everything.push(app.publish(&bystander_token, "aside").await);
        }
        let id = app.publish(&writer_token, &format!("missed {i}")).await;
        missed.push(id.clone());
        everything.push(id);
    }
    let mut socket = published(&app, reader, Some(&live), Some(writer)).await;
    let mut replayed = Vec::new();
    for _ in 0..50 {
        replayed.push(published_id(&next_message(&mut socket).await.unwrap()));
    }
    assert_eq!(replayed, missed);
    app.publish(&bystander_token, "not the writer's").await;
    let next = app.publish(&writer_token, "back live").await;
    assert_eq!(
        published_id(&next_message(&mut socket).await.unwrap()),
        next,
        "the first article after the replay is not the writer's next one"
    );
    drop(socket);

    // Unfiltered, from a cursor of `articles`, the same way.
    let listed = app
        .graphql("{ articles(first: 1) { edges { cursor } } }", json!({}))
        .await;
    let newest = listed["data"]["articles"]["edges"][0]["cursor"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let mut socket = published(&app, reader, Some(&live), None).await;
    let mut replayed = Vec::new();
    for _ in 0..everything.len() + 2 {
        replayed.push(published_id(&next_message(&mut socket).await.unwrap()));
    }
    assert_eq!(replayed[..everything.len()], everything[..]);
    assert_eq!(replayed[everything.len() + 1], next);
    drop(socket);
    let mut socket = published(&app, reader, Some(&newest), None).await;
    let last = app.publish(&bystander_token, "last").await;
    assert_eq!(
        published_id(&next_message(&mut socket).await.unwrap()),
        last
    );
    drop(socket);

    // 59 articles above the first, and 10 more: more than a replay carries.
    for i in 0..10 {
        app.publish(&writer_token, &format!("more {i}")).await;
    }
    let mut socket = published(&app, reader, Some(&first), None).await;
    let refused = ends_with(&mut socket, "RESYNC_REQUIRED").await;
    assert!(
        refused.to_string().contains("query `articles` again"),
        "{refused}"
    );

    let mut socket = published(&app, reader, Some("bm90IGFuIGlk"), None).await;
    ends_with(&mut socket, "BAD_USER_INPUT").await;
}
