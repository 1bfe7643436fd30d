//! Likes of articles and comments, on real Redis and real SQL: idempotent under concurrency,
//! idempotent after Redis forgot a relation, archived exactly once, and read in a constant number
//! of round trips.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use futures_util::future::join_all;
use pulse::jobs::{self, JobRuntime, JobSettings};
use pulse::keys::LikeKeys;
use pulse::likes::{LikeArchiver, Subject, archive};
use redis::AsyncCommands as _;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};

use crate::helpers::{TestApp, article_row, error_code, eventually, test_config};

pub const LIKE: &str = "mutation($s: ID!) { like(subjectId: $s) { liked likeCount subjectId } }";
pub const UNLIKE: &str =
    "mutation($s: ID!) { unlike(subjectId: $s) { liked likeCount subjectId } }";

/// `n` users made straight in SQL, with tokens from the app's own signer: hundreds of users
/// without hashing hundreds of passwords. Returns `(row id, token)` pairs.
pub async fn users(app: &TestApp, n: usize) -> Vec<(i64, String)> {
    use pulse::entities::users;
    let tag = format!("{:08x}", rand::random::<u32>());
    let now = chrono::Utc::now().naive_utc();
    let rows: Vec<users::ActiveModel> = (0..n)
        .map(|index| users::ActiveModel {
            handle: Set(format!("u{tag}{index}")),
            password_hash: Set("not-a-hash".into()),
            is_admin: Set(false),
            created_at: Set(now),
            ..Default::default()
        })
        .collect();
    for chunk in rows.chunks(200) {
        users::Entity::insert_many(chunk.to_vec())
            .exec_without_returning(&app.state.db)
            .await
            .unwrap();
    }
    let made = users::Entity::find()
        .filter(users::Column::Handle.starts_with(format!("u{tag}")))
        .order_by_asc(users::Column::Id)
        .all(&app.state.db)
        .await
        .unwrap();
    assert_eq!(made.len(), n);
    made.into_iter()
        .map(|user| (user.id, app.state.tokens.issue(user.id).unwrap()))
        .collect()
}

/// An article by a new author; returns the author's token and the article's global id.
pub async fn article(app: &TestApp) -> (String, String) {
    let (author, _) = users(app, 1).await.remove(0);
    let token = app.state.tokens.issue(author).unwrap();
    let id = app.publish(&token, "liked").await;
    (token, id)
}

pub async fn comment(app: &TestApp, token: &str, article: &str, body: &str) -> String {
    let response = app
        .graphql_as(
            Some(token),
            "mutation($a: ID!, $b: String!) { addComment(articleId: $a, body: $b) { id } }",
            json!({ "a": article, "b": body }),
        )
        .await;
    response["data"]["addComment"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("addComment failed: {response}"))
        .to_owned()
}

pub async fn set_like(app: &TestApp, token: Option<&str>, subject: &str, like: bool) -> Value {
    let query = if like { LIKE } else { UNLIKE };
    app.graphql_as(token, query, json!({ "s": subject })).await
}

/// Every one of `likers` likes `subject` at once; returns the counts their answers carried.
async fn like_all(app: &TestApp, likers: &[(i64, String)], subject: &str) -> BTreeSet<i64> {
    let answers = join_all(
        likers
            .iter()
            .map(|(_, token)| set_like(app, Some(token), subject, true)),
    )
    .await;
    answers
        .iter()
        .map(|answer| payload(answer)["likeCount"].as_i64().unwrap())
        .collect()
}

fn payload(response: &Value) -> &Value {
    let payload = response["data"]
        .get("like")
        .or_else(|| response["data"].get("unlike"))
        .unwrap_or(&Value::Null);
    assert!(payload.is_object(), "like failed: {response}");
    payload
}

