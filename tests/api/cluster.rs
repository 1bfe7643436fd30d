//! Redis Cluster failover under load: the master of the counted keys killed mid-run, its replica
//! promoted, the same process answering again without a restart (its live subscriptions too),
//! `/readyz` showing the window, and the views reconciling as the README says (nothing counted twice; at most the views
//! acknowledged just before the kill lost, with asynchronous replication).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pulse::keys::VIEW_SHARDS;
use pulse::keys::{ArticleKeys, ViewKeys};

use crate::helpers::{TestApp, article_row, eventually, two_votes_lead, unique_suffix};
use crate::likes_reads::{next_stats, watch_stats};
use crate::views::{BROWSER, distinct_ip, flusher, record, sql_view_count, view_count};

/// Acknowledged views this long before the kill may not have reached the replica yet.
const REPLICATION_AT_RISK: Duration = Duration::from_secs(1);
const CLIENTS: usize = 40;

/// Three masters and three replicas of the test's own (scripts/redis-cluster.sh), so killing one
/// disturbs no other test; stopped when dropped.
struct LocalCluster {
    dir: PathBuf,
    base: u16,
}

impl LocalCluster {
    async fn start() -> Self {
        let base = free_port_range();
        let dir = std::env::temp_dir().join(format!("pulse-cluster-{}", unique_suffix()));
        let started = tokio::process::Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .env("PULSE_CLUSTER_BASE_PORT", base.to_string())
            .output()
            .await
            .expect("bash runs");
        assert!(
            started.status.success(),
            "the test's cluster did not start: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        Self { dir, base }
    }

    fn url(&self) -> String {
        let seeds: Vec<String> = (0..3)
            .map(|i| format!("127.0.0.1:{}", self.base + i))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The port of the master that serves `key`'s slot now, as the node on port `asked` sees it.
    async fn master_of(key: &str, asked: u16) -> u16 {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{asked}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
            .unwrap();
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let first: i64 = redis::from_redis_value_ref(&fields[0]).unwrap();
            let last: i64 = redis::from_redis_value_ref(&fields[1]).unwrap();
            if (first..=last).contains(&slot) {
                let redis::Value::Array(master) = &fields[2] else {
                    panic!("CLUSTER SLOTS names no master for {first}-{last}");
                };
                return redis::from_redis_value_ref(&master[1]).unwrap();
            }
        }
        panic!("slot {slot} has no master");
    }

    fn kill(&self, port: u16) {
        let pid = std::fs::read_to_string(self.dir.join(port.to_string()).join("redis.pid"))
            .expect("the node wrote its pid file");
        let killed = std::process::Command::new("kill")
            .arg("-KILL")
            .arg(pid.trim())
            .status()
            .unwrap();
        assert!(killed.success());
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .env("PULSE_CLUSTER_BASE_PORT", self.base.to_string())
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/redis-cluster.sh")
}

/// A base port whose six ports and their cluster-bus ports (+10,000) are all free now. Both lie
/// below the kernel's ephemeral ports (32,768 up by default): a bus port up there could be taken
/// by another test's outgoing connection between this check and the node's bind, and the node
/// then aborts.
fn free_port_range() -> u16 {
    loop {
        let base = 10_000 + (rand::random::<u16>() % 300) * 10;
        let free = (0..6).all(|i| {
            [base + i, base + i + 10_000]
                .iter()
                .all(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        });
        if free {
            return base;
        }
    }
}

/// Whether `/readyz` reports Redis reachable (its `redis` field; SQL's readiness is not the
/// subject here).
async fn redis_ready(app: &TestApp) -> bool {
    let Ok(response) = app.http.get(app.url("/readyz")).send().await else {
        return false;
    };
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    body["redis"] == "ok"
}

/// What the viewers saw: when each view was acknowledged as counted, and the error codes of those
/// that failed.
#[derive(Default)]
struct Outcomes {
    counted: Vec<Instant>,
    failed: Vec<(Instant, String)>,
}

#[tokio::test]
async fn a_master_killed_under_load_fails_over_and_the_views_reconcile() {
    let cluster = LocalCluster::start().await;
    let url = cluster.url();
    let app = Arc::new(
        TestApp::spawn_with(|config| {
            config.redis_url = Some(url);
            config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        })
        .await,
    );
    // The victim is the first seed's master, where the hub's pub/sub connection is too, so its
    // death also moves the hub to the next seed. One of an author's first 16 articles (one per view
    // shard) has its views there.
    let victim = cluster.base;
    let (token, _) = app.sign_up("author").await;
    let mut on_victim = None;
    for _ in 0..VIEW_SHARDS {
        let article = app.publish(&token, "viewed").await;
        let shard_key = app
            .state
            .redis
            .keys
            .view_shard(article_row(&article))
            .base();
        if LocalCluster::master_of(&shard_key, victim).await == victim {
            on_victim = Some((article, shard_key));
            break;
        }
    }
    let (article, shard_key) = on_victim.expect("a view shard lives on the first master");
    let mut watcher = watch_stats(&app, &article).await;
    // The view and like scripts announce the article's counters each in its own slot, so each
    // channel is heard at that slot's master only, not copied to every node.
    let stats_channels = app
        .state
        .redis
        .keys
        .article_stats_channels(article_row(&article));
    for channel in &stats_channels {
        let owner = LocalCluster::master_of(channel, victim).await;
        eventually("the hub subscribes at the channel's master", async || {
            shard_subscribers(owner, channel).await == 1
        })
        .await;
        for port in (cluster.base..cluster.base + 6).filter(|port| *port != owner) {
            assert_eq!(shard_subscribers(port, channel).await, 0, "node {port}");
        }
    }
    assert_eq!(
        LocalCluster::master_of(&stats_channels[0], victim).await,
        victim,
        "the view channel lives with the view shard"
    );
    let survivor = (cluster.base..cluster.base + 6)
        .find(|port| *port != victim)
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let next_viewer = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let viewers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (app, article, stop, next_viewer, outcomes) = (
                app.clone(),
                article.clone(),
                stop.clone(),
                next_viewer.clone(),
                outcomes.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let viewer = distinct_ip(next_viewer.fetch_add(1, Ordering::Relaxed));
                    let response = record(&app, &article, &viewer, BROWSER).await;
                    let mut outcomes = outcomes.lock().unwrap();
                    if response["data"]["recordView"]["counted"] == true {
                        outcomes.counted.push(Instant::now());
                    } else {
                        let code = response["errors"][0]["extensions"]["code"].to_string();
                        outcomes.failed.push((Instant::now(), code));
                    }
                }
            })
        })
        .collect();
    let readiness = {
        let (app, stop) = (app.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                seen.push((Instant::now(), redis_ready(&app).await));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        })
    };

    tokio::time::sleep(Duration::from_secs(2)).await;
    let counted_before_kill = outcomes.lock().unwrap().counted.len();
    assert!(
        counted_before_kill > 0,
        "no view was counted before the kill"
    );
    let killed_at = Instant::now();
    cluster.kill(victim);

    // Recovered: the replica promoted, views counted since, and none failing for three seconds.
    let mut promoted_at = None;
    let recovered_at = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if killed_at.elapsed() > Duration::from_secs(60) {
            let outcomes = outcomes.lock().unwrap();
            panic!(
                "no recovery a minute after the kill: promoted after {:?}, {} counted since the kill, {} failed (last {:?} ago: {:?})",
                promoted_at.map(|at: Instant| at - killed_at),
                outcomes
                    .counted
                    .iter()
                    .filter(|at| **at > killed_at)
                    .count(),
                outcomes.failed.len(),
                outcomes.failed.last().map(|(at, _)| at.elapsed()),
                outcomes.failed.last().map(|(_, code)| code),
            );
        }
        if promoted_at.is_none() && LocalCluster::master_of(&shard_key, survivor).await != victim {
            promoted_at = Some(Instant::now());
        }
        let Some(promoted_at) = promoted_at else {
            continue;
        };
        let outcomes = outcomes.lock().unwrap();
        let last_failure = outcomes.failed.last().map(|(at, _)| *at);
        let since = last_failure.map_or(promoted_at, |failed| failed.max(promoted_at));
        let first_since = outcomes.counted.iter().find(|at| **at > since);
        if let Some(first_since) = first_since
            && last_failure.is_none_or(|failed| failed.elapsed() > Duration::from_secs(3))
        {
            break *first_since;
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for viewer in viewers {
        viewer.await.unwrap();
    }
    let readiness = readiness.await.unwrap();
    let outcomes = Arc::try_unwrap(outcomes)
        .ok()
        .unwrap()
        .into_inner()
        .unwrap();

    let window = recovered_at - killed_at;
    eprintln!(
        "failover: {} counted ({} before the kill), {} failed, answering again {:?} after the kill",
        outcomes.counted.len(),
        counted_before_kill,
        outcomes.failed.len(),
        window
    );
    assert!(window < Duration::from_secs(20), "took {window:?}");
    assert!(
        outcomes
            .failed
            .iter()
            .all(|(_, code)| code == "\"UNAVAILABLE\""),
        "a failure other than UNAVAILABLE: {:?}",
        outcomes
            .failed
            .iter()
            .map(|(_, code)| code)
            .collect::<Vec<_>>()
    );
    let unready_after_kill = readiness
        .iter()
        .any(|(at, ready)| *at > killed_at && *at < recovered_at && !ready);
    assert!(
        unready_after_kill,
        "/readyz reported Redis ready through the failover"
    );
    // Ready again; the suite's other tests may keep SQL (MariaDB above all) slow for a while, so
    // the wait is generous, and only Redis's part of the answer counts here.
    eventually("/readyz reports Redis ready again", async || {
        redis_ready(&app).await
    })
    .await;

    // The flush repairs what the promoted replica missed, and counts nothing twice.
    eventually("the views can be flushed after the failover", async || {
        flusher(&app).flush_all().await.is_ok()
    })
    .await;
    let in_sql = sql_view_count(&app, &article).await;
    assert_eq!(view_count(&app, &article).await, in_sql);
    let acknowledged = outcomes.counted.len() as i64;
    let at_risk = outcomes
        .counted
        .iter()
        .filter(|at| **at <= killed_at && killed_at.duration_since(**at) < REPLICATION_AT_RISK)
        .count() as i64;
    // A view whose answer was lost to the failover may still have been counted.
    let unanswered = outcomes.failed.len() as i64;
    eprintln!(
        "reconciled: {in_sql} stored for {acknowledged} acknowledged ({at_risk} at risk, {unanswered} unanswered)"
    );
    assert!(
        (acknowledged - at_risk..=acknowledged + unanswered).contains(&in_sql),
        "{in_sql} views stored for {acknowledged} acknowledged ({at_risk} at risk, {unanswered} unanswered)"
    );

    // Every master forgets its scripts (as a restarted or promoted node may): the next call loads
    // its script again on the master of its keys.
    let mut conn = app.state.redis.conn.clone();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let last_viewer = distinct_ip(next_viewer.fetch_add(1, Ordering::Relaxed));
    let last = record(&app, &article, &last_viewer, BROWSER).await;
    assert_eq!(last["data"]["recordView"]["counted"], true, "{last}");
    // The hub lost its node with the master and listens through another seed now.
    let pushed = tokio::time::timeout(Duration::from_secs(20), async {
        while next_stats(&mut watcher).await.0 != in_sql + 1 {}
    })
    .await;
    assert!(pushed.is_ok(), "no live push after the failover");
}

