//! The README's GraphQL examples, as written: every one validates against the schema, and the
//! likes example shows what the README says it shows.

use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::likes::drain;

/// The README's `graphql` code blocks, in order.
fn readme_blocks() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() == "```graphql" {
            let block: Vec<&str> = lines.by_ref().take_while(|line| *line != "```").collect();
            blocks.push(block.join("\n"));
        }
    }
    blocks
}

/// The README block that defines operation `name`.
fn readme_block_with(name: &str) -> String {
    readme_blocks()
        .into_iter()
        .find(|block| {
            block.lines().any(|line| {
                line.split(|c: char| !c.is_alphanumeric())
                    .nth(1)
                    .is_some_and(|word| word == name)
                    && ["query ", "mutation ", "subscription "]
                        .iter()
                        .any(|kind| line.starts_with(kind))
            })
        })
        .unwrap_or_else(|| panic!("the README defines no operation {name}"))
}

#[tokio::test]
async fn every_graphql_example_in_the_readme_validates() {
    let app = TestApp::spawn().await;
    let blocks = readme_blocks();
    assert!(blocks.len() >= 8, "found only {} blocks", blocks.len());
    for block in blocks {
        // A query of its own selects something that runs over HTTP, so that the whole document,
        // subscriptions included, is validated.
        let document = format!("{block}\nquery ReadmeProbe {{ __typename }}");
        let response = app
            .post_raw(
                json!({ "query": document, "operationName": "ReadmeProbe" }).to_string(),
                None,
            )
            .await
            .1;
        assert_eq!(
            response,
            json!({ "data": { "__typename": "Query" } }),
            "{block}"
        );
    }
}

/// Runs the README's operation `name` with `variables`, as `token`.
async fn run(app: &TestApp, token: &str, name: &str, variables: Value) -> Value {
    let body =
        json!({ "query": readme_block_with(name), "operationName": name, "variables": variables });
    let (_, response) = app.post_raw(body.to_string(), Some(token)).await;
    assert!(response["errors"].is_null(), "{name}: {response}");
    response["data"].clone()
}

#[tokio::test]
async fn the_readmes_likes_example_shows_a_liked_comment_as_featured() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("ada").await;
    let article = run(&app, &token, "Publish", json!({})).await["publishArticle"]["id"].clone();
    // The article is read before anything is liked, so its (empty) featured list is cached.
    let before = run(&app, &token, "Article", json!({ "id": article })).await;
    assert_eq!(before["article"]["featuredComments"], json!([]));

    let comment =
        run(&app, &token, "Comment", json!({ "article": article })).await["addComment"]["id"]
            .clone();
    let liked = run(&app, &token, "Like", json!({ "id": comment })).await;
    assert_eq!(
        liked["like"],
        json!({ "liked": true, "likeCount": 1, "subjectId": comment })
    );
    drain(&app).await;

    let after = run(&app, &token, "Article", json!({ "id": article })).await;
    assert_eq!(
        after["article"]["featuredComments"],
        json!([{ "body": "Well argued.", "likeCount": 1, "author": { "handle": "ada" } }])
    );
    assert_eq!(after["article"]["commentCount"], 1);
}
