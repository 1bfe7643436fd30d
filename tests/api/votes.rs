//! Polls and votes on real Redis and real SQL: exact scores in every period bucket of the poll's
//! zone, admin-only configuration with clear errors, and the vote log archived through the job
//! runtime.

use std::time::Duration;

use chrono::{DateTime, Utc};
use pulse::actor::Actor;
use pulse::graphql::ids;
use pulse::votes::service::{Ballot, BallotOutcome, Origin};
use sea_orm::{ActiveValue::Set, EntityTrait};
use serde_json::{Value, json};

use crate::helpers::{TestApp, error_code, eventually};
use crate::likes::users;

pub const CREATE_POLL: &str = "mutation($input: CreatePollInput!) {
  createPoll(input: $input) { id title timezone periods carryOver tiePolicy
    options { id label bonus initialVotes } rules { scope window limit channel device } } }";

pub const LEADERBOARD: &str = "query($p: ID!, $period: Period!, $at: DateTime, $board: Board!,
    $first: Int, $after: String, $around: ID) {
  leaderboard(pollId: $p, period: $period, at: $at, board: $board, first: $first, after: $after,
      around: $around) {
    period periodStart board version totalOptions
    entries { option { id label } rank score ahead { id } gapToAhead
      previousPeriod { rank score periodStart } }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor } } }";

/// A signed-in admin's token.
pub async fn admin(app: &TestApp) -> String {
    use pulse::entities::users as user_rows;
    let (id, token) = users(app, 1).await.remove(0);
    user_rows::Entity::update(user_rows::ActiveModel {
        id: Set(id),
        is_admin: Set(true),
        ..Default::default()
    })
    .exec(&app.state.db)
    .await
    .unwrap();
    token
}

/// A poll created through the API: its id and its options' ids, in the order given.
pub async fn create_poll(app: &TestApp, token: &str, input: Value) -> (String, Vec<String>) {
    let response = app
        .graphql_as(Some(token), CREATE_POLL, json!({ "input": input }))
        .await;
    let poll = &response["data"]["createPoll"];
    let id = poll["id"]
        .as_str()
        .unwrap_or_else(|| panic!("createPoll failed: {response}"))
        .to_owned();
    let options = poll["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|option| option["id"].as_str().unwrap().to_owned())
        .collect();
    (id, options)
}

pub fn row(global: &str, node: ids::NodeType) -> i64 {
    ids::decode(&global.to_owned().into(), node, "id").unwrap()
}

pub fn voter(user: i64) -> Actor {
    Actor {
        user: Some(user),
        client_ip: "192.0.2.1".parse().unwrap(),
        user_agent: None,
    }
}

/// Casts ballots straight through the service at a chosen time.
pub async fn cast_at(
    app: &TestApp,
    user: i64,
    ballots: &[(&str, &str)],
    origin: &Origin,
    at: DateTime<Utc>,
) -> Vec<BallotOutcome> {
    let ballots: Vec<Ballot> = ballots
        .iter()
        .map(|(poll, option)| Ballot {
            poll: row(poll, pulse::votes::POLL),
            option: row(option, pulse::votes::POLL_OPTION),
        })
        .collect();
    app.state
        .services
        .votes
        .cast(&voter(user), &ballots, origin, at)
        .await
        .unwrap()
}

pub fn utc(text: &str) -> DateTime<Utc> {
    text.parse().unwrap()
}

/// The score of `option` on a board read through the API, and the page's `periodStart`.
pub async fn score(
    app: &TestApp,
    poll: &str,
    option: &str,
    period: &str,
    board: &str,
    at: DateTime<Utc>,
) -> (f64, Value) {
    // ALL_TIME is one board, which no `at` selects.
    let at = (period != "ALL_TIME").then_some(at);
    let response = app
        .graphql(
            LEADERBOARD,
            json!({ "p": poll, "period": period, "at": at, "board": board, "first": 100 }),
        )
        .await;
    let board = &response["data"]["leaderboard"];
    let entry = board["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("leaderboard failed: {response}"))
        .iter()
        .find(|entry| entry["option"]["id"] == option)
        .unwrap_or_else(|| panic!("{option} is not on the board: {response}"));
    (
        entry["score"].as_f64().unwrap(),
        board["periodStart"].clone(),
    )
}

#[tokio::test]
async fn one_vote_with_five_periods_bonus_three_and_carry_over_moves_every_bucket_exactly() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Stars", "timezone": "Asia/Shanghai",
            "periods": ["HOUR", "DAY", "WEEK", "MONTH", "ALL_TIME"], "carryOver": 0.1,
            "options": [{ "label": "A", "bonus": 3 }, { "label": "B" }] }),
    )
    .await;
    let (user, _) = users(&app, 1).await.remove(0);
    // 23:59:59 on Sunday 29 November 2026 in Shanghai: the last second of an hour, a day, an ISO
    // week (W48); the next buckets are 00:00 Monday 30 November, W49, and still November.
    let at = utc("2026-11-29T15:59:59Z");
    let outcomes = cast_at(&app, user, &[(&poll, &options[0])], &Origin::default(), at).await;
    assert!(outcomes[0].rejection.is_none(), "{outcomes:?}");

    let carried = 0.1 * 3.0;
    let next_second = utc("2026-11-29T16:00:00Z");
    for period in ["HOUR", "DAY", "WEEK", "MONTH", "ALL_TIME"] {
        assert_eq!(
            score(&app, &poll, &options[0], period, "REAL", at).await.0,
            1.0,
            "{period}"
        );
        assert_eq!(
            score(&app, &poll, &options[0], period, "DISPLAY", at)
                .await
                .0,
            3.0,
            "{period}"
        );
        assert_eq!(
            score(&app, &poll, &options[1], period, "DISPLAY", at)
                .await
                .0,
            0.0,
            "{period}"
        );
    }
    for period in ["HOUR", "DAY", "WEEK"] {
        assert_eq!(
            score(&app, &poll, &options[0], period, "REAL", next_second)
                .await
                .0,
            0.1,
            "{period}"
        );
        assert_eq!(
            score(&app, &poll, &options[0], period, "DISPLAY", next_second)
                .await
                .0,
            carried,
            "{period}"
        );
    }
    // The month goes on past midnight: same bucket, and its carry went to December.
    assert_eq!(
        score(&app, &poll, &options[0], "MONTH", "DISPLAY", next_second)
            .await
            .0,
        3.0
    );
    let december = utc("2026-12-01T00:00:00Z");
    assert_eq!(
        score(&app, &poll, &options[0], "MONTH", "DISPLAY", december)
            .await
            .0,
        carried
    );
    assert_eq!(
        score(&app, &poll, &options[0], "MONTH", "REAL", december)
            .await
            .0,
        0.1
    );
    let (_, start) = score(&app, &poll, &options[0], "WEEK", "REAL", next_second).await;
    assert_eq!(start, json!("2026-11-29T16:00:00+00:00"));
}

