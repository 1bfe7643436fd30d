//! Redis coming back older than SQL (restarted from an old snapshot or AOF, a promoted replica)
//! never makes a flushed view count twice, nor hands out an article stats version below one a client
//! already holds.
//!
//! A snapshot here is a DUMP of every key under the test's prefix, and a restore deletes the
//! prefix's keys and RESTOREs the dump: for one prefix, that is what `SAVE` and a restart from the
//! RDB file do, without restarting the Redis other tests share.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pulse::keys::view_shard_of;
use pulse::redis::Redis;
use pulse::views::ViewFlusher;

use crate::crash::SqlLock;
use crate::helpers::{TestApp, article_row, eventually, stored_article};
use crate::likes::{set_like, users};
use crate::likes_reads::{next_versioned_stats, watch_stats};
use crate::views::{
    BROWSER, app_behind_proxy, concurrent_views, distinct_ip, flusher, pending_entries,
    publish_one, record, sql_view_count, view_count,
};
use pulse::keys::ViewKeys;

/// Every key under the prefix: name, DUMP payload, milliseconds left to live (0: none).
struct Snapshot(Vec<(String, Vec<u8>, i64)>);

async fn prefix_keys(redis: &Redis) -> Vec<String> {
    redis
        .scan(format!("{}*", redis.keys.prefix()))
        .collect()
        .await
        .unwrap()
}

async fn snapshot(redis: &Redis) -> Snapshot {
    let mut conn = redis.conn.clone();
    let mut saved = Vec::new();
    for key in prefix_keys(redis).await {
        let (dump, ttl): (Option<Vec<u8>>, i64) = redis::pipe()
            .cmd("DUMP")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some(dump) = dump {
            saved.push((key, dump, ttl.max(0)));
        }
    }
    Snapshot(saved)
}