/// `likeCount` and `viewerHasLiked` of an Article or Comment, as `token` sees them.
pub async fn like_state(app: &TestApp, token: Option<&str>, subject: &str) -> (i64, bool) {
    let response = app
        .graphql_as(
            token,
            "query($id: ID!) { node(id: $id) {
                ... on Article { likeCount viewerHasLiked }
                ... on Comment { likeCount viewerHasLiked } } }",
            json!({ "id": subject }),
        )
        .await;
    let node = &response["data"]["node"];
    assert!(node.is_object(), "{response}");
    (
        node["likeCount"].as_i64().unwrap(),
        node["viewerHasLiked"].as_bool().unwrap(),
    )
}

fn fast_jobs() -> JobSettings {
    JobSettings {
        lease: Duration::from_secs(2),
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        poll: Duration::from_millis(20),
        ..JobSettings::default()
    }
}

/// Events of the likes archive not yet acknowledged: pending with a consumer or not delivered.
pub async fn unarchived(app: &TestApp) -> u64 {
    jobs::status(&app.state.redis, archive::SPEC)
        .await
        .unwrap()
        .iter()
        .map(|stream| stream.pending + stream.lag)
        .sum()
}

/// Runs the likes archive from the test (a consumer of its own) until every event is archived.
pub async fn drain(app: &TestApp) {
    let archiver = LikeArchiver::new(
        app.state.db.clone(),
        app.state.redis.clone(),
        app.state.services.featured.clone(),
        app.config.like_relation_ttl,
        app.config.timezone,
    );
    let runtime = JobRuntime::new(app.state.redis.clone(), fast_jobs());
    eventually("the likes archive drains", async || {
        runtime.poll_once(&archiver).await.unwrap();
        unarchived(app).await == 0
    })
    .await;
}

/// An app that runs no job consumer, so the test decides when to archive.
pub async fn app_archiving_on_demand() -> TestApp {
    TestApp::spawn_with(|config| config.run_jobs = false).await
}

async fn sql_article(app: &TestApp, id: &str) -> pulse::entities::articles::Model {
    app.stored_article(id).await
}

async fn like_events(app: &TestApp, subject: Subject) -> Vec<pulse::entities::like_events::Model> {
    use pulse::entities::like_events;
    like_events::Entity::find()
        .filter(like_events::Column::SubjectKind.eq(subject.kind_code()))
        .filter(like_events::Column::SubjectId.eq(subject.id()))
        .order_by_asc(like_events::Column::Id)
        .all(&app.state.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_hundred_concurrent_likes_by_one_user_count_once() {
    let app = TestApp::spawn().await;
    let (_, article) = article(&app).await;
    let (_, token) = users(&app, 1).await.remove(0);

    let answers = join_all((0..200).map(|_| set_like(&app, Some(&token), &article, true))).await;

    for answer in &answers {
        let payload = payload(answer);
        assert_eq!(payload["liked"], true, "{answer}");
        assert_eq!(payload["likeCount"], 1, "{answer}");
        assert_eq!(payload["subjectId"], article.as_str());
    }
    assert_eq!(like_state(&app, Some(&token), &article).await, (1, true));
    drain(&app).await;
    assert_eq!(sql_article(&app, &article).await.like_count, 1);
    assert_eq!(app.count("like_events").await, 1);
    assert_eq!(app.count("likes").await, 1);
    assert_eq!(like_state(&app, Some(&token), &article).await, (1, true));
}

#[tokio::test]
async fn two_hundred_users_liking_at_once_count_two_hundred() {
    let app = TestApp::spawn().await;
    let (_, article) = article(&app).await;
    let likers = users(&app, 200).await;

    let counts = like_all(&app, &likers, &article).await;

    // One atomic script per like: every answer saw a different count.
    assert_eq!(counts, (1..=200).collect());
    assert_eq!(like_state(&app, None, &article).await, (200, false));
    drain(&app).await;
    assert_eq!(sql_article(&app, &article).await.like_count, 200);
    let events = like_events(&app, Subject::Article(article_row(&article))).await;
    assert_eq!(events.len(), 200);
    let archived_counts: BTreeSet<i64> = events.iter().map(|event| event.like_count).collect();
    assert_eq!(archived_counts, (1..=200).collect());
    assert_eq!(like_state(&app, None, &article).await, (200, false));
}

#[tokio::test]
async fn two_hundred_concurrent_toggles_by_one_user_end_consistent() {
    let app = TestApp::spawn().await;
    let (_, article) = article(&app).await;
    let (_, token) = users(&app, 1).await.remove(0);

    let answers =
        join_all((0..200).map(|n| set_like(&app, Some(&token), &article, n % 2 == 0))).await;
    for answer in &answers {
        let payload = payload(answer);
        let liked = payload["liked"].as_bool().unwrap();
        assert_eq!(payload["likeCount"], i64::from(liked), "{answer}");
    }

    let (count, liked) = like_state(&app, Some(&token), &article).await;
    assert_eq!(count, i64::from(liked));
    drain(&app).await;
    assert_eq!(sql_article(&app, &article).await.like_count, count);
    let events = like_events(&app, Subject::Article(article_row(&article))).await;
    assert!(!events.is_empty());
    // Only changes are archived: they alternate, starting with a like, each with its count.
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.liked, index % 2 == 0, "event {index}");
        assert_eq!(event.like_count, i64::from(event.liked), "event {index}");
    }
    assert_eq!(events.last().unwrap().liked, liked);
    assert_eq!(
        like_state(&app, Some(&token), &article).await,
        (count, liked)
    );
}

