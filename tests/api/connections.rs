//! Clients that hold connections without finishing anything: each case as the abuse test found it,
//! over real sockets.

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use pulse::keys::ArticleKeys;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest as _};

use crate::helpers::{TestApp, eventually, series};
use crate::subscriptions::{
    SUBSCRIPTION, Socket, close_frame, connect, next_message, open_socket, send, subscribed,
    wait_until_listening,
};

const SHORT: Duration = Duration::from_millis(300);

/// Reads until the server closes the connection; returns what it sent and when it closed.
async fn read_until_closed(stream: &mut TcpStream) -> (Vec<u8>, Instant) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("the server closes the connection within 10 s");
        match read {
            Ok(0) | Err(_) => return (received, Instant::now()),
            Ok(n) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

#[tokio::test]
async fn a_websocket_without_connection_init_is_closed_with_4408_in_both_protocols() {
    let app = TestApp::spawn_with(|config| config.ws_init_timeout = SHORT).await;
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let opened = Instant::now();
        let mut socket = open_socket(&app, protocol).await;
        let frame = close_frame(&mut socket).await;
        assert_eq!(u16::from(frame.code), 4408, "{protocol}");
        assert_eq!(frame.reason.as_str(), "Connection initialisation timeout");
        assert!(
            opened.elapsed() >= SHORT,
            "{protocol}: closed before the timeout"
        );
    }
}

#[tokio::test]
async fn an_initialised_websocket_outlives_the_init_timeout() {
    let app = TestApp::spawn_with(|config| config.ws_init_timeout = SHORT).await;
    let mut socket = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;
    tokio::time::sleep(SHORT * 2).await;
    let (token, _) = app.sign_up("ines").await;
    app.publish(&token, "still here").await;
    let message = next_message(&mut socket).await.expect("the socket is open");
    assert_eq!(message["type"], "next", "{message}");
}

#[tokio::test]
async fn hundreds_of_silent_websockets_are_all_closed_and_their_connections_released() {
    let init_timeout = Duration::from_secs(5);
    let app = TestApp::spawn_with(|config| config.ws_init_timeout = init_timeout).await;
    let sockets =
        futures_util::future::join_all((0..300).map(|_| open_socket(&app, "graphql-transport-ws")))
            .await;
    let connections = app.state.connections.clone();
    eventually("all 300 websockets are counted", async || {
        connections.open_websockets() == 300
    })
    .await;
    assert_eq!(connections.open(), 300);
    // The edge's gauge counts every socket it serves, initialised or not (other tests' sockets
    // count too: the recorder is the process's).
    eventually("the edge's gauge counts the 300 sockets", async || {
        series(&app.metrics().await, "pulse_live_sockets_open") >= 300.0
    })
    .await;

    let codes = futures_util::future::join_all(
        sockets
            .into_iter()
            .map(|mut socket| async move { u16::from(close_frame(&mut socket).await.code) }),
    )
    .await;
    assert!(codes.iter().all(|&code| code == 4408), "{codes:?}");
    eventually("every websocket connection is released", async || {
        connections.open() == 0 && connections.open_websockets() == 0
    })
    .await;
    let metrics = app.metrics().await;
    assert!(metrics.contains("pulse_http_connections_open"), "{metrics}");
}