/// Puts the prefix back exactly as `snapshot` saw it: later keys go, earlier ones come back.
async fn restore(redis: &Redis, snapshot: &Snapshot) {
    let mut conn = redis.conn.clone();
    for key in prefix_keys(redis).await {
        let () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    for (key, dump, ttl) in &snapshot.0 {
        let () = redis::cmd("RESTORE")
            .arg(key)
            .arg(ttl)
            .arg(dump.as_slice())
            .arg("REPLACE")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

async fn wipe(redis: &Redis) {
    restore(redis, &Snapshot(Vec::new())).await;
}

/// Redis's flush sequence for the shard of `article`.
async fn redis_seq(app: &TestApp, article: &str) -> i64 {
    let mut conn = app.state.redis.conn.clone();
    let shard = app.state.redis.keys.view_shard(article_row(article));
    let seq: Option<i64> = redis::cmd("GET")
        .arg(shard.seq())
        .query_async(&mut conn)
        .await
        .unwrap();
    seq.unwrap_or(0)
}

/// Waits until the article's shard has taken batch `seq`.
async fn wait_for_redis_seq(app: &TestApp, article: &str, seq: i64, failure: &str) {
    eventually(failure, async || redis_seq(app, article).await == seq).await;
}

async fn top_score(app: &TestApp) -> f64 {
    let response = app
        .graphql("{ topArticles(first: 1) { score } }", serde_json::json!({}))
        .await;
    response["data"]["topArticles"][0]["score"]
        .as_f64()
        .unwrap_or_else(|| panic!("{response}"))
}

/// Articles of one author, the first `same_shard` of them in one view shard.
async fn articles_in_one_shard(app: &TestApp, same_shard: usize) -> Vec<String> {
    let (token, _) = app.sign_up("sharded").await;
    let mut chosen: Vec<String> = Vec::new();
    let mut i = 0;
    while chosen.len() < same_shard {
        let article = app.publish(&token, &format!("s{i}")).await;
        i += 1;
        let shard = view_shard_of(article_row(&article));
        if chosen
            .first()
            .is_none_or(|first| view_shard_of(article_row(first)) == shard)
        {
            chosen.push(article);
        }
    }
    chosen
}

#[tokio::test]
async fn a_redis_restored_from_an_older_snapshot_never_counts_flushed_views_twice() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    assert_eq!(
        concurrent_views(&app, &article, 300, distinct_ip).await,
        300
    );
    let saved = snapshot(&app.state.redis).await;

    // A clean shutdown flushes the 300 views; then Redis restarts from the snapshot and so does
    // Pulse, whose flusher runs at once.
    let (config, state) = (app.config.clone(), app.state.clone());
    let app = Arc::try_unwrap(app).ok().expect("the viewers are done");
    app.stop().await.unwrap();
    assert_eq!(stored_article(&state, &article).await.view_count, 300);
    restore(&state.redis, &saved).await;
    let app = Arc::new(TestApp::start(config).await);
    wait_for_redis_seq(
        &app,
        &article,
        1,
        "the start-up flush never repaired the shard",
    )
    .await;

    assert_eq!(sql_view_count(&app, &article).await, 300);
    assert_eq!(view_count(&app, &article).await, 300);
    assert_eq!(pending_entries(&app).await, 0);
    assert!(app.metrics().await.contains("pulse_view_rollbacks_total"));
    let again = flusher(&app).flush_all().await.unwrap();
    assert_eq!(again.views, 0, "the stale pending views were flushed again");
    assert_eq!(sql_view_count(&app, &article).await, 300);
    assert_eq!(top_score(&app).await, 300.0);

    let fresh = record(&app, &article, "203.0.113.77", BROWSER).await;
    assert_eq!(fresh["data"]["recordView"]["viewCount"], 301);
    flusher(&app).flush_all().await.unwrap();
    assert_eq!(sql_view_count(&app, &article).await, 301);
    assert_eq!(view_count(&app, &article).await, 301);
}

/// The snapshot holds a batch taken but not yet committed; SQL then commits it and a later batch.
#[tokio::test]
async fn a_snapshot_taken_while_a_batch_was_in_flight_is_still_exact() {
    // The blocked flush waits on SQLite's write lock while the test snapshots Redis, which can take
    // seconds on a busy machine: the default busy timeout would end the wait before the lock is freed.
    let app = Arc::new(
        TestApp::spawn_with(|config| {
            config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            config.sqlite_busy_timeout = Duration::from_secs(120);
        })
        .await,
    );
    let article = publish_one(&app).await;
    assert_eq!(
        concurrent_views(&app, &article, 200, distinct_ip).await,
        200
    );

    let lock = SqlLock::take(&app.config.database_url(), "view_flush_batches").await;
    let blocked = {
        // A lease that is over by the time the snapshot comes back, as after a real restart.
        let flusher = ViewFlusher::new(
            app.state.db.clone(),
            app.state.redis.clone(),
            Duration::from_millis(1),
        );
        tokio::spawn(async move { flusher.flush_all().await })
    };
    wait_for_redis_seq(&app, &article, 1, "the flusher took nothing").await;
    let saved = snapshot(&app.state.redis).await;
    lock.release().await;
    assert_eq!(blocked.await.unwrap().unwrap().views, 200);
    assert_eq!(sql_view_count(&app, &article).await, 200);

    for i in 0..50 {
        record(&app, &article, &distinct_ip(1000 + i), BROWSER).await;
    }
    flusher(&app).flush_all().await.unwrap();
    assert_eq!(sql_view_count(&app, &article).await, 250);

    restore(&app.state.redis, &saved).await;
    let report = flusher(&app).flush_all().await.unwrap();
    assert_eq!(report.repaired_shards, 1);
    assert_eq!(
        report.views, 200,
        "the batch restored in flight was re-driven"
    );
    assert_eq!(
        report.dropped_views, 0,
        "the re-driven batch's clear left nothing stale"
    );
    assert_eq!(sql_view_count(&app, &article).await, 250);
    assert_eq!(view_count(&app, &article).await, 250);
    assert_eq!(pending_entries(&app).await, 0);
    assert_eq!(top_score(&app).await, 250.0);
}

#[tokio::test]
async fn a_redis_that_lost_everything_doubles_nothing_and_counts_on_from_sql() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    assert_eq!(
        concurrent_views(&app, &article, 120, distinct_ip).await,
        120
    );
    flusher(&app).flush_all().await.unwrap();
    assert_eq!(sql_view_count(&app, &article).await, 120);

    wipe(&app.state.redis).await;
    assert_eq!(view_count(&app, &article).await, 120, "SQL answers alone");
    let report = flusher(&app).flush_all().await.unwrap();
    assert_eq!(report.repaired_shards, 1);
    assert_eq!((report.views, report.dropped_views), (0, 0));
    assert_eq!(redis_seq(&app, &article).await, 1);
    assert_eq!(top_score(&app).await, 120.0);

    let fresh = record(&app, &article, "203.0.113.78", BROWSER).await;
    assert_eq!(fresh["data"]["recordView"]["viewCount"], 121);
    let report = flusher(&app).flush_all().await.unwrap();
    assert_eq!(
        report.views, 1,
        "the view counted after the loss reached SQL"
    );
    assert_eq!(sql_view_count(&app, &article).await, 121);
    assert_eq!(view_count(&app, &article).await, 121);
    assert_eq!(top_score(&app).await, 121.0);
}

/// Only views SQL already holds are dropped: views of articles SQL has not counted since the
/// snapshot, whether pending in it or recorded after the restart, are flushed once. Views recorded
/// after the restart on an article flushed after the snapshot are the documented loss.
#[tokio::test]
async fn a_rollback_repair_keeps_the_views_sql_does_not_have() {
    let app = app_behind_proxy().await;
    let same_shard = articles_in_one_shard(&app, 2).await;
    let (flushed, unseen) = (&same_shard[0], &same_shard[1]);
    let (token, _) = app.sign_up("elsewhere").await;
    let mut held = app.publish(&token, "held").await;
    while view_shard_of(article_row(&held)) == view_shard_of(article_row(flushed)) {
        held = app.publish(&token, "held").await;
    }

    for i in 0..4 {
        record(&app, flushed, &distinct_ip(i), BROWSER).await;
    }
    flusher(&app).flush_all().await.unwrap();
    for i in 4..14 {
        record(&app, flushed, &distinct_ip(i), BROWSER).await;
    }
    for i in 0..7 {
        record(&app, &held, &distinct_ip(i), BROWSER).await;
    }
    let saved = snapshot(&app.state.redis).await;

    // Between the snapshot and the flush: 5 more views, which SQL gets. Another process holds
    // `held`'s shard meanwhile, so its 7 pending views are never flushed before the rollback.
    for i in 14..19 {
        record(&app, flushed, &distinct_ip(i), BROWSER).await;
    }
    let mut conn = app.state.redis.conn.clone();
    let held_shard = app.state.redis.keys.view_shard(article_row(&held));
    let () = redis::cmd("HSET")
        .arg(held_shard.in_flight())
        .arg("batch")
        .arg("held-by-another-process")
        .arg("lease")
        .arg(i64::MAX)
        .query_async(&mut conn)
        .await
        .unwrap();
    let report = flusher(&app).flush_all().await.unwrap();
    assert_eq!((report.views, report.busy_shards), (15, 1));
    assert_eq!(sql_view_count(&app, flushed).await, 19);

    restore(&app.state.redis, &saved).await;
    // After the restart, before the repair: `unseen` shares the repaired shard but SQL never
    // counted it, so its views are kept; the views on `flushed` are lost with its stale pending.
    for i in 100..104 {
        record(&app, unseen, &distinct_ip(i), BROWSER).await;
    }
    for i in 100..103 {
        record(&app, flushed, &distinct_ip(i), BROWSER).await;
    }
    let report = flusher(&app).flush_all().await.unwrap();
    assert_eq!(report.repaired_shards, 1);
    assert_eq!(report.dropped_views, 10 + 3);
    assert_eq!(report.views, 4 + 7);

    for (article, expected) in [(flushed, 19), (unseen, 4), (&held, 7)] {
        assert_eq!(sql_view_count(&app, article).await, expected);
        assert_eq!(view_count(&app, article).await, expected);
    }
    assert_eq!(pending_entries(&app).await, 0);
    assert_eq!(flusher(&app).flush_all().await.unwrap().views, 0);
}

/// Views keep arriving while several flushers find the rolled-back shards and repair them. Each
/// view counted before its shard's repair, on an article flushed after the snapshot, is dropped
/// with the stale pending views (and reported as dropped); every other view reaches SQL once.
#[tokio::test]
async fn views_during_a_rollback_repair_are_never_counted_twice() {
    const STALE_VIEWS: usize = 20;
    // Four flushers take SQLite's write lock in a loop beside 500 concurrent views: on a busy
    // machine one can wait longer for it than the default busy timeout.
    let app = Arc::new(
        TestApp::spawn_with(|config| {
            config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
            config.sqlite_busy_timeout = Duration::from_secs(120);
        })
        .await,
    );
    let (token, _) = app.sign_up("busy").await;
    let stale = app.publish_many(&token, "stale", 15).await;
    for (n, article) in stale.iter().enumerate() {
        for i in 0..STALE_VIEWS {
            record(&app, article, &distinct_ip(n * 100 + i), BROWSER).await;
        }
    }
    let saved = snapshot(&app.state.redis).await;
    flusher(&app).flush_all().await.unwrap();
    restore(&app.state.redis, &saved).await;
    let fresh = app.publish_many(&token, "fresh", 10).await;

    let stop = tokio_util::sync::CancellationToken::new();
    let flushers: Vec<_> = (0..4)
        .map(|_| {
            let (flusher, stop) = (flusher(&app), stop.clone());
            tokio::spawn(async move {
                let mut dropped = 0;
                while !stop.is_cancelled() {
                    dropped += flusher.flush_all().await.unwrap().dropped_views;
                }
                dropped
            })
        })
        .collect();
    let articles: Vec<String> = stale.iter().chain(&fresh).cloned().collect();
    let calls = (0..500).map(|i| {
        let (app, article) = (app.clone(), articles[i % articles.len()].clone());
        tokio::spawn(async move {
            let response = record(&app, &article, &distinct_ip(100_000 + i), BROWSER).await;
            (article, response["data"]["recordView"]["counted"] == true)
        })
    });
    let mut counted: HashMap<String, i64> = HashMap::new();
    for call in futures_util::future::join_all(calls).await {
        let (article, was_counted) = call.unwrap();
        assert!(was_counted, "every viewer is new");
        *counted.entry(article).or_default() += 1;
    }
    stop.cancel();
    let mut dropped = 0;
    for flusher in flushers {
        dropped += flusher.await.unwrap();
    }
    dropped += flusher(&app).flush_all().await.unwrap().dropped_views;

    let stale_pending = (stale.len() * STALE_VIEWS) as i64;
    let lost = dropped - stale_pending;
    assert!(
        lost >= 0,
        "the repairs dropped {dropped} views, fewer than the {stale_pending} stale ones"
    );
    let mut stale_in_sql = 0;
    for article in &stale {
        let in_sql = sql_view_count(&app, article).await;
        assert!(
            (STALE_VIEWS as i64..=STALE_VIEWS as i64 + counted[article]).contains(&in_sql),
            "{article}: {in_sql} in SQL, {} new views counted",
            counted[article]
        );
        assert_eq!(view_count(&app, article).await, in_sql);
        stale_in_sql += in_sql;
    }
    let stale_counted: i64 = stale.iter().map(|article| counted[article]).sum();
    assert_eq!(
        stale_in_sql,
        stale_pending + stale_counted - lost,
        "every new view is either in SQL once or reported dropped"
    );
    for article in &fresh {
        assert_eq!(sql_view_count(&app, article).await, counted[article]);
        assert_eq!(view_count(&app, article).await, counted[article]);
    }
    assert_eq!(pending_entries(&app).await, 0);
}

/// The snapshot holds a batch taken but never committed (Redis died first), and SQL has committed
/// the same sequence under another batch since: SQL refuses the stale batch when it is re-driven.
#[tokio::test]
async fn sql_refuses_a_batch_taken_from_a_redis_that_rolled_back() {
    let app = app_behind_proxy().await;
    let article = publish_one(&app).await;
    assert_eq!(concurrent_views(&app, &article, 10, distinct_ip).await, 10);
    let saved = snapshot(&app.state.redis).await;
    flusher(&app).flush_all().await.unwrap();
    assert_eq!(sql_view_count(&app, &article).await, 10);

    restore(&app.state.redis, &saved).await;
    let row = article_row(&article);
    let shard = app.state.redis.keys.view_shard(row);
    let mut conn = app.state.redis.conn.clone();
    let () = redis::pipe()
        .hset_multiple(
            shard.in_flight(),
            &[
                ("batch", "v-never-committed".to_owned()),
                ("lease", "0".to_owned()),
                ("seq", "1".to_owned()),
                (&row.to_string(), "10".to_owned()),
            ],
        )
        .ignore()
        .set(shard.seq(), 1)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    let report = flusher(&app).flush_all().await.unwrap();
    assert_eq!(report.views, 0, "the stale batch was applied");
    assert_eq!((report.repaired_shards, report.dropped_views), (1, 10));
    assert_eq!(sql_view_count(&app, &article).await, 10);
    assert_eq!(view_count(&app, &article).await, 10);
    assert_eq!(pending_entries(&app).await, 0);

    let fresh = record(&app, &article, "203.0.113.79", BROWSER).await;
    assert_eq!(fresh["data"]["recordView"]["viewCount"], 11);
    flusher(&app).flush_all().await.unwrap();
    assert_eq!(sql_view_count(&app, &article).await, 11);
}

/// A client keeps the snapshot with the highest version it has seen, so a version that went back
/// would freeze its counters. The like part of the version moves past the shard's sequence, which
/// never falls behind the clock: a rolled-back Redis still hands out a higher one.
#[tokio::test]
async fn a_redis_restored_from_an_older_snapshot_hands_out_higher_stats_versions_than_before() {
    let app = TestApp::spawn_with(|config| config.stats_tick = Duration::from_millis(50)).await;
    let people = users(&app, 3).await;
    let article = app.publish(&people[0].1, "rolled back").await;
    let mut socket = watch_stats(&app, &article).await;
    let (_, first) = next_versioned_stats(&mut socket).await;
    set_like(&app, Some(&people[1].1), &article, true).await;
    let saved = snapshot(&app.state.redis).await;

    let mut seen = first;
    for like in [false, true, false] {
        set_like(&app, Some(&people[1].1), &article, like).await;
        let expected = i64::from(like);
        loop {
            let ((_, likes, _), version) = next_versioned_stats(&mut socket).await;
            seen = seen.max(version);
            if likes == expected {
                break;
            }
        }
    }
    restore(&app.state.redis, &saved).await;

    // The watcher still running shows its last snapshot, read before the restore; the like's
    // announcement makes it read the restored Redis.
    set_like(&app, Some(&people[2].1), &article, true).await;
    let next_version = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let (_, version) = next_versioned_stats(&mut socket).await;
            if version > seen {
                break version;
            }
        }
    })
    .await;
    assert!(
        next_version.is_ok(),
        "no stats version above {seen} within 10 s of a like on the restored Redis"
    );
}