#[tokio::test]
async fn a_like_after_redis_forgot_the_relation_counts_once_before_and_after_archiving() {
    let app = app_archiving_on_demand().await;
    let (_, article) = article(&app).await;
    let (user, token) = users(&app, 1).await.remove(0);
    let subject = Subject::Article(article_row(&article));
    let relation = app
        .state
        .redis
        .keys
        .like_shard(subject.id())
        .relation(&subject.field(), user);
    let mut redis = app.state.redis.conn.clone();

    assert_eq!(
        payload(&set_like(&app, Some(&token), &article, true).await)["likeCount"],
        1
    );
    // Before the archive ran: the like is only in Redis (and its stream).
    let _: () = redis.del(&relation).await.unwrap();
    assert_eq!(unarchived(&app).await, 1);
    let again = set_like(&app, Some(&token), &article, true).await;
    assert_eq!(
        (
            payload(&again)["liked"].clone(),
            payload(&again)["likeCount"].clone()
        ),
        (json!(true), json!(1))
    );
    assert_eq!(unarchived(&app).await, 1, "a repeat like appended an event");

    drain(&app).await;
    assert_eq!(sql_article(&app, &article).await.like_count, 1);
    // After the archive ran: SQL decides.
    let _: () = redis.del(&relation).await.unwrap();
    let again = set_like(&app, Some(&token), &article, true).await;
    assert_eq!(payload(&again)["likeCount"], 1);
    assert_eq!(unarchived(&app).await, 0, "a repeat like appended an event");
    assert_eq!(like_state(&app, Some(&token), &article).await, (1, true));

    // And the same for unliking what is no longer liked.
    assert_eq!(
        payload(&set_like(&app, Some(&token), &article, false).await)["likeCount"],
        0
    );
    let _: () = redis.del(&relation).await.unwrap();
    assert_eq!(
        payload(&set_like(&app, Some(&token), &article, false).await)["likeCount"],
        0
    );
    drain(&app).await;
    let _: () = redis.del(&relation).await.unwrap();
    assert_eq!(
        payload(&set_like(&app, Some(&token), &article, false).await)["likeCount"],
        0
    );
    assert_eq!(unarchived(&app).await, 0);
    assert_eq!(sql_article(&app, &article).await.like_count, 0);
    assert_eq!(app.count("like_events").await, 2);
    assert_eq!(like_state(&app, Some(&token), &article).await, (0, false));
}

