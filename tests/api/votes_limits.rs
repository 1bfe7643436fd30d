//! Rate-limit rules under real concurrency: hundreds of voters at once against per-voter and
//! per-option limits get exactly the limits, a partner channel's extra allowance and a second
//! device work as documented, and a refused ballot changes nothing at all.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use pulse::votes::service::{Ballot, Origin, Rejection};
use serde_json::json;

use crate::helpers::TestApp;
use crate::likes::users;
use crate::votes::{admin, cast_at, create_poll, row, voter};

/// Voters of the second round: few enough that their ballots stay under the option limit.
const QUIET_VOTERS: usize = 40;

#[tokio::test]
async fn five_hundred_concurrent_voters_get_exactly_the_per_option_and_per_voter_limits() {
    let app = Arc::new(TestApp::spawn().await);
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Limits", "periods": ["DAY", "ALL_TIME"],
            "rules": [{ "scope": "VOTER", "window": "MINUTE", "limit": 2 },
                      { "scope": "OPTION", "window": "HOUR", "limit": 100 }],
            "options": [{ "label": "Crowded" }, { "label": "Quiet" }] }),
    )
    .await;
    let (poll_row, crowded, quiet) = (
        row(&poll, pulse::votes::POLL),
        row(&options[0], pulse::votes::POLL_OPTION),
        row(&options[1], pulse::votes::POLL_OPTION),
    );
    let voters = users(&app, 500).await;
    // One instant for every ballot, at the start of the next minute: the test never straddles a
    // window boundary, and the counters, which expire at their window's end, live 60 to 120 s of
    // real time. (The current minute's window could end seconds into the test, and a loaded machine
    // then saw the voter counters vanish between the two rounds.)
    let at = start_of_next_minute();
    let cast = |user: i64, option: i64| {
        let app = app.clone();
        tokio::spawn(async move {
            let ballot = Ballot {
                poll: poll_row,
                option,
            };
            app.state
                .services
                .votes
                .cast(&voter(user), &[ballot], &Origin::default(), at)
                .await
                .unwrap()
                .remove(0)
        })
    };
    let on_crowded: Vec<_> = voters
        .iter()
        .map(|(user, _)| (*user, cast(*user, crowded)))
        .collect();
    let mut accepted = 0;
    let mut spent_on_crowded: HashMap<i64, usize> = HashMap::new();
    for (user, task) in on_crowded {
        match task.await.unwrap().rejection {
            None => {
                accepted += 1;
                spent_on_crowded.insert(user, 1);
            }
            Some(Rejection::RateLimited { rule, retry_after }) => {
                assert_eq!(rule.limit, 100, "{rule:?}");
                assert!(
                    retry_after.is_some_and(|s| (1..=3600).contains(&s)),
                    "{retry_after:?}"
                );
            }
            Some(other) => panic!("unexpected rejection {other:?}"),
        }
    }
    assert_eq!(accepted, 100);

    // 40 voters send 5 ballots each at once for the quiet option: 2 a minute each pass the voter
    // rule, less the one a voter already spent on the crowded option if it was accepted there. At
    // most 80 pass, under the option's 100 an hour: with 60 voters, the option rule refused some
    // whenever fewer than 20 of them had been accepted on the crowded option, and the test failed
    // by which voters won the first round.
    let mut tasks = Vec::new();
    for (user, _) in &voters[..QUIET_VOTERS] {
        for _ in 0..5 {
            tasks.push((*user, cast(*user, quiet)));
        }
    }
    let mut per_voter: HashMap<i64, usize> = HashMap::new();
    let mut quiet_accepted = 0;
    for (user, task) in tasks {
        if task.await.unwrap().rejection.is_none() {
            *per_voter.entry(user).or_default() += 1;
            quiet_accepted += 1;
        }
    }
    let mut expected = 0;
    for (user, _) in &voters[..QUIET_VOTERS] {
        let spent = spent_on_crowded.get(user).copied().unwrap_or(0);
        assert_eq!(
            per_voter.get(user).copied().unwrap_or(0),
            2 - spent,
            "voter {user}"
        );
        expected += 2 - spent;
    }
    assert_eq!(quiet_accepted, expected);

    let board = |option: &str| {
        let (app, poll, option) = (app.clone(), poll.clone(), option.to_owned());
        async move {
            crate::votes::score(&app, &poll, &option, "ALL_TIME", "REAL", at)
                .await
                .0
        }
    };
    assert_eq!(board(&options[0]).await, 100.0);
    assert_eq!(board(&options[1]).await, quiet_accepted as f64);
}

