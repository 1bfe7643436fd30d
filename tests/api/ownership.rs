//! One Redis prefix belongs to one database: a process of another database refuses to start on
//! it and leaves every key under it as it was; a fresh pair is claimed once however many processes
//! start at once; a Redis that lost its data is claimed again; and dev servers of two data dirs on
//! the probed local Redis get prefixes of their own.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use futures_util::future::join_all;
use pulse::config::Config;
use serde_json::json;

use crate::helpers::{TestApp, pulse_command, redis_url, test_config};

/// Every key under `prefix` with its serialized value (`DUMP`), by `SCAN`.
async fn snapshot(app_redis: &pulse::redis::Redis, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let keys = pulse::redis::Keys::new(prefix);
    let mut names = app_redis
        .scan(keys.everything_pattern())
        .collect()
        .await
        .unwrap();
    names.sort();
    names.dedup();
    let mut conn = app_redis.conn.clone();
    let mut dumped = BTreeMap::new();
    for name in names {
        let value: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some(value) = value {
            dumped.insert(name, value);
        }
    }
    dumped
}

/// Deletes `keys`, as a Redis that lost them would have.
async fn delete(redis: &pulse::redis::Redis, keys: Vec<String>) {
    if keys.is_empty() {
        return;
    }
    let mut conn = redis.conn.clone();
    redis::cmd("DEL")
        .arg(keys)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
}

/// Leaves data of every kind under the app's prefix: an account, an article, a view, a like and
/// its archive's stream.
async fn use_it(app: &TestApp) -> String {
    let (token, _) = app.sign_up("owner").await;
    let article = app.publish(&token, "mine").await;
    let viewed = app
        .graphql(
            "mutation($a: ID!) { recordView(articleId: $a) { counted } }",
            json!({ "a": article }),
        )
        .await;
    assert_eq!(viewed["data"]["recordView"]["counted"], true, "{viewed}");
    let liked = app
        .graphql_as(
            Some(&token),
            "mutation($a: ID!) { like(subjectId: $a) { liked } }",
            json!({ "a": article }),
        )
        .await;
    assert_eq!(liked["data"]["like"]["liked"], true, "{liked}");
    article
}

fn prefix_of(config: &Config) -> String {
    config
        .redis_prefix
        .clone()
        .expect("tests name their prefix")
}

#[tokio::test]
async fn a_second_database_on_a_prefix_is_refused_and_changes_nothing_under_it() {
    let first = TestApp::spawn().await;
    use_it(&first).await;
    let (first_config, redis) = (first.config.clone(), first.state.redis.clone());
    let prefix = prefix_of(&first_config);
    // Stopped, so that its own background work cannot change a key between the snapshots.
    first.stop().await.unwrap();
    let before = snapshot(&redis, &prefix).await;
    assert!(
        before.len() > 5,
        "the first server left too little to compare: {before:?}"
    );

    let second_config = test_config(|config| config.redis_prefix = Some(prefix.clone())).await;
    let refusal = match pulse::App::build(second_config.clone()).await {
        Ok(_) => panic!("a second database started on another's prefix"),
        Err(err) => format!("{err:#}"),
    };
    let first_database = pulse::config::redacted_url(&first_config.database_url());
    let second_database = pulse::config::redacted_url(&second_config.database_url());
    for named in [
        "belongs to another database",
        first_database.as_str(),
        second_database.as_str(),
        prefix.as_str(),
        redis_url().as_str(),
        "PULSE_REDIS_PREFIX",
    ] {
        assert!(refusal.contains(named), "{named:?} is not in: {refusal}");
    }
    assert_eq!(snapshot(&redis, &prefix).await, before);

    // The command that erased the first database's views in the report refuses alike.
    let rebuild = pulse_command()
        .args(["rebuild", "views"])
        .env("DATABASE_URL", second_config.database_url())
        .env("REDIS_URL", redis_url())
        .env("PULSE_REDIS_PREFIX", &prefix)
        .env("PULSE_DATA_DIR", &second_config.data_dir)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&rebuild.stderr);
    assert!(!rebuild.status.success(), "the rebuild ran: {stderr}");
    assert!(stderr.contains("belongs to another database"), "{stderr}");
    assert_eq!(snapshot(&redis, &prefix).await, before);

    // The owner is unaffected, and the second database runs on a prefix of its own.
    let first = TestApp::start(first_config).await;
    let own = TestApp::start(Config {
        redis_prefix: Some(format!("{prefix}own:")),
        ..second_config
    })
    .await;
    first.stop().await.unwrap();
    own.stop().await.unwrap();
}

#[tokio::test]
async fn processes_of_one_fresh_database_starting_at_once_share_a_fresh_prefix() {
    let config = test_config(|_| {}).await;
    // Migrated first: the race under test is the claim, not the schema's creation.
    let db = pulse::db::connect(&config.database_url(), config.sqlite_busy_timeout)
        .await
        .unwrap();
    pulse::db::migrate(&db).await.unwrap();
    let built = join_all((0..3).map(|_| pulse::App::build(config.clone()))).await;
    let apps: Vec<pulse::App> = built
        .into_iter()
        .map(|app| app.expect("every process of the database starts"))
        .collect();
    let identity = pulse::ownership::DatabaseIdentity::load_or_create(&db, "")
        .await
        .unwrap();
    assert_eq!(identity.claimed_prefix, config.redis_prefix);
    drop(apps);
}

