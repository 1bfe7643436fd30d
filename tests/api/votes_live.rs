//! `leaderboardChanged`: a snapshot at once, then coalesced updates; votes through any process
//! reach subscribers on every process; under a thousand votes a second and 200 subscribers a
//! process reads the board once per tick; an unchanged visible top sends nothing; a lone vote is
//! read at once; a dashboard goes on by itself after its process's pub/sub connection is killed or
//! Redis restarts.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::future::join_all;
use pulse::keys::VoteKeys;
use pulse::votes::service::{Ballot, Origin};
use serde_json::{Value, json};

use crate::crash::free_port;
use crate::helpers::{
    OwnRedis, TestApp, app_on_a_private_redis, eventually, redis_subscribers, two_votes_lead,
};
use crate::likes::users;
use crate::subscriptions::{Socket, connect, next_message, send, subscribed_as};
use crate::votes::{admin, create_poll, row, voter};

const LIVE: &str = "subscription($p: ID!, $first: Int) {
  leaderboardChanged(pollId: $p, period: ALL_TIME, board: DISPLAY, first: $first) {
    version totalOptions entries { option { label } rank score } } }";

/// A dashboard subscribed to the poll's ALL_TIME DISPLAY top `first`, with its first snapshot.
pub async fn dashboard(app: &TestApp, poll: &str, first: i32) -> (Socket, Value) {
    let variables = json!({ "p": poll, "first": first });
    let mut socket = subscribed_as(app, json!({}), LIVE, variables).await;
    let first_snapshot = snapshot(&mut socket).await;
    (socket, first_snapshot)
}

pub async fn snapshot(socket: &mut Socket) -> Value {
    let message = next_message(socket).await.expect("the socket stays open");
    assert_eq!(message["type"], "next", "{message}");
    message["payload"]["data"]["leaderboardChanged"].clone()
}

/// Waits until `app` has subscribed to the poll's votes channel in Redis (with `SUBSCRIBE` on one
/// server, `SSUBSCRIBE` on a cluster).
pub async fn listening(app: &TestApp, poll: i64) {
    let channel = app.state.redis.keys.poll(poll).votes_channel();
    eventually(&format!("a process subscribes to {channel}"), async || {
        redis_subscribers(app, &channel).await > 0
    })
    .await;
}