/// How many of the node's own clients subscribe to `channel` with `SSUBSCRIBE`.
async fn shard_subscribers(port: u16, channel: &str) -> i64 {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .unwrap();
    counts[0].1
}

#[tokio::test]
async fn a_leaderboard_is_heard_at_its_slots_master_only_and_again_after_that_master_fails_over() {
    use crate::votes::{admin, create_poll, row};
    use crate::votes_live::{dashboard, snapshot, vote};
    use pulse::keys::VoteKeys;

    let cluster = LocalCluster::start().await;
    let url = cluster.url();
    let app = TestApp::spawn_with(|config| config.redis_url = Some(url)).await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        serde_json::json!({ "title": "Sharded", "options": [{ "label": "A" }, { "label": "B" }] }),
    )
    .await;
    let (mut socket, _) = dashboard(&app, &poll, 2).await;
    let (poll, options): (i64, Vec<i64>) = (
        row(&poll, pulse::votes::POLL),
        options
            .iter()
            .map(|o| row(o, pulse::votes::POLL_OPTION))
            .collect(),
    );
    let channel = app.state.redis.keys.poll(poll).votes_channel();
    let owner = LocalCluster::master_of(&channel, cluster.base).await;
    eventually("the hub subscribes at the channel's master", async || {
        shard_subscribers(owner, &channel).await == 1
    })
    .await;
    for port in cluster.base..cluster.base + 6 {
        if port != owner {
            assert_eq!(shard_subscribers(port, &channel).await, 0, "node {port}");
        }
    }
    vote(&app, poll, options[1]).await;
    let update = snapshot(&mut socket).await;
    assert_eq!(update["entries"][0]["score"], 1.0);

    cluster.kill(owner);
    let survivor = (cluster.base..cluster.base + 6)
        .find(|port| *port != owner)
        .unwrap();
    eventually("a replica takes the channel's slot over", async || {
        LocalCluster::master_of(&channel, survivor).await != owner
    })
    .await;
    let promoted = LocalCluster::master_of(&channel, survivor).await;
    eventually("the hub subscribes at the promoted master", async || {
        shard_subscribers(promoted, &channel).await == 1
    })
    .await;
    eventually("votes are accepted again", async || {
        app.state.redis.ping().await.is_ok()
    })
    .await;
    let update = two_votes_lead(&app, &mut socket, poll, options[0]).await;
    assert_eq!(update["entries"][0]["option"]["label"], "A");
}

