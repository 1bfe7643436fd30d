//! Groups of identical live operations: websocket snapshots that read nothing of the viewer are
//! resolved and serialized once per change for every socket that runs the same request, and sent
//! as the same bytes; operations reading the viewer keep their own answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::join_all;
use pulse::graphql::ids;
use pulse::http::groups::Groups;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::helpers::{TestApp, eventually, series};
use crate::likes::users;
use crate::multipart::Parts;
use crate::sse::Events;
use crate::subscriptions::{
    Socket, connect, next_message, send, subscribed_as, wait_until_listening,
};
use crate::votes::{admin, create_poll};
use crate::votes_live::listening;

const BOARD: &str = "subscription($p: ID!, $first: Int!) {
  leaderboardChanged(pollId: $p, first: $first) { version entries { option { label } score } } }";

fn groups(app: &TestApp) -> &Groups {
    app.state
        .websocket
        .groups
        .as_deref()
        .expect("the server groups identical operations")
}

/// The next text message that is not a keep-alive, as the server wrote it.
async fn next_text(socket: &mut Socket) -> String {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a message within 10 s")
            .expect("the socket stays open")
            .expect("a clean message");
        if let Message::Text(text) = message
            && !text.contains(r#""type":"ka""#)
            && !text.contains(r#""type":"ping""#)
        {
            return text.to_string();
        }
    }
}

/// A socket on `protocol` (acknowledged) that has subscribed to the poll's board as `id`.
async fn board_socket(
    app: &TestApp,
    protocol: &str,
    token: Option<&str>,
    id: &str,
    variables: Value,
) -> Socket {
    let init = token.map_or(json!({}), |token| json!({ "token": token }));
    let mut socket = connect(app, protocol, init).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    subscribe(&mut socket, protocol, id, variables).await;
    socket
}

async fn subscribe(socket: &mut Socket, protocol: &str, id: &str, variables: Value) {
    let start = if protocol == "graphql-ws" {
        "start"
    } else {
        "subscribe"
    };
    send(
        socket,
        json!({ "id": id, "type": start, "payload": { "query": BOARD, "variables": variables } }),
    )
    .await;
}

/// A poll of five options and a way to vote for one of them as a new voter.
struct Poll {
    id: String,
    options: Vec<String>,
}

async fn poll(app: &TestApp) -> Poll {
    let token = admin(app).await;
    let labels: Vec<Value> = ["A", "B", "C", "D", "E"]
        .iter()
        .map(|label| json!({ "label": label }))
        .collect();
    let (id, options) = create_poll(
        app,
        &token,
        json!({ "title": "Grouped", "options": labels }),
    )
    .await;
    Poll { id, options }
}

impl Poll {
    async fn vote(&self, app: &TestApp, option: usize) {
        let (_, token) = users(app, 1).await.remove(0);
        let response = app
            .graphql_as(
                Some(&token),
                "mutation($p: ID!, $o: ID!) { castVotes(input: { ballots: [{ pollId: $p, optionId: $o }] }) { results { accepted } } }",
                json!({ "p": self.id, "o": self.options[option] }),
            )
            .await;
        assert_eq!(
            response["data"]["castVotes"]["results"][0]["accepted"], true,
            "{response}"
        );
    }

    fn row(&self) -> i64 {
        crate::votes::row(&self.id, pulse::votes::POLL)
    }
}

#[tokio::test]
async fn hundreds_of_identical_subscriptions_get_the_same_bytes_from_one_serialization_per_change()
{
    let app = TestApp::spawn().await;
    let poll = poll(&app).await;
    let same = json!({ "p": poll.id, "first": 10 });
    let signed_in = users(&app, 100).await;
    // 300 sockets on both protocols, anonymous and signed in, subscribing all at once.
    let sockets = join_all((0..300).map(|n| {
        let (app, same) = (&app, same.clone());
        let token = (n % 3 == 0).then(|| signed_in[n / 3].1.clone());
        let protocol = if n % 2 == 0 {
            "graphql-transport-ws"
        } else {
            "graphql-ws"
        };
        async move {
            let socket = board_socket(app, protocol, token.as_deref(), "board", same).await;
            (protocol, socket)
        }
    }))
    .await;
    let mut other = board_socket(
        &app,
        "graphql-transport-ws",
        None,
        "board",
        json!({ "p": poll.id, "first": 3 }),
    )
    .await;
    let (protocols, mut sockets): (Vec<&str>, Vec<Socket>) = sockets.into_iter().unzip();
    let first = join_all(sockets.iter_mut().map(next_text)).await;
    let other_first = next_text(&mut other).await;
    assert_eq!(
        groups(&app).running(),
        2,
        "different variables, another group"
    );
    // The gauge is the process's, which other tests' servers share.
    assert!(series(&app.metrics().await, "pulse_live_groups") >= 2.0);
    listening(&app, poll.row()).await;

    let mut seen = vec![first];
    for change in 0..3 {
        let (payloads, deliveries) = (groups(&app).payloads(), groups(&app).deliveries());
        let scrape = app.metrics().await;
        poll.vote(&app, change).await;
        let texts = join_all(sockets.iter_mut().map(next_text)).await;
        let other_text = next_text(&mut other).await;
        assert!(other_text.contains("payload") && other_text != other_first);
        eventually("both groups delivered the change", async || {
            groups(&app).deliveries() == deliveries + 301
        })
        .await;
        assert_eq!(
            groups(&app).payloads(),
            payloads + 2,
            "one serialization per group"
        );
        let after = app.metrics().await;
        for name in [
            "pulse_live_group_payloads_total",
            "pulse_live_group_deliveries_total",
        ] {
            assert!(
                series(&after, name) >= series(&scrape, name) + 2.0,
                "{name}"
            );
        }
        seen.push(texts);
    }

    for texts in &seen {
        for protocol in ["graphql-transport-ws", "graphql-ws"] {
            let of_protocol: Vec<&String> = texts
                .iter()
                .zip(&protocols)
                .filter(|(_, sent_on)| **sent_on == protocol)
                .map(|(text, _)| text)
                .collect();
            assert!(
                of_protocol.iter().all(|text| *text == of_protocol[0]),
                "the same bytes on every {protocol} socket"
            );
            let kind = if protocol == "graphql-ws" {
                "data"
            } else {
                "next"
            };
            let message: Value = serde_json::from_str(of_protocol[0]).unwrap();
            assert_eq!(
                (&message["type"], &message["id"]),
                (&json!(kind), &json!("board"))
            );
        }
    }
    let scores = |texts: &Vec<String>| {
        let message: Value = serde_json::from_str(&texts[0]).unwrap();
        message["payload"]["data"]["leaderboardChanged"]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["score"].as_f64().unwrap())
            .sum::<f64>()
    };
    let scores: Vec<f64> = seen.iter().map(scores).collect();
    assert!(
        scores.windows(2).all(|pair| pair[0] < pair[1]),
        "every change reached every socket: {scores:?}"
    );

    drop(sockets);
    drop(other);
    eventually("every group stops with its last member", async || {
        groups(&app).running() == 0
    })
    .await;
}