#[tokio::test]
async fn a_count_missing_from_redis_is_read_from_sql_once_by_two_hundred_concurrent_likes() {
    let app = app_archiving_on_demand().await;
    let (_, article) = article(&app).await;
    let likers = users(&app, 205).await;
    for (_, token) in &likers[..5] {
        set_like(&app, Some(token), &article, true).await;
    }
    drain(&app).await;
    let subject = Subject::Article(article_row(&article));
    let shard = app.state.redis.keys.like_shard(subject.id());
    let field = subject.field();
    let mut redis = app.state.redis.conn.clone();
    let _: () = redis.hdel(shard.base(), &field).await.unwrap();
    let _: () = redis.hdel(shard.base_versions(), &field).await.unwrap();
    let loads = app.state.services.likes.sql_count_loads();

    let counts = like_all(&app, &likers[5..], &article).await;

    assert_eq!(counts, (6..=205).collect());
    assert_eq!(app.state.services.likes.sql_count_loads() - loads, 1);
    drain(&app).await;
    assert_eq!(sql_article(&app, &article).await.like_count, 205);
    assert_eq!(like_state(&app, None, &article).await.0, 205);
}

#[tokio::test]
async fn liking_an_unknown_subject_is_not_found_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let (_, token) = users(&app, 1).await.remove(0);
    let missing_article = pulse::graphql::ids::encode(pulse::articles::ARTICLE, 987_654);
    let missing_comment = pulse::graphql::ids::encode(pulse::likes::COMMENT, 987_654);

    for subject in [&missing_article, &missing_comment] {
        for like in [true, false] {
            let response = set_like(&app, Some(&token), subject, like).await;
            assert_eq!(error_code(&response), "NOT_FOUND", "{response}");
        }
    }

    let keys = app.keys_under_prefix().await;
    // The job streams and the prefix's owner key are written at start-up.
    let owner = app.state.redis.keys.owner();
    let written: Vec<&String> = keys
        .iter()
        .filter(|key| (!key.contains(":job:") || key.contains("dead")) && **key != owner)
        .collect();
    assert!(written.is_empty(), "an unknown subject wrote {written:?}");
    assert_eq!(unarchived(&app).await, 0);
    assert_eq!(app.count("likes").await, 0);
}

#[tokio::test]
async fn anonymous_likes_are_unauthenticated_and_other_ids_are_bad_input() {
    let app = TestApp::spawn().await;
    let (_, article) = article(&app).await;
    let (user, token) = users(&app, 1).await.remove(0);

    for like in [true, false] {
        let response = set_like(&app, None, &article, like).await;
        assert_eq!(error_code(&response), "UNAUTHENTICATED", "{response}");
    }
    let user_id = pulse::graphql::ids::encode(pulse::accounts::USER, user);
    let response = set_like(&app, Some(&token), &user_id, true).await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT");
    assert_eq!(response["errors"][0]["extensions"]["field"], "subjectId");
    assert!(
        response["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("not an Article or Comment id")
    );
    assert_eq!(like_state(&app, None, &article).await, (0, false));
    assert_eq!(unarchived(&app).await, 0);
}

#[tokio::test]
async fn an_article_and_a_comment_are_liked_apart_and_read_in_one_page() {
    let app = TestApp::spawn().await;
    let (author, article) = article(&app).await;
    let comment = comment(&app, &author, &article, "first!").await;
    let likers = users(&app, 3).await;
    for (_, token) in &likers {
        set_like(&app, Some(token), &comment, true).await;
    }
    set_like(&app, Some(&likers[0].1), &article, true).await;

    assert_eq!(
        like_state(&app, Some(&likers[0].1), &article).await,
        (1, true)
    );
    assert_eq!(
        like_state(&app, Some(&likers[1].1), &article).await,
        (1, false)
    );
    assert_eq!(
        like_state(&app, Some(&likers[1].1), &comment).await,
        (3, true)
    );
    let page = app
        .graphql_as(
            Some(&likers[2].1),
            "query($id: ID!) { article(id: $id) { likeCount viewerHasLiked commentCount
                comments(first: 5) { edges { node { body likeCount viewerHasLiked } } } } }",
            json!({ "id": article }),
        )
        .await;
    let found = &page["data"]["article"];
    assert_eq!(found["likeCount"], 1, "{page}");
    assert_eq!(found["viewerHasLiked"], false);
    assert_eq!(found["commentCount"], 1);
    let node = &found["comments"]["edges"][0]["node"];
    assert_eq!(
        (
            node["body"].clone(),
            node["likeCount"].clone(),
            node["viewerHasLiked"].clone()
        ),
        (json!("first!"), json!(3), json!(true))
    );
    drain(&app).await;
    let stored = pulse::entities::comments::Entity::find_by_id(
        pulse::graphql::ids::decode(&comment.clone().into(), pulse::likes::COMMENT, "id").unwrap(),
    )
    .one(&app.state.db)
    .await
    .unwrap()
    .unwrap();
    assert_eq!(stored.like_count, 3);
    assert_eq!(sql_article(&app, &article).await.like_count, 1);
}