#[tokio::test]
async fn votes_a_second_apart_across_local_midnight_land_in_different_days() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Midnight", "timezone": "America/Los_Angeles",
            "periods": ["DAY", "ALL_TIME"], "options": [{ "label": "A" }] }),
    )
    .await;
    let voters = users(&app, 2).await;
    let before = utc("2026-11-25T07:59:59Z"); // 23:59:59 PST
    let after = utc("2026-11-25T08:00:00Z"); // 00:00:00 PST
    for ((user, _), at) in voters.iter().zip([before, after]) {
        cast_at(&app, *user, &[(&poll, &options[0])], &Origin::default(), at).await;
    }
    let (late, late_start) = score(&app, &poll, &options[0], "DAY", "REAL", before).await;
    let (early, early_start) = score(&app, &poll, &options[0], "DAY", "REAL", after).await;
    assert_eq!((late, early), (1.0, 1.0));
    assert_eq!(late_start, json!("2026-11-24T08:00:00+00:00"));
    assert_eq!(early_start, json!("2026-11-25T08:00:00+00:00"));
    assert_eq!(
        score(&app, &poll, &options[0], "ALL_TIME", "REAL", after)
            .await
            .0,
        2.0
    );
}

#[tokio::test]
async fn iso_week_one_and_a_25_hour_dst_day_bound_their_buckets() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (utc_poll, utc_options) = create_poll(
        &app,
        &token,
        json!({ "title": "Weeks", "periods": ["WEEK"], "carryOver": 0.5,
            "options": [{ "label": "A", "bonus": 2 }] }),
    )
    .await;
    let (paris_poll, paris_options) = create_poll(
        &app,
        &token,
        json!({ "title": "DST", "timezone": "Europe/Paris", "periods": ["DAY"], "carryOver": 0.5,
            "options": [{ "label": "A" }] }),
    )
    .await;
    let (user, _) = users(&app, 1).await.remove(0);
    // Sunday 3 January 2027, the last day of ISO week 2026W53; W01 of 2027 starts Monday 4.
    let sunday = utc("2027-01-03T23:00:00Z");
    cast_at(
        &app,
        user,
        &[(&utc_poll, &utc_options[0])],
        &Origin::default(),
        sunday,
    )
    .await;
    let (score_w53, start_w53) =
        score(&app, &utc_poll, &utc_options[0], "WEEK", "DISPLAY", sunday).await;
    assert_eq!(
        (score_w53, start_w53),
        (2.0, json!("2026-12-28T00:00:00+00:00"))
    );
    let monday = utc("2027-01-04T00:00:00Z");
    let (score_w01, start_w01) =
        score(&app, &utc_poll, &utc_options[0], "WEEK", "DISPLAY", monday).await;
    assert_eq!(
        (score_w01, start_w01),
        (1.0, json!("2027-01-04T00:00:00+00:00"))
    );

    // 25 October 2026 in Paris lasts 25 hours: 22:00 UTC on the 24th to 23:00 UTC on the 25th.
    let late_on_the_long_day = utc("2026-10-25T22:30:00Z");
    cast_at(
        &app,
        user,
        &[(&paris_poll, &paris_options[0])],
        &Origin::default(),
        late_on_the_long_day,
    )
    .await;
    let (long_day, long_start) = score(
        &app,
        &paris_poll,
        &paris_options[0],
        "DAY",
        "REAL",
        late_on_the_long_day,
    )
    .await;
    assert_eq!(
        (long_day, long_start),
        (1.0, json!("2026-10-24T22:00:00+00:00"))
    );
    let next_day = utc("2026-10-25T23:00:00Z");
    let (carried, next_start) = score(
        &app,
        &paris_poll,
        &paris_options[0],
        "DAY",
        "REAL",
        next_day,
    )
    .await;
    assert_eq!(
        (carried, next_start),
        (0.5, json!("2026-10-25T23:00:00+00:00"))
    );
}