#[tokio::test]
async fn of_two_fresh_databases_racing_for_a_fresh_prefix_exactly_one_starts() {
    let first = test_config(|_| {}).await;
    let prefix = prefix_of(&first);
    let second = test_config(|config| config.redis_prefix = Some(prefix.clone())).await;
    let (a, b) = tokio::join!(pulse::App::build(first), pulse::App::build(second));
    let refusals: Vec<String> = [a.err(), b.err()]
        .into_iter()
        .flatten()
        .map(|err| format!("{err:#}"))
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(
        refusals[0].contains("belongs to another database"),
        "{refusals:?}"
    );
}

#[tokio::test]
async fn a_prefix_that_lost_its_owner_key_or_all_its_keys_is_claimed_again_by_its_database() {
    let app = TestApp::spawn().await;
    use_it(&app).await;
    let (config, redis) = (app.config.clone(), app.state.redis.clone());
    app.stop().await.unwrap();

    // Redis came back older than the claim: the keys stayed, the owner key did not.
    delete(&redis, vec![redis.keys.owner()]).await;
    let app = TestApp::start(config.clone()).await;
    app.stop().await.unwrap();

    // Redis restarted empty.
    let everything = snapshot(&redis, &prefix_of(&config)).await;
    delete(&redis, everything.into_keys().collect()).await;
    let app = TestApp::start(config).await;
    let mut conn = redis.conn.clone();
    let owner: Option<String> = redis::cmd("GET")
        .arg(redis.keys.owner())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(owner.is_some(), "the prefix was not claimed again");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_database_that_owned_another_prefix_takes_an_ownerless_one_only_when_it_is_empty() {
    let elsewhere = TestApp::spawn().await;
    let moving = elsewhere.config.clone();
    elsewhere.stop().await.unwrap();

    let owner = TestApp::spawn().await;
    use_it(&owner).await;
    let (prefix, redis) = (prefix_of(&owner.config), owner.state.redis.clone());
    owner.stop().await.unwrap();
    delete(&redis, vec![redis.keys.owner()]).await;
    let before = snapshot(&redis, &prefix).await;

    let moved = Config {
        redis_prefix: Some(prefix.clone()),
        ..moving
    };
    let refusal = match pulse::App::build(moved.clone()).await {
        Ok(_) => panic!("a database took a prefix holding keys with no owner"),
        Err(err) => format!("{err:#}"),
    };
    assert!(refusal.contains("records no owner"), "{refusal}");
    assert_eq!(snapshot(&redis, &prefix).await, before);

    delete(&redis, before.into_keys().collect()).await;
    TestApp::start(moved).await.stop().await.unwrap();
}

/// The address of the test Redis when it is a single server, as the probe would find it.
fn probe_address() -> SocketAddr {
    let url = redis_url();
    url.strip_prefix("redis://")
        .and_then(|rest| rest.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| "127.0.0.1:6379".parse().unwrap())
}

#[tokio::test]
async fn dev_servers_of_two_data_dirs_on_the_probed_redis_keep_their_data_apart() {
    let dev = |config: &mut Config| {
        config.dev = true;
        config.token_secret = None;
        config.redis_url = None;
        config.redis_prefix = None;
        config.redis_probe = probe_address();
        config.database_url = None;
    };
    let (one, two) = (
        TestApp::spawn_with(dev).await,
        TestApp::spawn_with(dev).await,
    );
    let prefixes =
        [one.state.redis.keys.prefix(), two.state.redis.keys.prefix()].map(str::to_owned);
    assert_ne!(prefixes[0], prefixes[1]);
    for prefix in &prefixes {
        assert!(
            prefix.starts_with("pulse:") && prefix.len() == "pulse:".len() + 13,
            "{prefix}"
        );
    }

    // Both fresh databases number their first article 1: the keys of one would be the other's.
    let mine = use_it(&one).await;
    let (token, _) = two.sign_up("other").await;
    let theirs = two.publish(&token, "theirs").await;
    assert_eq!(
        crate::helpers::article_row(&mine),
        crate::helpers::article_row(&theirs)
    );
    let read = "query($a: ID!) { article(id: $a) { viewCount likeCount } }";
    let seen = two.graphql(read, json!({ "a": theirs })).await;
    assert_eq!(
        seen["data"]["article"],
        json!({ "viewCount": 0, "likeCount": 0 }),
        "{seen}"
    );

    let row = crate::helpers::article_row(&mine);
    let redis = one.state.redis.clone();
    let databases = [one.state.db.clone(), two.state.db.clone()];
    // A clean stop flushes each server's pending views into its own database.
    one.stop().await.unwrap();
    two.stop().await.unwrap();
    let mut stored = Vec::new();
    for db in &databases {
        use sea_orm::EntityTrait as _;
        let article = pulse::entities::articles::Entity::find_by_id(row)
            .one(db)
            .await
            .unwrap()
            .unwrap();
        stored.push(article.view_count);
    }
    assert_eq!(stored, [1, 0]);

    for prefix in prefixes {
        let keys = snapshot(&redis, &prefix).await.into_keys().collect();
        delete(&redis, keys).await;
    }
}