#[tokio::test]
async fn a_client_stalling_in_its_headers_is_cut_off_after_the_header_timeout() {
    let app = TestApp::spawn_with(|config| config.http_header_timeout = SHORT).await;
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    let sent = Instant::now();
    stream
        .write_all(b"POST /graphql HTTP/1.1\r\nHost: pulse\r\nContent-Type: appl")
        .await
        .unwrap();
    let (answer, closed) = read_until_closed(&mut stream).await;
    assert!(closed - sent >= SHORT, "closed after {:?}", closed - sent);
    assert!(
        !String::from_utf8_lossy(&answer).contains(" 200 "),
        "half a request was served"
    );
    eventually("the connection is released", async || {
        app.state.connections.open() == 0
    })
    .await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let app = TestApp::spawn_with(|config| config.http_header_timeout = SHORT).await;
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    // The server's idle clock starts once it has answered, which is after the request went out
    // and may be well before this test gets to read the answer on a busy machine: the request's
    // send time is the bound that holds however late the test is scheduled.
    let sent = Instant::now();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: pulse\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = [0u8; 1024];
    let mut answer = Vec::new();
    while !answer.ends_with(b"ok") {
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&buffer[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200"));

    let (more, closed) = read_until_closed(&mut stream).await;
    assert!(more.is_empty(), "{}", String::from_utf8_lossy(&more));
    assert!(
        closed - sent >= SHORT,
        "closed {:?} after the request",
        closed - sent
    );
}

#[tokio::test]
async fn a_client_stalling_in_its_body_gets_a_408_and_the_connection_closed() {
    let app = TestApp::spawn_with(|config| config.http_body_timeout = SHORT).await;
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    let sent = Instant::now();
    stream
        .write_all(
            b"POST /graphql HTTP/1.1\r\nHost: pulse\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"query\":",
        )
        .await
        .unwrap();
    let (answer, closed) = read_until_closed(&mut stream).await;
    assert!(closed - sent >= SHORT, "answered after {:?}", closed - sent);
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let (_, body) = answer.split_once("\r\n\r\n").expect("a body");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        crate::helpers::error_code(&body),
        "BAD_USER_INPUT",
        "{body}"
    );
}

/// Sends a POST to /graphql on `stream` (its body from a task of its own, since the server may
/// answer and close before all of it is sent) and reads the answer's head.
async fn post_head(stream: TcpStream, content_type: &str, body: Vec<u8>) -> (String, TcpStream) {
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST /graphql HTTP/1.1\r\nHost: pulse\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let sending = tokio::spawn(async move {
        let sent = async {
            writer.write_all(head.as_bytes()).await?;
            writer.write_all(&body).await
        };
        // A refused body is cut off by the server's close: that is the case under test.
        let _ = sent.await;
        writer
    });
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), reader.read(&mut byte))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed before answering: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.push(byte[0]);
    }
    let writer = sending.await.unwrap();
    let stream = reader.reunite(writer).unwrap();
    (
        String::from_utf8(answer).unwrap().to_ascii_lowercase(),
        stream,
    )
}

#[tokio::test]
async fn a_request_answered_before_its_body_was_read_says_the_connection_closes() {
    let app = TestApp::spawn().await;
    let large = vec![b'x'; 4 << 20];
    // Refused for its type (nothing of the body read), then for its size (part of it read).
    for (content_type, status) in [("text/plain", "415"), ("application/json", "413")] {
        let stream = TcpStream::connect(app.addr).await.unwrap();
        let (head, _) = post_head(stream, content_type, large.clone()).await;
        assert!(head.starts_with(&format!("http/1.1 {status}")), "{head}");
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    }

    // A request whose body was read keeps its connection for the next one.
    let query = br#"{"query":"{ __typename }"}"#.to_vec();
    let stream = TcpStream::connect(app.addr).await.unwrap();
    let (first, mut stream) = post_head(stream, "application/json", query.clone()).await;
    assert!(first.starts_with("http/1.1 200"), "{first}");
    assert!(!first.contains("connection: close"), "{first}");
    let length: usize = first
        .split("\r\n")
        .find_map(|line| line.strip_prefix("content-length: "))
        .expect("a content length")
        .parse()
        .unwrap();
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    let (second, _) = post_head(stream, "application/json", query).await;
    assert!(second.starts_with("http/1.1 200"), "{second}");
}

