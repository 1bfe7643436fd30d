//! Apollo's multipart HTTP subscriptions on `POST /graphql`: leaderboard snapshots and feed items
//! arrive as `{"payload": …}` parts with the caller's credentials, `{}` heartbeats keep an idle
//! response alive, a document over the complexity limit is one part with the errors and the
//! final boundary, and a dropped response gives its place back.

use std::time::Duration;

use serde_json::{Value, json};

use crate::feed::{bulk_follow, feed_page, publish, token, users};
use crate::helpers::{TestApp, article_row, error_code, eventually};
use crate::sse::{FEED_ITEMS, LEADERBOARD};
use crate::votes::{admin, create_poll, row};
use crate::votes_live::{listening, vote};

/// What Apollo Client's HttpLink sends for a subscription.
const APOLLO_ACCEPT: &str =
    "multipart/mixed;boundary=\"graphql\";subscriptionSpec=1.0,application/json";

const BOUNDARY: &str = "\r\n--graphql";

/// A multipart response read part by part.
pub struct Parts {
    response: reqwest::Response,
    buffer: String,
    /// The opening boundary has been read.
    opened: bool,
}

/// What the response holds next.
#[derive(Debug, PartialEq)]
enum Part {
    Json(Value),
    /// The final boundary.
    End,
}

impl Parts {
    pub fn new(response: reqwest::Response) -> Self {
        assert_eq!(response.status(), 200, "the response streams");
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert_eq!(
            content_type,
            "multipart/mixed;boundary=\"graphql\";subscriptionSpec=\"1.0\""
        );
        Self {
            response,
            buffer: String::new(),
            opened: false,
        }
    }

    async fn next(&mut self) -> Option<Part> {
        loop {
            if !self.opened && self.buffer.len() >= BOUNDARY.len() {
                assert!(self.buffer.starts_with(BOUNDARY), "{:?}", self.buffer);
                self.buffer.drain(..BOUNDARY.len());
                self.opened = true;
            }
            if self.opened {
                if self.buffer.starts_with("--\r\n") {
                    return Some(Part::End);
                }
                if let Some(end) = self.buffer.find(BOUNDARY) {
                    let part: String = self.buffer.drain(..end + BOUNDARY.len()).collect();
                    let (headers, body) =
                        part.split_once("\r\n\r\n").expect("headers, then a body");
                    assert!(
                        headers
                            .to_ascii_lowercase()
                            .contains("content-type: application/json"),
                        "{headers}"
                    );
                    let body = &body[..body.len() - BOUNDARY.len()];
                    return Some(Part::Json(serde_json::from_str(body).unwrap()));
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("a part within 10 s");
            match chunk {
                Ok(Some(bytes)) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The next part that is not a heartbeat: its payload.
    pub async fn payload(&mut self) -> Value {
        loop {
            match self.next().await.expect("the response goes on") {
                Part::Json(part) if part == json!({}) => continue,
                Part::Json(part) => return part["payload"].clone(),
                Part::End => panic!("the response ended"),
            }
        }
    }
}

pub async fn subscribe(
    app: &TestApp,
    token: Option<&str>,
    query: &str,
    variables: Value,
) -> reqwest::Response {
    let mut request = app
        .http
        .post(app.url("/graphql"))
        .header("accept", APOLLO_ACCEPT)
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn leaderboard_snapshots_and_feed_items_arrive_as_payload_parts() {
    let app = TestApp::spawn().await;
    let admin_token = admin(&app).await;
    let input = json!({ "title": "Parts", "options": [{ "label": "A" }, { "label": "B" }] });
    let (poll_id, options) = create_poll(&app, &admin_token, input).await;
    let mut board = Parts::new(subscribe(&app, None, LEADERBOARD, json!({ "p": poll_id })).await);
    let first = board.payload().await;
    assert_eq!(
        first["data"]["leaderboardChanged"]["entries"][0]["score"],
        0.0
    );
    listening(&app, row(&poll_id, pulse::votes::POLL)).await;
    let option = row(&options[0], pulse::votes::POLL_OPTION);
    vote(&app, row(&poll_id, pulse::votes::POLL), option).await;
    loop {
        let snapshot = board.payload().await;
        if snapshot["data"]["leaderboardChanged"]["entries"][0]["score"] == 1.0 {
            break;
        }
    }

    let people = users(&app, "multipart", 2).await;
    let (author, reader) = (people[0], people[1]);
    bulk_follow(&app, &[reader], author).await;
    publish(&app, &token(&app, author), "before").await;
    let cursor = feed_page(&app, &token(&app, reader), 1, None)
        .await
        .end_cursor
        .unwrap();
    let response = subscribe(
        &app,
        Some(&token(&app, reader)),
        FEED_ITEMS,
        json!({ "after": cursor }),
    )
    .await;
    let mut feed = Parts::new(response);
    let published = publish(&app, &token(&app, author), "in parts").await;
    let item = feed.payload().await;
    let id = item["data"]["feedItemAdded"]["node"]["id"]
        .as_str()
        .unwrap();
    assert_eq!(article_row(id), published);
}

#[tokio::test]
async fn an_idle_response_sends_empty_heartbeat_parts() {
    let app = TestApp::spawn().await;
    let (reader_token, _) = app.sign_up("heartbeats").await;
    let mut feed = Parts::new(subscribe(&app, Some(&reader_token), FEED_ITEMS, json!({})).await);
    let started = tokio::time::Instant::now();
    assert_eq!(feed.next().await, Some(Part::Json(json!({}))));
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_bad_token_is_a_401_and_a_document_over_the_limit_one_error_part_then_the_end() {
    let app = TestApp::spawn().await;
    let refused = subscribe(&app, Some("forged"), FEED_ITEMS, json!({})).await;
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(error_code(&body), "UNAUTHENTICATED");

    let fields: String = (0..3_000)
        .map(|i| format!("a{i}: leaderboardChanged(pollId: \"x\") {{ version }} "))
        .collect();
    let query = format!("subscription {{ {fields} }}");
    let mut parts = Parts::new(subscribe(&app, None, &query, json!({})).await);
    let payload = parts.payload().await;
    assert_eq!(error_code(&payload), "BAD_USER_INPUT", "{payload}");
    assert_eq!(parts.next().await, Some(Part::End));
}

#[tokio::test]
async fn a_dropped_response_gives_its_place_under_the_cap_back() {
    let app = TestApp::spawn_with(|config| config.max_sockets_per_ip = 1).await;
    let (reader_token, _) = app.sign_up("dropper").await;
    let local = "127.0.0.1".parse().unwrap();
    let held = subscribe(&app, Some(&reader_token), FEED_ITEMS, json!({})).await;
    assert_eq!(held.status(), 200);
    assert_eq!(app.state.sockets_per_ip.held(local), 1);
    let over = subscribe(&app, Some(&reader_token), FEED_ITEMS, json!({})).await;
    assert_eq!(over.status(), 429);
    drop(held);
    eventually("the dropped response's place is given back", async || {
        app.state.sockets_per_ip.held(local) == 0
    })
    .await;
}
