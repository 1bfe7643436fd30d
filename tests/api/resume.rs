//! Resumable event streams: `feedItemAdded(after:)` and `articlePublished(after:)` replay what a
//! client missed while away, then go on live with no gap and no duplicate, or end with
//! `RESYNC_REQUIRED` when they cannot.

use std::collections::HashSet;
use std::time::Duration;

use pulse::keys::{ArticleKeys, FeedKeys};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::feed::{
    bulk_follow, feed_page, feed_response, in_inbox, publish, token, user_id, users, whole_feed,
};
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

/// Refuses new connections to the app's PostgreSQL database and ends the ones it has, or lets
/// them in again: SQL gone for as long as the test says. A database cannot shut itself: this is
/// done from the one the tests' databases are created from.
async fn postgres_reachable(app: &TestApp, reachable: bool) {
    use sea_orm::ConnectionTrait as _;
    let url = app.config.database_url();
    let (_, name) = url.rsplit_once('/').unwrap();
    let admin = sea_orm::Database::connect(crate::helpers::postgres_admin_url())
        .await
        .unwrap();
    admin
        .execute_unprepared(&format!(
            "ALTER DATABASE \"{name}\" WITH ALLOW_CONNECTIONS {reachable}"
        ))
        .await
        .unwrap();
    if !reachable {
        admin
            .execute_unprepared(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            ))
            .await
            .unwrap();
    }
    admin.close().await.unwrap();
}

#[tokio::test]
async fn a_replay_whose_sql_is_away_waits_for_it_then_sends_everything_in_order_and_goes_on_live() {
    let app = TestApp::spawn().await;
    if crate::sql_input::backend(&app) != sea_orm::DbBackend::Postgres {
        eprintln!("PostgreSQL only: a database that refuses connections is its ALLOW_CONNECTIONS");
        return;
    }
    let people = users(&app, "away", 2).await;
    let (writer, reader) = (token(&app, people[0]), people[1]);
    let first = app.publish(&writer, "first").await;
    // More than one chunk of the replay, so that it is loaded again past its first.
    let mut missed = Vec::new();
    for i in 0..2 * pulse_runtime::realtime::REPLAY_CHUNK + 5 {
        missed.push(app.publish(&writer, &format!("missed {i}")).await);
    }

    postgres_reachable(&app, false).await;
    let mut socket = published(&app, reader, Some(&first), None).await;
    let silent = message_before(&mut socket, Instant::now() + Duration::from_secs(2)).await;
    assert!(
        silent.is_none(),
        "the replay did not wait for SQL: {silent:?}"
    );
    postgres_reachable(&app, true).await;

    let mut replayed = Vec::new();
    for _ in 0..missed.len() {
        let message = message_before(&mut socket, Instant::now() + Duration::from_secs(20))
            .await
            .expect("the replay went on once SQL was back");
        replayed.push(published_id(&message));
    }
    assert_eq!(replayed, missed);
    let live = app.publish(&writer, "live").await;
    assert_eq!(
        published_id(&next_message(&mut socket).await.unwrap()),
        live
    );
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
        refused
            .to_string()
            .contains("subscribe again without `after`, then query `articles`"),
        "{refused}"
    );

    let mut socket = published(&app, reader, Some("bm90IGFuIGlk"), None).await;
    ends_with(&mut socket, "BAD_USER_INPUT").await;
}