#[tokio::test]
async fn the_connection_cap_holds_a_flood_back_and_the_server_still_answers() {
    let cap = 20;
    let app = TestApp::spawn_with(|config| {
        config.max_connections = cap;
        config.http_header_timeout = SHORT;
    })
    .await;
    let mut flood = Vec::new();
    for _ in 0..100 {
        flood.push(TcpStream::connect(app.addr).await.unwrap());
    }
    let connections = app.state.connections.clone();
    eventually("the cap is reached", async || {
        connections.open() == cap as usize
    })
    .await;

    let http = app.http.clone();
    let url = app.url("/healthz");
    let answer = tokio::spawn(async move { http.get(url).send().await });
    let mut peak = 0;
    while !answer.is_finished() {
        peak = peak.max(connections.open());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(peak <= cap as usize, "{peak} connections open at once");
    let response = answer
        .await
        .unwrap()
        .expect("an answer once the flood times out");
    assert_eq!(response.status(), 200);
    drop(flood);
}

#[tokio::test]
async fn a_duplicate_subscription_id_closes_the_socket_with_4409() {
    let app = TestApp::spawn().await;
    let mut socket = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;
    send(
        &mut socket,
        json!({ "id": "1", "type": "subscribe", "payload": { "query": SUBSCRIPTION } }),
    )
    .await;
    let frame = close_frame(&mut socket).await;
    assert_eq!(u16::from(frame.code), 4409);
    assert_eq!(frame.reason.as_str(), "Subscriber for 1 already exists");

    let long_id = "x".repeat(10_000);
    let subscribe =
        json!({ "id": long_id, "type": "subscribe", "payload": { "query": SUBSCRIPTION } });
    let mut socket = subscribed(
        &app,
        "graphql-transport-ws",
        json!({}),
        "subscribe",
        &long_id,
    )
    .await;
    send(&mut socket, subscribe).await;
    assert_eq!(u16::from(close_frame(&mut socket).await.code), 4409);
}

#[tokio::test]
async fn a_subscription_id_may_be_reused_once_it_completed() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("reuse").await;
    // Subscription 2 keeps the process's Redis subscription in place while 1 comes and goes.
    let mut socket = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "2").await;
    let channel = app.state.redis.keys.articles_published_channel();
    // Id 1 is subscribed three times, and completed after the first two.
    for round in 1..=3 {
        send(
            &mut socket,
            json!({ "id": "1", "type": "subscribe", "payload": { "query": SUBSCRIPTION } }),
        )
        .await;
        eventually("both subscriptions run", async || {
            app.state.hub.local_subscribers(&channel) == 2
        })
        .await;
        if round == 3 {
            break;
        }
        send(&mut socket, json!({ "id": "1", "type": "complete" })).await;
        let completed = next_message(&mut socket).await.expect("the socket is open");
        assert_eq!(completed, json!({ "type": "complete", "id": "1" }));
    }
    wait_until_listening(&app).await;
    app.publish(&token, "to both").await;
    let mut ids = vec![
        next_message(&mut socket).await.expect("a message")["id"].clone(),
        next_message(&mut socket).await.expect("a message")["id"].clone(),
    ];
    ids.sort_by_key(|id| id.to_string());
    assert_eq!(ids, [json!("1"), json!("2")]);
}

#[tokio::test]
async fn stopping_the_server_closes_open_websockets_with_going_away() {
    let app = TestApp::spawn().await;
    let mut socket = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;
    let connections = app.state.connections.clone();
    let stopping = tokio::spawn(app.stop());
    let frame = close_frame(&mut socket).await;
    assert_eq!(u16::from(frame.code), 1001);
    stopping
        .await
        .unwrap()
        .expect("a clean shutdown after the close");
    assert_eq!(connections.open(), 0);
}

#[tokio::test]
async fn graphql_transport_ws_closes_with_the_codes_the_protocol_names() {
    let app = TestApp::spawn().await;

    let mut forged = open_socket(&app, "graphql-transport-ws").await;
    let init = json!({ "type": "connection_init", "payload": { "token": "forged" } });
    send(&mut forged, init).await;
    assert_eq!(u16::from(close_frame(&mut forged).await.code), 4403);

    let mut early = open_socket(&app, "graphql-transport-ws").await;
    let subscribe = json!({ "id": "1", "type": "subscribe", "payload": { "query": SUBSCRIPTION } });
    send(&mut early, subscribe).await;
    let frame = close_frame(&mut early).await;
    assert_eq!(
        (u16::from(frame.code), frame.reason.as_str()),
        (4401, "Unauthorized")
    );

    let mut garbled = open_socket(&app, "graphql-transport-ws").await;
    send(&mut garbled, json!({ "type": "connection_init" })).await;
    assert_eq!(
        next_message(&mut garbled).await.unwrap()["type"],
        "connection_ack"
    );
    send(&mut garbled, json!({ "type": "no-such-message" })).await;
    assert_eq!(u16::from(close_frame(&mut garbled).await.code), 4400);
}