#[tokio::test]
async fn a_partner_channel_grants_extra_votes_and_a_second_device_counts_apart() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Channels",
            "rules": [{ "scope": "VOTER", "window": "MINUTE", "limit": 2 },
                      { "scope": "VOTER", "window": "MINUTE", "limit": 7, "channel": "partner" },
                      { "scope": "VOTER", "window": "DAY", "limit": 3, "device": "web" },
                      { "scope": "VOTER", "window": "DAY", "limit": 3, "device": "mobile" }],
            "options": [{ "label": "A" }] }),
    )
    .await;
    let voters = users(&app, 2).await;
    let at = start_of_next_minute();
    let accepted = |outcomes: Vec<pulse::votes::service::BallotOutcome>| {
        outcomes.iter().filter(|o| o.rejection.is_none()).count()
    };
    let ballots = vec![(poll.as_str(), options[0].as_str()); 6];
    let plain = Origin::default();
    let partner = Origin {
        channel: Some("partner".into()),
        device: None,
    };
    let (alice, bob) = (voters[0].0, voters[1].0);
    assert_eq!(
        accepted(cast_at(&app, alice, &ballots[..3], &plain, at).await),
        2
    );
    // The partner's limit of 7 counts the 2 already cast: 5 more, not 7.
    assert_eq!(
        accepted(cast_at(&app, alice, &ballots, &partner, at).await),
        5
    );
    let refused = cast_at(&app, alice, &ballots[..1], &plain, at).await;
    match &refused[0].rejection {
        Some(Rejection::RateLimited { rule, retry_after }) => {
            assert_eq!((rule.limit, rule.channel.as_deref()), (2, None));
            assert!(retry_after.is_some_and(|s| (1..=60).contains(&s)));
        }
        other => panic!("expected the general minute rule: {other:?}"),
    }

    let on = |device: &str| Origin {
        channel: None,
        device: Some(device.into()),
    };
    let minute_later = at + chrono::Duration::minutes(2);
    assert_eq!(
        accepted(cast_at(&app, bob, &ballots[..2], &on("web"), at).await),
        2
    );
    assert_eq!(
        accepted(cast_at(&app, bob, &ballots[..2], &on("web"), minute_later).await),
        1
    );
    // Capped on the web for the day, Bob still votes on mobile.
    assert_eq!(
        accepted(
            cast_at(
                &app,
                bob,
                &ballots[..2],
                &on("web"),
                minute_later + chrono::Duration::minutes(2)
            )
            .await
        ),
        0
    );
    assert_eq!(
        accepted(
            cast_at(
                &app,
                bob,
                &ballots[..2],
                &on("mobile"),
                minute_later + chrono::Duration::minutes(2)
            )
            .await
        ),
        2
    );
}

#[tokio::test]
async fn a_refused_ballot_changes_no_board_counter_hll_sequence_or_log() {
    // No archive job: its reads move the stream's group state, which is not the ballot's doing.
    let app = TestApp::spawn_with(|config| config.run_jobs = false).await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Untouched", "periods": ["HOUR", "DAY", "WEEK", "MONTH", "ALL_TIME"],
            "carryOver": 0.2,
            "rules": [{ "scope": "VOTER", "window": "HOUR", "limit": 1 },
                      { "scope": "IP", "window": "DAY", "limit": 50 }],
            "options": [{ "label": "A", "bonus": 5 }, { "label": "B" }] }),
    )
    .await;
    let (user, _) = users(&app, 1).await.remove(0);
    let at = Utc::now();
    let first = cast_at(&app, user, &[(&poll, &options[0])], &Origin::default(), at).await;
    assert!(first[0].rejection.is_none());
    let before = everything_under_the_prefix(&app).await;
    let second = cast_at(&app, user, &[(&poll, &options[1])], &Origin::default(), at).await;
    assert!(matches!(
        second[0].rejection,
        Some(Rejection::RateLimited { .. })
    ));
    assert_eq!(everything_under_the_prefix(&app).await, before);
}

fn start_of_next_minute() -> chrono::DateTime<Utc> {
    let minute = chrono::TimeDelta::minutes(1);
    chrono::DurationRound::duration_trunc(Utc::now(), minute).unwrap() + minute
}

/// Every key under the app's prefix with a dump of its value.
async fn everything_under_the_prefix(app: &TestApp) -> Vec<(String, Vec<u8>)> {
    let mut conn = app.state.redis.conn.clone();
    let keys = app.keys_under_prefix().await;
    let mut dumped = Vec::new();
    for key in keys {
        let value: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        dumped.push((key, value));
    }
    dumped.sort();
    dumped
}