#[tokio::test]
async fn a_late_joiner_gets_the_last_snapshot_at_once_and_a_stopped_id_is_free_on_either_protocol()
{
    let app = TestApp::spawn().await;
    let poll = poll(&app).await;
    let ten = json!({ "p": poll.id, "first": 10 });
    let mut first = board_socket(&app, "graphql-transport-ws", None, "1", ten.clone()).await;
    next_text(&mut first).await;
    listening(&app, poll.row()).await;
    poll.vote(&app, 0).await;
    let mut latest: Value = serde_json::from_str(&next_text(&mut first).await).unwrap();

    for (protocol, stop, kind) in [
        ("graphql-transport-ws", "complete", "next"),
        ("graphql-ws", "stop", "data"),
    ] {
        let mut late = board_socket(&app, protocol, None, "1", ten.clone()).await;
        let at_once: Value = serde_json::from_str(&next_text(&mut late).await).unwrap();
        assert_eq!(at_once["type"], kind);
        assert_eq!(at_once["payload"], latest["payload"], "the last snapshot");
        assert_eq!(groups(&app).running(), 1);

        send(&mut late, json!({ "id": "1", "type": stop })).await;
        let complete: Value = serde_json::from_str(&next_text(&mut late).await).unwrap();
        assert_eq!(complete, json!({ "type": "complete", "id": "1" }));
        // The id is free again, for another board: nothing of the old one comes under it.
        subscribe(
            &mut late,
            protocol,
            "1",
            json!({ "p": poll.id, "first": 3 }),
        )
        .await;
        let three: Value = serde_json::from_str(&next_text(&mut late).await).unwrap();
        let entries = |message: &Value| {
            message["payload"]["data"]["leaderboardChanged"]["entries"]
                .as_array()
                .map(Vec::len)
        };
        assert_eq!((&three["id"], entries(&three)), (&json!("1"), Some(3)));
        assert_eq!(groups(&app).running(), 2);
        poll.vote(&app, 1).await;
        let update: Value = serde_json::from_str(&next_text(&mut late).await).unwrap();
        assert_eq!(entries(&update), Some(3), "{update}");
        latest = serde_json::from_str(&next_text(&mut first).await).unwrap();

        late.close(None).await.unwrap();
        eventually("the closed socket's group stops", async || {
            groups(&app).running() == 1
        })
        .await;
    }
    first.close(None).await.unwrap();
    eventually("the last group stops", async || groups(&app).running() == 0).await;
}

