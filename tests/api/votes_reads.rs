//! Reading boards: tie policies, the option ahead and the previous period at period boundaries,
//! keyset pages and `around` covering every option once, and a constant number of Redis round
//! trips however many standings a request asks for.

use std::collections::HashSet;
use std::time::Duration;

use pulse::votes::service::Origin;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::likes::users;
use crate::votes::{LEADERBOARD, admin, cast_at, create_poll, utc};

fn ranks(board: &Value) -> Vec<(String, i64, f64)> {
    board["data"]["leaderboard"]["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries: {board}"))
        .iter()
        .map(|entry| {
            (
                entry["option"]["label"].as_str().unwrap().to_owned(),
                entry["rank"].as_i64().unwrap(),
                entry["score"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn tie_policies_give_the_documented_ranks() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let labels_and_votes = [
        ("A", 10),
        ("B", 30),
        ("C", 30),
        ("D", 10),
        ("E", 5),
        ("F", 0),
    ];
    let options: Vec<Value> = labels_and_votes
        .iter()
        .map(|(label, votes)| json!({ "label": label, "initialVotes": votes }))
        .collect();
    let (poll, _) = create_poll(
        &app,
        &token,
        json!({ "title": "Ties", "tiePolicy": "ORDINAL", "options": options }),
    )
    .await;
    let expected = [
        ("ORDINAL", [1, 2, 3, 4, 5, 6]),
        ("DENSE", [1, 1, 2, 2, 3, 4]),
        ("COMPETITION", [1, 1, 3, 3, 5, 6]),
    ];
    let update = "mutation($id: ID!, $t: TiePolicy!) { updatePoll(id: $id, input: { tiePolicy: $t }) { tiePolicy } }";
    for (policy, ranks_expected) in expected {
        let response = app
            .graphql_as(Some(&token), update, json!({ "id": poll, "t": policy }))
            .await;
        assert_eq!(
            response["data"]["updatePoll"]["tiePolicy"], policy,
            "{response}"
        );
        let board = app
            .graphql(
                LEADERBOARD,
                json!({ "p": poll, "period": "ALL_TIME", "board": "DISPLAY", "first": 10 }),
            )
            .await;
        let got = ranks(&board);
        let order: Vec<&str> = got.iter().map(|(label, _, _)| label.as_str()).collect();
        assert_eq!(order, ["B", "C", "A", "D", "E", "F"], "{policy}");
        let got_ranks: Vec<i64> = got.iter().map(|(_, rank, _)| *rank).collect();
        assert_eq!(got_ranks, ranks_expected, "{policy}");
        // The one ahead of D is B's tie partner C under ORDINAL, else the nearest better rank.
        let d = &board["data"]["leaderboard"]["entries"][3];
        let ahead_gap = d["gapToAhead"].as_f64().unwrap();
        assert_eq!(
            ahead_gap,
            if policy == "ORDINAL" { 0.0 } else { 20.0 },
            "{policy}"
        );
    }
}

#[tokio::test]
async fn the_option_ahead_and_the_previous_period_are_right_across_midnight() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Days", "periods": ["DAY"],
            "options": [{ "label": "A" }, { "label": "B" }, { "label": "C" }] }),
    )
    .await;
    let voters = users(&app, 3).await;
    let last_second = utc("2026-11-24T23:59:59Z");
    let midnight = utc("2026-11-25T00:00:00Z");
    let plain = Origin::default();
    // Tuesday: A 2, B 1. Wednesday from its first second: B 2, A 1.
    for (user, option, at) in [
        (0, 0, last_second),
        (1, 0, last_second),
        (2, 1, last_second),
        (0, 1, midnight),
        (1, 1, midnight),
        (2, 0, midnight),
    ] {
        let outcome = cast_at(
            &app,
            voters[user].0,
            &[(&poll, &options[option])],
            &plain,
            at,
        )
        .await;
        assert!(outcome[0].rejection.is_none());
    }
    let standing = "query($o: ID!, $at: DateTime) { node(id: $o) { ... on PollOption {
        standing(period: DAY, at: $at, board: REAL) { rank score ahead { label } gapToAhead
          previousPeriod { rank score periodStart } } } } }";
    let a = app
        .graphql(standing, json!({ "o": options[0], "at": midnight }))
        .await;
    assert_eq!(
        a["data"]["node"]["standing"],
        json!({ "rank": 2, "score": 1.0, "ahead": { "label": "B" }, "gapToAhead": 1.0,
            "previousPeriod": { "rank": 1, "score": 2.0, "periodStart": "2026-11-24T00:00:00+00:00" } })
    );
    let b = app
        .graphql(standing, json!({ "o": options[1], "at": midnight }))
        .await;
    assert_eq!(
        b["data"]["node"]["standing"],
        json!({ "rank": 1, "score": 2.0, "ahead": null, "gapToAhead": null,
            "previousPeriod": { "rank": 2, "score": 1.0, "periodStart": "2026-11-24T00:00:00+00:00" } })
    );
    let a_before = app
        .graphql(standing, json!({ "o": options[0], "at": last_second }))
        .await;
    assert_eq!(a_before["data"]["node"]["standing"]["rank"], 1);
    assert_eq!(
        a_before["data"]["node"]["standing"]["previousPeriod"]["score"],
        0.0
    );
}