/// Checks that the reader's feed socket gets `article` and the articles socket its announcement.
async fn expect_both(
    feed: &mut crate::subscriptions::Socket,
    articles: &mut crate::subscriptions::Socket,
    article: i64,
    title: &str,
) {
    use crate::subscriptions::next_message;
    let item = next_message(feed)
        .await
        .expect("the feed socket stays open");
    assert_eq!(crate::feed_live::item_id(&item), article, "{item}");
    let message = next_message(articles)
        .await
        .expect("the articles socket stays open");
    assert_eq!(
        message["payload"]["data"]["articlePublished"]["title"], title,
        "{message}"
    );
}

/// Waits until the hub listens to `channel` with `SSUBSCRIBE` at the master of its slot (as the
/// node on port `asked` sees it), and checks that no other node of the cluster (but `dead`)
/// hears it; returns that master's port.
async fn heard_at_its_master_only(
    cluster: &LocalCluster,
    channel: &str,
    asked: u16,
    dead: Option<u16>,
) -> u16 {
    let owner = LocalCluster::master_of(channel, asked).await;
    eventually(
        &format!("the hub subscribes to {channel} at its master"),
        async || shard_subscribers(owner, channel).await == 1,
    )
    .await;
    let others =
        (cluster.base..cluster.base + 6).filter(|&port| port != owner && Some(port) != dead);
    for port in others {
        assert_eq!(
            shard_subscribers(port, channel).await,
            0,
            "{channel} on node {port}"
        );
    }
    owner
}