#[tokio::test]
async fn the_legacy_protocol_refuses_a_bad_token_with_a_coded_error_and_a_close_frame() {
    let app = TestApp::spawn().await;
    let mut socket = open_socket(&app, "graphql-ws").await;
    let init = json!({ "type": "connection_init", "payload": { "token": "forged" } });
    send(&mut socket, init).await;
    let refusal = next_message(&mut socket).await.expect("a connection_error");
    assert_eq!(refusal["type"], "connection_error", "{refusal}");
    assert_eq!(
        refusal["payload"]["extensions"]["code"], "UNAUTHENTICATED",
        "{refusal}"
    );
    assert_eq!(u16::from(close_frame(&mut socket).await.code), 1000);
}

#[tokio::test]
async fn the_legacy_protocol_closes_an_operation_started_before_init_as_unauthorized() {
    let app = TestApp::spawn().await;
    let mut socket = open_socket(&app, "graphql-ws").await;
    let start = json!({ "id": "1", "type": "start", "payload": { "query": SUBSCRIPTION } });
    send(&mut socket, start).await;
    assert_eq!(u16::from(close_frame(&mut socket).await.code), 4401);
}

/// Reads `socket` as a live client does until a message of type `until` arrives: answers
/// graphql-transport-ws pings (its websocket answers Ping frames by itself while it reads).
/// Returns the types of what came before, Ping frames included, and that message.
async fn answer_pings(socket: &mut Socket, until: &str) -> (Vec<String>, Value) {
    let mut seen = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), socket.next())
            .await
            .expect("a message within 20 s")
            .expect("the socket stays open")
            .expect("a frame");
        match message {
            Message::Text(text) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                let kind = value["type"].as_str().unwrap_or_default().to_owned();
                if kind == until {
                    return (seen, value);
                }
                if kind == "ping" {
                    send(socket, json!({ "type": "pong" })).await;
                }
                seen.push(kind);
            }
            Message::Ping(_) => seen.push("Ping frame".to_owned()),
            Message::Close(frame) => panic!("closed: {frame:?}"),
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_client_that_stops_answering_pings_is_closed_with_3008_and_one_that_answers_stays() {
    let pong_timeout = Duration::from_secs(2);
    let app = TestApp::spawn_with(|config| {
        config.ws_ping_interval = Duration::from_millis(200);
        config.ws_pong_timeout = pong_timeout;
    })
    .await;
    let mut answering = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;
    let mut legacy = subscribed(&app, "graphql-ws", json!({}), "start", "1").await;
    // What the silent client last sent, its subscribe, reaches the server after this.
    let silent_since = Instant::now();
    let mut silent = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;
    let ((seen, next), (legacy_seen, data), frame) = tokio::join!(
        answer_pings(&mut answering, "next"),
        answer_pings(&mut legacy, "data"),
        async {
            let frame = close_frame(&mut silent).await;
            let closed_after = silent_since.elapsed();
            // Published once the silent one is gone, while the others go on answering.
            let (token, _) = app.sign_up("awake").await;
            app.publish(&token, "still answering").await;
            (frame, closed_after)
        },
    );
    let (frame, closed_after) = frame;
    assert_eq!(u16::from(frame.code), 3008, "{frame:?}");
    assert!(
        closed_after >= pong_timeout,
        "closed after {closed_after:?}"
    );
    assert!(seen.iter().any(|kind| kind == "ping"), "{seen:?}");
    assert!(
        legacy_seen.iter().any(|kind| kind == "ka"),
        "{legacy_seen:?}"
    );
    assert!(
        legacy_seen.iter().any(|kind| kind == "Ping frame"),
        "{legacy_seen:?}"
    );
    for message in [next, data] {
        assert_eq!(
            message["payload"]["data"]["articlePublished"]["title"], "still answering",
            "{message}"
        );
    }
}

/// Upgrades to a websocket as a client behind `forwarded_for`, if any.
async fn upgrade(app: &TestApp, forwarded_for: Option<&str>) -> Result<Socket, tungstenite::Error> {
    let mut request = format!("ws://{}/graphql/ws", app.addr)
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    if let Some(forwarded_for) = forwarded_for {
        headers.insert("x-forwarded-for", forwarded_for.parse().unwrap());
    }
    tokio_tungstenite::connect_async(request)
        .await
        .map(|(socket, _)| socket)
}