#[tokio::test]
async fn after_the_journal_of_publications_is_lost_subscribing_afresh_then_rereading_misses_nothing()
 {
    let app = TestApp::spawn().await;
    let people = users(&app, "renewed", 2).await;
    let (writer, reader) = (people[0], people[1]);
    let writer_token = token(&app, writer);
    let before = app.publish(&writer_token, "before").await;
    let mut conn = app.state.redis.conn.clone();
    let () = redis::cmd("DEL")
        .arg(app.state.redis.keys.articles_journal())
        .query_async(&mut conn)
        .await
        .unwrap();
    // The journal started again does not hold `before`: resuming after it cannot replay, however
    // often the client tries, so the recovery must not be "re-read and resume after the newest".
    for _ in 0..2 {
        let mut socket = published(&app, reader, Some(&before), None).await;
        ends_with(&mut socket, "RESYNC_REQUIRED").await;
    }
    // The documented recovery: subscribe without `after` first, then re-read `articles`.
    let mut socket = published(&app, reader, None, None).await;
    let page = app
        .graphql(
            "{ articles(first: 10) { edges { node { id } } } }",
            json!({}),
        )
        .await;
    let reread: Vec<&str> = page["data"]["articles"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{page}"))
        .iter()
        .filter_map(|edge| edge["node"]["id"].as_str())
        .collect();
    assert!(reread.contains(&before.as_str()), "{page}");
    let after = app.publish(&writer_token, "after").await;
    assert_eq!(
        published_id(&next_message(&mut socket).await.unwrap()),
        after
    );
}

/// How long a churning subscriber waits for its next item before it reconnects anyway.
const IDLE: Duration = Duration::from_secs(2);

/// What one churning feed subscriber ended with.
struct Churned {
    user: i64,
    /// Every item the subscription sent, in the order it came, across every reconnection.
    received: Vec<i64>,
    /// Items read back through `feed` after a resync.
    reread: HashSet<i64>,
    resyncs: usize,
    connections: usize,
}

/// The next message on `socket` before `deadline`; `None` at the deadline or when the server
/// closed the socket.
async fn message_before(socket: &mut Socket, deadline: Instant) -> Option<Value> {
    tokio::time::timeout_at(deadline, next_message(socket))
        .await
        .ok()
        .flatten()
}

/// The feed's newest cursor and every item in it, paging 100 at a time: what a client re-reads
/// after a resync. The cursor comes from the first page, read before the others.
async fn reread_feed(app: &TestApp, token: &str) -> (String, HashSet<i64>) {
    let first = feed_response(app, Some(token), 1, None).await;
    let newest = first["data"]["feed"]["edges"][0]["cursor"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    let everything = whole_feed(app, token, 100).await;
    (newest, everything.into_iter().collect())
}

/// `user`'s `feedItemAdded` from `cursor`, dropped after a random number of items and resumed from
/// the last cursor it got, until it holds `wanted` items besides `seed`; after a resync, re-reads `feed`
/// and resumes from its newest cursor.
async fn churn(
    app: &TestApp,
    user: i64,
    mut cursor: String,
    seed: i64,
    wanted: usize,
    progress: &Progress,
) -> Churned {
    let token = token(app, user);
    let mut run = Churned {
        user,
        received: Vec::new(),
        reread: HashSet::new(),
        resyncs: 0,
        connections: 0,
    };
    let mut held: HashSet<i64> = HashSet::new();
    while held.len() < wanted {
        let mut socket = feed_items(app, user, Some(&cursor)).await;
        run.connections += 1;
        // Dropped after a random number of items, or at once, or when nothing comes for a while.
        let stay: usize = rand::random_range(0..=150);
        let mut deadline = Instant::now()
            + match stay {
                0 => Duration::from_millis(rand::random_range(0..20)),
                _ => IDLE,
            };
        let mut got = 0;
        while let Some(message) = message_before(&mut socket, deadline).await {
            match message["type"].as_str() {
                Some("next") if message["payload"]["data"].is_null() => {
                    assert_eq!(
                        error_code(&message["payload"]),
                        "RESYNC_REQUIRED",
                        "{message}"
                    );
                    run.resyncs += 1;
                    let (newest, everything) = reread_feed(app, &token).await;
                    cursor = newest;
                    held.extend(everything.iter().filter(|&&id| id != seed));
                    run.reread.extend(everything);
                    break;
                }
                Some("next") => {
                    let (id, next) = feed_item(&message);
                    run.received.push(id);
                    held.insert(id);
                    cursor = next;
                    got += 1;
                    if got >= stay {
                        break;
                    }
                    deadline = Instant::now() + IDLE;
                }
                _ => panic!("user {user}: unexpected {message}"),
            }
        }
        drop(socket);
        progress
            .lock()
            .unwrap()
            .insert(user, (held.len(), run.connections, run.resyncs));
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..60))).await;
    }
    run
}

/// Each churning subscriber's items held, connections and resyncs so far: what a test that runs
/// out of time reports.
type Progress = std::sync::Mutex<std::collections::BTreeMap<i64, (usize, usize, usize)>>;

/// The articles in `user`'s feed journal, in its order.
async fn journal(app: &TestApp, user: i64) -> Vec<i64> {
    let mut conn = app.state.redis.conn.clone();
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(app.state.redis.keys.feed_user(user).journal())
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    members
        .into_iter()
        .filter_map(|member| member.parse().ok())
        .collect()
}

