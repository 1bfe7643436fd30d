//! Fan-out at scale: only active inboxes are written, and a worker process killed mid-fan-out
//! (SIGKILL) leaves each item delivered exactly once per active inbox after a restart.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pulse::config::Config;

use crate::crash::{free_port, spawn_server_process};
use crate::feed::{bulk_follow, eventually, publish, redis_conn, token, users};
use crate::helpers::{TestApp, test_config};

const FOLLOWERS: usize = 20_000;
const ACTIVE_EVERY: usize = 10;

/// How many of `users`' inboxes hold `article`, and how many of them exist at all.
async fn inboxes(app: &TestApp, users: &[i64], article: i64) -> (usize, usize) {
    let mut conn = redis_conn(app).await;
    let mut holding = 0;
    let mut existing = 0;
    for chunk in users.chunks(2000) {
        let mut pipe = redis::pipe();
        for &user in chunk {
            let inbox = app.state.redis.keys.feed_user(user).inbox();
            pipe.zscore(&inbox, article).exists(inbox);
        }
        let replies: Vec<(Option<f64>, bool)> = pipe.query_async(&mut conn).await.unwrap();
        holding += replies.iter().filter(|(score, _)| score.is_some()).count();
        existing += replies.iter().filter(|(_, exists)| *exists).count();
    }
    (holding, existing)
}

/// Makes `users` active as a read does: marked active, their inboxes exist (the anchor only).
async fn activate(app: &TestApp, users: &[i64]) {
    let mut conn = redis_conn(app).await;
    let mut pipe = redis::pipe();
    let now = chrono::Utc::now().timestamp_millis();
    for &user in users {
        let inbox = app.state.redis.keys.feed_user(user).inbox();
        pipe.zadd(&inbox, 0, 0)
            .ignore()
            .expire(&inbox, 3600)
            .ignore()
            .zadd(app.state.redis.keys.feed_active(), user, now)
            .ignore();
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
}

async fn fanout_settled(app: &TestApp) -> bool {
    let mut settled = true;
    for spec in [pulse::feed::dispatch::SPEC, pulse::feed::fanout::SPEC] {
        for shard in pulse::jobs::status(&app.state.redis, spec).await.unwrap() {
            settled &= shard.pending == 0 && shard.lag == 0;
        }
    }
    settled
}

#[tokio::test]
async fn fanning_out_to_20000_followers_2000_active_survives_a_killed_worker_and_writes_each_active_inbox_once()
 {
    let adjust = |config: &mut Config| {
        config.run_jobs = false;
        config.feed_celebrity_followers = 1_000_000;
    };
    let config = test_config(adjust).await;
    let app = TestApp::start(config.clone()).await;
    let people = users(&app, "fan", FOLLOWERS + 1).await;
    let (author, followers) = (people[0], &people[1..]);
    bulk_follow(&app, followers, author).await;
    let active: Vec<i64> = followers.iter().copied().step_by(ACTIVE_EVERY).collect();
    let inactive: Vec<i64> = followers
        .iter()
        .copied()
        .enumerate()
        .filter(|(i, _)| i % ACTIVE_EVERY != 0)
        .map(|(_, user)| user)
        .collect();
    activate(&app, &active).await;

    let port = free_port();
    let mut worker = spawn_server_process(
        &config,
        port,
        &[
            ("PULSE_FEED_FANOUT_CHUNK", "20"),
            ("PULSE_FEED_CELEBRITY_FOLLOWERS", "1000000"),
            ("PULSE_JOB_BATCH", "1"),
            ("PULSE_JOB_CONCURRENCY", "1"),
            ("PULSE_JOB_LEASE", "2s"),
        ],
    )
    .await;
    let article = publish(&app, &token(&app, author), "to the many").await;
    eventually("the worker has written some inboxes", async || {
        inboxes(&app, &active, article).await.0 > 0
    })
    .await;
    worker.kill().await.unwrap();
    let (written_before_kill, _) = inboxes(&app, &active, article).await;
    assert!(
        written_before_kill < active.len(),
        "the worker finished before it was killed: not the crash under test"
    );

    let restarted = TestApp::start(Config {
        run_jobs: true,
        job_lease: Duration::from_secs(2),
        ..config
    })
    .await;
    eventually("every active inbox holds the article", async || {
        inboxes(&restarted, &active, article).await.0 == active.len()
    })
    .await;
    eventually("the fan-out streams are drained", async || {
        fanout_settled(&restarted).await
    })
    .await;
    let counters = &restarted.state.services.feed.store().counters;
    assert_eq!(
        counters.inbox_writes.load(Ordering::Relaxed) as usize,
        active.len() - written_before_kill,
        "the restart wrote an inbox the killed worker had written, or missed one"
    );
    let (holding, existing) = inboxes(&restarted, &inactive, article).await;
    assert_eq!(
        (holding, existing),
        (0, 0),
        "an inactive follower's inbox was written"
    );
    let (holding, existing) = inboxes(&restarted, &active, article).await;
    assert_eq!((holding, existing), (active.len(), active.len()));
}
