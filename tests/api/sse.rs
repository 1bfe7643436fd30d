//! GraphQL over Server-Sent Events, `graphql-sse`'s two modes: leaderboard snapshots and feed
//! items arrive with the caller's credentials; a bad token, a document over the complexity limit,
//! the caps on operations and on streams per address are refused with their codes and hold
//! nothing open; a stream the client drops gives its place back; shutdown ends streams; a feed
//! stream reopened with `Last-Event-ID` resumes after that event; a reader that stops reading a
//! board has its unsent snapshot replaced and then gets the latest; an expiring token ends the
//! streams that read the viewer.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::connections::{LONG_ARTICLES, publish_long_articles_until};
use crate::feed::{bulk_follow, feed_page, in_inbox, publish, token, users};
use crate::helpers::{TestApp, article_row, error_code, eventually, series};
use crate::votes::{admin, create_poll, row};
use crate::votes_live::{listening, vote};

pub const LEADERBOARD: &str = "subscription($p: ID!) {
  leaderboardChanged(pollId: $p, first: 2) { version entries { option { label } score } } }";

pub const FEED_ITEMS: &str = "subscription($after: String) {
  feedItemAdded(after: $after) { cursor node { id title } } }";

const TOKEN_HEADER: &str = "x-graphql-event-stream-token";

/// An SSE response read event by event.
pub struct Events {
    source: Source,
    buffer: String,
}

/// Where an SSE response's body comes from.
enum Source {
    Response(reqwest::Response),
    /// A response read off a socket by hand, for a client that controls its receive buffer: its
    /// chunked body, what has arrived of it and is not decoded yet.
    Raw {
        stream: tokio::net::TcpStream,
        pending: Vec<u8>,
    },
}

impl Source {
    /// The next piece of the body; `None` when it ends (cleanly or not).
    async fn chunk(&mut self) -> Option<Vec<u8>> {
        match self {
            Self::Response(response) => response.chunk().await.ok()?.map(|bytes| bytes.to_vec()),
            Self::Raw { stream, pending } => loop {
                if let Some(line) = pending.windows(2).position(|pair| pair == b"\r\n") {
                    let size = std::str::from_utf8(&pending[..line]).unwrap();
                    let size = usize::from_str_radix(size.trim(), 16).unwrap();
                    if size == 0 {
                        return None;
                    }
                    if pending.len() >= line + 2 + size + 2 {
                        let chunk = pending[line + 2..line + 2 + size].to_vec();
                        pending.drain(..line + 2 + size + 2);
                        return Some(chunk);
                    }
                }
                let mut buffer = [0u8; 4096];
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => pending.extend_from_slice(&buffer[..n]),
                }
            },
        }
    }
}

/// One event: its name, its data, parsed (`null` when empty), and its id if it has one.
#[derive(Debug)]
pub struct Event {
    pub name: String,
    pub data: Value,
    pub id: Option<String>,
}

impl Events {
    pub fn new(response: reqwest::Response) -> Self {
        assert_eq!(response.status(), 200, "the stream opens");
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Self {
            source: Source::Response(response),
            buffer: String::new(),
        }
    }