// The server and the hundred clients share the test's runtime: on one thread they would take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_feed_subscribers_reconnecting_at_random_while_a_thousand_items_are_published_each_end_with_every_item_once_in_order()
 {
    const AUTHORS: usize = 4;
    const READERS: usize = 100;
    const ITEMS: usize = 1000;
    // Readers whose journal is lost halfway, as if Redis had dropped it: they must be told to
    // resync, re-read and still end with every item.
    const LOST: usize = 5;
    let app = TestApp::spawn_with(|config| {
        config.replay_limit = 1100;
        // The hundred clients read in one task, behind the server's replays: the disconnects
        // are the test's own, not slow-consumer closes.
        config.ws_send_budget = 64 << 20;
    })
    .await;
    let people = users(&app, "churn", AUTHORS + READERS).await;
    let (authors, readers) = people.split_at(AUTHORS);
    for &author in authors {
        bulk_follow(&app, readers, author).await;
    }
    // Active readers (an inbox, so fan-out reaches them), each with a cursor of a first item.
    let tokens: Vec<String> = readers.iter().map(|&reader| token(&app, reader)).collect();
    futures_util::future::join_all(tokens.iter().map(|token| feed_page(&app, token, 1, None)))
        .await;
    let seed = publish(&app, &token(&app, authors[0]), "seed").await;
    let mut cursors = Vec::new();
    for (&reader, token) in readers.iter().zip(&tokens) {
        eventually("the seed reaches every inbox", async || {
            in_inbox(&app, reader, seed).await
        })
        .await;
        let page = feed_page(&app, token, 1, None).await;
        assert_eq!(page.ids, vec![seed]);
        cursors.push(page.end_cursor.unwrap());
    }

    let started = Instant::now();
    let app = &app;
    let progress = Progress::default();
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let published = async {
        let halfway = tokio::sync::Barrier::new(AUTHORS);
        let each = futures_util::future::join_all(authors.iter().map(|&author| {
            let (token, halfway, sent) = (token(app, author), &halfway, &sent);
            async move {
                let mut ids = Vec::new();
                for i in 0..ITEMS / AUTHORS {
                    if i == ITEMS / AUTHORS / 2 && halfway.wait().await.is_leader() {
                        let mut conn = app.state.redis.conn.clone();
                        for &reader in &readers[..LOST] {
                            let journal = app.state.redis.keys.feed_user(reader).journal();
                            let () = redis::cmd("DEL")
                                .arg(journal)
                                .query_async(&mut conn)
                                .await
                                .unwrap();
                        }
                    }
                    ids.push(publish(app, &token, &format!("churn {i}")).await);
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                ids
            }
        }))
        .await;
        each.concat()
    };
    let churned = futures_util::future::join_all(
        readers
            .iter()
            .zip(cursors)
            .map(|(&reader, cursor)| churn(app, reader, cursor, seed, ITEMS, &progress)),
    );
    let (published, churned) = tokio::time::timeout(
        Duration::from_secs(300),
        futures_util::future::join(published, churned),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "not every subscriber got every item within 300 s ({} published): {:?}",
            sent.load(std::sync::atomic::Ordering::Relaxed),
            progress.lock().unwrap()
        )
    });
    let elapsed = started.elapsed();

    let everything: HashSet<i64> = published.iter().copied().collect();
    assert_eq!(everything.len(), ITEMS);
    let connections: usize = churned.iter().map(|run| run.connections).sum();
    for run in &churned {
        let user = run.user;
        let mut once = HashSet::new();
        let twice: Vec<i64> = run
            .received
            .iter()
            .copied()
            .filter(|&id| !once.insert(id))
            .collect();
        assert!(twice.is_empty(), "user {user} got {twice:?} twice");
        let lost = readers[..LOST].contains(&user);
        if lost {
            assert!(run.resyncs > 0, "user {user} lost its journal, never told");
        } else {
            assert_eq!(run.resyncs, 0, "user {user} resynced within its history");
            // The order the items joined this reader's feed in, which its journal recorded.
            let recorded: Vec<i64> = journal(app, user)
                .await
                .into_iter()
                .filter(|&id| id != seed)
                .collect();
            assert_eq!(
                run.received, recorded,
                "user {user}: not in the feed's order"
            );
        }
        let union: HashSet<i64> = once
            .union(&run.reread)
            .copied()
            .filter(|&id| id != seed)
            .collect();
        assert_eq!(
            union.len(),
            ITEMS,
            "user {user} ends with {} of {ITEMS} items ({} received, {} re-read, {} resyncs)",
            union.len(),
            run.received.len(),
            run.reread.len(),
            run.resyncs
        );
        assert_eq!(union, everything, "user {user} holds items not published");
    }
    eprintln!(
        "{READERS} subscribers, {ITEMS} items, {connections} connections, {:.1} s",
        elapsed.as_secs_f64()
    );
}