/// The status and body of a refused upgrade.
fn refusal(refused: Result<Socket, tungstenite::Error>) -> (u16, Value) {
    match refused {
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().expect("a body");
            (
                response.status().as_u16(),
                serde_json::from_slice(body).unwrap(),
            )
        }
        Err(other) => panic!("not an HTTP refusal: {other}"),
        Ok(_) => panic!("upgraded past the cap"),
    }
}

#[tokio::test]
async fn an_address_past_its_socket_cap_gets_429_rate_limited_until_one_of_its_sockets_closes() {
    let app = TestApp::spawn_with(|config| config.max_sockets_per_ip = 2).await;
    let first = upgrade(&app, None).await.expect("a first socket");
    let _second = upgrade(&app, None).await.expect("a second socket");

    let (status, body) = refusal(upgrade(&app, None).await);
    assert_eq!(status, 429);
    assert_eq!(crate::helpers::error_code(&body), "RATE_LIMITED", "{body}");
    assert_eq!(app.state.connections.open_websockets(), 2);

    drop(first);
    let mut third = eventually_upgraded(&app).await;
    send(&mut third, json!({ "type": "connection_init" })).await;
    let ack = next_message(&mut third).await.expect("the socket is open");
    assert_eq!(ack["type"], "connection_ack");
}

