//! Response fields come in the order the document selected them (the spec's "serialized map
//! ordering"), whatever order the resolvers finish in: root fields, nested objects, lists,
//! fragments and aliases, over HTTP and over websockets.

use async_graphql::Value as Ordered;
use serde_json::json;

use crate::helpers::TestApp;

/// The response keys of every object along `path`, in the order the server wrote them.
fn keys(text: &str, path: &[&str]) -> Vec<String> {
    let mut value: Ordered = serde_json::from_str(text).unwrap();
    for step in path {
        value = match value {
            Ordered::Object(mut object) => object
                .shift_remove(*step)
                .unwrap_or_else(|| panic!("no {step} in {text}")),
            Ordered::List(mut items) => items.swap_remove(step.parse().unwrap()),
            other => panic!("{step} of {other}"),
        };
    }
    match value {
        Ordered::Object(object) => object.keys().map(|key| key.to_string()).collect(),
        other => panic!("not an object: {other}"),
    }
}

async fn raw(
    app: &TestApp,
    token: Option<&str>,
    query: &str,
    variables: serde_json::Value,
) -> String {
    let mut request = app
        .http
        .post(app.url("/graphql"))
        .header("content-type", "application/json")
        .body(json!({ "query": query, "variables": variables }).to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let text = request.send().await.unwrap().text().await.unwrap();
    assert!(!text.contains("\"errors\""), "{text}");
    text
}

/// Requests are repeated: before the fix the order changed from one request to the next, with
/// whichever resolver finished first.
const ROUNDS: usize = 40;

#[tokio::test]
async fn root_fields_come_in_selection_order() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("orderly").await;
    app.publish_many(&token, "ordered", 3).await;
    // `__typename` is answered at once, the others wait on SQL or Redis.
    let query = "{ articles(first: 3) { edges { cursor } } viewer { handle } topArticles { score } __typename }";
    for _ in 0..ROUNDS {
        let text = raw(&app, Some(&token), query, json!({})).await;
        assert_eq!(
            keys(&text, &["data"]),
            ["articles", "viewer", "topArticles", "__typename"]
        );
    }
}

#[tokio::test]
async fn nested_objects_lists_fragments_and_aliases_come_in_selection_order() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("nested_order").await;
    let article = app.publish(&token, "Ordered").await;
    let query = "
        query($id: ID!) {
          second: article(id: $id) { ...Counts title }
          node(id: $id) {
            __typename
            ... on User { handle }
            ... on Article { likeCount author { articles(first: 1) { edges { node { title id } } } handle id } }
            id
          }
          first: article(id: $id) { id viewCount title likeCount }
        }
        fragment Counts on Article { likeCount viewerHasLiked viewCount id }";
    for _ in 0..ROUNDS {
        let text = raw(&app, Some(&token), query, json!({ "id": article })).await;
        assert_eq!(keys(&text, &["data"]), ["second", "node", "first"]);
        assert_eq!(
            keys(&text, &["data", "second"]),
            ["likeCount", "viewerHasLiked", "viewCount", "id", "title"]
        );
        assert_eq!(
            keys(&text, &["data", "node"]),
            ["__typename", "likeCount", "author", "id"]
        );
        assert_eq!(
            keys(&text, &["data", "node", "author"]),
            ["articles", "handle", "id"]
        );
        assert_eq!(
            keys(
                &text,
                &["data", "node", "author", "articles", "edges", "0", "node"]
            ),
            ["title", "id"]
        );
        assert_eq!(
            keys(&text, &["data", "first"]),
            ["id", "viewCount", "title", "likeCount"]
        );
    }
}

#[tokio::test]
async fn mutation_payloads_come_in_selection_order() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("mutation_order").await;
    let article = app.publish(&token, "Liked in order").await;
    let mutation = "mutation($id: ID!) { like(subjectId: $id) { likeCount liked } }";
    let text = raw(&app, Some(&token), mutation, json!({ "id": article })).await;
    assert_eq!(keys(&text, &["data", "like"]), ["likeCount", "liked"]);
}

/// The next text frame that is not a keep-alive, as the server wrote it.
async fn next_text(socket: &mut crate::subscriptions::Socket) -> String {
    use futures_util::StreamExt;
    loop {
        let message = tokio::time::timeout(std::time::Duration::from_secs(10), socket.next())
            .await
            .expect("a message within 10 s")
            .expect("the socket stays open")
            .expect("a clean frame");
        if let tokio_tungstenite::tungstenite::Message::Text(text) = message
            && !text.contains("\"ka\"")
            && !text.contains("\"ping\"")
        {
            return text.to_string();
        }
    }
}

#[tokio::test]
async fn websocket_answers_and_subscription_events_come_in_selection_order() {
    use crate::subscriptions::{connect, send, wait_until_listening};
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("ws_order").await;
    let mut socket = connect(&app, "graphql-transport-ws", json!({ "token": token })).await;
    assert!(next_text(&mut socket).await.contains("connection_ack"));

    let query = "{ articles(first: 1) { edges { cursor } } viewer { handle } __typename }";
    send(
        &mut socket,
        json!({ "id": "q", "type": "subscribe", "payload": { "query": query } }),
    )
    .await;
    let answer = next_text(&mut socket).await;
    assert_eq!(
        keys(&answer, &["payload", "data"]),
        ["articles", "viewer", "__typename"]
    );
    assert!(next_text(&mut socket).await.contains("complete"));

    let subscription =
        "subscription { articlePublished { viewCount author { id handle } title id } }";
    send(
        &mut socket,
        json!({ "id": "s", "type": "subscribe", "payload": { "query": subscription } }),
    )
    .await;
    wait_until_listening(&app).await;
    app.publish(&token, "Ordered live").await;
    let event = next_text(&mut socket).await;
    assert_eq!(
        keys(&event, &["payload", "data", "articlePublished"]),
        ["viewCount", "author", "title", "id"]
    );
    assert_eq!(
        keys(&event, &["payload", "data", "articlePublished", "author"]),
        ["id", "handle"]
    );
}
