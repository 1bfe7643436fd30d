//! The follow feed: reads from the inbox, rebuilds, SQL past the cap, cursors, celebrities,
//! follow and unfollow. Fixtures here are shared by the other feed test files.

use std::collections::HashSet;
use std::time::Duration;

use pulse::entities::{follow_counts, follows, users};
use pulse::graphql::ids;
use pulse::keys::FeedKeys;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QuerySelect};
use serde_json::{Value, json};

use crate::helpers::{TestApp, article_row, error_code, eventually};

/// Creates `n` users straight in SQL (no password hashing: they get tokens from the signer).
pub(crate) async fn users(app: &TestApp, prefix: &str, n: usize) -> Vec<i64> {
    let now = pulse::db::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let rows = chunk.iter().map(|i| users::ActiveModel {
            handle: Set(format!("{prefix}{i}")),
            password_hash: Set("unusable".into()),
            is_admin: Set(false),
            created_at: Set(now),
            ..Default::default()
        });
        users::Entity::insert_many(rows)
            .exec_without_returning(&app.state.db)
            .await
            .unwrap();
    }
    let rows: Vec<(i64, String)> = users::Entity::find()
        .select_only()
        .column(users::Column::Id)
        .column(users::Column::Handle)
        .filter(users::Column::Handle.starts_with(prefix))
        .into_tuple()
        .all(&app.state.db)
        .await
        .unwrap();
    let by_handle: std::collections::HashMap<String, i64> =
        rows.into_iter().map(|(id, handle)| (handle, id)).collect();
    (0..n).map(|i| by_handle[&format!("{prefix}{i}")]).collect()
}

pub(crate) fn token(app: &TestApp, user: i64) -> String {
    app.state.tokens.issue(user).unwrap()
}

pub(crate) fn user_id(user: i64) -> String {
    ids::encode(pulse::accounts::USER, user).to_string()
}

/// Makes every one of `followers` follow `followee` straight in SQL, with the counts.
pub(crate) async fn bulk_follow(app: &TestApp, followers: &[i64], followee: i64) {
    let now = pulse::db::now();
    for chunk in followers.chunks(500) {
        let rows = chunk.iter().map(|&follower| follows::ActiveModel {
            follower_id: Set(follower),
            followee_id: Set(followee),
            created_at: Set(now),
            ..Default::default()
        });
        follows::Entity::insert_many(rows)
            .exec_without_returning(&app.state.db)
            .await
            .unwrap();
    }
    let existing = follow_counts::Entity::find_by_id(followee)
        .one(&app.state.db)
        .await
        .unwrap();
    let row = follow_counts::ActiveModel {
        user_id: Set(followee),
        followers: Set(existing.as_ref().map_or(0, |row| row.followers) + followers.len() as i64),
        following: Set(existing.as_ref().map_or(0, |row| row.following)),
    };
    match existing {
        Some(_) => follow_counts::Entity::update(row)
            .exec(&app.state.db)
            .await
            .map(|_| ())
            .unwrap(),
        None => follow_counts::Entity::insert(row)
            .exec_without_returning(&app.state.db)
            .await
            .map(|_| ())
            .unwrap(),
    }
}

/// Publishes `n` articles by `author` straight into SQL, with no feed publication (no fan-out):
/// reachable only by pull. Returns their row ids, oldest first.
pub(crate) async fn stored_articles(app: &TestApp, author: i64, n: usize) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let article =
            pulse::articles::service::insert_article(&app.state.db, author, &format!("a{i}"), "b")
                .await
                .unwrap();
        ids.push(article.id);
    }
    ids
}

/// Publishes through the API; returns the article's row id.
pub(crate) async fn publish(app: &TestApp, token: &str, title: &str) -> i64 {
    article_row(&app.publish(token, title).await)
}

pub(crate) struct FeedPage {
    pub ids: Vec<i64>,
    pub authors: Vec<i64>,
    pub end_cursor: Option<String>,
    pub has_next_page: bool,
    pub regenerating: bool,
}

pub(crate) const FEED_QUERY: &str = "query($first: Int, $after: String) {
    feed(first: $first, after: $after) {
        edges { cursor node { id author { id } } }
        pageInfo { hasNextPage endCursor }
        regenerating
    }
}";