#[tokio::test]
async fn only_admins_configure_polls_and_malformed_settings_are_refused_whole() {
    let app = TestApp::spawn().await;
    let admin_token = admin(&app).await;
    let (_, user_token) = users(&app, 1).await.remove(0);
    let input = json!({ "title": "Mine", "options": [{ "label": "A" }] });
    let response = app
        .graphql_as(Some(&user_token), CREATE_POLL, json!({ "input": input }))
        .await;
    assert_eq!(error_code(&response), "FORBIDDEN", "{response}");
    let response = app.graphql(CREATE_POLL, json!({ "input": input })).await;
    assert_eq!(error_code(&response), "UNAUTHENTICATED", "{response}");

    let malformed = [
        json!({ "title": "Bad zone", "timezone": "Mars/Olympus_Mons" }),
        json!({ "title": "Bad period", "periods": ["FORTNIGHT"] }),
        json!({ "title": "Twice", "periods": ["DAY", "DAY"] }),
        json!({ "title": "Bad window", "rules": [{ "scope": "VOTER", "window": "DECADE", "limit": 1 }] }),
        json!({ "title": "Bad scope", "rules": [{ "scope": "PLANET", "window": "DAY", "limit": 1 }] }),
        json!({ "title": "Zero", "rules": [{ "scope": "VOTER", "window": "DAY", "limit": 0 }] }),
        json!({ "title": "Carry", "carryOver": 1.5 }),
        json!({ "title": "Bonus", "options": [{ "label": "A", "bonus": 0 }] }),
        json!({ "title": "Span", "startsAt": "2026-12-01T00:00:00Z", "endsAt": "2026-11-01T00:00:00Z" }),
    ];
    for input in malformed {
        let response = app
            .graphql_as(Some(&admin_token), CREATE_POLL, json!({ "input": input }))
            .await;
        assert_eq!(
            error_code(&response),
            "BAD_USER_INPUT",
            "{input}: {response}"
        );
    }
    assert_eq!(app.count("polls").await, 0);
    assert_eq!(app.count("poll_rules").await, 0);

    let (poll, options) = create_poll(
        &app,
        &admin_token,
        json!({ "title": "Fine", "options": [{ "label": "A" }] }),
    )
    .await;
    let update = "mutation($id: ID!, $input: UpdatePollInput!) { updatePoll(id: $id, input: $input) { title timezone } }";
    let response = app
        .graphql_as(
            Some(&user_token),
            update,
            json!({ "id": poll, "input": { "title": "Hijacked" } }),
        )
        .await;
    assert_eq!(error_code(&response), "FORBIDDEN");
    let response = app
        .graphql_as(
            Some(&admin_token),
            update,
            json!({ "id": poll, "input": { "timezone": "Nowhere/Else" } }),
        )
        .await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT");
    for (query, vars) in [
        (
            "mutation($p: ID!) { addPollOption(pollId: $p, input: { label: \"B\" }) { id } }",
            json!({ "p": poll }),
        ),
        (
            "mutation($o: ID!) { updatePollOption(id: $o, input: { label: \"A2\" }) { id } }",
            json!({ "o": options[0] }),
        ),
        (
            "mutation($p: ID!) { closePoll(id: $p) { id } }",
            json!({ "p": poll }),
        ),
    ] {
        let response = app.graphql_as(Some(&user_token), query, vars).await;
        assert_eq!(error_code(&response), "FORBIDDEN", "{query}: {response}");
    }
    let response = app
        .graphql(
            "query($p: ID!) { poll(id: $p) { title timezone options { label } } }",
            json!({ "p": poll }),
        )
        .await;
    assert_eq!(
        response["data"]["poll"],
        json!({ "title": "Fine", "timezone": "UTC", "options": [{ "label": "A" }] })
    );
}

