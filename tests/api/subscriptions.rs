use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

use crate::helpers::{TestApp, eventually, redis_subscribers};
use pulse::keys::ArticleKeys;

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A websocket upgraded with `protocol` that has sent nothing yet.
pub async fn open_socket(app: &TestApp, protocol: &str) -> Socket {
    open_socket_at(&app.addr.to_string(), protocol).await
}

/// A websocket to the server listening at `address` (host:port).
pub async fn open_socket_at(address: &str, protocol: &str) -> Socket {
    let mut request = format!("ws://{address}/graphql/ws")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol.parse().unwrap());
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("websocket upgrade");
    socket
}

/// A graphql-transport-ws socket, acknowledged after `init_payload`, that has sent `query` with
/// `variables` as subscription "1".
pub async fn subscribed_as(
    app: &TestApp,
    init_payload: Value,
    query: &str,
    variables: Value,
) -> Socket {
    let mut socket = connect(app, "graphql-transport-ws", init_payload).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    send(
        &mut socket,
        json!({ "id": "1", "type": "subscribe",
                "payload": { "query": query, "variables": variables } }),
    )
    .await;
    socket
}

pub async fn connect(app: &TestApp, protocol: &str, init_payload: Value) -> Socket {
    let mut socket = open_socket(app, protocol).await;
    send(
        &mut socket,
        json!({ "type": "connection_init", "payload": init_payload }),
    )
    .await;
    socket
}

pub async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::Text(message.to_string().into()))
        .await
        .unwrap();
}

/// The next JSON message that is not a keep-alive, or None when the server closes the socket.
pub async fn next_message(socket: &mut Socket) -> Option<Value> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a message within 10 s")?;
        match message.ok()? {
            Message::Text(text) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if value["type"] != "ka" && value["type"] != "ping" {
                    return Some(value);
                }
            }
            Message::Close(_) => return None,
            _ => {}
        }
    }
}

/// The close frame the server ends the socket with; no message before it may be a
/// `connection_ack`.
pub async fn close_frame(socket: &mut Socket) -> CloseFrame {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("the server closes the socket within 10 s")
            .expect("a close frame before the end of the stream")
            .expect("a clean close, not a cut connection");
        match message {
            Message::Close(frame) => return frame.expect("the close frame has a code"),
            Message::Text(text) => {
                assert!(!text.contains("connection_ack"), "acknowledged: {text}")
            }
            _ => {}
        }
    }
}

/// Waits until this app's Redis subscription for new articles is in place, so a publish is seen.
pub async fn wait_until_listening(app: &TestApp) {
    let channel = app.state.redis.keys.articles_published_channel();
    eventually("the subscription reaches Redis", async || {
        redis_subscribers(app, &channel).await > 0
    })
    .await;
}

pub const SUBSCRIPTION: &str = "subscription { articlePublished { title author { handle } } }";

/// Connects with `protocol`, expects the ack, sends `start` (the protocol's subscribe message, id
/// `id`) and waits until the subscription reached Redis.
pub async fn subscribed(
    app: &TestApp,
    protocol: &str,
    init_payload: Value,
    start: &str,
    id: &str,
) -> Socket {
    let mut socket = connect(app, protocol, init_payload).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    send(
        &mut socket,
        json!({ "id": id, "type": start, "payload": { "query": SUBSCRIPTION } }),
    )
    .await;
    wait_until_listening(app).await;
    socket
}

#[tokio::test]
async fn new_articles_arrive_over_graphql_transport_ws() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("uma").await;
    let init = json!({ "token": token });
    let mut socket = subscribed(&app, "graphql-transport-ws", init, "subscribe", "1").await;

    app.publish(&token, "live one").await;
    let message = next_message(&mut socket).await.unwrap();
    assert_eq!(message["type"], "next", "{message}");
    assert_eq!(message["id"], "1");
    assert_eq!(
        message["payload"]["data"]["articlePublished"]["title"],
        "live one"
    );
    assert_eq!(
        message["payload"]["data"]["articlePublished"]["author"]["handle"],
        "uma"
    );
}

