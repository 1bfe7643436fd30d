use std::collections::HashSet;
use std::sync::Arc;

use pulse::graphql::ids;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{Value, json};

use crate::helpers::{TestApp, article_row, error_code};

const EDIT: &str = "mutation($id: ID!, $title: String) { editArticle(id: $id, input: { title: $title }) { id title viewCount } }";

#[tokio::test]
async fn publishing_needs_a_signed_in_user() {
    let app = TestApp::spawn().await;
    let response = app
        .graphql(
            "mutation { publishArticle(input: { title: \"t\", body: \"b\" }) { id } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&response), "UNAUTHENTICATED");
    assert_eq!(app.count("articles").await, 0);
}

#[tokio::test]
async fn a_published_article_reads_back_everywhere() {
    let app = TestApp::spawn().await;
    let (token, user_id) = app.sign_up("kim").await;
    let id = app.publish(&token, "  Hello, world ").await;

    let by_id = app
        .graphql(
            "query($id: ID!) { article(id: $id) { id title author { id handle } viewCount } }",
            json!({ "id": id }),
        )
        .await;
    let article = &by_id["data"]["article"];
    assert_eq!(article["title"], "Hello, world");
    assert_eq!(article["author"]["id"], user_id.as_str());
    assert_eq!(article["viewCount"], 0);

    let node = app
        .graphql(
            "query($id: ID!) { node(id: $id) { id ... on Article { title } } }",
            json!({ "id": id }),
        )
        .await;
    assert_eq!(node["data"]["node"]["title"], "Hello, world");
    let user_node = app
        .graphql("query($id: ID!) { node(id: $id) { ... on User { handle articles { edges { node { id } } } } } }", json!({ "id": user_id }))
        .await;
    assert_eq!(user_node["data"]["node"]["handle"], "kim");
    assert_eq!(
        user_node["data"]["node"]["articles"]["edges"][0]["node"]["id"],
        id.as_str()
    );
}

#[tokio::test]
async fn unknown_and_malformed_ids_are_told_apart() {
    let app = TestApp::spawn().await;
    let (_, user_id) = app.sign_up("lee").await;
    let query = "query($id: ID!) { article(id: $id) { id } }";

    let unknown = app
        .graphql(
            query,
            json!({ "id": ids::encode(pulse::articles::ARTICLE, 999_999).0 }),
        )
        .await;
    assert!(
        unknown["data"]["article"].is_null() && unknown["errors"].is_null(),
        "{unknown}"
    );
    for bad in ["%%%", "QXJ0aWNsZTphYmM", user_id.as_str()] {
        let response = app.graphql(query, json!({ "id": bad })).await;
        assert_eq!(error_code(&response), "BAD_USER_INPUT", "{bad}: {response}");
    }
}

#[tokio::test]
async fn invalid_article_input_is_bad_user_input_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("mia").await;
    let publish = "mutation($t: String!, $b: String!) { publishArticle(input: { title: $t, body: $b }) { id } }";
    let long_title = "t".repeat(201);
    let long_body = "b".repeat(50_001);
    for (title, body, field) in [
        ("  ", "body", "title"),
        (long_title.as_str(), "body", "title"),
        ("title", "", "body"),
        ("title", long_body.as_str(), "body"),
    ] {
        let response = app
            .graphql_as(Some(&token), publish, json!({ "t": title, "b": body }))
            .await;
        assert_eq!(error_code(&response), "BAD_USER_INPUT");
        assert_eq!(response["errors"][0]["extensions"]["field"], field);
    }
    assert_eq!(app.count("articles").await, 0);

    let id = app.publish(&token, "original").await;
    let response = app
        .graphql_as(Some(&token), EDIT, json!({ "id": id, "title": "" }))
        .await;
    assert_eq!(error_code(&response), "BAD_USER_INPUT");
    let nothing = app
        .graphql_as(Some(&token), EDIT, json!({ "id": id }))
        .await;
    assert_eq!(error_code(&nothing), "BAD_USER_INPUT");
    let article = app.stored_article(&id).await;
    assert_eq!(article.title, "original");
}