#[tokio::test]
async fn likes_rank_articles_in_real_time() {
    let app = TestApp::spawn().await;
    let likers = users(&app, 3).await;
    let (_, first) = article(&app).await;
    let (_, second) = article(&app).await;
    let (_, unliked) = article(&app).await;
    for (_, token) in &likers {
        set_like(&app, Some(token), &second, true).await;
    }
    set_like(&app, Some(&likers[0].1), &first, true).await;
    set_like(&app, Some(&likers[1].1), &first, true).await;
    set_like(&app, Some(&likers[1].1), &first, false).await;

    for window in ["ALL_TIME", "DAY", "WEEK"] {
        let response = app
            .graphql(
                &format!("{{ topArticles(by: LIKES, window: {window}) {{ rank score article {{ id likeCount }} }} }}"),
                json!({}),
            )
            .await;
        let ranked = response["data"]["topArticles"]
            .as_array()
            .unwrap_or_else(|| panic!("{response}"));
        let ids: Vec<&str> = ranked
            .iter()
            .map(|entry| entry["article"]["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            vec![second.as_str(), first.as_str()],
            "{window}: {response}"
        );
        assert_eq!(ranked[0]["score"], 3.0);
        assert_eq!(ranked[1]["score"], 1.0);
        assert!(!ids.contains(&unliked.as_str()));
    }
}

#[tokio::test]
async fn events_archived_while_sql_was_locked_and_a_worker_was_killed_land_exactly_once() {
    // The test app never archives on its own: a separate server process does, until it is killed
    // in the middle of a batch that SQL's lock holds up.
    let config = test_config(|config| {
        config.run_jobs = false;
        config.job_lease = Duration::from_secs(2);
    })
    .await;
    let app = TestApp::start(config.clone()).await;
    let likers = users(&app, 30).await;
    let mut articles = Vec::new();
    for _ in 0..5 {
        articles.push(article(&app).await.1);
    }
    let port = crate::crash::free_port();
    let mut worker = crate::crash::spawn_server_process(
        &config,
        port,
        &[("PULSE_JOB_POLL", "20ms"), ("PULSE_JOB_LEASE", "2s")],
    )
    .await;
    let lock = crate::crash::SqlLock::take(&config.database_url(), "like_events").await;

    // Likes keep flowing while SQL refuses the archive: 30 users × 5 articles, some withdrawn.
    let mut requests = Vec::new();
    for (index, (_, token)) in likers.iter().enumerate() {
        for (number, article) in articles.iter().enumerate() {
            requests.push(set_like(&app, Some(token), article, true));
            if (index + number) % 7 == 0 {
                requests.push(set_like(&app, Some(token), article, false));
            }
        }
    }
    for answer in join_all(requests).await {
        payload(&answer);
    }
    let expected: Vec<i64> = join_all(
        articles
            .iter()
            .map(|article| like_state(&app, None, article)),
    )
    .await
    .into_iter()
    .map(|(count, _)| count)
    .collect();
    let events = unarchived(&app).await;
    assert!(events >= 150, "{events} events queued");

    // The worker holds a batch, stuck on the lock; then it dies.
    lock.wait_for_a_waiter().await;
    eventually("the worker holds a batch", async || {
        held_by_others(&app).await > 0
    })
    .await;
    worker.kill().await.unwrap();
    lock.release().await;

    drain(&app).await;
    assert_eq!(app.count("like_events").await as u64, events);
    let ids: HashSet<String> = pulse::entities::like_events::Entity::find()
        .all(&app.state.db)
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(ids.len() as u64, events, "an event was archived twice");
    for (article, &expected) in articles.iter().zip(&expected) {
        assert_eq!(
            sql_article(&app, article).await.like_count,
            expected,
            "{article}"
        );
        assert_eq!(
            like_state(&app, None, article).await.0,
            expected,
            "{article}"
        );
    }
    let liked_rows = pulse::entities::likes::Entity::find()
        .filter(pulse::entities::likes::Column::Liked.eq(true))
        .all(&app.state.db)
        .await
        .unwrap()
        .len() as i64;
    assert_eq!(liked_rows, expected.iter().sum::<i64>());
}

/// Entries of the likes archive that consumers other than the test's hold.
async fn held_by_others(app: &TestApp) -> u64 {
    jobs::status(&app.state.redis, archive::SPEC)
        .await
        .unwrap()
        .iter()
        .map(|stream| stream.pending)
        .sum()
}

fn archiver(app: &TestApp) -> LikeArchiver {
    LikeArchiver::new(
        app.state.db.clone(),
        app.state.redis.clone(),
        app.state.services.featured.clone(),
        app.config.like_relation_ttl,
        app.config.timezone,
    )
}

fn entries(
    shard: u32,
    ids: Vec<redis::streams::StreamId>,
    deliveries: u64,
) -> Vec<jobs::Entry<archive::LikeEntry>> {
    ids.into_iter()
        .map(|id| {
            jobs::Entry {
                shard,
                payload: id
                    .map
                    .iter()
                    .map(|(name, value)| {
                        (name.clone(), redis::from_redis_value_ref(value).unwrap())
                    })
                    .collect(),
                id: id.id,
                deliveries,
            }
            .decode()
            .unwrap()
        })
        .collect()
}

/// The likes archive's new entries, delivered to `consumer` as the runtime would (pending with it
/// until acknowledged). Every shard is read: the test's own prefix holds only its subject's.
async fn deliver(app: &TestApp, consumer: &str) -> Vec<jobs::Entry<archive::LikeEntry>> {
    let mut redis = app.state.redis.conn.clone();
    let mut delivered = Vec::new();
    for shard in 0..archive::SPEC.shards {
        let stream = archive::SPEC.keys_in(&app.state.redis.keys, shard).stream();
        let created: redis::RedisResult<()> = redis
            .xgroup_create_mkstream(&stream, archive::SPEC.name, "0")
            .await;
        if let Err(err) = created {
            assert_eq!(err.code(), Some("BUSYGROUP"), "{err}");
        }
        let options =
            redis::streams::StreamReadOptions::default().group(archive::SPEC.name, consumer);
        let reply: redis::streams::StreamReadReply = redis
            .xread_options(&[&stream], &[">"], &options)
            .await
            .unwrap();
        let ids = reply.keys.into_iter().flat_map(|key| key.ids).collect();
        delivered.extend(entries(shard, ids, 1));
    }
    delivered
}

/// `held` (entries of one shard) claimed by `consumer`, as the runtime takes over a dead
/// consumer's entries.
async fn take_over(
    app: &TestApp,
    consumer: &str,
    held: &[jobs::Entry<archive::LikeEntry>],
) -> Vec<jobs::Entry<archive::LikeEntry>> {
    let shard = held[0].shard;
    let stream = archive::SPEC.keys_in(&app.state.redis.keys, shard).stream();
    let ids: Vec<&str> = held.iter().map(|entry| entry.id.as_str()).collect();
    let mut redis = app.state.redis.conn.clone();
    let claimed: redis::streams::StreamClaimReply = redis
        .xclaim(&stream, archive::SPEC.name, consumer, 0, &ids)
        .await
        .unwrap();
    entries(shard, claimed.ids, 2)
}

#[tokio::test]
async fn a_like_taken_over_after_newer_ones_of_its_relation_were_archived_is_late_not_lost() {
    let app = app_archiving_on_demand().await;
    let (_, article) = article(&app).await;
    let (_, token) = users(&app, 1).await.remove(0);
    let subject = Subject::Article(article_row(&article));
    let archiver = archiver(&app);

    set_like(&app, Some(&token), &article, true).await;
    // A consumer takes the like, then dies before archiving it.
    let held = deliver(&app, "dead").await;
    assert_eq!(held.len(), 1);
    set_like(&app, Some(&token), &article, false).await;
    set_like(&app, Some(&token), &article, true).await;

    // The unlike finds SQL without the like it undoes: the held like explains it.
    let newer = deliver(&app, "alive").await;
    assert_eq!(newer.len(), 2);
    let outcome = archiver.archive(&newer).await.unwrap();
    assert_eq!(
        (outcome.archived, outcome.late, outcome.lost),
        (2, 1, 0),
        "{outcome:?}"
    );
    // The dead consumer's like, taken over: older than what SQL applied.
    let taken = take_over(&app, "alive", &held).await;
    let outcome = archiver.archive(&taken).await.unwrap();
    assert_eq!(
        (outcome.archived, outcome.late, outcome.lost),
        (1, 1, 0),
        "{outcome:?}"
    );

    assert_eq!(unarchived(&app).await, 0);
    assert_eq!(sql_article(&app, &article).await.like_count, 1);
    assert_eq!(like_state(&app, Some(&token), &article).await, (1, true));
    assert_eq!(like_events(&app, subject).await.len(), 3);
}

#[tokio::test]
async fn a_like_that_redis_counted_again_after_losing_the_archived_one_is_lost_state() {
    let app = app_archiving_on_demand().await;
    let (_, article) = article(&app).await;
    let (user, token) = users(&app, 1).await.remove(0);
    let subject = Subject::Article(article_row(&article));
    let archiver = archiver(&app);
    set_like(&app, Some(&token), &article, true).await;
    let first = deliver(&app, "alive").await;
    assert_eq!(archiver.archive(&first).await.unwrap().lost, 0);

    // Redis comes back not knowing the archived like (as from an older snapshot): it counts the
    // next like again, while SQL has it already.
    let relation = app
        .state
        .redis
        .keys
        .like_shard(subject.id())
        .relation(&subject.field(), user);
    let mut redis = app.state.redis.conn.clone();
    let _: () = redis.set(&relation, "0").await.unwrap();
    let again = set_like(&app, Some(&token), &article, true).await;
    assert_eq!(
        payload(&again)["likeCount"],
        2,
        "Redis did not count it again"
    );

    let second = deliver(&app, "alive").await;
    let outcome = archiver.archive(&second).await.unwrap();
    assert_eq!(
        (outcome.archived, outcome.late, outcome.lost),
        (1, 0, 1),
        "{outcome:?}"
    );
    assert_eq!(sql_article(&app, &article).await.like_count, 1);
    assert_eq!(like_state(&app, Some(&token), &article).await, (1, true));
}
