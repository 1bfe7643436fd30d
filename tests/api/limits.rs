//! Hostile and broken requests get a clear error, and the server goes on serving.

use serde_json::json;

use crate::helpers::{TestApp, error_code};

async fn still_serves(app: &TestApp) {
    let response = app
        .graphql("{ articles(first: 1) { edges { cursor } } }", json!({}))
        .await;
    assert!(
        response["errors"].is_null(),
        "the next request failed: {response}"
    );
}

#[tokio::test]
async fn a_query_fifty_levels_deep_is_refused() {
    let app = TestApp::spawn().await;
    let mut query = String::from("id");
    for _ in 0..25 {
        query = format!("articles {{ edges {{ node {{ author {{ {query} }} }} }} }}");
    }
    let response = app.graphql(&format!("{{ {query} }}"), json!({})).await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT");
    assert!(response["data"].is_null());
    still_serves(&app).await;
}

#[tokio::test]
async fn a_query_with_ten_thousand_aliases_is_refused() {
    let app = TestApp::spawn().await;
    let fields: String = (0..10_000)
        .map(|i| format!("a{i}: viewer {{ id }} "))
        .collect();
    let response = app.graphql(&format!("{{ {fields} }}"), json!({})).await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT");
    assert!(
        response["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("complex"),
        "{response}"
    );
    still_serves(&app).await;
}

#[tokio::test]
async fn large_pages_of_nested_connections_cost_their_size() {
    let app = TestApp::spawn().await;
    let query = "{ articles(first: 100) { edges { node { author { articles(first: 100) { edges { node { title body } } } } } } } }";
    let response = app.graphql(query, json!({})).await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT", "{response}");
}

#[tokio::test]
async fn a_five_mebibyte_body_is_refused() {
    let app = TestApp::spawn().await;
    let padding = "x".repeat(5 * 1024 * 1024);
    let body =
        json!({ "query": "{ viewer { id } }", "variables": { "padding": padding } }).to_string();
    let (status, response) = app.post_raw(body, None).await;
    assert_eq!(status, 413);
    assert_eq!(error_code(&response), "BAD_USER_INPUT");
    still_serves(&app).await;
}

#[tokio::test]
async fn malformed_json_is_refused() {
    let app = TestApp::spawn().await;
    for body in [
        "{\"query\": ",
        "not json at all",
        "[{\"query\": \"{ viewer { id } }\"}]",
        "{\"variables\": {}}",
    ] {
        let (status, response) = app.post_raw(body.to_owned(), None).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(error_code(&response), "BAD_USER_INPUT");
    }
    still_serves(&app).await;
}

#[tokio::test]
async fn unknown_operations_and_fields_are_refused() {
    let app = TestApp::spawn().await;
    let body = json!({ "query": "query A { viewer { id } }", "operationName": "B" }).to_string();
    let (_, response) = app.post_raw(body, None).await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT");
    assert!(
        response["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains('B'),
        "{response}"
    );

    let unknown_field = app.graphql("{ noSuchField }", json!({})).await;
    assert_eq!(error_code(&unknown_field), "BAD_USER_INPUT");
    let syntax = app.graphql("{ viewer { ", json!({})).await;
    assert_eq!(error_code(&syntax), "BAD_USER_INPUT");
    still_serves(&app).await;
}

#[tokio::test]
async fn introspection_can_be_turned_off() {
    let open = TestApp::spawn().await;
    let introspect = "{ __schema { queryType { name } } }";
    assert_eq!(
        open.graphql(introspect, json!({})).await["data"]["__schema"]["queryType"]["name"],
        "Query"
    );

    let closed = TestApp::spawn_with(|config| config.introspection = false).await;
    let response = closed.graphql(introspect, json!({})).await;
    assert!(response["data"]["__schema"].is_null(), "{response}");
    let type_query = closed
        .graphql("{ __type(name: \"Article\") { name } }", json!({}))
        .await;
    assert!(type_query["data"]["__type"].is_null(), "{type_query}");
    still_serves(&closed).await;
}
