//! GraphQL over HTTP (the GraphQL foundation's spec): media types, methods and status codes, as a
//! stock client or a CDN sees them.

use reqwest::header::{ACCEPT, ALLOW, CACHE_CONTROL, CONTENT_TYPE, VARY};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::TestApp;

const GRAPHQL_RESPONSE: &str = "application/graphql-response+json";

struct Answer {
    status: StatusCode,
    content_type: String,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let content_type = headers
        .get(CONTENT_TYPE)
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer {
        status,
        content_type,
        headers,
        body,
    }
}

async fn post(
    app: &TestApp,
    accept: Option<&str>,
    content_type: Option<&str>,
    body: Value,
) -> Answer {
    let mut request = app.http.post(app.url("/graphql")).body(body.to_string());
    if let Some(accept) = accept {
        request = request.header(ACCEPT, accept);
    }
    if let Some(content_type) = content_type {
        request = request.header(CONTENT_TYPE, content_type);
    }
    answer(request.send().await.unwrap()).await
}

async fn get(app: &TestApp, accept: Option<&str>, parameters: &[(&str, &str)]) -> Answer {
    let mut request = app.http.get(app.url("/graphql")).query(parameters);
    if let Some(accept) = accept {
        request = request.header(ACCEPT, accept);
    }
    answer(request.send().await.unwrap()).await
}

fn code(body: &Value) -> &str {
    body["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_post_must_say_its_body_is_json() {
    let app = TestApp::spawn().await;
    let query = json!({ "query": "{ __typename }" });
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/json; charset=latin1"),
    ] {
        let answer = post(&app, None, content_type, query.clone()).await;
        assert_eq!(
            answer.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
        assert_eq!(code(&answer.body), "BAD_USER_INPUT");
        assert!(answer.body.get("data").is_none());
    }
    for content_type in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=\"UTF-8\"",
    ] {
        let answer = post(&app, None, Some(content_type), query.clone()).await;
        assert_eq!(answer.status, StatusCode::OK, "{content_type}");
        assert_eq!(answer.body["data"]["__typename"], "Query");
    }
}

#[tokio::test]
async fn the_spec_media_type_answers_requests_that_never_ran_with_400_and_no_data() {
    let app = TestApp::spawn().await;
    let json = Some("application/json");
    let cases = [
        ("parse failure", json!({ "query": "{ articles(" })),
        ("validation failure", json!({ "query": "{ noSuchField }" })),
        (
            "variable coercion failure",
            json!({ "query": "query($n: Int) { articles(first: $n) { edges { cursor } } }", "variables": { "n": "ten" } }),
        ),
        (
            "unknown operation",
            json!({ "query": "query A { __typename }", "operationName": "B" }),
        ),
    ];
    for (case, body) in cases {
        let answer = post(&app, Some(GRAPHQL_RESPONSE), json, body.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{case}");
        assert!(
            answer.content_type.starts_with(GRAPHQL_RESPONSE),
            "{case}: {}",
            answer.content_type
        );
        assert!(answer.body.get("data").is_none(), "{case}: {}", answer.body);
        assert!(
            !answer.body["errors"].as_array().unwrap().is_empty(),
            "{case}"
        );

        // The type clients sent before the spec keeps its 200 for every GraphQL answer.
        let legacy = post(&app, Some("application/json"), json, body).await;
        assert_eq!(legacy.status, StatusCode::OK, "{case}");
        assert_eq!(legacy.content_type, "application/json", "{case}");
        assert!(
            !legacy.body["errors"].as_array().unwrap().is_empty(),
            "{case}"
        );
    }
}

#[tokio::test]
async fn a_required_variable_left_out_or_null_is_named_and_nothing_runs() {
    let app = TestApp::spawn().await;
    let query = "query Read($id: ID!, $at: String!, $first: Int = 3, $maybe: String) {
      article(id: $id) { comments(first: $first, after: $at) { edges { cursor } } }
      viewer { articles(after: $maybe) { edges { cursor } } } }";
    let id = pulse::graphql::ids::encode(pulse::articles::ARTICLE, 1);
    for (variables, message, column) in [
        (
            json!({ "at": "x" }),
            "Variable \"$id\" of required type \"ID!\" was not provided.",
            12,
        ),
        // `after` takes a null; the variable's own type does not.
        (
            json!({ "id": id, "at": null }),
            "Variable \"$at\" of required type \"String!\" must not be null.",
            22,
        ),
    ] {
        let body = json!({ "query": query, "variables": variables });
        let answer = post(&app, Some(GRAPHQL_RESPONSE), Some("application/json"), body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
        assert!(answer.body.get("data").is_none(), "{}", answer.body);
        assert_eq!(answer.body["errors"][0]["message"], message);
        assert_eq!(code(&answer.body), "BAD_USER_INPUT");
        assert_eq!(
            answer.body["errors"][0]["locations"],
            json!([{ "line": 1, "column": column }])
        );
    }
    // A default and a nullable variable may be left out.
    let body = json!({ "query": query, "variables": { "id": id, "at": "x" } });
    let answer = post(&app, Some(GRAPHQL_RESPONSE), Some("application/json"), body).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.body,
        json!({ "data": { "article": null, "viewer": null } })
    );
}