    /// A distinct stream of `query` POSTed to `/graphql/stream` over a socket whose receive
    /// buffer holds 4 KiB, so that a client that stops reading soon holds the server back.
    pub async fn with_small_receive_buffer(app: &TestApp, query: &str, variables: Value) -> Self {
        let tcp = tokio::net::TcpSocket::new_v4().unwrap();
        tcp.set_recv_buffer_size(4096).unwrap();
        let mut stream = tcp.connect(app.addr).await.unwrap();
        let body = json!({ "query": query, "variables": variables }).to_string();
        let request = format!(
            "POST /graphql/stream HTTP/1.1\r\nhost: {}\r\naccept: text/event-stream\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            app.addr,
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut pending = Vec::new();
        let end = loop {
            if let Some(end) = pending.windows(4).position(|four| four == b"\r\n\r\n") {
                break end;
            }
            let mut buffer = [0u8; 4096];
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the server answers");
            pending.extend_from_slice(&buffer[..n]);
        };
        let head = String::from_utf8(pending.drain(..end + 4).collect())
            .unwrap()
            .to_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        Self {
            source: Source::Raw { stream, pending },
            buffer: String::new(),
        }
    }

    /// The next event, comments skipped; `None` when the body ends (cleanly or not).
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut name = None;
                let mut id = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("id:") {
                        id = Some(value.trim().to_owned());
                    } else if let Some(value) = line.strip_prefix("event:") {
                        name = Some(value.trim().to_owned());
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.trim_start());
                    }
                }
                let Some(name) = name else { continue };
                let data = if data.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_str(&data).unwrap()
                };
                return Some(Event { name, data, id });
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.source.chunk())
                .await
                .expect("an event within 10 s");
            match chunk {
                Some(bytes) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => return None,
            }
        }
    }

    /// The next event, which must be a `next`: its data.
    pub async fn next_result(&mut self) -> Value {
        let event = self.next().await.expect("the stream goes on");
        assert_eq!(event.name, "next", "{event:?}");
        event.data
    }
}

