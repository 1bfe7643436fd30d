//! Fan-out at scale: only active inboxes are written, and a worker process killed mid-fan-out
//! (SIGKILL) leaves each item delivered exactly once per active inbox after a restart.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pulse::config::Config;

use crate::crash::{free_port, spawn_server_process};
use crate::feed::{bulk_follow, publish, redis_conn, token, users};
use crate::helpers::{TestApp, eventually, test_config};
use pulse::keys::FeedKeys;

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

/// Makes `users` active as a read does: their inboxes exist (the anchor only), and they are in the
/// audience of `author`, whom they follow.
async fn activate(app: &TestApp, users: &[i64], author: i64) {
    let mut conn = redis_conn(app).await;
    let mut pipe = redis::pipe();
    for &user in users {
        let inbox = app.state.redis.keys.feed_user(user).inbox();
        pipe.zadd(&inbox, 0, 0)
            .ignore()
            .expire(&inbox, 3600)
            .ignore();
        pulse::feed::store::add_audience_joins(&mut pipe, &app.state.redis.keys, user, &[author]);
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
    activate(&app, &active, author).await;

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

#[tokio::test]
async fn an_audience_is_cut_into_slices_of_one_shard_that_hold_each_follower_once() {
    let app = TestApp::spawn().await;
    let store = app.state.services.feed.store();
    let author = 1;
    // 32 shards: shard 0 gets 25 followers, shard 1 exactly 10, shard 2 one, the rest none.
    let mut followers: Vec<i64> = (0..25).map(|i| 32 * i + 100_000).collect();
    followers.extend((0..10).map(|i| 32 * i + 100_001));
    followers.push(100_002);
    let mut conn = redis_conn(&app).await;
    let mut pipe = redis::pipe();
    for &follower in &followers {
        pulse::feed::store::add_audience_joins(
            &mut pipe,
            &app.state.redis.keys,
            follower,
            &[author],
        );
    }
    let () = pipe.query_async(&mut conn).await.unwrap();

    let slices = store.audience_slices(author, 10).await.unwrap();
    let mut sizes = Vec::new();
    let mut seen = Vec::new();
    for slice in &slices {
        let members = store.audience_of(author, slice).await.unwrap();
        assert!(
            members
                .iter()
                .all(|&member| pulse::keys::feed_shard(member) == slice.shard),
            "a slice spans shards"
        );
        sizes.push((slice.shard, members.len()));
        seen.extend(members);
    }
    assert_eq!(sizes, vec![(0, 10), (0, 10), (0, 5), (1, 10), (2, 1)]);
    seen.sort_unstable();
    followers.sort_unstable();
    assert_eq!(seen, followers, "a follower is in no slice or in two");
    // A follower who joins after the cut is in the slice covering their id.
    let late = 32 * 1000 + 100_000;
    let mut pipe = redis::pipe();
    pulse::feed::store::add_audience_joins(&mut pipe, &app.state.redis.keys, late, &[author]);
    let () = pipe.query_async(&mut conn).await.unwrap();
    let last_of_shard_0 = store.audience_of(author, &slices[2]).await.unwrap();
    assert!(last_of_shard_0.contains(&late));
}

#[tokio::test]
async fn a_burst_by_one_author_travels_as_one_chunk_per_slice_and_reaches_each_inbox_once() {
    let app = TestApp::spawn_with(|config| config.run_jobs = false).await;
    let people = users(&app, "burst", 4).await;
    let (author, readers) = (people[0], &people[1..]);
    bulk_follow(&app, readers, author).await;
    activate(&app, readers, author).await;
    let store = app.state.services.feed.store().clone();
    let runtime = pulse::jobs::JobRuntime::new(app.state.redis.clone(), Default::default());
    let dispatcher = pulse::feed::dispatch::Dispatcher(store.clone());
    let fanout = pulse::feed::fanout::Fanout(store.clone());
    let author_token = token(&app, author);

    let mut burst = Vec::new();
    for i in 0..5 {
        burst.push(publish(&app, &author_token, &format!("burst {i}")).await);
    }
    assert_eq!(runtime.poll_once(&dispatcher).await.unwrap(), 5);
    // One more publication dispatched on its own: a second chunk for the same slices.
    let late = publish(&app, &author_token, "late").await;
    assert_eq!(runtime.poll_once(&dispatcher).await.unwrap(), 1);

    let mut conn = redis_conn(&app).await;
    let mut queued = Vec::new();
    let streams = pulse::jobs::status(&app.state.redis, pulse::feed::fanout::SPEC)
        .await
        .unwrap();
    for (shard, status) in streams.iter().enumerate() {
        let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(&status.stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        for entry in entries.ids {
            let slice = (
                entry.get::<String>("shard").unwrap(),
                entry.get::<String>("after").unwrap(),
                entry.get::<String>("up_to").unwrap(),
            );
            queued.push((shard, slice, entry.get::<String>("articles").unwrap()));
        }
    }
    let shards_of_readers: std::collections::BTreeSet<u32> = readers
        .iter()
        .map(|&reader| pulse::keys::feed_shard(reader))
        .collect();
    let joined = |ids: &[i64]| ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(
        queued.len(),
        2 * shards_of_readers.len(),
        "not one chunk per slice and dispatch: {queued:?}"
    );
    for (stream, slice, articles) in &queued {
        assert!(
            articles == &joined(&burst) || articles == &late.to_string(),
            "a chunk carries {articles}"
        );
        let twin = queued
            .iter()
            .filter(|(_, other_slice, _)| other_slice == slice)
            .all(|(other_stream, _, _)| other_stream == stream);
        assert!(twin, "the chunks of one slice went to different streams");
    }

    let handled = runtime.poll_once(&fanout).await.unwrap();
    assert_eq!(handled, queued.len());
    for &reader in readers {
        let (holding, _) = inboxes(&app, &[reader], late).await;
        assert_eq!(holding, 1);
        for &article in &burst {
            assert_eq!(inboxes(&app, &[reader], article).await, (1, 1));
        }
    }
    assert_eq!(
        store.counters.inbox_writes.load(Ordering::Relaxed) as usize,
        readers.len() * (burst.len() + 1)
    );
}