#[tokio::test]
async fn a_request_that_ran_is_a_200_in_either_type_even_with_field_errors() {
    let app = TestApp::spawn().await;
    // An id that does not decode fails in the resolver, after execution started.
    let body = json!({ "query": "query($id: ID!) { __typename article(id: $id) { id } }", "variables": { "id": "not-an-id" } });
    for accept in [GRAPHQL_RESPONSE, "application/json", "*/*"] {
        let answer = post(&app, Some(accept), Some("application/json"), body.clone()).await;
        assert_eq!(answer.status, StatusCode::OK, "{accept}");
        assert_eq!(answer.body["data"]["__typename"], "Query", "{accept}");
        assert!(answer.body["errors"][0]["path"].is_array(), "{accept}");
    }
    let no_accept = post(&app, None, Some("application/json"), body).await;
    assert_eq!(no_accept.content_type, "application/json");
}

#[tokio::test]
async fn an_accept_header_that_allows_nothing_we_produce_is_406() {
    let app = TestApp::spawn().await;
    let body = json!({ "query": "{ __typename }" });
    for accept in ["text/html", "application/xml", "application/json;q=0"] {
        let answer = post(&app, Some(accept), Some("application/json"), body.clone()).await;
        assert_eq!(answer.status, StatusCode::NOT_ACCEPTABLE, "{accept}");
    }
    let preferred = post(
        &app,
        Some("application/json;q=0.9, application/graphql-response+json"),
        Some("application/json"),
        body,
    )
    .await;
    assert!(preferred.content_type.starts_with(GRAPHQL_RESPONSE));
}

#[tokio::test]
async fn queries_run_over_get_and_mutations_do_not() {
    let app = TestApp::spawn().await;
    let answer = get(
        &app,
        Some(GRAPHQL_RESPONSE),
        &[
            (
                "query",
                "query Q($n: Int) { articles(first: $n) { edges { cursor } } __typename }",
            ),
            ("variables", r#"{"n": 2}"#),
            ("operationName", "Q"),
        ],
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["data"]["__typename"], "Query");
    assert_eq!(answer.headers[VARY], "Accept, Authorization");

    for accept in [GRAPHQL_RESPONSE, "application/json"] {
        let mutation =
            "mutation { signIn(handle: \"nobody\", password: \"wrong-password\") { token } }";
        let refused = get(&app, Some(accept), &[("query", mutation)]).await;
        assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED, "{accept}");
        assert_eq!(refused.headers[ALLOW], "POST");
        assert_eq!(code(&refused.body), "METHOD_NOT_ALLOWED");
    }

    let bad_variables = get(
        &app,
        None,
        &[("query", "{ __typename }"), ("variables", "[1]")],
    )
    .await;
    assert_eq!(bad_variables.status, StatusCode::BAD_REQUEST);
    assert_eq!(code(&bad_variables.body), "BAD_USER_INPUT");
    let no_query = get(&app, Some("application/json"), &[]).await;
    assert_eq!(no_query.status, StatusCode::BAD_REQUEST);
    assert!(
        no_query.body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("query")
    );
}

#[tokio::test]
async fn a_browser_without_a_query_gets_graphiql() {
    let app = TestApp::spawn().await;
    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let page = get(&app, Some(browser), &[]).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.content_type.starts_with("text/html"));
    assert!(
        page.body
            .as_str()
            .unwrap()
            .contains("<title>Pulse GraphiQL</title>")
    );
    let with_query = get(&app, Some(browser), &[("query", "{ __typename }")]).await;
    assert_eq!(with_query.body["data"]["__typename"], "Query");
}

#[tokio::test]
async fn other_methods_are_405() {
    let app = TestApp::spawn().await;
    for method in [Method::PUT, Method::DELETE, Method::PATCH] {
        let response = app
            .http
            .request(method.clone(), app.url("/graphql"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method}"
        );
    }
}

#[tokio::test]
async fn a_subscription_over_http_points_to_the_websocket() {
    let app = TestApp::spawn().await;
    let subscription = "subscription { articlePublished { id } }";
    let over_post = post(
        &app,
        Some(GRAPHQL_RESPONSE),
        Some("application/json"),
        json!({ "query": subscription }),
    )
    .await;
    let over_get = get(&app, None, &[("query", subscription)]).await;
    for answer in [over_post, over_get] {
        assert_eq!(code(&answer.body), "WEBSOCKET_REQUIRED");
        let message = answer.body["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains("/graphql/ws"), "{message}");
    }
}

#[tokio::test]
async fn get_answers_for_a_signed_in_viewer_are_never_cached() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("cache_me_not").await;
    let response = app
        .http
        .get(app.url("/graphql"))
        .query(&[("query", "{ viewer { handle } }")])
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let answer = answer(response).await;
    assert_eq!(answer.body["data"]["viewer"]["handle"], "cache_me_not");
    assert_eq!(answer.headers[CACHE_CONTROL], "private, no-store");
}

#[tokio::test]
async fn anonymous_gets_of_public_reads_may_be_cached_briefly_and_errors_not_at_all() {
    let app = TestApp::spawn().await;
    let public = get(
        &app,
        None,
        &[(
            "query",
            "{ articles(first: 1) { edges { cursor } } topArticles { score } }",
        )],
    )
    .await;
    assert_eq!(public.status, StatusCode::OK, "{}", public.body);
    assert_eq!(public.headers[CACHE_CONTROL], "max-age=5");

    let failed = get(
        &app,
        None,
        &[("query", "{ article(id: \"not-an-id\") { id } }")],
    )
    .await;
    assert!(
        failed.headers.get(CACHE_CONTROL).is_none(),
        "an error is not cached"
    );
    let unhinted = get(&app, None, &[("query", "{ __typename }")]).await;
    assert!(unhinted.headers.get(CACHE_CONTROL).is_none());
}