#[tokio::test]
async fn feed_items_and_publications_are_heard_at_their_slots_master_only_and_again_after_it_fails_over()
 {
    use crate::feed::{bulk_follow, feed_page, publish, token, users};
    use crate::feed_live::subscribed as feed_subscribed;
    use crate::subscriptions::subscribed;
    use pulse::keys::{FEED_SHARDS, FeedKeys};
    use serde_json::json;

    let cluster = LocalCluster::start().await;
    let url = cluster.url();
    let app = TestApp::spawn_with(|config| {
        config.redis_url = Some(url);
        // The star's two followers make it a celebrity, whose articles reach live readers on its
        // own channel; the author's one follower keeps it fanned out to.
        config.feed_celebrity_followers = 2;
    })
    .await;
    let keys = &app.state.redis.keys;
    let published_channel = keys.articles_published_channel();
    let victim = LocalCluster::master_of(&published_channel, cluster.base).await;
    // Consecutive ids cover every feed shard: some reader's feed lives on the victim too, so one
    // kill moves both of the reader's channels.
    let people = users(&app, "sharded", 2 + FEED_SHARDS as usize).await;
    let (author, star) = (people[0], people[1]);
    let mut reader = None;
    for &candidate in &people[2..] {
        if LocalCluster::master_of(&keys.feed_channel(candidate), victim).await == victim {
            reader = Some(candidate);
            break;
        }
    }
    let reader = reader.expect("a feed shard lives with the journal of publications");
    let fan = *people[2..].iter().find(|&&user| user != reader).unwrap();
    bulk_follow(&app, &[reader], author).await;
    bulk_follow(&app, &[reader, fan], star).await;
    feed_page(&app, &token(&app, reader), 5, None).await;
    let mut feed = feed_subscribed(&app, reader).await;
    let mut articles = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;

    // Each channel is named with the slot of the keys its script touches, published with
    // SPUBLISH, so only that slot's master carries it.
    for channel in [
        &keys.feed_channel(reader),
        &keys.feed_author_channel(star),
        &published_channel,
    ] {
        heard_at_its_master_only(&cluster, channel, victim, None).await;
    }
    let fanned_out = publish(&app, &token(&app, author), "fanned out").await;
    expect_both(&mut feed, &mut articles, fanned_out, "fanned out").await;
    let famous = publish(&app, &token(&app, star), "famous").await;
    expect_both(&mut feed, &mut articles, famous, "famous").await;

    cluster.kill(victim);
    let survivor = (cluster.base..cluster.base + 6)
        .find(|port| *port != victim)
        .unwrap();
    eventually("a replica takes the journal's slot over", async || {
        LocalCluster::master_of(&published_channel, survivor).await != victim
    })
    .await;
    for channel in [&published_channel, &keys.feed_channel(reader)] {
        let promoted = heard_at_its_master_only(&cluster, channel, survivor, Some(victim)).await;
        assert_ne!(promoted, victim);
    }
    eventually("Redis answers again", async || {
        app.state.redis.ping().await.is_ok()
    })
    .await;
    let after = publish(&app, &token(&app, author), "after the failover").await;
    expect_both(&mut feed, &mut articles, after, "after the failover").await;
    let famous_after = publish(&app, &token(&app, star), "famous after").await;
    expect_both(&mut feed, &mut articles, famous_after, "famous after").await;
}