pub(crate) async fn feed_response(
    app: &TestApp,
    token: Option<&str>,
    first: i32,
    after: Option<&str>,
) -> Value {
    app.graphql_as(token, FEED_QUERY, json!({ "first": first, "after": after }))
        .await
}

pub(crate) async fn feed_page(
    app: &TestApp,
    token: &str,
    first: i32,
    after: Option<&str>,
) -> FeedPage {
    let response = feed_response(app, Some(token), first, after).await;
    let feed = &response["data"]["feed"];
    assert!(feed.is_object(), "feed failed: {response}");
    let edges = feed["edges"].as_array().unwrap();
    let decode = |id: &Value, kind| ids::decode(&id.as_str().unwrap().into(), kind, "id").unwrap();
    FeedPage {
        ids: edges
            .iter()
            .map(|edge| decode(&edge["node"]["id"], pulse::articles::ARTICLE))
            .collect(),
        authors: edges
            .iter()
            .map(|edge| decode(&edge["node"]["author"]["id"], pulse::accounts::USER))
            .collect(),
        end_cursor: feed["pageInfo"]["endCursor"].as_str().map(str::to_owned),
        has_next_page: feed["pageInfo"]["hasNextPage"].as_bool().unwrap(),
        regenerating: feed["regenerating"].as_bool().unwrap(),
    }
}

/// Every item of the viewer's feed, paging `page_size` at a time.
pub(crate) async fn whole_feed(app: &TestApp, token: &str, page_size: i32) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = feed_page(app, token, page_size, after.as_deref()).await;
        ids.extend(&page.ids);
        if !page.has_next_page {
            return ids;
        }
        after = page.end_cursor;
    }
}

pub(crate) async fn redis_conn(app: &TestApp) -> pulse::redis::Link {
    app.state.redis.target.connect().await.unwrap()
}

/// Whether `article` sits in `user`'s inbox.
pub(crate) async fn in_inbox(app: &TestApp, user: i64, article: i64) -> bool {
    let mut conn = redis_conn(app).await;
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(app.state.redis.keys.feed_user(user).inbox())
        .arg(article)
        .query_async(&mut conn)
        .await
        .unwrap();
    score.is_some()
}

pub(crate) async fn follow(app: &TestApp, token: &str, user: i64) -> Value {
    app.graphql_as(
        Some(token),
        "mutation($u: ID!) { follow(userId: $u) { following user { followerCount viewerFollows } } }",
        json!({ "u": user_id(user) }),
    )
    .await
}

pub(crate) async fn unfollow(app: &TestApp, token: &str, user: i64) -> Value {
    app.graphql_as(
        Some(token),
        "mutation($u: ID!) { unfollow(userId: $u) { following user { followerCount } } }",
        json!({ "u": user_id(user) }),
    )
    .await
}

fn descending(ids: &[i64]) -> bool {
    ids.windows(2).all(|pair| pair[0] > pair[1])
}

#[tokio::test]
async fn the_feed_needs_a_sign_in_and_refuses_forged_and_foreign_cursors() {
    let app = TestApp::spawn().await;
    let people = users(&app, "cur", 3).await;
    let (author, alice, bob) = (people[0], people[1], people[2]);
    bulk_follow(&app, &[alice, bob], author).await;
    stored_articles(&app, author, 5).await;

    let anonymous = feed_response(&app, None, 2, None).await;
    assert_eq!(error_code(&anonymous), "UNAUTHENTICATED", "{anonymous}");

    let alices = feed_page(&app, &token(&app, alice), 2, None).await;
    assert_eq!(alices.ids.len(), 2);
    let cursor = alices.end_cursor.unwrap();
    let foreign = feed_response(&app, Some(&token(&app, bob)), 2, Some(&cursor)).await;
    assert_eq!(error_code(&foreign), "BAD_USER_INPUT", "{foreign}");

    use base64::Engine as _;
    let forged_position = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("feed|12345|3");
    for forged in [forged_position.as_str(), "not-a-cursor", &"A".repeat(300)] {
        let response = feed_response(&app, Some(&token(&app, alice)), 2, Some(forged)).await;
        assert_eq!(
            error_code(&response),
            "BAD_USER_INPUT",
            "{forged}: {response}"
        );
    }
    let next = feed_page(&app, &token(&app, alice), 2, Some(&cursor)).await;
    assert_eq!(next.ids.len(), 2);
    assert!(next.ids[0] < alices.ids[1]);
}