#[tokio::test]
async fn editing_someone_elses_article_is_forbidden_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let (author, _) = app.sign_up("nina").await;
    let (intruder, _) = app.sign_up("oscar").await;
    let id = app.publish(&author, "mine").await;

    let response = app
        .graphql_as(
            Some(&intruder),
            EDIT,
            json!({ "id": id, "title": "yours now" }),
        )
        .await;
    assert_eq!(error_code(&response), "FORBIDDEN");
    let anonymous = app
        .graphql(EDIT, json!({ "id": id, "title": "anyone's" }))
        .await;
    assert_eq!(error_code(&anonymous), "UNAUTHENTICATED");
    let missing = app
        .graphql_as(
            Some(&author),
            EDIT,
            json!({ "id": ids::encode(pulse::articles::ARTICLE, 424_242).0, "title": "x" }),
        )
        .await;
    assert_eq!(error_code(&missing), "NOT_FOUND");

    let article = app.stored_article(&id).await;
    assert_eq!(article.title, "mine");

    let own = app
        .graphql_as(
            Some(&author),
            EDIT,
            json!({ "id": id, "title": "still mine" }),
        )
        .await;
    assert_eq!(own["data"]["editArticle"]["title"], "still mine");
}

/// The view flusher adds to `view_count` while authors edit; an edit must never write the counter.
#[tokio::test]
async fn editing_leaves_a_concurrently_changed_view_count_intact() {
    let app = Arc::new(TestApp::spawn().await);
    let (token, _) = app.sign_up("pat").await;
    let id = app.publish(&token, "counted").await;
    let row = article_row(&id);
    const INCREMENTS: i64 = 150;
    const EDITS: usize = 60;

    let counter = {
        let db = app.state.db.clone();
        tokio::spawn(async move {
            for _ in 0..INCREMENTS {
                db.execute_raw(Statement::from_string(
                    db.get_database_backend(),
                    format!("UPDATE articles SET view_count = view_count + 1 WHERE id = {row}"),
                ))
                .await
                .unwrap();
            }
        })
    };
    let editors = (0..EDITS).map(|i| {
        let (app, token, id) = (app.clone(), token.clone(), id.clone());
        tokio::spawn(async move {
            let response = app
                .graphql_as(
                    Some(&token),
                    EDIT,
                    json!({ "id": id, "title": format!("edit {i}") }),
                )
                .await;
            assert!(response["errors"].is_null(), "{response}");
        })
    });
    let edits = futures_util::future::join_all(editors);
    let (counted, edits) = tokio::join!(counter, edits);
    counted.unwrap();
    edits.into_iter().for_each(|edit| edit.unwrap());

    let article = app.state.services.articles.get(row).await.unwrap().unwrap();
    assert_eq!(article.view_count, INCREMENTS);
    assert!(article.title.starts_with("edit "));
}

async fn walk_all_pages(app: &TestApp, page_size: usize) -> Vec<i64> {
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let response = app
            .graphql(
                "query($first: Int, $after: String) { articles(first: $first, after: $after) { edges { cursor node { id } } pageInfo { hasNextPage endCursor } } }",
                json!({ "first": page_size, "after": after }),
            )
            .await;
        let connection = &response["data"]["articles"];
        let edges = connection["edges"]
            .as_array()
            .unwrap_or_else(|| panic!("{response}"));
        seen.extend(
            edges
                .iter()
                .map(|edge| article_row(edge["node"]["id"].as_str().unwrap())),
        );
        if connection["pageInfo"]["hasNextPage"] != Value::Bool(true) {
            return seen;
        }
        after = connection["pageInfo"]["endCursor"]
            .as_str()
            .map(str::to_owned);
    }
}

#[tokio::test]
async fn keyset_pagination_returns_every_article_once_while_others_insert() {
    let app = Arc::new(TestApp::spawn().await);
    let (token, _) = app.sign_up("quinn").await;
    let existing: HashSet<i64> = app
        .publish_many(&token, "before ", 90)
        .await
        .iter()
        .map(|id| article_row(id))
        .collect();

    let writers = (0..4).map(|w| {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move {
            for i in 0..20 {
                app.publish(&token, &format!("during {w}/{i}")).await;
            }
        })
    });
    let writers = futures_util::future::join_all(writers);
    let walks = futures_util::future::join_all((0..3).map(|_| walk_all_pages(&app, 7)));
    let (writers, walks) = tokio::join!(writers, walks);
    writers.into_iter().for_each(|writer| writer.unwrap());

    for walk in walks {
        let unique: HashSet<_> = walk.iter().copied().collect();
        assert_eq!(unique.len(), walk.len(), "an article came twice");
        assert!(
            walk.windows(2).all(|pair| pair[0] > pair[1]),
            "not newest first"
        );
        assert!(
            existing.is_subset(&unique),
            "an article that existed throughout was skipped"
        );
    }
    assert_eq!(walk_all_pages(&app, 100).await.len(), 90 + 80);
}