/// A subscription that reads the viewer is resolved for its connection alone, event after event:
/// each article still shows its author as they are when it arrives, not as the first one found
/// them (its loads go through the process's shared loaders, never older than
/// `SHARED_LOADERS_FOR`).
#[tokio::test]
async fn a_viewers_new_articles_show_their_authors_as_they_are_when_each_arrives() {
    const WITH_AUTHOR: &str =
        "subscription { articlePublished { title viewerHasLiked author { followerCount } } }";
    let app = TestApp::spawn().await;
    let (author, author_id) = app.sign_up("ines").await;
    let (viewer, _) = app.sign_up("olga").await;
    let (fan, _) = app.sign_up("pia").await;
    let follow = async |token: &str| {
        let followed = app
            .graphql_as(
                Some(token),
                "mutation($u: ID!) { follow(userId: $u) { following } }",
                json!({ "u": author_id }),
            )
            .await;
        assert_eq!(followed["data"]["follow"]["following"], true, "{followed}");
    };
    follow(&viewer).await;
    let mut socket = subscribed_as(&app, json!({ "token": viewer }), WITH_AUTHOR, json!({})).await;
    wait_until_listening(&app).await;
    let mut followers_shown = async |title: &str| {
        app.publish(&author, title).await;
        let message = next_message(&mut socket).await.unwrap();
        let article = &message["payload"]["data"]["articlePublished"];
        assert_eq!(article["title"], title, "{message}");
        assert_eq!(article["viewerHasLiked"], false, "{message}");
        article["author"]["followerCount"]
            .as_i64()
            .unwrap_or_else(|| panic!("no follower count: {message}"))
    };

    assert_eq!(followers_shown("before the fan").await, 1);
    follow(&fan).await;
    tokio::time::sleep(pulse_kit::context::SHARED_LOADERS_FOR * 2).await;
    assert_eq!(followers_shown("after the fan").await, 2);
}

/// Many viewers' `articlePublished` resolve the same article at once through the process's shared
/// loaders, where one batch holds all their `viewerFollows` questions: each viewer gets its own
/// answer, never another's.
#[tokio::test]
async fn viewers_resolving_one_article_at_once_each_get_their_own_answer() {
    const VIEWERS: usize = 120;
    const QUERY: &str = "subscription { articlePublished { title author { viewerFollows } } }";
    let app = TestApp::spawn().await;
    let people = crate::feed::users(&app, "mixed", VIEWERS + 1).await;
    let (author, viewers) = (people[0], &people[1..]);
    let following: Vec<i64> = viewers.iter().copied().step_by(2).collect();
    crate::feed::bulk_follow(&app, &following, author).await;
    let mut sockets = Vec::new();
    for &viewer in viewers {
        let token = crate::feed::token(&app, viewer);
        let socket = subscribed_as(&app, json!({ "token": token }), QUERY, json!({})).await;
        sockets.push((viewer, socket));
    }
    let channel = app.state.redis.keys.articles_published_channel();
    eventually("every viewer is subscribed", async || {
        app.state.hub.local_subscribers(&channel) == VIEWERS
    })
    .await;
    wait_until_listening(&app).await;

    app.publish(&crate::feed::token(&app, author), "for some")
        .await;
    let answers =
        futures_util::future::join_all(sockets.iter_mut().map(async |(viewer, socket)| {
            let message = next_message(socket).await.unwrap();
            let article = &message["payload"]["data"]["articlePublished"];
            assert_eq!(article["title"], "for some", "{message}");
            (*viewer, article["author"]["viewerFollows"].clone())
        }))
        .await;
    for (viewer, follows) in answers {
        assert_eq!(
            follows,
            following.contains(&viewer),
            "viewer {viewer} was answered for another"
        );
    }
}

#[tokio::test]
async fn new_articles_arrive_over_the_legacy_graphql_ws_protocol() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("vic").await;
    let init = json!({ "Authorization": format!("Bearer {token}") });
    let mut socket = subscribed(&app, "graphql-ws", init, "start", "7").await;

    app.publish(&token, "legacy").await;
    let message = next_message(&mut socket).await.unwrap();
    assert_eq!(message["type"], "data", "{message}");
    assert_eq!(
        message["payload"]["data"]["articlePublished"]["title"],
        "legacy"
    );
}