/// Whether `user` is in `author`'s audience (fan-out reaches them).
pub(crate) async fn in_audience(app: &TestApp, author: i64, user: i64) -> bool {
    let mut conn = redis_conn(app).await;
    let shard = pulse::keys::feed_shard(user);
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(app.state.redis.keys.feed_audience(author, shard))
        .arg(user)
        .query_async(&mut conn)
        .await
        .unwrap();
    score.is_some()
}

#[tokio::test]
async fn an_article_published_by_a_followee_reaches_an_active_readers_first_page() {
    let app = TestApp::spawn().await;
    let people = users(&app, "push", 3).await;
    let (author, reader, idle) = (people[0], people[1], people[2]);
    bulk_follow(&app, &[reader, idle], author).await;
    let reader_token = token(&app, reader);
    assert!(
        feed_page(&app, &reader_token, 10, None)
            .await
            .ids
            .is_empty()
    );

    let article = publish(&app, &token(&app, author), "pushed").await;
    eventually("the article reaches the active inbox", async || {
        in_inbox(&app, reader, article).await
    })
    .await;
    let page = feed_page(&app, &reader_token, 10, None).await;
    assert_eq!(page.ids, vec![article]);
    assert_eq!(page.authors, vec![author]);
    assert!(!page.has_next_page);
    let mut conn = redis_conn(&app).await;
    let idle_inbox: bool = redis::cmd("EXISTS")
        .arg(app.state.redis.keys.feed_user(idle).inbox())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!idle_inbox, "an inactive follower got an inbox write");
}

#[tokio::test]
async fn a_dispatched_publication_wakes_this_process_fan_out_instead_of_waiting_for_its_poll() {
    let app = TestApp::spawn_with(|config| config.run_jobs = false).await;
    let people = users(&app, "bell", 2).await;
    let (author, reader) = (people[0], people[1]);
    bulk_follow(&app, &[reader], author).await;
    feed_page(&app, &token(&app, reader), 10, None).await;
    let store = app.state.services.feed.store().clone();
    let settings = pulse::jobs::JobSettings {
        poll: Duration::from_secs(600),
        ..Default::default()
    };
    let runtime = pulse::jobs::JobRuntime::new(app.state.redis.clone(), settings);
    let stop = tokio_util::sync::CancellationToken::new();
    let fanout = std::sync::Arc::new(pulse::feed::fanout::Fanout(store.clone()));
    let worker = tokio::spawn(runtime.clone().run(fanout, stop.clone()));
    // Let the worker finish its first round and settle into its ten-minute wait.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let article = publish(&app, &token(&app, author), "rung").await;
    let dispatcher = pulse::feed::dispatch::Dispatcher(store);
    assert_eq!(runtime.poll_once(&dispatcher).await.unwrap(), 1);
    eventually("the article reaches the inbox", async || {
        in_inbox(&app, reader, article).await
    })
    .await;
    stop.cancel();
    worker.await.unwrap();
}

#[tokio::test]
async fn paging_while_a_hundred_articles_are_published_returns_every_older_item_exactly_once() {
    // A hundred publishes at once queue for SQLite's one writer; on a busy machine the default
    // 3 s wait runs out before the last one's turn.
    let app =
        TestApp::spawn_with(|config| config.sqlite_busy_timeout = Duration::from_secs(60)).await;
    let people = users(&app, "page", 5).await;
    let reader = people[0];
    let authors = &people[1..];
    for &author in authors {
        bulk_follow(&app, &[reader], author).await;
    }
    let reader_token = token(&app, reader);
    feed_page(&app, &reader_token, 1, None).await;
    let mut older = Vec::new();
    for &author in authors {
        for _ in 0..15 {
            older.push(publish(&app, &token(&app, author), "older").await);
        }
    }
    eventually("the older articles are all fanned out", async || {
        feed_page(&app, &reader_token, 100, None).await.ids.len() == older.len()
    })
    .await;

    let tokens: Vec<String> = authors.iter().map(|&a| token(&app, a)).collect();
    let publishing = async {
        let publishes = (0..100).map(|i| {
            let token = tokens[i % tokens.len()].clone();
            let app = &app;
            async move { publish(app, &token, "newer").await }
        });
        futures_util::future::join_all(publishes).await
    };
    let paging = async {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = feed_page(&app, &reader_token, 7, after.as_deref()).await;
            assert!(descending(&page.ids), "{:?}", page.ids);
            seen.extend(page.ids);
            if !page.has_next_page {
                return seen;
            }
            after = page.end_cursor;
            tokio::task::yield_now().await;
        }
    };
    let (newer, seen) = tokio::join!(publishing, paging);
    assert_eq!(newer.len(), 100);
    let unique: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "an item came twice: {seen:?}");
    for article in &older {
        assert!(unique.contains(article), "older item {article} was skipped");
    }
}

