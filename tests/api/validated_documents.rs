//! A document's validation is reused only where the variables cannot change its verdict.

use serde_json::{Value, json};

use crate::helpers::{TestApp, error_code};

const LIKE: &str = "mutation($s: ID!) { like(subjectId: $s) { liked likeCount } }";

fn skipped(app: &TestApp) -> u64 {
    app.state.validations.skipped()
}

#[tokio::test]
async fn a_document_sent_again_with_string_variables_reuses_its_validation_and_still_runs() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("reuser").await;
    let first = app.publish(&token, "first").await;
    let second = app.publish(&token, "second").await;
    let before = skipped(&app);

    for (sent_before, article) in [first, second].iter().enumerate() {
        let liked = app
            .graphql_as(Some(&token), LIKE, json!({ "s": article }))
            .await;
        assert_eq!(
            liked["data"]["like"],
            json!({ "liked": true, "likeCount": 1 })
        );
        // The first sending validates in full; the second reuses its verdict.
        assert_eq!(skipped(&app), before + sent_before as u64, "{article}");
    }

    let unknown = app
        .graphql_as(Some(&token), LIKE, json!({ "s": "QXJ0aWNsZTo5OTk5OTk" }))
        .await;
    assert_eq!(error_code(&unknown), "NOT_FOUND", "{unknown}");
    assert_eq!(
        skipped(&app),
        before + 2,
        "a resolver's refusal is not validation's"
    );
}

#[tokio::test]
async fn values_validation_refuses_are_refused_after_the_document_was_accepted() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("refused").await;
    let article = app.publish(&token, "kept").await;
    app.graphql_as(Some(&token), LIKE, json!({ "s": article }))
        .await;
    let before = skipped(&app);

    for variables in [
        json!({}),
        json!({ "s": null }),
        json!({ "s": { "nested": article } }),
        json!({ "s": [article] }),
        json!({ "s": true }),
    ] {
        let refused = app.graphql_as(Some(&token), LIKE, variables.clone()).await;
        assert_eq!(
            error_code(&refused),
            "BAD_USER_INPUT",
            "{variables}: {refused}"
        );
        assert!(refused["data"].is_null(), "{variables}: {refused}");
    }
    assert_eq!(skipped(&app), before, "none of them reused the verdict");
    let count: Value = app
        .graphql(
            "query($id: ID!) { node(id: $id) { ... on Article { likeCount } } }",
            json!({ "id": article }),
        )
        .await;
    assert_eq!(
        count["data"]["node"]["likeCount"], 1,
        "nothing else was counted"
    );
}

#[tokio::test]
async fn page_sizes_sent_as_variables_are_measured_on_every_request() {
    let app = TestApp::spawn().await;
    let query = "query($n: Int) { articles(first: $n) { edges { node { author { articles(first: $n) { edges { node { title } } } } } } } }";
    for _ in 0..2 {
        let small = app.graphql(query, json!({ "n": 1 })).await;
        assert!(small["errors"].is_null(), "{small}");
    }
    let large = app.graphql(query, json!({ "n": 100 })).await;
    assert_eq!(error_code(&large), "BAD_USER_INPUT", "{large}");
    let message = large["errors"][0]["message"].as_str().unwrap();
    assert!(message.starts_with("query complexity"), "{message}");
    assert_eq!(skipped(&app), 0, "an Int variable always validates in full");
}

#[tokio::test]
async fn a_document_that_failed_validation_fails_it_every_time() {
    let app = TestApp::spawn().await;
    let query = "query($id: ID!) { node(id: $id) { id noSuchField } }";
    for _ in 0..3 {
        let refused = app.graphql(query, json!({ "id": "QXJ0aWNsZTox" })).await;
        assert_eq!(error_code(&refused), "BAD_USER_INPUT", "{refused}");
        assert!(
            refused["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("noSuchField"),
            "{refused}"
        );
    }
    assert_eq!(skipped(&app), 0);
}