#[tokio::test]
async fn a_bad_token_in_connection_init_is_refused() {
    let app = TestApp::spawn().await;
    let mut socket = connect(&app, "graphql-transport-ws", json!({ "token": "forged" })).await;
    // 4403 Forbidden is graphql-transport-ws's close for a refused `connection_init`.
    assert_eq!(u16::from(close_frame(&mut socket).await.code), 4403);
}

#[tokio::test]
async fn subscribers_of_one_process_share_one_redis_subscription() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("wes").await;
    let mut sockets = Vec::new();
    for _ in 0..5 {
        sockets.push(subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await);
    }
    let channel = app.state.redis.keys.articles_published_channel();
    eventually("the five subscribers are counted", async || {
        app.state.hub.local_subscribers(&channel) == 5
    })
    .await;

    app.publish(&token, "to everyone").await;
    for socket in &mut sockets {
        let message = next_message(socket).await.unwrap();
        assert_eq!(
            message["payload"]["data"]["articlePublished"]["title"],
            "to everyone"
        );
    }
    assert_eq!(
        redis_subscribers(&app, &channel).await,
        1,
        "one Redis subscription per process"
    );

    drop(sockets);
    eventually("closed subscriptions are released", async || {
        app.state.hub.local_subscribers(&channel) == 0
    })
    .await;
}

#[tokio::test]
async fn subscriptions_survive_a_lost_pubsub_connection() {
    // A Redis of its own, so that killing every pub/sub client there touches no other test.
    let private = crate::helpers::private_redis().await;
    let url = private.url().to_owned();
    let app = TestApp::spawn_with(|config| config.redis_url = Some(url)).await;
    let (token, _) = app.sign_up("xena").await;
    let mut socket = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;

    let mut conn = app.state.redis.conn.clone();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the hub's one pub/sub connection");
    wait_until_listening(&app).await;

    app.publish(&token, "after the reconnect").await;
    let message = next_message(&mut socket).await.unwrap();
    assert_eq!(
        message["payload"]["data"]["articlePublished"]["title"],
        "after the reconnect"
    );
    private.stop().await;
}

#[tokio::test]
async fn a_message_longer_than_a_request_body_closes_the_socket_as_too_big() {
    let app = TestApp::spawn().await;
    let mut socket = connect(&app, "graphql-transport-ws", json!({})).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    let limit = app.config.max_body_bytes;
    // A message of `length` bytes: a query padded in its extensions.
    let padded = |id: &str, length: usize| {
        let bare = json!({ "id": id, "type": "subscribe",
                           "payload": { "query": "{ __typename }", "extensions": { "pad": "" } } })
        .to_string();
        let pad = "p".repeat(length - bare.len());
        json!({ "id": id, "type": "subscribe",
                "payload": { "query": "{ __typename }", "extensions": { "pad": pad } } })
    };
    let within = padded("1", limit);
    assert_eq!(within.to_string().len(), limit);
    send(&mut socket, within).await;
    let answer = next_message(&mut socket).await.unwrap();
    assert_eq!(answer["payload"]["data"]["__typename"], "Query", "{answer}");

    let _ = socket
        .send(Message::Text(padded("2", limit + 1).to_string().into()))
        .await;
    let frame = close_frame(&mut socket).await;
    assert_eq!(u16::from(frame.code), 1009, "{frame:?}");
}

#[tokio::test]
async fn a_socket_running_too_many_subscriptions_is_closed_with_policy_violation() {
    let app = TestApp::spawn().await;
    let mut socket = connect(&app, "graphql-transport-ws", json!({})).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    let limit = app.config.ws_max_subscriptions as usize;
    for id in 0..=limit {
        send(
            &mut socket,
            json!({ "id": id.to_string(), "type": "subscribe",
                    "payload": { "query": "subscription { articlePublished { id } }" } }),
        )
        .await;
    }
    let frame = close_frame(&mut socket).await;
    assert_eq!(u16::from(frame.code), 1008, "{frame:?}");
    assert!(frame.reason.contains("more than"), "{frame:?}");
}