#[tokio::test]
async fn an_admins_change_reaches_another_process_within_a_second() {
    let first = TestApp::spawn().await;
    let second = TestApp::start(first.config.clone()).await;
    let token = admin(&first).await;
    let (poll, _) = create_poll(
        &first,
        &token,
        json!({ "title": "Before", "options": [{ "label": "A" }] }),
    )
    .await;
    let read = "query($p: ID!) { poll(id: $p) { title } }";
    let seen = second.graphql(read, json!({ "p": poll })).await;
    assert_eq!(seen["data"]["poll"]["title"], "Before");
    let update =
        "mutation($id: ID!) { updatePoll(id: $id, input: { title: \"After\" }) { title } }";
    let response = first
        .graphql_as(Some(&token), update, json!({ "id": poll }))
        .await;
    assert_eq!(
        response["data"]["updatePoll"]["title"], "After",
        "{response}"
    );
    // Within a second: the change is announced, not left to a cache's expiry.
    let changed = tokio::time::Instant::now();
    eventually("the second process serves the new title", async || {
        let seen = second.graphql(read, json!({ "p": poll })).await;
        seen["data"]["poll"]["title"] == "After"
    })
    .await;
    assert!(
        changed.elapsed() < Duration::from_secs(1),
        "the second process served the old title for {:?}",
        changed.elapsed()
    );
}

#[tokio::test]
async fn a_closed_poll_refuses_ballots_and_the_log_gets_every_accepted_one() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Closing", "options": [{ "label": "A" }] }),
    )
    .await;
    let voters = users(&app, 3).await;
    let cast = "mutation($p: ID!, $o: ID!) { castVotes(input: { ballots: [{ pollId: $p, optionId: $o }] }) {
        results { accepted reason standing { rank score } } } }";
    for (_, voter_token) in &voters[..2] {
        let response = app
            .graphql_as(
                Some(voter_token),
                cast,
                json!({ "p": poll, "o": options[0] }),
            )
            .await;
        assert_eq!(
            response["data"]["castVotes"]["results"][0]["accepted"], true,
            "{response}"
        );
    }
    let response = app
        .graphql(cast, json!({ "p": poll, "o": options[0] }))
        .await;
    assert_eq!(error_code(&response), "UNAUTHENTICATED");
    let close = "mutation($p: ID!) { closePoll(id: $p) { closedAt } }";
    let response = app
        .graphql_as(Some(&token), close, json!({ "p": poll }))
        .await;
    assert!(
        response["data"]["closePoll"]["closedAt"].is_string(),
        "{response}"
    );
    let response = app
        .graphql_as(
            Some(&voters[2].1),
            cast,
            json!({ "p": poll, "o": options[0] }),
        )
        .await;
    let result = &response["data"]["castVotes"]["results"][0];
    assert_eq!(result["accepted"], false, "{response}");
    assert_eq!(result["reason"], "POLL_CLOSED");
    // Once the archive has taken every entry of its stream, the log holds exactly the accepted.
    eventually("the vote archive is drained", async || {
        pulse::jobs::status(&app.state.redis, pulse::votes::archive::SPEC)
            .await
            .unwrap()
            .iter()
            .all(|stream| stream.pending + stream.lag == 0)
    })
    .await;
    assert_eq!(app.count("vote_log").await, 2);
}

#[tokio::test]
async fn ballots_before_the_start_or_after_the_end_are_refused_and_change_nothing() {
    use pulse::votes::config::NotOpen;
    use pulse::votes::service::Rejection;
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Window", "startsAt": "2026-12-01T00:00:00Z", "endsAt": "2026-12-02T00:00:00Z",
            "options": [{ "label": "A" }] }),
    )
    .await;
    let (user, _) = users(&app, 1).await.remove(0);
    let ballot = [(poll.as_str(), options[0].as_str())];
    for (at, expected) in [
        ("2026-11-30T23:59:59Z", Some(NotOpen::NotStarted)),
        ("2026-12-01T12:00:00Z", None),
        ("2026-12-02T00:00:00Z", Some(NotOpen::Ended)),
    ] {
        let outcome = cast_at(&app, user, &ballot, &Origin::default(), utc(at)).await;
        assert_eq!(
            outcome[0].rejection,
            expected.map(Rejection::PollNotOpen),
            "{at}"
        );
    }
    let at = utc("2026-12-01T12:00:00Z");
    assert_eq!(
        score(&app, &poll, &options[0], "ALL_TIME", "REAL", at)
            .await
            .0,
        1.0
    );
}