/// A prune of old batch ids that waits for the batch table (locked here, as a migration or an
/// operator's long DELETE would hold it) holds up none of the passes after it: views recorded
/// meanwhile are taken, and committed once the table is free. SQLite's lock is the whole
/// database, which stops a pass as much as a prune (and ends the wait at its busy timeout), so
/// only a server that locks one table can show it.
#[tokio::test]
async fn a_prune_waiting_for_the_batch_table_holds_up_no_pass_of_the_flusher() {
    let app = TestApp::spawn_with(|config| {
        config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    if app.state.db.get_database_backend() == sea_orm::DbBackend::Sqlite {
        return;
    }
    let article = publish_one(&app).await;
    let lock = SqlLock::take(&app.config.database_url(), "view_flush_batches").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(flusher(&app).run(Duration::from_millis(50), stop.clone()));
    // The first pass finds no view; the first prune, which follows it, waits for the table.
    lock.wait_for_a_waiter().await;
    for i in 0..5 {
        record(&app, &article, &distinct_ip(i), BROWSER).await;
    }
    wait_for_redis_seq(
        &app,
        &article,
        1,
        "no pass took the views after the prune waited",
    )
    .await;
    lock.release().await;
    eventually("the taken views reach SQL", async || {
        sql_view_count(&app, &article).await == 5
    })
    .await;
    stop.cancel();
    running.await.unwrap();
}