/// A socket, once the server has seen an earlier one of this address close.
async fn eventually_upgraded(app: &TestApp) -> Socket {
    let mut upgraded = None;
    eventually("a closed socket frees its place", async || {
        upgraded = upgrade(app, None).await.ok();
        upgraded.is_some()
    })
    .await;
    upgraded.unwrap()
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_socket_cap_counts_the_forwarded_address() {
    let app = TestApp::spawn_with(|config| {
        config.max_sockets_per_ip = 1;
        config.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let _first = upgrade(&app, Some("192.0.2.1"))
        .await
        .expect("one for 192.0.2.1");
    let _second = upgrade(&app, Some("192.0.2.2"))
        .await
        .expect("one for 192.0.2.2");
    let (status, _) = refusal(upgrade(&app, Some("192.0.2.1")).await);
    assert_eq!(status, 429);
}

#[tokio::test]
async fn an_expiring_token_ends_the_operations_reading_the_viewer_and_no_other() {
    let app = TestApp::spawn_with(|config| config.token_ttl = Duration::from_secs(2)).await;
    let (token, _) = app.sign_up("fleeting").await;
    let mut socket = connect(&app, "graphql-transport-ws", json!({ "token": token })).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    let operations = [
        ("feed", "subscription { feedItemAdded { node { title } } }"),
        (
            "liked",
            "subscription { articlePublished { title viewerHasLiked } }",
        ),
        ("public", SUBSCRIPTION),
    ];
    for (id, query) in operations {
        send(
            &mut socket,
            json!({ "id": id, "type": "subscribe", "payload": { "query": query } }),
        )
        .await;
    }
    wait_until_listening(&app).await;

    // Each private operation gets an `error` coded UNAUTHENTICATED, then `complete`.
    let mut ended = Vec::new();
    while ended.len() < 4 {
        let message = next_message(&mut socket)
            .await
            .expect("the socket stays open");
        assert_ne!(message["id"], "public", "{message}");
        ended.push(message);
    }
    for id in ["feed", "liked"] {
        let of_id: Vec<&Value> = ended.iter().filter(|m| m["id"] == id).collect();
        assert_eq!(of_id.len(), 2, "{ended:?}");
        assert_eq!(of_id[0]["type"], "error", "{ended:?}");
        assert_eq!(
            of_id[0]["payload"][0]["extensions"]["code"], "UNAUTHENTICATED",
            "{ended:?}"
        );
        assert_eq!(*of_id[1], json!({ "type": "complete", "id": id }));
    }

    // The public one goes on, and a new private one ends at once.
    let (author, _) = app.sign_up("steady").await;
    app.publish(&author, "after the expiry").await;
    let message = next_message(&mut socket)
        .await
        .expect("the socket stays open");
    assert_eq!(message["id"], "public", "{message}");
    assert_eq!(
        message["payload"]["data"]["articlePublished"]["title"],
        "after the expiry"
    );
    send(
        &mut socket,
        json!({ "id": "again", "type": "subscribe",
                "payload": { "query": "subscription { feedItemAdded { cursor } }" } }),
    )
    .await;
    let refused = next_message(&mut socket).await.unwrap();
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["id"], "again");
    assert_eq!(
        next_message(&mut socket).await.unwrap(),
        json!({ "type": "complete", "id": "again" })
    );
}

/// A websocket whose client takes at most 4 KiB into its receive buffer, so that a client that
/// stops reading backs the server up after little data.
async fn socket_with_small_receive_buffer(app: &TestApp) -> Socket {
    let tcp = tokio::net::TcpSocket::new_v4().unwrap();
    tcp.set_recv_buffer_size(4096).unwrap();
    let stream = tcp.connect(app.addr).await.unwrap();
    let mut request = format!("ws://{}/graphql/ws", app.addr)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut socket, _) =
        tokio_tungstenite::client_async(request, tokio_tungstenite::MaybeTlsStream::Plain(stream))
            .await
            .expect("websocket upgrade");
    send(&mut socket, json!({ "type": "connection_init" })).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    socket
}

const SEND_BUDGET: usize = 32 * 1024;

#[tokio::test]
async fn a_subscriber_that_stops_reading_holds_one_snapshot_within_its_budget_and_then_gets_the_latest()
 {
    use crate::votes::{admin, create_poll, row, voter};
    use pulse::votes::service::{Ballot, Origin};

    let app = TestApp::spawn_with(|config| {
        config.ws_send_budget = SEND_BUDGET;
        config.leaderboard_tick = Duration::from_millis(5);
    })
    .await;
    let token = admin(&app).await;
    // A hundred long labels: each snapshot of the top 100 is some 25 KB.
    let labels: Vec<Value> = (0..100)
        .map(|n| json!({ "label": format!("{n:03} {}", "x".repeat(190)) }))
        .collect();
    let (poll, options) =
        create_poll(&app, &token, json!({ "title": "Wide", "options": labels })).await;
    let mut socket = socket_with_small_receive_buffer(&app).await;
    let board = "subscription($p: ID!) { leaderboardChanged(pollId: $p, first: 100) {
        version entries { option { label } score } } }";
    send(
        &mut socket,
        json!({ "id": "board", "type": "subscribe",
                "payload": { "query": board, "variables": { "p": poll } } }),
    )
    .await;
    let first = next_message(&mut socket).await.expect("the first snapshot");
    assert_eq!(first["type"], "next", "{first}");
    crate::votes_live::listening(&app, row(&poll, pulse::votes::POLL)).await;

    // The client reads nothing more while votes move the board, each tick a new snapshot, until
    // the server's queue has had to replace one.
    let (user, _) = crate::likes::users(&app, 1).await.remove(0);
    let replaced_before = series(&app.metrics().await, "pulse_live_snapshots_replaced_total");
    let mut votes = 0usize;
    let mut peak_queued: f64 = 0.0;
    loop {
        let ballot = Ballot {
            poll: row(&poll, pulse::votes::POLL),
            option: row(&options[votes % options.len()], pulse::votes::POLL_OPTION),
        };
        app.state
            .services
            .votes
            .cast(
                &voter(user),
                &[ballot],
                &Origin::default(),
                chrono::Utc::now(),
            )
            .await
            .unwrap();
        votes += 1;
        tokio::time::sleep(Duration::from_millis(6)).await;
        if votes.is_multiple_of(20) {
            let scrape = app.metrics().await;
            peak_queued = peak_queued.max(series(&scrape, "pulse_live_queued_bytes"));
            let replaced = series(&scrape, "pulse_live_snapshots_replaced_total");
            if replaced > replaced_before + 20.0 {
                break;
            }
            assert!(
                votes < 5_000,
                "no snapshot was replaced after {votes} votes"
            );
        }
    }
    // One waiting snapshot and its replacement's growth, with room for other tests' sockets that
    // share the process's gauge for an instant.
    assert!(
        peak_queued <= (SEND_BUDGET + 64 * 1024) as f64,
        "{peak_queued} bytes queued for a budget of {SEND_BUDGET}"
    );

    // Reading again, the client ends on the board with every vote, its versions only growing.
    let mut last_version: i64 = first["payload"]["data"]["leaderboardChanged"]["version"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut received = 0;
    loop {
        let message = next_message(&mut socket)
            .await
            .expect("the socket stays open");
        assert_eq!(message["type"], "next", "{message}");
        received += 1;
        let snapshot = &message["payload"]["data"]["leaderboardChanged"];
        let version: i64 = snapshot["version"].as_str().unwrap().parse().unwrap();
        assert!(version > last_version, "{version} after {last_version}");
        last_version = version;
        let total: f64 = snapshot["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["score"].as_f64().unwrap())
            .sum();
        if total as usize == votes {
            break;
        }
    }
    assert!(received < votes, "{received} snapshots for {votes} votes");
}

/// Publishes articles of 48,000 characters as `token` until `enough` says so (at most 600): few
/// are needed to fill what the network holds for a client that stops reading, even when a busy
/// process skips some announcements for a lagging listener. Their global ids, in order.
pub(crate) async fn publish_long_articles_until(
    app: &TestApp,
    token: &str,
    mut enough: impl AsyncFnMut() -> bool,
) -> Vec<String> {
    let body = "y".repeat(48_000);
    let publish = "mutation($t: String!, $b: String!) { publishArticle(input: { title: $t, body: $b }) { id } }";
    let mut published = Vec::new();
    while published.len() < 600 && !enough().await {
        let response = app
            .graphql_as(
                Some(token),
                publish,
                json!({ "t": format!("long {}", published.len()), "b": body }),
            )
            .await;
        assert!(response["errors"].is_null(), "{response}");
        published.push(
            response["data"]["publishArticle"]["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    published
}

pub(crate) const LONG_ARTICLES: &str = "subscription($after: String) {
    articlePublished(after: $after) { id title body } }";

#[tokio::test]
async fn an_event_subscriber_that_stops_reading_gets_what_was_queued_then_a_resync_with_its_cursor_and_resumes_from_it_on_the_same_socket()
 {
    let app = TestApp::spawn_with(|config| config.ws_send_budget = SEND_BUDGET).await;
    let (token, _) = app.sign_up("prolific").await;
    let start = app.publish(&token, "start").await;
    let mut socket = socket_with_small_receive_buffer(&app).await;
    send(
        &mut socket,
        json!({ "id": "articles", "type": "subscribe",
                "payload": { "query": LONG_ARTICLES, "variables": { "after": start } } }),
    )
    .await;
    wait_until_listening(&app).await;

    // Announcements trail the publishes (they are relayed from SQL's outbox), so the resync may
    // come after the last one.
    let resyncs = async || {
        series(
            &app.metrics().await,
            "pulse_live_slow_consumer_resyncs_total",
        )
    };
    let resyncs_before = resyncs().await;
    let published =
        publish_long_articles_until(&app, &token, async || resyncs().await > resyncs_before).await;
    eventually("the server ends the stream that fell behind", async || {
        resyncs().await > resyncs_before
    })
    .await;

    // Reading again, the client gets what was queued, in order, then the resync with the cursor
    // of the last of them, and the operation's end.
    let mut delivered = Vec::new();
    let resync = loop {
        let message = next_message(&mut socket)
            .await
            .expect("the socket stays open");
        assert_eq!(message["id"], "articles", "{message}");
        assert_eq!(message["type"], "next", "{message}");
        match message["payload"]["data"]["articlePublished"]["id"].as_str() {
            Some(id) => delivered.push(id.to_owned()),
            None => break message["payload"].clone(),
        }
    };
    assert_eq!(
        crate::helpers::error_code(&resync),
        "RESYNC_REQUIRED",
        "{resync}"
    );
    assert!(
        !delivered.is_empty(),
        "nothing delivered of {}",
        published.len()
    );
    assert_eq!(
        delivered[..],
        published[..delivered.len()],
        "in order, from the first"
    );
    assert_eq!(
        resync["errors"][0]["extensions"]["cursor"].as_str(),
        delivered.last().map(String::as_str),
        "{resync}"
    );
    let complete = next_message(&mut socket).await.unwrap();
    assert_eq!(complete, json!({ "type": "complete", "id": "articles" }));
    assert!(
        delivered.len() < published.len(),
        "all {} delivered",
        published.len()
    );

    // The socket stays open: subscribed again after the cursor, the client gets the rest, each
    // once.
    send(
        &mut socket,
        json!({ "id": "again", "type": "subscribe",
                "payload": { "query": LONG_ARTICLES,
                             "variables": { "after": delivered.last() } } }),
    )
    .await;
    while delivered.len() < published.len() {
        let message = next_message(&mut socket)
            .await
            .expect("the socket stays open");
        assert_eq!(message["id"], "again", "{message}");
        let id = message["payload"]["data"]["articlePublished"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{message}"));
        delivered.push(id.to_owned());
    }
    assert_eq!(delivered, published, "a gap or a duplicate");
}

/// The value of a metric's series with `labels` (as the scrape writes them) in a scrape.
fn labelled(scrape: &str, name: &str, labels: &str) -> f64 {
    series(scrape, &format!("{name}{{{labels}}}"))
}

#[tokio::test]
async fn socket_metrics_count_sockets_operations_by_field_and_what_was_sent() {
    let app = TestApp::spawn().await;
    let before = app.metrics().await;
    let mut socket = subscribed(&app, "graphql-transport-ws", json!({}), "subscribe", "1").await;
    let during = app.metrics().await;
    assert!(
        series(&during, "pulse_live_sockets_open") >= 1.0,
        "{during}"
    );
    let operations = |scrape: &str| {
        labelled(
            scrape,
            "pulse_live_operations",
            "field=\"articlePublished\"",
        )
    };
    assert!(operations(&during) >= 1.0, "{during}");

    let (token, _) = app.sign_up("counted").await;
    app.publish(&token, "counted").await;
    next_message(&mut socket).await.expect("the article");
    let after = app.metrics().await;
    for sent in [
        "pulse_live_messages_sent_total",
        "pulse_live_bytes_sent_total",
    ] {
        assert!(
            series(&after, sent) > series(&before, sent),
            "{sent}: {after}"
        );
    }
}

/// `likeCount` and `viewerHasLiked` of `article` asked as operation `id` of `socket` (a query: one
/// `next`, then `complete`).
async fn like_state_over(socket: &mut Socket, id: &str, article: &str) -> (i64, bool) {
    send(
        socket,
        json!({ "id": id, "type": "subscribe", "payload": {
            "query": "query($a: ID!) { node(id: $a) { ... on Article { likeCount viewerHasLiked } } }",
            "variables": { "a": article } } }),
    )
    .await;
    let answer = next_message(socket).await.unwrap();
    assert_eq!(answer["type"], "next", "{answer}");
    let complete = next_message(socket).await.unwrap();
    assert_eq!(complete["type"], "complete", "{complete}");
    let node = &answer["payload"]["data"]["node"];
    (
        node["likeCount"]
            .as_i64()
            .unwrap_or_else(|| panic!("{answer}")),
        node["viewerHasLiked"].as_bool().unwrap(),
    )
}

#[tokio::test]
async fn an_operation_on_a_socket_reads_afresh_what_an_earlier_one_on_it_read() {
    let app = TestApp::spawn().await;
    let (_, article) = crate::likes::article(&app).await;
    let (_, token) = crate::likes::users(&app, 1).await.remove(0);
    let mut socket = connect(&app, "graphql-transport-ws", json!({ "token": token })).await;
    assert_eq!(
        next_message(&mut socket).await.unwrap()["type"],
        "connection_ack"
    );
    assert_eq!(
        like_state_over(&mut socket, "1", &article).await,
        (0, false)
    );
    let liked = crate::likes::set_like(&app, Some(&token), &article, true).await;
    assert_eq!(liked["data"]["like"]["likeCount"], 1, "{liked}");
    assert_eq!(like_state_over(&mut socket, "2", &article).await, (1, true));
}