#[tokio::test]
async fn a_returning_user_following_500_authors_gets_one_rebuild_and_pages_past_the_cap_from_sql() {
    let app = TestApp::spawn_with(|config| {
        config.feed_cap = 40;
        config.feed_inbox_ttl = Duration::from_millis(1500);
    })
    .await;
    let people = users(&app, "many", 501).await;
    let reader = people[0];
    let mut expected = Vec::new();
    for (i, &author) in people[1..].iter().enumerate() {
        bulk_follow(&app, &[reader], author).await;
        // Two articles from every fifth author: 200 in all, five times the cap.
        if i % 5 == 0 {
            expected.extend(stored_articles(&app, author, 2).await);
        }
    }
    expected.sort_unstable_by(|a, b| b.cmp(a));
    let reader_token = token(&app, reader);
    feed_page(&app, &reader_token, 1, None).await;
    let mut conn = redis_conn(&app).await;
    let inbox = app.state.redis.keys.feed_user(reader).inbox();
    eventually("the unread inbox expires", async || {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&inbox)
            .query_async(&mut conn)
            .await
            .unwrap();
        !exists
    })
    .await;
    let counters = &app.state.services.feed.store().counters;
    let rebuilds_before = counters.rebuilds.load(std::sync::atomic::Ordering::Relaxed);

    let readers = (0..50).map(|_| feed_page(&app, &reader_token, 20, None));
    let pages = futures_util::future::join_all(readers).await;
    for page in &pages {
        assert_eq!(page.ids, expected[..20], "a first page was wrong");
        assert!(page.has_next_page);
        assert!(
            !page.regenerating,
            "the rebuild in this process was not waited for"
        );
    }
    assert_eq!(
        counters.rebuilds.load(std::sync::atomic::Ordering::Relaxed) - rebuilds_before,
        1,
        "50 concurrent readers rebuilt more than once"
    );
    let whole = whole_feed(&app, &reader_token, 30).await;
    assert_eq!(whole, expected, "the pages past the cap were wrong");
}

#[tokio::test]
async fn a_celebritys_new_post_is_on_followers_first_pages_without_any_inbox_write() {
    let app = TestApp::spawn_with(|config| config.feed_celebrity_followers = 3).await;
    let people = users(&app, "celeb", 5).await;
    let (star, ordinary, fans) = (people[0], people[1], &people[2..]);
    bulk_follow(&app, fans, star).await;
    bulk_follow(&app, &fans[..1], ordinary).await;
    for &fan in fans {
        feed_page(&app, &token(&app, fan), 5, None).await;
    }
    let counters = &app.state.services.feed.store().counters;
    let ordinary_post = publish(&app, &token(&app, ordinary), "ordinary").await;
    eventually("the ordinary post is fanned out", async || {
        in_inbox(&app, fans[0], ordinary_post).await
    })
    .await;
    let writes_before = counters
        .inbox_writes
        .load(std::sync::atomic::Ordering::Relaxed);

    let star_post = publish(&app, &token(&app, star), "famous").await;
    for &fan in fans {
        let page = feed_page(&app, &token(&app, fan), 5, None).await;
        assert_eq!(page.ids[0], star_post, "fan {fan} lacks the post");
        assert!(!in_inbox(&app, fan, star_post).await);
    }
    let first = feed_page(&app, &token(&app, fans[0]), 5, None).await;
    assert_eq!(first.ids, vec![star_post, ordinary_post]);
    // Dispatch runs after the mutation: wait until it did, then check it wrote nothing.
    let publication_done = async || {
        app.count("feed_publications WHERE dispatched_at IS NULL")
            .await
            == 0
    };
    eventually("the celebrity post is dispatched", publication_done).await;
    assert_eq!(
        counters
            .inbox_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        writes_before,
        "a celebrity post was written to inboxes"
    );
}