#[tokio::test]
async fn keyset_pages_and_around_return_every_option_exactly_once() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    // 25 options, scores with ties: 0, 0, 1, 1, 2, 2, …
    let options: Vec<Value> = (0..25)
        .map(|index| json!({ "label": format!("o{index}"), "initialVotes": index / 2 }))
        .collect();
    let (poll, ids) = create_poll(
        &app,
        &token,
        json!({ "title": "Pages", "options": options }),
    )
    .await;
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = app
            .graphql(
                LEADERBOARD,
                json!({ "p": poll, "period": "ALL_TIME", "board": "DISPLAY", "first": 4, "after": after }),
            )
            .await;
        let board = &page["data"]["leaderboard"];
        assert_eq!(board["totalOptions"], 25, "{page}");
        seen.extend(ranks(&page).into_iter().map(|(label, _, _)| label));
        if board["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = board["pageInfo"]["endCursor"].as_str().map(str::to_owned);
    }
    assert_eq!(seen.len(), 25);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 25);
    assert_eq!(seen[0], "o24");

    let centred = app
        .graphql(
            LEADERBOARD,
            json!({ "p": poll, "period": "ALL_TIME", "board": "DISPLAY", "first": 5, "around": ids[10] }),
        )
        .await;
    let labels: Vec<String> = ranks(&centred)
        .into_iter()
        .map(|(label, _, _)| label)
        .collect();
    assert_eq!(labels.len(), 5);
    assert_eq!(labels[2], "o10", "{centred}");
    assert_eq!(
        centred["data"]["leaderboard"]["pageInfo"]["hasPreviousPage"],
        true
    );
    let stale = app
        .graphql(
            LEADERBOARD,
            json!({ "p": poll, "period": "ALL_TIME", "board": "DISPLAY", "first": 5, "around": ids[10], "after": "x" }),
        )
        .await;
    assert_eq!(crate::helpers::error_code(&stale), "BAD_USER_INPUT");
}

#[tokio::test]
async fn standings_of_many_options_cost_the_same_round_trips_as_of_a_few() {
    let app = TestApp::spawn_with(|config| config.run_jobs = false).await;
    let token = admin(&app).await;
    let query = "query($p: ID!) { poll(id: $p) { participantCount options { label participantCount
        standing(period: DAY) { rank score ahead { label } previousPeriod { rank score } } } } }";
    let mut trips = Vec::new();
    for count in [3, 30] {
        let options: Vec<Value> = (0..count)
            .map(|i| json!({ "label": format!("o{i}") }))
            .collect();
        let (poll, ids) = create_poll(
            &app,
            &token,
            json!({ "title": "Trips", "periods": ["DAY", "ALL_TIME"], "options": options }),
        )
        .await;
        let (user, _) = users(&app, 1).await.remove(0);
        cast_at(
            &app,
            user,
            &[(&poll, &ids[1])],
            &Origin::default(),
            chrono::Utc::now(),
        )
        .await;
        // The poll's configuration is cached by the first read; measure the second.
        app.graphql(query, json!({ "p": poll })).await;
        settle(&app).await;
        let before = app.state.redis.conn.round_trips();
        let response = app.graphql(query, json!({ "p": poll })).await;
        settle(&app).await;
        trips.push(app.state.redis.conn.round_trips() - before);
        let options = response["data"]["poll"]["options"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(options.len(), count);
        assert_eq!(options[1]["standing"]["rank"], 1, "{response}");
        assert_eq!(options[1]["participantCount"], 1);
        assert_eq!(response["data"]["poll"]["participantCount"], 1);
    }
    assert_eq!(trips[0], trips[1], "{trips:?}");
    assert!(trips[1] <= 3, "{trips:?}");
}

async fn settle(app: &TestApp) {
    let mut last = app.state.redis.conn.round_trips();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = app.state.redis.conn.round_trips();
        if now == last {
            return;
        }
        last = now;
    }
}
