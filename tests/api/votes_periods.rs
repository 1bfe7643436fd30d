//! What `leaderboard(at:)` answers for a period before the poll, past the retention, in the future
//! and now, and for `at` on ALL_TIME; and reads of an unknown poll.

use std::time::Duration;

use chrono::{DateTime, Utc};
use pulse::votes::service::Origin;
use sea_orm::{ActiveValue::Set, EntityTrait};
use serde_json::{Value, json};

use crate::helpers::{TestApp, error_code, test_config};
use crate::likes::users;
use crate::votes::{admin, cast_at, create_poll, row};

const BOARD: &str = "query($p: ID!, $period: Period!, $at: DateTime) {
  leaderboard(pollId: $p, period: $period, at: $at, board: REAL) {
    periodState periodStart totalOptions entries { option { label } score } } }";

async fn board(app: &TestApp, poll: &str, period: &str, at: Option<DateTime<Utc>>) -> Value {
    let response = app
        .graphql(BOARD, json!({ "p": poll, "period": period, "at": at }))
        .await;
    assert!(response["errors"].is_null(), "{response}");
    response["data"]["leaderboard"].clone()
}

fn scores(board: &Value) -> Vec<(String, f64)> {
    board["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("{board}"))
        .iter()
        .map(|entry| {
            (
                entry["option"]["label"].as_str().unwrap().to_owned(),
                entry["score"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_board_says_whether_its_period_is_before_the_poll_past_expired_current_or_future() {
    let config = test_config(|config| {
        config.vote_bucket_retention = Duration::from_secs(3 * 24 * 3600);
    })
    .await;
    let app = TestApp::start(config.clone()).await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Days", "periods": ["DAY", "ALL_TIME"], "carryOver": 0.5,
                "options": [{ "label": "A" }, { "label": "B" }] }),
    )
    .await;
    // The poll has been open ten days: its creation moves back, and a fresh process reads it.
    let now = Utc::now();
    pulse::entities::polls::Entity::update(pulse::entities::polls::ActiveModel {
        id: Set(row(&poll, pulse::votes::POLL)),
        created_at: Set((now - chrono::Duration::days(10)).naive_utc()),
        ..Default::default()
    })
    .exec(&app.state.db)
    .await
    .unwrap();
    app.stop().await.unwrap();
    let app = TestApp::start(config).await;
    let (voter, _) = users(&app, 1).await.remove(0);
    let days_ago = |days: i64| now - chrono::Duration::days(days);
    for at in [now, days_ago(2)] {
        let cast = cast_at(&app, voter, &[(&poll, &options[0])], &Origin::default(), at).await;
        assert!(cast[0].rejection.is_none(), "{cast:?}");
    }

    let current = board(&app, &poll, "DAY", Some(now)).await;
    assert_eq!(current["periodState"], "CURRENT");
    assert_eq!(scores(&current), [("A".into(), 1.0), ("B".into(), 0.0)]);
    assert_eq!(board(&app, &poll, "DAY", None).await, current);

    // Tomorrow holds the carry-over of today's vote so far, and the day after nothing.
    let tomorrow = board(&app, &poll, "DAY", Some(now + chrono::Duration::days(1))).await;
    assert_eq!(tomorrow["periodState"], "FUTURE");
    assert_eq!(scores(&tomorrow), [("A".into(), 0.5), ("B".into(), 0.0)]);
    let later = board(&app, &poll, "DAY", Some(now + chrono::Duration::days(2))).await;
    assert_eq!(later["periodState"], "FUTURE");
    assert_eq!(scores(&later), [("A".into(), 0.0), ("B".into(), 0.0)]);

    let past = board(&app, &poll, "DAY", Some(days_ago(2))).await;
    assert_eq!(past["periodState"], "PAST");
    assert_eq!(scores(&past), [("A".into(), 1.0), ("B".into(), 0.0)]);

    // Five days ago ended more than the three days of retention ago: not kept, so not scored.
    let expired = board(&app, &poll, "DAY", Some(days_ago(5))).await;
    assert_eq!(expired["periodState"], "EXPIRED");
    assert_eq!(expired["entries"], json!([]));
    assert_eq!(expired["totalOptions"], 0);
    assert!(expired["periodStart"].is_string());

    let before = board(&app, &poll, "DAY", Some(days_ago(20))).await;
    assert_eq!(before["periodState"], "BEFORE_POLL");
    assert_eq!(scores(&before), [("A".into(), 0.0), ("B".into(), 0.0)]);

    let all_time = board(&app, &poll, "ALL_TIME", None).await;
    assert_eq!(all_time["periodState"], "CURRENT");
    assert_eq!(scores(&all_time), [("A".into(), 2.0), ("B".into(), 0.0)]);
    let refused = app
        .graphql(
            BOARD,
            json!({ "p": poll, "period": "ALL_TIME", "at": days_ago(2) }),
        )
        .await;
    assert_eq!(error_code(&refused), "BAD_USER_INPUT", "{refused}");
    assert_eq!(refused["errors"][0]["extensions"]["field"], "at");
    let standing = app
        .graphql(
            "query($o: ID!, $at: DateTime) { node(id: $o) { ... on PollOption {
               standing(period: ALL_TIME, at: $at) { score } } } }",
            json!({ "o": options[0], "at": days_ago(2) }),
        )
        .await;
    assert_eq!(error_code(&standing), "BAD_USER_INPUT", "{standing}");
}

#[tokio::test]
async fn an_unknown_poll_reads_as_null_and_a_malformed_id_is_refused() {
    let app = TestApp::spawn().await;
    let unknown = pulse::graphql::ids::encode(pulse::votes::POLL, 987_654);
    let response = app
        .graphql(
            "query($p: ID!) { leaderboard(pollId: $p) { totalOptions } poll(id: $p) { id }
               node(id: $p) { id } }",
            json!({ "p": unknown }),
        )
        .await;
    assert_eq!(
        response,
        json!({ "data": { "leaderboard": null, "poll": null, "node": null } })
    );
    let malformed = app
        .graphql(
            "{ leaderboard(pollId: \"nope\") { totalOptions } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&malformed), "BAD_USER_INPUT");
}

#[tokio::test]
async fn a_polls_own_leaderboard_centres_on_an_option_like_the_root_one() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let options: Vec<Value> = (0..9)
        .map(|n| json!({ "label": format!("O{n}"), "initialVotes": 100 - n }))
        .collect();
    let (poll, ids) = create_poll(
        &app,
        &token,
        json!({ "title": "Around", "options": options }),
    )
    .await;
    let labels = |entries: &Value| -> Vec<String> {
        entries
            .as_array()
            .unwrap_or_else(|| panic!("{entries}"))
            .iter()
            .map(|entry| entry["option"]["label"].as_str().unwrap().to_owned())
            .collect()
    };
    let response = app
        .graphql(
            "query($p: ID!, $o: ID!) {
               poll(id: $p) { leaderboard(first: 3, around: $o) { entries { option { label } } } }
               leaderboard(pollId: $p, first: 3, around: $o) { entries { option { label } } } }",
            json!({ "p": poll, "o": ids[5] }),
        )
        .await;
    let own = labels(&response["data"]["poll"]["leaderboard"]["entries"]);
    assert_eq!(own, ["O4", "O5", "O6"], "{response}");
    assert_eq!(labels(&response["data"]["leaderboard"]["entries"]), own);
}