/// `user`'s `articlePublished` after `last` (an article's global id), dropped after a random number
/// of articles and resumed after the last one it got, until it got `wanted` or `until` passed;
/// every article it got, in order, and how many times it subscribed.
async fn churn_articles(
    app: &TestApp,
    user: i64,
    mut last: String,
    wanted: usize,
    until: Instant,
) -> (Vec<String>, usize) {
    let mut received = Vec::new();
    let mut connections = 0;
    while received.len() < wanted && Instant::now() < until {
        let mut socket = published(app, user, Some(&last), None).await;
        connections += 1;
        let stay: usize = rand::random_range(0..=30);
        let mut deadline = Instant::now()
            + match stay {
                0 => Duration::from_millis(rand::random_range(0..20)),
                _ => IDLE,
            };
        let mut got = 0;
        while let Some(message) = message_before(&mut socket, deadline).await {
            let id = published_id(&message);
            received.push(id.clone());
            last = id;
            got += 1;
            if got >= stay {
                break;
            }
            deadline = Instant::now() + IDLE;
        }
        drop(socket);
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..40))).await;
    }
    (received, connections)
}

#[tokio::test]
async fn article_subscribers_reconnecting_at_random_while_eight_authors_publish_at_once_each_end_with_every_article_once_in_announced_order()
 {
    const AUTHORS: usize = 8;
    const EACH: usize = 40;
    const READERS: usize = 10;
    let app = TestApp::spawn_with(|config| config.replay_limit = 1000).await;
    let people = users(&app, "announced", AUTHORS + READERS).await;
    let (authors, readers) = people.split_at(AUTHORS);
    let seed = app.publish(&token(&app, authors[0]), "seed").await;
    let app = &app;
    // Concurrent publishes commit, and are announced, in an order of their own: ids alone could
    // not say what a reader holds.
    let published = futures_util::future::join_all(authors.iter().map(|&author| async move {
        let token = token(app, author);
        let mut ids = Vec::new();
        for i in 0..EACH {
            ids.push(app.publish(&token, &format!("at once {i}")).await);
        }
        ids
    }));
    // Each reader gives up at `until`, so a reader still short of articles then says which.
    let started = Instant::now();
    let until = started + Duration::from_secs(60);
    let churned = futures_util::future::join_all(
        readers
            .iter()
            .map(|&reader| churn_articles(app, reader, seed.clone(), AUTHORS * EACH, until)),
    );
    let (published, churned) = tokio::time::timeout(
        Duration::from_secs(90),
        futures_util::future::join(published, churned),
    )
    .await
    .expect("every author published within 90 s");
    eprintln!(
        "{READERS} article subscribers, {} articles, {} connections, {:.1} s",
        AUTHORS * EACH,
        churned
            .iter()
            .map(|(_, connections)| connections)
            .sum::<usize>(),
        started.elapsed().as_secs_f64()
    );

    let everything: HashSet<String> = published.concat().into_iter().collect();
    assert_eq!(everything.len(), AUTHORS * EACH);
    let mut conn = app.state.redis.conn.clone();
    let journaled: Vec<String> = redis::cmd("ZRANGE")
        .arg(app.state.redis.keys.articles_journal())
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let announced: Vec<i64> = journaled
        .iter()
        .filter_map(|member| member.parse().ok())
        .filter(|&id| id != article_row(&seed))
        .collect();
    let unannounced: Vec<i64> = everything
        .iter()
        .map(|id| article_row(id))
        .filter(|row| !announced.contains(row))
        .collect();
    assert!(
        unannounced.is_empty(),
        "published but never journaled: {unannounced:?}"
    );
    for (reader, (received, connections)) in readers.iter().zip(&churned) {
        let rows: Vec<i64> = received.iter().map(|id| article_row(id)).collect();
        let missing: Vec<i64> = announced
            .iter()
            .copied()
            .filter(|row| !rows.contains(row))
            .collect();
        assert!(
            missing.is_empty(),
            "reader {reader} lacks {} of {} articles after 60 s and {connections} subscriptions: \
             {missing:?} (at {:?} in the announced order)",
            missing.len(),
            announced.len(),
            missing
                .iter()
                .map(|row| announced.iter().position(|a| a == row).unwrap())
                .collect::<Vec<_>>()
        );
        assert_eq!(
            rows.iter().collect::<HashSet<_>>().len(),
            rows.len(),
            "reader {reader} got an article twice"
        );
        assert_eq!(
            received.iter().cloned().collect::<HashSet<_>>(),
            everything,
            "reader {reader} does not hold every article"
        );
        assert_eq!(
            rows, announced,
            "reader {reader}: not in the announced order"
        );
    }
}