#[tokio::test]
async fn pages_are_bounded_and_filtered_by_author() {
    let app = TestApp::spawn().await;
    let (ruth, ruth_id) = app.sign_up("ruth").await;
    let (sam, _) = app.sign_up("sam").await;
    for i in 0..3 {
        app.publish(&ruth, &format!("ruth {i}")).await;
        app.publish(&sam, &format!("sam {i}")).await;
    }

    let too_big = app
        .graphql("{ articles(first: 101) { edges { cursor } } }", json!({}))
        .await;
    assert_eq!(error_code(&too_big), "BAD_USER_INPUT");
    let bad_cursor = app
        .graphql(
            "{ articles(after: \"nope\") { edges { cursor } } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&bad_cursor), "BAD_USER_INPUT");

    let by_ruth = app
        .graphql("query($a: ID) { articles(authorId: $a) { edges { node { title author { handle } } } } }", json!({ "a": ruth_id }))
        .await;
    let edges = by_ruth["data"]["articles"]["edges"].as_array().unwrap();
    assert_eq!(edges.len(), 3);
    assert!(
        edges
            .iter()
            .all(|edge| edge["node"]["author"]["handle"] == "ruth")
    );
    assert_eq!(edges[0]["node"]["title"], "ruth 2");
}

#[tokio::test]
async fn a_cursor_from_another_list_is_bad_input() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("rhea").await;
    app.publish_many(&token, "mine ", 3).await;
    let response = app
        .graphql_as(
            Some(&token),
            "{ viewer { articles(first: 1) { pageInfo { endCursor } } } }",
            json!({}),
        )
        .await;
    let cursor = response["data"]["viewer"]["articles"]["pageInfo"]["endCursor"]
        .as_str()
        .unwrap_or_else(|| panic!("{response}"))
        .to_owned();

    let own_list = app
        .graphql_as(
            Some(&token),
            "query($after: String) { viewer { articles(first: 5, after: $after) { edges { node { title } } } } }",
            json!({ "after": cursor }),
        )
        .await;
    assert_eq!(
        own_list["data"]["viewer"]["articles"]["edges"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "{own_list}"
    );
    let other_list = app
        .graphql(
            "query($after: String) { articles(first: 5, after: $after) { edges { node { id } } } }",
            json!({ "after": cursor }),
        )
        .await;
    assert_eq!(error_code(&other_list), "BAD_USER_INPUT", "{other_list}");
    assert_eq!(other_list["errors"][0]["extensions"]["field"], "after");

    let user_id = app
        .graphql_as(Some(&token), "{ viewer { id } }", json!({}))
        .await["data"]["viewer"]["id"]
        .clone();
    let same_walk = app
        .graphql(
            "query($after: String, $a: ID) { articles(first: 5, after: $after, authorId: $a) { edges { node { id } } } }",
            json!({ "after": cursor, "a": user_id }),
        )
        .await;
    assert_eq!(
        same_walk["data"]["articles"]["edges"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "one author's list is the walk `User.articles` pages: {same_walk}"
    );
}

#[tokio::test]
async fn an_id_in_padded_base64_names_the_same_article_as_the_unpadded_one() {
    use base64::Engine as _;
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("padder").await;
    // Ten articles, so the last one's id is `Article:10`: the one `btoa` pads with `==`.
    let ids = app.publish_many(&token, "padded ", 10).await;
    let unpadded = ids.last().unwrap().clone();
    let padded = base64::engine::general_purpose::STANDARD.encode(format!(
        "Article:{}",
        crate::helpers::article_row(&unpadded)
    ));
    assert!(padded.ends_with('='), "{padded}");
    let read = "query($id: ID!) { article(id: $id) { id title }
        node(id: $id) { ... on Article { title } } }";
    for id in [&unpadded, &padded] {
        let response = app.graphql(read, json!({ "id": id })).await;
        assert_eq!(
            response,
            json!({ "data": {
                "article": { "id": unpadded, "title": "padded 9" },
                "node": { "title": "padded 9" } } }),
            "{id}"
        );
    }
}