#[tokio::test]
async fn after_unfollow_no_page_shows_the_author_and_after_follow_their_recent_posts_appear() {
    let app = TestApp::spawn().await;
    let people = users(&app, "fol", 3).await;
    let (reader, kept, dropped) = (people[0], people[1], people[2]);
    let reader_token = token(&app, reader);
    for author in [kept, dropped] {
        let response = follow(&app, &reader_token, author).await;
        assert_eq!(response["data"]["follow"]["following"], true, "{response}");
    }
    feed_page(&app, &reader_token, 5, None).await;
    let mut dropped_posts = Vec::new();
    for _ in 0..6 {
        publish(&app, &token(&app, kept), "kept").await;
        dropped_posts.push(publish(&app, &token(&app, dropped), "dropped").await);
    }
    eventually("everything is fanned out", async || {
        whole_feed(&app, &reader_token, 5).await.len() == 12
    })
    .await;

    assert!(in_audience(&app, dropped, reader).await);
    let response = unfollow(&app, &reader_token, dropped).await;
    assert_eq!(
        response["data"]["unfollow"]["following"], false,
        "{response}"
    );
    for page_size in [1, 4, 20] {
        let mut after: Option<String> = None;
        loop {
            let page = feed_page(&app, &reader_token, page_size, after.as_deref()).await;
            assert!(
                !page.authors.contains(&dropped),
                "an unfollowed author's post showed"
            );
            if !page.has_next_page {
                break;
            }
            after = page.end_cursor;
        }
    }
    eventually(
        "the removal job empties the inbox of the author",
        async || {
            let mut left = false;
            for &post in &dropped_posts {
                left |= in_inbox(&app, reader, post).await;
            }
            !left
        },
    )
    .await;

    assert!(
        !in_audience(&app, dropped, reader).await,
        "the unfollower is still fanned out to"
    );
    assert!(in_audience(&app, kept, reader).await);

    follow(&app, &reader_token, dropped).await;
    eventually("the followee's recent posts are back", async || {
        let page = feed_page(&app, &reader_token, 20, None).await;
        dropped_posts.iter().all(|post| page.ids.contains(post))
    })
    .await;
    assert!(in_audience(&app, dropped, reader).await);
    let fresh = publish(&app, &token(&app, dropped), "after the follow").await;
    eventually("a new post of the followee is fanned out", async || {
        in_inbox(&app, reader, fresh).await
    })
    .await;
}

#[tokio::test]
async fn a_reader_whose_inbox_expired_leaves_the_audience_and_rejoins_on_the_next_read() {
    let app = TestApp::spawn().await;
    let people = users(&app, "aud", 2).await;
    let (author, reader) = (people[0], people[1]);
    let reader_token = token(&app, reader);
    follow(&app, &reader_token, author).await;
    assert!(
        !in_audience(&app, author, reader).await,
        "a follower who never read their feed is fanned out to"
    );
    feed_page(&app, &reader_token, 10, None).await;
    assert!(
        in_audience(&app, author, reader).await,
        "the read did not join"
    );
    let first = publish(&app, &token(&app, author), "while active").await;
    eventually("fanned out while active", async || {
        in_inbox(&app, reader, first).await
    })
    .await;

    // The inbox expires, as an unread one does.
    let mut conn = redis_conn(&app).await;
    let () = redis::cmd("DEL")
        .arg(app.state.redis.keys.feed_user(reader).inbox())
        .query_async(&mut conn)
        .await
        .unwrap();
    let second = publish(&app, &token(&app, author), "while away").await;
    eventually("the delivery drops the inactive reader", async || {
        !in_audience(&app, author, reader).await
    })
    .await;
    let inbox_exists: bool = redis::cmd("EXISTS")
        .arg(app.state.redis.keys.feed_user(reader).inbox())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!inbox_exists, "the delivery created an expired inbox");

    let page = feed_page(&app, &reader_token, 10, None).await;
    assert_eq!(page.ids, vec![second, first], "the rebuild missed a post");
    assert!(
        in_audience(&app, author, reader).await,
        "the rebuild did not rejoin"
    );
    let third = publish(&app, &token(&app, author), "back again").await;
    eventually("fanned out again after the return", async || {
        in_inbox(&app, reader, third).await
    })
    .await;
}