/// A distinct-connections stream of `query` POSTed to `path`, as `token`, unopened.
async fn distinct(
    app: &TestApp,
    path: &str,
    token: Option<&str>,
    query: &str,
    variables: Value,
) -> reqwest::Response {
    let mut request = app
        .http
        .post(app.url(path))
        .header("accept", "text/event-stream")
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

/// A poll of two options with no votes, its first snapshot asked for on a stream by `open`.
async fn poll(app: &TestApp) -> (String, Vec<String>) {
    let token = admin(app).await;
    let input = json!({ "title": "Streams", "options": [{ "label": "A" }, { "label": "B" }] });
    create_poll(app, &token, input).await
}

/// Two votes for the poll's second option, and the snapshot that shows them.
async fn second_option_leads(
    app: &TestApp,
    poll: &str,
    options: &[String],
    mut next: impl AsyncFnMut() -> Value,
) {
    listening(app, row(poll, pulse::votes::POLL)).await;
    let option = row(&options[1], pulse::votes::POLL_OPTION);
    vote(app, row(poll, pulse::votes::POLL), option).await;
    vote(app, row(poll, pulse::votes::POLL), option).await;
    loop {
        let snapshot = next().await;
        let top = &snapshot["data"]["leaderboardChanged"]["entries"][0];
        if top["score"] == 2.0 {
            assert_eq!(top["option"]["label"], "B");
            return;
        }
    }
}

/// A reader of `author`'s items and the cursor of its feed's newest.
async fn reader_with_cursor(app: &TestApp, prefix: &str) -> (i64, i64, String) {
    let people = users(app, prefix, 2).await;
    let (author, reader) = (people[0], people[1]);
    bulk_follow(app, &[reader], author).await;
    let first = publish(app, &token(app, author), "before").await;
    let page = feed_page(app, &token(app, reader), 1, None).await;
    assert_eq!(page.ids, vec![first]);
    (author, reader, page.end_cursor.unwrap())
}

fn feed_item(result: &Value) -> i64 {
    let id = result["data"]["feedItemAdded"]["node"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("not a feed item: {result}"));
    article_row(id)
}

#[tokio::test]
async fn leaderboard_snapshots_and_feed_items_arrive_over_distinct_streams_at_either_path() {
    let app = TestApp::spawn().await;
    let (poll_id, options) = poll(&app).await;
    let response = distinct(
        &app,
        "/graphql/stream",
        None,
        LEADERBOARD,
        json!({ "p": poll_id }),
    )
    .await;
    let mut board = Events::new(response);
    let first = board.next_result().await;
    assert_eq!(
        first["data"]["leaderboardChanged"]["entries"][0]["score"],
        0.0
    );
    second_option_leads(&app, &poll_id, &options, async || board.next_result().await).await;

    // The feed is the signed-in reader's own: the token in the Authorization header says whose.
    let (author, reader, cursor) = reader_with_cursor(&app, "sse_distinct").await;
    let response = distinct(
        &app,
        "/graphql",
        Some(&token(&app, reader)),
        FEED_ITEMS,
        json!({ "after": cursor }),
    )
    .await;
    let mut feed = Events::new(response);
    let published = publish(&app, &token(&app, author), "streamed").await;
    assert_eq!(feed_item(&feed.next_result().await), published);
}

#[tokio::test]
async fn a_bad_token_is_a_401_and_a_document_over_the_complexity_limit_one_error_then_complete() {
    let app = TestApp::spawn().await;
    let refused = distinct(
        &app,
        "/graphql/stream",
        Some("forged"),
        FEED_ITEMS,
        json!({}),
    )
    .await;
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(error_code(&body), "UNAUTHENTICATED");

    let fields: String = (0..3_000)
        .map(|i| format!("a{i}: leaderboardChanged(pollId: \"x\") {{ version }} "))
        .collect();
    let response = distinct(
        &app,
        "/graphql/stream",
        None,
        &format!("subscription {{ {fields} }}"),
        json!({}),
    )
    .await;
    let mut events = Events::new(response);
    let result = events.next_result().await;
    assert_eq!(error_code(&result), "BAD_USER_INPUT", "{result}");
    let message = result["errors"][0]["message"].as_str().unwrap();
    assert!(message.starts_with("query complexity "), "{message}");
    assert_eq!(events.next().await.unwrap().name, "complete");
    assert!(events.next().await.is_none(), "the stream ends");
    let local = "127.0.0.1".parse().unwrap();
    eventually("nothing is held open", async || {
        app.state.sockets_per_ip.held(local) == 0
    })
    .await;
}

#[tokio::test]
async fn streams_count_under_the_cap_per_address_and_a_dropped_one_gives_its_place_back() {
    let app = TestApp::spawn_with(|config| config.max_sockets_per_ip = 1).await;
    let (poll_id, _) = poll(&app).await;
    let local = "127.0.0.1".parse().unwrap();
    let response = distinct(&app, "/graphql", None, LEADERBOARD, json!({ "p": poll_id })).await;
    let mut board = Events::new(response);
    board.next_result().await;
    assert_eq!(app.state.sockets_per_ip.held(local), 1);

    let over = distinct(&app, "/graphql", None, LEADERBOARD, json!({ "p": poll_id })).await;
    assert_eq!(over.status(), 429);
    let body: Value = over.json().await.unwrap();
    assert_eq!(error_code(&body), "RATE_LIMITED");
    let reservation = app
        .http
        .put(app.url("/graphql/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(reservation.status(), 429, "a reservation counts too");

    drop(board);
    eventually("the dropped stream's place is given back", async || {
        app.state.sockets_per_ip.held(local) == 0
    })
    .await;
    let again = distinct(&app, "/graphql", None, LEADERBOARD, json!({ "p": poll_id })).await;
    Events::new(again).next_result().await;
}

/// Reserves a stream as `token` and opens it.
async fn single_connection(app: &TestApp, token: Option<&str>) -> (String, Events) {
    let mut reserve = app.http.put(app.url("/graphql/stream"));
    if let Some(token) = token {
        reserve = reserve.bearer_auth(token);
    }
    let reserved = reserve.send().await.unwrap();
    assert_eq!(reserved.status(), 201);
    let stream_token = reserved.text().await.unwrap();
    let opened = app
        .http
        .get(app.url("/graphql/stream"))
        .header("accept", "text/event-stream")
        .header(TOKEN_HEADER, &stream_token)
        .send()
        .await
        .unwrap();
    (stream_token, Events::new(opened))
}

/// POSTs `query` as operation `id` on the stream of `stream_token`; the status and the body.
async fn operation(
    app: &TestApp,
    stream_token: &str,
    auth: Option<&str>,
    id: &str,
    query: &str,
    variables: Value,
) -> (u16, String) {
    let mut request = app
        .http
        .post(app.url("/graphql/stream"))
        .header(TOKEN_HEADER, stream_token)
        .json(&json!({ "query": query, "variables": variables,
                       "extensions": { "operationId": id } }));
    if let Some(auth) = auth {
        request = request.bearer_auth(auth);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The next `next` event of operation `id` on a single-connection stream: its payload.
async fn result_of(events: &mut Events, id: &str) -> Value {
    loop {
        let event = events.next().await.expect("the stream goes on");
        if event.data["id"] == id {
            assert_eq!(event.name, "next", "{event:?}");
            return event.data["payload"].clone();
        }
    }
}

#[tokio::test]
async fn one_stream_carries_the_leaderboard_and_the_feed_as_operations_by_id() {
    let app = TestApp::spawn().await;
    let (poll_id, options) = poll(&app).await;
    let (author, reader, cursor) = reader_with_cursor(&app, "sse_single").await;
    let reader_token = token(&app, reader);
    let (stream_token, mut events) = single_connection(&app, Some(&reader_token)).await;

    let (status, _) = operation(
        &app,
        &stream_token,
        None,
        "board",
        LEADERBOARD,
        json!({ "p": poll_id }),
    )
    .await;
    assert_eq!(status, 202);
    let (status, _) = operation(
        &app,
        &stream_token,
        Some(&reader_token),
        "feed",
        FEED_ITEMS,
        json!({ "after": cursor }),
    )
    .await;
    assert_eq!(status, 202);

    let first = result_of(&mut events, "board").await;
    assert_eq!(
        first["data"]["leaderboardChanged"]["entries"][0]["score"],
        0.0
    );
    second_option_leads(&app, &poll_id, &options, async || {
        result_of(&mut events, "board").await
    })
    .await;
    let published = publish(&app, &token(&app, author), "on one stream").await;
    assert_eq!(feed_item(&result_of(&mut events, "feed").await), published);

    // Stopped, the board sends no more; the feed goes on.
    let stopped = app
        .http
        .delete(app.url("/graphql/stream?operationId=board"))
        .header(TOKEN_HEADER, &stream_token)
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.status(), 200);
    vote(
        &app,
        row(&poll_id, pulse::votes::POLL),
        row(&options[0], pulse::votes::POLL_OPTION),
    )
    .await;
    let later = publish(&app, &token(&app, author), "after the stop").await;
    let event = events.next().await.unwrap();
    assert_eq!(event.data["id"], "feed", "only the feed goes on: {event:?}");
    assert_eq!(feed_item(&event.data["payload"]), later);
}

#[tokio::test]
async fn the_single_connection_mode_refuses_unknown_tokens_second_streams_reused_ids_and_operations_past_the_cap()
 {
    let app = TestApp::spawn_with(|config| config.ws_max_subscriptions = 2).await;
    let (poll_id, _) = poll(&app).await;
    let (stream_token, _events) = single_connection(&app, None).await;

    let second = app
        .http
        .get(app.url(&format!("/graphql/stream?token={stream_token}")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 409);

    let (status, body) = operation(
        &app,
        "not-a-token",
        None,
        "1",
        LEADERBOARD,
        json!({ "p": poll_id }),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error_code(&body), "NOT_FOUND");

    let board = json!({ "p": poll_id });
    for id in ["1", "2"] {
        let (status, body) =
            operation(&app, &stream_token, None, id, LEADERBOARD, board.clone()).await;
        assert_eq!(status, 202, "{body}");
    }
    let (status, _) = operation(&app, &stream_token, None, "1", LEADERBOARD, board.clone()).await;
    assert_eq!(status, 409, "an id that runs already");
    let (status, body) = operation(&app, &stream_token, None, "3", LEADERBOARD, board).await;
    assert_eq!(status, 429, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error_code(&body), "TOO_MANY_OPERATIONS");

    let (status, body) = operation(
        &app,
        &stream_token,
        Some("forged"),
        "4",
        FEED_ITEMS,
        json!({}),
    )
    .await;
    assert_eq!(status, 401, "{body}");
}

#[tokio::test]
async fn a_reservation_whose_stream_never_opens_lapses_and_gives_its_place_back() {
    let app = TestApp::spawn_with(|config| {
        config.ws_init_timeout = Duration::from_millis(300);
    })
    .await;
    let reserved = app
        .http
        .put(app.url("/graphql/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(reserved.status(), 201);
    let stream_token = reserved.text().await.unwrap();
    let local = "127.0.0.1".parse().unwrap();
    assert_eq!(app.state.sockets_per_ip.held(local), 1);
    eventually("the reservation lapses", async || {
        app.state.sockets_per_ip.held(local) == 0
    })
    .await;
    let late = app
        .http
        .get(app.url("/graphql/stream"))
        .header("accept", "text/event-stream")
        .header(TOKEN_HEADER, &stream_token)
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 404);
}

#[tokio::test]
async fn shutting_the_server_down_ends_open_streams() {
    let app = TestApp::spawn().await;
    let (poll_id, _) = poll(&app).await;
    let response = distinct(&app, "/graphql", None, LEADERBOARD, json!({ "p": poll_id })).await;
    let mut board = Events::new(response);
    board.next_result().await;
    let (_, mut single) = single_connection(&app, None).await;
    let stopping = tokio::spawn(app.stop());
    assert!(board.next().await.is_none(), "the distinct stream ends");
    assert!(single.next().await.is_none(), "the single stream ends");
    stopping.await.unwrap().unwrap();
}

/// A distinct feed stream of `reader_token` running `query`, resumed after `last_event_id`.
async fn feed_stream(
    app: &TestApp,
    reader_token: &str,
    query: &str,
    variables: Value,
    last_event_id: Option<&str>,
) -> Events {
    let mut request = app
        .http
        .post(app.url("/graphql/stream"))
        .header("accept", "text/event-stream")
        .bearer_auth(reader_token)
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(last_event_id) = last_event_id {
        request = request.header("last-event-id", last_event_id);
    }
    Events::new(request.send().await.unwrap())
}

/// A feed item's event: its article row id and its SSE id, which must be its cursor.
fn feed_event(event: Option<Event>) -> (i64, String) {
    let event = event.expect("the stream goes on");
    assert_eq!(event.name, "next", "{event:?}");
    let id = event
        .id
        .expect("a feed item's event carries its cursor as its id");
    assert_eq!(
        Some(id.as_str()),
        event.data["data"]["feedItemAdded"]["cursor"].as_str()
    );
    (feed_item(&event.data), id)
}

/// The stream's last result, an error coded `code`, then `complete` and the end.
async fn ends_with(events: &mut Events, code: &str) {
    let result = events.next_result().await;
    assert!(result["data"].is_null(), "{result}");
    assert_eq!(error_code(&result), code, "{result}");
    assert_eq!(events.next().await.unwrap().name, "complete");
    assert!(events.next().await.is_none(), "the stream ends");
}

#[tokio::test]
async fn a_feed_stream_back_with_last_event_id_after_missing_50_items_gets_exactly_those_then_live_ones_and_past_its_history_a_resync()
 {
    // An inbox of 20: most of the 50 missed are replayed from SQL, below the inbox's floor.
    let app = TestApp::spawn_with(|config| {
        config.feed_cap = 20;
        config.replay_limit = 60;
    })
    .await;
    let (author, reader, cursor) = reader_with_cursor(&app, "sse_resume").await;
    let (author_token, reader_token) = (token(&app, author), token(&app, reader));
    let from_page = json!({ "after": cursor });
    let mut feed = feed_stream(&app, &reader_token, FEED_ITEMS, from_page.clone(), None).await;
    let seen = publish(&app, &author_token, "seen").await;
    let (id, seen_id) = feed_event(feed.next().await);
    assert_eq!(id, seen);
    drop(feed);

    let mut missed = Vec::new();
    for i in 0..50 {
        missed.push(publish(&app, &author_token, &format!("missed {i}")).await);
    }
    eventually("the 50 reached the reader's inbox", async || {
        in_inbox(&app, reader, missed[49]).await
    })
    .await;
    // The request is sent again as it was, as an EventSource does: without Last-Event-ID it
    // would replay "seen" as well.
    let mut resumed = feed_stream(
        &app,
        &reader_token,
        FEED_ITEMS,
        from_page.clone(),
        Some(&seen_id),
    )
    .await;
    let mut replayed = Vec::new();
    for _ in 0..50 {
        replayed.push(feed_event(resumed.next().await).0);
    }
    assert_eq!(replayed, missed);
    let live = publish(&app, &author_token, "live").await;
    assert_eq!(
        feed_event(resumed.next().await).0,
        live,
        "the first item after the replay is not the next one published"
    );
    drop(resumed);

    let mut more = 0;
    for i in 0..10 {
        more = publish(&app, &author_token, &format!("more {i}")).await;
    }
    eventually("the 10 more reached the reader's inbox", async || {
        in_inbox(&app, reader, more).await
    })
    .await;
    // 61 items after "seen": more than a replay carries.
    let mut past = feed_stream(&app, &reader_token, FEED_ITEMS, from_page, Some(&seen_id)).await;
    ends_with(&mut past, "RESYNC_REQUIRED").await;
}

#[tokio::test]
async fn last_event_id_fills_an_after_the_operation_omits_or_writes_inline() {
    let app = TestApp::spawn().await;
    let (author, reader, page_cursor) = reader_with_cursor(&app, "sse_inline").await;
    let (author_token, reader_token) = (token(&app, author), token(&app, reader));
    // The README's example: no `after` at all.
    let bare = "subscription { feedItemAdded { cursor node { id title } } }";
    let mut feed = feed_stream(&app, &reader_token, bare, json!({}), None).await;
    let seen = publish(&app, &author_token, "seen").await;
    let (id, seen_id) = feed_event(feed.next().await);
    assert_eq!(id, seen);
    drop(feed);

    let missed = publish(&app, &author_token, "missed").await;
    let mut resumed = feed_stream(&app, &reader_token, bare, json!({}), Some(&seen_id)).await;
    let (id, missed_id) = feed_event(resumed.next().await);
    assert_eq!(id, missed, "the item missed is replayed");
    drop(resumed);

    // An inline `after`, older than the event received last: the header wins, so neither "seen"
    // nor "missed" comes again.
    let inline = format!(
        "subscription {{ items: feedItemAdded(after: {}) {{ cursor node {{ id title }} }} }}",
        json!(page_cursor)
    );
    let mut resumed = feed_stream(&app, &reader_token, &inline, json!({}), Some(&missed_id)).await;
    let live = publish(&app, &author_token, "live").await;
    let event = resumed.next().await.unwrap();
    assert_eq!(event.name, "next", "{event:?}");
    let item = &event.data["data"]["items"];
    assert_eq!(article_row(item["node"]["id"].as_str().unwrap()), live);
    assert_eq!(
        event.id.as_deref(),
        item["cursor"].as_str(),
        "the alias keeps the id"
    );
}

#[tokio::test]
async fn a_reader_that_stops_reading_a_board_has_its_unsent_snapshot_replaced_and_then_gets_the_latest()
 {
    use pulse::votes::service::{Ballot, Origin};

    let app = TestApp::spawn_with(|config| {
        config.ws_send_budget = 32 * 1024;
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
    let board = "subscription($p: ID!) { leaderboardChanged(pollId: $p, first: 100) {
        version entries { option { label } score } } }";
    let response = distinct(&app, "/graphql/stream", None, board, json!({ "p": poll })).await;
    let mut events = Events::new(response);
    let first = events.next_result().await;
    listening(&app, row(&poll, pulse::votes::POLL)).await;

    // The client reads nothing while votes move the board, each tick a new snapshot, until the
    // server's queue has had to replace some.
    let (user, _) = crate::likes::users(&app, 1).await.remove(0);
    let replaced = async || {
        series(
            &app.metrics().await,
            "pulse_live_stream_snapshots_replaced_total{transport=\"sse\"}",
        )
    };
    let replaced_before = replaced().await;
    let mut votes = 0usize;
    loop {
        let ballot = Ballot {
            poll: row(&poll, pulse::votes::POLL),
            option: row(&options[votes % options.len()], pulse::votes::POLL_OPTION),
        };
        app.state
            .services
            .votes
            .cast(
                &crate::votes::voter(user),
                &[ballot],
                &Origin::default(),
                chrono::Utc::now(),
            )
            .await
            .unwrap();
        votes += 1;
        tokio::time::sleep(Duration::from_millis(6)).await;
        if votes.is_multiple_of(20) {
            if replaced().await > replaced_before + 20.0 {
                break;
            }
            assert!(
                votes < 5_000,
                "no snapshot was replaced after {votes} votes"
            );
        }
    }

    // Reading again, the client ends on the board with every vote, its versions only growing.
    let version = |snapshot: &Value| -> i64 {
        snapshot["data"]["leaderboardChanged"]["version"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut last_version = version(&first);
    let mut received = 0;
    loop {
        let snapshot = events.next_result().await;
        received += 1;
        assert!(version(&snapshot) > last_version, "versions only grow");
        last_version = version(&snapshot);
        let total: f64 = snapshot["data"]["leaderboardChanged"]["entries"]
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

#[tokio::test]
async fn an_expiring_token_ends_a_stream_reading_the_viewer_with_unauthenticated_and_no_other() {
    let app = TestApp::spawn_with(|config| config.token_ttl = Duration::from_secs(2)).await;
    let (poll_id, _) = poll(&app).await;
    let (token, _) = app.sign_up("fleeting_sse").await;
    let mut feed =
        Events::new(distinct(&app, "/graphql", Some(&token), FEED_ITEMS, json!({})).await);
    let mut board = Events::new(
        distinct(
            &app,
            "/graphql",
            Some(&token),
            LEADERBOARD,
            json!({ "p": poll_id }),
        )
        .await,
    );
    board.next_result().await;

    let ended = feed.next_result().await;
    assert_eq!(error_code(&ended), "UNAUTHENTICATED", "{ended}");
    assert_eq!(feed.next().await.unwrap().name, "complete");
    assert!(feed.next().await.is_none(), "the stream ends");
    // The board reads nothing of the viewer: it goes on, a heartbeat or a snapshot at a time.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), board.next())
            .await
            .is_err(),
        "the board's stream stays open"
    );
}

#[tokio::test]
async fn an_event_stream_that_stops_reading_gets_what_was_queued_then_a_resync_with_its_cursor_and_resumes_with_last_event_id()
 {
    let app = TestApp::spawn_with(|config| config.ws_send_budget = 32 * 1024).await;
    let (token, _) = app.sign_up("prolific_sse").await;
    let start = app.publish(&token, "start").await;
    let from_start = json!({ "after": start });
    let mut events =
        Events::with_small_receive_buffer(&app, LONG_ARTICLES, from_start.clone()).await;
    crate::subscriptions::wait_until_listening(&app).await;

    let resyncs = async || {
        series(
            &app.metrics().await,
            "pulse_live_stream_slow_consumer_resyncs_total{transport=\"sse\"}",
        )
    };
    let resyncs_before = resyncs().await;
    let published =
        publish_long_articles_until(&app, &token, async || resyncs().await > resyncs_before).await;
    eventually("the server ends the stream that fell behind", async || {
        resyncs().await > resyncs_before
    })
    .await;

    // Reading again: what was queued, in order, each event's id its article's, then the resync
    // with the cursor of the last of them, and the stream's end.
    let mut delivered = Vec::new();
    let resync = loop {
        let event = events.next().await.expect("the stream goes on");
        assert_eq!(event.name, "next", "{event:?}");
        match event.data["data"]["articlePublished"]["id"].as_str() {
            Some(id) => {
                assert_eq!(event.id.as_deref(), Some(id));
                delivered.push(id.to_owned());
            }
            None => break event.data,
        }
    };
    assert_eq!(error_code(&resync), "RESYNC_REQUIRED", "{resync}");
    assert!(
        !delivered.is_empty(),
        "nothing delivered of {}",
        published.len()
    );
    assert!(
        delivered.len() < published.len(),
        "all {} delivered",
        published.len()
    );
    assert_eq!(
        delivered[..],
        published[..delivered.len()],
        "in order, from the first"
    );
    let cursor = resync["errors"][0]["extensions"]["cursor"]
        .as_str()
        .unwrap_or_else(|| panic!("no cursor: {resync}"))
        .to_owned();
    assert_eq!(Some(&cursor), delivered.last());
    assert_eq!(events.next().await.unwrap().name, "complete");
    assert!(events.next().await.is_none(), "the stream ends");

    // The same request again with the cursor as Last-Event-ID, as an EventSource reconnects:
    // the rest, each once. The replay is as large as what the first client missed (megabytes), so
    // a client slowed by a loaded machine can fall behind again; it then resumes once more from
    // the new cursor, as the documented recovery says, and each resume must bring something.
    let mut cursor = cursor;
    while delivered.len() < published.len() {
        let resumed = app
            .http
            .post(app.url("/graphql/stream"))
            .header("accept", "text/event-stream")
            .header("last-event-id", &cursor)
            .json(&json!({ "query": LONG_ARTICLES, "variables": from_start }))
            .send()
            .await
            .unwrap();
        let mut resumed = Events::new(resumed);
        let before = delivered.len();
        while delivered.len() < published.len() {
            let result = resumed.next_result().await;
            match result["data"]["articlePublished"]["id"].as_str() {
                Some(id) => delivered.push(id.to_owned()),
                None => {
                    assert_eq!(error_code(&result), "RESYNC_REQUIRED", "{result}");
                    cursor = result["errors"][0]["extensions"]["cursor"]
                        .as_str()
                        .unwrap_or_else(|| panic!("no cursor: {result}"))
                        .to_owned();
                    assert_eq!(Some(&cursor), delivered.last());
                    break;
                }
            }
        }
        assert!(
            delivered.len() > before,
            "a resume from {cursor} brought nothing"
        );
    }
    assert_eq!(delivered, published, "a gap or a duplicate");
}

#[tokio::test]
async fn an_operation_that_does_not_validate_is_a_400_with_its_errors_and_holds_neither_its_id_nor_a_place()
 {
    let app = TestApp::spawn_with(|config| config.ws_max_subscriptions = 1).await;
    let (poll_id, _) = poll(&app).await;
    let (stream_token, mut events) = single_connection(&app, None).await;
    let fields: String = (0..3_000)
        .map(|i| format!("a{i}: leaderboardChanged(pollId: \"x\") {{ version }} "))
        .collect();
    let over_the_limit = format!("subscription {{ {fields} }}");
    let refused = [
        ("subscription {", "does not parse"),
        ("subscription { noSuchField }", "does not validate"),
        (over_the_limit.as_str(), "query complexity "),
        (LEADERBOARD, "required variable"),
    ];
    for (query, why) in refused {
        let (status, body) = operation(&app, &stream_token, None, "1", query, json!({})).await;
        assert_eq!(status, 400, "{why}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error_code(&body), "BAD_USER_INPUT", "{why}: {body}");
        assert!(body.get("data").is_none(), "{why}: {body}");
    }
    let over: Value = serde_json::from_str(
        &operation(&app, &stream_token, None, "1", &over_the_limit, json!({}))
            .await
            .1,
    )
    .unwrap();
    let message = over["errors"][0]["message"].as_str().unwrap();
    assert!(message.starts_with("query complexity "), "{message}");

    // None took the id "1" or the one place the stream has: a valid operation gets both, and its
    // result is the first event on the stream.
    let (status, body) = operation(
        &app,
        &stream_token,
        None,
        "1",
        LEADERBOARD,
        json!({ "p": poll_id }),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let event = events.next().await.unwrap();
    assert_eq!(event.data["id"], "1", "{event:?}");
    assert_eq!(event.name, "next", "{event:?}");
    assert_eq!(
        event.data["payload"]["data"]["leaderboardChanged"]["entries"][0]["score"], 0.0,
        "{event:?}"
    );
}