#[tokio::test]
async fn a_groups_stream_that_ends_completes_it_for_every_member() {
    let app = TestApp::spawn().await;
    let missing = ids::encode(pulse::votes::POLL, 987_654).0;
    let variables = json!({ "p": missing, "first": 10 });
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let mut sockets =
            join_all((0..3).map(|_| board_socket(&app, protocol, None, "gone", variables.clone())))
                .await;
        for socket in &mut sockets {
            let error = next_message(socket).await.unwrap();
            assert_eq!(error["id"], "gone");
            assert_eq!(
                error["payload"]["errors"][0]["extensions"]["code"], "NOT_FOUND",
                "{error}"
            );
            let complete = next_message(socket).await.unwrap();
            assert_eq!(complete, json!({ "type": "complete", "id": "gone" }));
        }
        assert_eq!(groups(&app).running(), 0);
    }
}

#[tokio::test]
async fn viewers_with_different_answers_never_see_each_others_while_a_board_is_shared() {
    let app = TestApp::spawn().await;
    let author_token = admin(&app).await;
    let author_id = app
        .graphql_as(Some(&author_token), "{ viewer { id } }", json!({}))
        .await["data"]["viewer"]["id"]
        .clone();
    let people = users(&app, 2).await;
    let (follower, stranger) = (&people[0].1, &people[1].1);
    let followed = app
        .graphql_as(
            Some(follower),
            "mutation($u: ID!) { follow(userId: $u) { following } }",
            json!({ "u": author_id }),
        )
        .await;
    assert!(followed["errors"].is_null(), "{followed}");
    let poll = poll(&app).await;

    let private = "subscription { articlePublished { title viewerHasLiked author { isAdmin viewerFollows } } }";
    let mut viewers = Vec::new();
    for token in [&author_token, follower, stranger] {
        let mut socket = subscribed_as(&app, json!({ "token": token }), private, json!({})).await;
        subscribe(
            &mut socket,
            "graphql-transport-ws",
            "board",
            json!({ "p": poll.id, "first": 10 }),
        )
        .await;
        viewers.push(socket);
    }
    wait_until_listening(&app).await;
    let mut boards = Vec::new();
    for socket in &mut viewers {
        let text = next_text(socket).await;
        assert!(text.contains(r#""id":"board""#), "{text}");
        boards.push(text);
    }
    // The board, shared by the three, is a snapshot anyone may see; the articles are not.
    assert!(boards.iter().all(|board| *board == boards[0]));
    assert_eq!(groups(&app).running(), 1);

    listening(&app, poll.row()).await;
    let expected = [
        json!({ "isAdmin": true, "viewerFollows": false }),
        json!({ "isAdmin": null, "viewerFollows": true }),
        json!({ "isAdmin": null, "viewerFollows": false }),
    ];
    for change in 0..3 {
        let title = format!("private {change}");
        app.publish(&author_token, &title).await;
        poll.vote(&app, change).await;
        for (socket, expected) in viewers.iter_mut().zip(&expected) {
            let (mut article, mut board) = (None, None);
            while article.is_none() || board.is_none() {
                let message: Value = serde_json::from_str(&next_text(socket).await).unwrap();
                match message["id"].as_str() {
                    Some("1") => article = Some(message),
                    Some("board") => board = Some(message),
                    _ => panic!("unexpected: {message}"),
                }
            }
            let article = &article.unwrap()["payload"]["data"]["articlePublished"];
            assert_eq!(article["title"], title.as_str());
            assert_eq!(&article["author"], expected, "{article}");
            assert_eq!(article["viewerHasLiked"], false);
        }
    }
    for socket in &mut viewers {
        socket.close(None).await.unwrap();
    }
    eventually("the shared board stops", async || {
        groups(&app).running() == 0
    })
    .await;
}

#[tokio::test]
async fn sse_and_multipart_streams_of_a_board_share_the_websockets_group_and_its_bytes() {
    let app = TestApp::spawn().await;
    let poll = poll(&app).await;
    let variables = json!({ "p": poll.id, "first": 10 });
    let (_, token) = users(&app, 1).await.remove(0);
    let mut socket = board_socket(
        &app,
        "graphql-transport-ws",
        Some(&token),
        "board",
        variables.clone(),
    )
    .await;
    let first: Value = serde_json::from_str(&next_text(&mut socket).await).unwrap();
    let sse = async |token: Option<&str>| {
        let mut request = app
            .http
            .post(app.url("/graphql/stream"))
            .header("accept", "text/event-stream")
            .json(&json!({ "query": BOARD, "variables": variables }));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        Events::new(request.send().await.unwrap())
    };
    let mut streams = [sse(None).await, sse(Some(&token)).await];
    let mut parts =
        Parts::new(crate::multipart::subscribe(&app, None, BOARD, variables.clone()).await);
    for events in &mut streams {
        assert_eq!(events.next_result().await, first["payload"]);
    }
    assert_eq!(parts.payload().await, first["payload"]);
    assert_eq!(groups(&app).running(), 1, "one group for every transport");
    listening(&app, poll.row()).await;

    let (payloads, deliveries) = (groups(&app).payloads(), groups(&app).deliveries());
    poll.vote(&app, 0).await;
    let update: Value = serde_json::from_str(&next_text(&mut socket).await).unwrap();
    for events in &mut streams {
        assert_eq!(events.next_result().await, update["payload"]);
    }
    assert_eq!(parts.payload().await, update["payload"]);
    eventually("the change reached the four members", async || {
        groups(&app).deliveries() == deliveries + 4
    })
    .await;
    assert_eq!(groups(&app).payloads(), payloads + 1);

    drop((streams, parts));
    socket.close(None).await.unwrap();
    eventually("the group stops with its last member", async || {
        groups(&app).running() == 0
    })
    .await;
}

/// A group writes its results into its members' sockets itself, from its own task, while each
/// connection ends and starts operations from another: no result of an ended membership may reach
/// the socket after the `complete` that ended it, even under the same id. Two workers, so that a
/// fan-out and the connections' tasks run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_operation_hears_nothing_of_its_group_after_its_complete_while_votes_stream() {
    const SOCKETS: usize = 300;
    const ROUNDS: usize = 20;
    // A short tick, so that the boards' fan-outs run all through the switches.
    let app =
        TestApp::spawn_with(|config| config.leaderboard_tick = Duration::from_millis(5)).await;
    let poll = poll(&app).await;
    let ten = json!({ "p": poll.id, "first": 10 });
    let mut sockets = join_all(
        (0..SOCKETS).map(|_| board_socket(&app, "graphql-transport-ws", None, "1", ten.clone())),
    )
    .await;
    join_all(sockets.iter_mut().map(next_text)).await;
    listening(&app, poll.row()).await;

    // Votes keep both boards changing while every socket switches between them under one id.
    let voters = users(&app, 500).await;
    let switching = AtomicBool::new(true);
    let voting = async {
        let mut cast = 0;
        for (_, token) in &voters {
            if !switching.load(Ordering::Relaxed) {
                break;
            }
            let response = app
                .graphql_as(
                    Some(token),
                    "mutation($p: ID!, $o: ID!) { castVotes(input: { ballots: [{ pollId: $p, optionId: $o }] }) { results { accepted } } }",
                    json!({ "p": poll.id, "o": poll.options[cast % poll.options.len()] }),
                )
                .await;
            assert_eq!(
                response["data"]["castVotes"]["results"][0]["accepted"],
                true
            );
            cast += 1;
        }
        cast
    };
    let entries = |text: &str| {
        let message: Value = serde_json::from_str(text).unwrap();
        message["payload"]["data"]["leaderboardChanged"]["entries"]
            .as_array()
            .map(Vec::len)
    };
    let poll_id = &poll.id;
    let switches = sockets.iter_mut().map(|socket| async move {
        for round in 0..ROUNDS {
            // The poll's five options: ten asked for, five shown.
            let ((_, from), (to, to_entries)) = if round % 2 == 0 {
                ((10, 5), (3, 3))
            } else {
                ((3, 3), (10, 5))
            };
            send(socket, json!({ "id": "1", "type": "complete" })).await;
            // What the old membership sent before the complete may still come, then the complete.
            loop {
                let text = next_text(socket).await;
                if text == r#"{"type":"complete","id":"1"}"# {
                    break;
                }
                assert_eq!(entries(&text), Some(from), "before the complete: {text}");
            }
            subscribe(
                socket,
                "graphql-transport-ws",
                "1",
                json!({ "p": poll_id, "first": to }),
            )
            .await;
            let text = next_text(socket).await;
            assert_eq!(
                entries(&text),
                Some(to_entries),
                "after the new subscribe: {text}"
            );
        }
    });
    let switched = async {
        join_all(switches).await;
        switching.store(false, Ordering::Relaxed);
    };
    let (cast, ()) = tokio::join!(voting, switched);
    assert!(cast > 10, "votes ran through the switches: {cast}");
    // Every socket now runs the board of ten again; the last vote reaches each, and nothing of
    // the board of three.
    assert_eq!(ROUNDS % 2, 0);
    poll.vote(&app, 4).await;
    for socket in &mut sockets {
        loop {
            let text = next_text(socket).await;
            assert_eq!(entries(&text), Some(5), "{text}");
            let message: Value = serde_json::from_str(&text).unwrap();
            let total: f64 = message["payload"]["data"]["leaderboardChanged"]["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|entry| entry["score"].as_f64().unwrap())
                .sum();
            if total == (cast + 1) as f64 {
                break;
            }
        }
    }
    drop(sockets);
    eventually("every group stops with its last member", async || {
        groups(&app).running() == 0
    })
    .await;
}