fn version(snapshot: &Value) -> i64 {
    snapshot["version"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_dashboard_on_one_process_sees_votes_cast_through_another() {
    let a = TestApp::spawn().await;
    let b = TestApp::start(a.config.clone()).await;
    let token = admin(&a).await;
    let (poll, _) = create_poll(
        &a,
        &token,
        json!({ "title": "Live", "options": [{ "label": "A", "bonus": 2 }, { "label": "B" }] }),
    )
    .await;
    let (mut socket, first) = dashboard(&a, &poll, 10).await;
    assert_eq!(first["totalOptions"], 2);
    assert_eq!(first["entries"][0]["score"], 0.0);
    listening(&a, row(&poll, pulse::votes::POLL)).await;

    let voters = users(&b, 1).await;
    let cast = "mutation($p: ID!, $o: ID!) { castVotes(input: { ballots: [{ pollId: $p, optionId: $o }] }) { results { accepted } } }";
    let options = b
        .graphql(
            "query($p: ID!) { poll(id: $p) { options { id } } }",
            json!({ "p": poll }),
        )
        .await;
    let option_a = options["data"]["poll"]["options"][0]["id"].clone();
    let response = b
        .graphql_as(
            Some(&voters[0].1),
            cast,
            json!({ "p": poll, "o": option_a }),
        )
        .await;
    assert_eq!(
        response["data"]["castVotes"]["results"][0]["accepted"],
        true
    );
    let update = snapshot(&mut socket).await;
    assert_eq!(
        update["entries"][0],
        json!({ "option": { "label": "A" }, "rank": 1, "score": 2.0 })
    );
    assert!(version(&update) > version(&first), "{update} after {first}");
}

#[tokio::test]
async fn a_thousand_votes_a_second_and_200_subscribers_cost_one_board_read_per_tick() {
    let tick = Duration::from_millis(250);
    let app = Arc::new(TestApp::spawn_with(|config| config.leaderboard_tick = tick).await);
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Busy", "options": [{ "label": "A" }, { "label": "B" }, { "label": "C" }] }),
    )
    .await;
    let poll_row = row(&poll, pulse::votes::POLL);
    let option_rows: Vec<i64> = options
        .iter()
        .map(|o| row(o, pulse::votes::POLL_OPTION))
        .collect();
    let dashboards = join_all((0..200).map(|_| dashboard(&app, &poll, 3))).await;
    listening(&app, poll_row).await;
    let (user, _) = users(&app, 1).await.remove(0);

    let votes = &app.state.services.votes;
    let reads_before = votes.board_reads();
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    let mut casts = Vec::new();
    let mut pace = tokio::time::interval(Duration::from_millis(10));
    // 3 s at 10 ballots every 10 ms: 1,000 votes a second, each cast without waiting for the last.
    while started.elapsed() < Duration::from_secs(3) {
        pace.tick().await;
        for index in 0..10 {
            let ballot = Ballot {
                poll: poll_row,
                option: option_rows[(sent + index) % 3],
            };
            let app = app.clone();
            casts.push(tokio::spawn(async move {
                app.state
                    .services
                    .votes
                    .cast(&voter(user), &[ballot], &Origin::default(), Utc::now())
                    .await
                    .unwrap()
            }));
        }
        sent += 10;
    }
    for cast in join_all(casts).await {
        assert!(cast.unwrap()[0].rejection.is_none());
    }
    let elapsed = started.elapsed();
    // The last votes are read within a tick or two.
    tokio::time::sleep(tick * 3).await;
    let reads = votes.board_reads() - reads_before;
    let ticks = (elapsed + tick * 3).as_millis() / tick.as_millis();
    assert!(sent >= 2_700, "only {sent} votes were cast");
    // At most one read per tick (the storm's first vote read at once, the rest at each tick's
    // end), plus the first read, and some: the final check below needs the last votes read.
    assert!(
        (2..=ticks as u64 + 2).contains(&reads),
        "{reads} board reads in {ticks} ticks for {sent} votes"
    );

    // Every dashboard ends on the final board, with versions that only grew.
    let finals = join_all(
        dashboards
            .into_iter()
            .map(|(mut socket, first)| async move {
                let mut last = first;
                loop {
                    let total: f64 = last["entries"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|entry| entry["score"].as_f64().unwrap())
                        .sum();
                    if total as usize == sent {
                        return last;
                    }
                    let next = snapshot(&mut socket).await;
                    assert!(version(&next) > version(&last), "{next} after {last}");
                    last = next;
                }
            }),
    )
    .await;
    assert_eq!(finals.len(), 200);
}

#[tokio::test]
async fn nothing_is_sent_while_the_visible_top_stays_the_same() {
    let tick = Duration::from_millis(50);
    let app = TestApp::spawn_with(|config| config.leaderboard_tick = tick).await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Quiet top", "options": [{ "label": "Leader", "initialVotes": 100 },
            { "label": "Second" }, { "label": "Third" }] }),
    )
    .await;
    let poll_row = row(&poll, pulse::votes::POLL);
    let (mut socket, first) = dashboard(&app, &poll, 1).await;
    assert_eq!(first["entries"][0]["option"]["label"], "Leader");
    listening(&app, poll_row).await;
    let (user, _) = users(&app, 1).await.remove(0);
    let reads_before = app.state.services.votes.board_reads();
    for _ in 0..5 {
        let ballot = Ballot {
            poll: poll_row,
            option: row(&options[2], pulse::votes::POLL_OPTION),
        };
        app.state
            .services
            .votes
            .cast(&voter(user), &[ballot], &Origin::default(), Utc::now())
            .await
            .unwrap();
    }
    tokio::time::sleep(tick * 6).await;
    assert!(
        app.state.services.votes.board_reads() > reads_before,
        "the votes were never read"
    );
    let quiet = tokio::time::timeout(tick * 4, futures_util::StreamExt::next(&mut socket)).await;
    assert!(
        quiet.is_err(),
        "a snapshot was sent for an unchanged top: {quiet:?}"
    );

    let ballot = Ballot {
        poll: poll_row,
        option: row(&options[0], pulse::votes::POLL_OPTION),
    };
    app.state
        .services
        .votes
        .cast(&voter(user), &[ballot], &Origin::default(), Utc::now())
        .await
        .unwrap();
    let moved = snapshot(&mut socket).await;
    assert_eq!(moved["entries"][0]["score"], 101.0);
    assert!(version(&moved) > version(&first));
}

/// Casts one ballot for `option` as a fresh voter, accepted.
pub async fn vote(app: &TestApp, poll: i64, option: i64) {
    let (user, _) = users(app, 1).await.remove(0);
    let ballot = Ballot { poll, option };
    let results = app
        .state
        .services
        .votes
        .cast(&voter(user), &[ballot], &Origin::default(), Utc::now())
        .await
        .unwrap();
    assert!(results[0].rejection.is_none(), "{:?}", results[0].rejection);
}

#[tokio::test]
async fn a_lone_vote_after_a_quiet_spell_is_pushed_at_once_not_at_the_end_of_the_tick() {
    // Nothing waiting for a tick's end can pass this test.
    let app =
        TestApp::spawn_with(|config| config.leaderboard_tick = Duration::from_secs(3600)).await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Lone", "options": [{ "label": "A" }, { "label": "B" }] }),
    )
    .await;
    let (mut socket, first) = dashboard(&app, &poll, 2).await;
    assert_eq!(first["entries"][0]["score"], 0.0);
    listening(&app, row(&poll, pulse::votes::POLL)).await;
    let reads = app.state.services.votes.board_reads();

    vote(
        &app,
        row(&poll, pulse::votes::POLL),
        row(&options[1], pulse::votes::POLL_OPTION),
    )
    .await;
    let update = snapshot(&mut socket).await;
    assert_eq!(
        update["entries"][0],
        json!({ "option": { "label": "B" }, "rank": 1, "score": 1.0 })
    );
    assert_eq!(app.state.services.votes.board_reads(), reads + 1);
}

