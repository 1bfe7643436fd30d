//! `pulse rebuild votes`: the boards, participant counts and sequence of a poll whose Redis keys
//! were all deleted come back from the SQL vote log exactly as they were, floats included.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use pulse::keys::VoteKeys;
use pulse::votes::service::Origin;
use serde_json::json;

use crate::helpers::{TestApp, eventually, pulse_command, redis_url};
use crate::likes::users;
use crate::votes::{admin, cast_at, create_poll, row};

/// Every key of the poll (boards with exact score text, HLL counts, sequence, closed flag).
async fn poll_state(app: &TestApp, poll: i64, options: &[i64]) -> BTreeMap<String, String> {
    let keys = app.state.redis.keys.poll(poll);
    let mut conn = app.state.redis.conn.clone();
    let boards = app.keys_matching(&keys.board_pattern()).await;
    let mut state = BTreeMap::new();
    for board in boards {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&board)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .unwrap();
        state.insert(board, members.join(" "));
    }
    let mut hlls = vec![keys.participants()];
    hlls.extend(
        options
            .iter()
            .map(|option| keys.option_participants(*option)),
    );
    for hll in hlls {
        let count: i64 = redis::cmd("PFCOUNT")
            .arg(&hll)
            .query_async(&mut conn)
            .await
            .unwrap();
        state.insert(hll, count.to_string());
    }
    for key in [keys.seq(), keys.closed()] {
        let value: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        state.insert(key, value.unwrap_or_default());
    }
    state
}

#[tokio::test]
async fn rebuilding_from_the_vote_log_after_the_polls_keys_are_deleted_reproduces_the_boards() {
    let app = TestApp::spawn().await;
    let token = admin(&app).await;
    let (poll, options) = create_poll(
        &app,
        &token,
        json!({ "title": "Rebuilt", "timezone": "Europe/Paris",
            "periods": ["HOUR", "DAY", "WEEK", "MONTH", "ALL_TIME"], "carryOver": 0.1,
            "options": [{ "label": "A", "bonus": 3, "initialVotes": 40 },
                        { "label": "B", "bonus": 7 }, { "label": "C" }] }),
    )
    .await;
    let voters = users(&app, 120).await;
    let start: DateTime<Utc> = Utc::now() - chrono::Duration::days(9);
    // 360 votes spread over nine days and many hours, cast concurrently.
    let casts = voters.iter().enumerate().flat_map(|(index, (user, _))| {
        let (app, poll, options) = (&app, &poll, &options);
        (0..3).map(move |round| async move {
            let at = start
                + chrono::Duration::minutes((index * 97 + round * 1931) as i64 % (9 * 24 * 60));
            let option = &options[(index + round) % 3];
            cast_at(app, *user, &[(poll, option)], &Origin::default(), at).await
        })
    });
    let accepted = join_all(casts)
        .await
        .into_iter()
        .flatten()
        .filter(|outcome| outcome.rejection.is_none())
        .count();
    assert_eq!(accepted, 360);
    eventually("every vote is archived", async || {
        app.count("vote_log").await == 360
    })
    .await;

    let poll_row = row(&poll, pulse::votes::POLL);
    let option_rows: Vec<i64> = options
        .iter()
        .map(|option| row(option, pulse::votes::POLL_OPTION))
        .collect();
    let live = poll_state(&app, poll_row, &option_rows).await;
    let boards = live.keys().filter(|key| key.contains("vote:b:")).count();
    assert!(boards > 40, "only {boards} boards");

    let mut conn = app.state.redis.conn.clone();
    let doomed: Vec<String> = live.keys().cloned().collect();
    redis::cmd("DEL")
        .arg(&doomed)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert_ne!(poll_state(&app, poll_row, &option_rows).await, live);

    let output = pulse_command()
        .args(["rebuild", "votes"])
        .env("DATABASE_URL", app.config.database_url())
        .env("REDIS_URL", redis_url())
        .env(
            "PULSE_REDIS_PREFIX",
            app.config.redis_prefix.as_deref().unwrap(),
        )
        .env("PULSE_DATA_DIR", &app.config.data_dir)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("360 logged votes"));
    assert_eq!(poll_state(&app, poll_row, &option_rows).await, live);
}