/// Kills every pub/sub connection of the app's Redis (the hub's), and says how many there were.
async fn kill_pubsub_connections(app: &TestApp) -> i64 {
    let mut conn = app.state.redis.conn.clone();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_dashboard_goes_on_by_itself_after_its_pubsub_connection_is_killed() {
    let (app, private) = app_on_a_private_redis().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Killed", "options": [{ "label": "A" }, { "label": "B" }] }),
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
    listening(&app, poll).await;

    assert_eq!(
        kill_pubsub_connections(&app).await,
        1,
        "the hub's connection"
    );
    // Cast at once: the hub may still be reconnecting, so nobody hears this announcement; the
    // read made when the subscription is back shows it.
    vote(&app, poll, options[1]).await;
    let update = snapshot(&mut socket).await;
    assert_eq!(update["entries"][0]["option"]["label"], "B");
    assert_eq!(update["entries"][0]["score"], 1.0);
    // And the next vote is heard as usual.
    listening(&app, poll).await;
    let update = two_votes_lead(&app, &mut socket, poll, options[0]).await;
    assert_eq!(update["entries"][0]["option"]["label"], "A");
    drop(socket);
    app.stop().await.unwrap();
    private.stop().await;
}

#[tokio::test]
async fn a_dashboard_goes_on_by_itself_after_redis_restarts() {
    let port = free_port();
    let dir =
        std::env::temp_dir().join(format!("pulse-live-redis-{port}-{}", rand::random::<u32>()));
    let mut own = OwnRedis::start(port, dir.clone()).await;
    let url = own.url();
    let app = TestApp::spawn_with(|config| config.redis_url = Some(url)).await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Restarted", "options": [{ "label": "A" }, { "label": "B" }] }),
    )
    .await;
    let (mut socket, _) = dashboard(&app, &poll, 2).await;
    let (poll, option_b) = (
        row(&poll, pulse::votes::POLL),
        row(&options[1], pulse::votes::POLL_OPTION),
    );
    listening(&app, poll).await;

    own.stop().await;
    let mut own = OwnRedis::start(port, dir).await;
    eventually("the app reaches the restarted Redis", async || {
        app.state.redis.ping().await.is_ok()
    })
    .await;
    vote(&app, poll, option_b).await;
    let update = snapshot(&mut socket).await;
    assert_eq!(
        update["entries"][0],
        json!({ "option": { "label": "B" }, "rank": 1, "score": 1.0 })
    );
    drop(socket);
    app.stop().await.unwrap();
    own.stop().await;
}

#[tokio::test]
async fn a_subscribe_message_several_times_the_sockets_read_buffer_is_read_whole() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, _) = create_poll(
        &app,
        &token,
        json!({ "title": "Padded", "options": [{ "label": "A" }, { "label": "B" }] }),
    )
    .await;
    let mut socket = connect(&app, "graphql-transport-ws", json!({})).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    // The socket reads 1 KiB at a time.
    let padded = format!("# {}\n{LIVE}", "x".repeat(16 * 1024));
    send(
        &mut socket,
        json!({ "id": "1", "type": "subscribe",
            "payload": { "query": padded, "variables": { "p": poll, "first": 2 } } }),
    )
    .await;
    assert_eq!(snapshot(&mut socket).await["totalOptions"], 2);
}

#[tokio::test]
async fn each_snapshot_reads_its_options_fields_afresh_not_what_an_earlier_one_loaded() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Fresh", "options": [{ "label": "A" }, { "label": "B" }] }),
    )
    .await;
    let query = "subscription($p: ID!) { leaderboardChanged(pollId: $p, first: 1) {
        entries { score option { label participantCount } } } }";
    let mut socket = subscribed_as(&app, json!({}), query, json!({ "p": poll })).await;
    snapshot(&mut socket).await;
    listening(&app, row(&poll, pulse::votes::POLL)).await;
    let (poll, option) = (
        row(&poll, pulse::votes::POLL),
        row(&options[0], pulse::votes::POLL_OPTION),
    );
    for voters in 1..=3 {
        vote(&app, poll, option).await;
        // Coalesced snapshots may skip a vote, never go back: read on to this one's.
        let seen = loop {
            let seen = snapshot(&mut socket).await;
            if seen["entries"][0]["score"] == f64::from(voters) {
                break seen;
            }
        };
        assert_eq!(
            seen["entries"][0]["option"],
            json!({ "label": "A", "participantCount": voters }),
            "{seen}"
        );
    }
}
