//! Persisted documents: Apollo's automatic persisted queries shared by every process through
//! Redis, and trusted-documents mode, where only registered documents run.

use pulse::documents::{PersistedMode, sha256_hex};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;

fn persisted(hash: &str) -> Value {
    json!({ "persistedQuery": { "version": 1, "sha256Hash": hash } })
}

async fn get_by_hash(app: &TestApp, hash: &str, variables: Option<Value>) -> (StatusCode, Value) {
    let mut parameters = vec![("extensions", persisted(hash).to_string())];
    if let Some(variables) = variables {
        parameters.push(("variables", variables.to_string()));
    }
    let response = app
        .http
        .get(app.url("/graphql"))
        .query(&parameters)
        .send()
        .await
        .unwrap();
    (response.status(), response.json().await.unwrap())
}

async fn post(app: &TestApp, body: Value) -> Value {
    app.post_raw(body.to_string(), None).await.1
}

fn code(body: &Value) -> &str {
    body["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_default()
}

const QUERY: &str = "query Recent($n: Int) { articles(first: $n) { edges { node { title } } } }";

#[tokio::test]
async fn a_query_registered_through_one_process_is_served_by_another_by_hash() {
    let first = TestApp::spawn().await;
    let (token, _) = first.sign_up("apq_author").await;
    first.publish(&token, "Persisted").await;
    // A second process on the same SQL and Redis.
    let second = TestApp::start(first.config.clone()).await;
    let hash = sha256_hex(QUERY);

    let (_, unknown) = get_by_hash(&second, &hash, Some(json!({ "n": 1 }))).await;
    assert_eq!(code(&unknown), "PERSISTED_QUERY_NOT_FOUND");
    assert_eq!(unknown["errors"][0]["message"], "PersistedQueryNotFound");

    let registered = post(
        &first,
        json!({ "query": QUERY, "variables": { "n": 1 }, "extensions": persisted(&hash) }),
    )
    .await;
    assert_eq!(
        registered["data"]["articles"]["edges"][0]["node"]["title"],
        "Persisted"
    );

    let (status, by_hash) = get_by_hash(&second, &hash, Some(json!({ "n": 1 }))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        by_hash["data"]["articles"]["edges"][0]["node"]["title"], "Persisted",
        "{by_hash}"
    );
}

#[tokio::test]
async fn a_hash_that_does_not_match_its_document_registers_nothing() {
    let app = TestApp::spawn().await;
    let other = sha256_hex("{ __typename }");
    let refused = post(
        &app,
        json!({ "query": QUERY, "extensions": persisted(&other) }),
    )
    .await;
    assert_eq!(code(&refused), "BAD_USER_INPUT");
    assert!(refused["data"].is_null());
    let (_, lookup) = get_by_hash(&app, &other, None).await;
    assert_eq!(
        code(&lookup),
        "PERSISTED_QUERY_NOT_FOUND",
        "the wrong text was not kept under the hash"
    );

    // A document that does not validate is not kept for anyone either.
    let invalid = "{ noSuchField }";
    let hash = sha256_hex(invalid);
    post(
        &app,
        json!({ "query": invalid, "extensions": persisted(&hash) }),
    )
    .await;
    let (_, lookup) = get_by_hash(&app, &hash, None).await;
    assert_eq!(code(&lookup), "PERSISTED_QUERY_NOT_FOUND");

    for malformed in [
        json!({ "version": 1, "sha256Hash": "../../x" }),
        json!({ "version": 2, "sha256Hash": other }),
    ] {
        let response = post(
            &app,
            json!({ "query": QUERY, "extensions": { "persistedQuery": malformed } }),
        )
        .await;
        assert_eq!(code(&response), "BAD_USER_INPUT", "{response}");
    }
}

#[tokio::test]
async fn with_trusted_documents_only_registered_documents_run() {
    let app = TestApp::spawn_with(|config| config.persisted_queries = PersistedMode::Trusted).await;
    let refused = post(&app, json!({ "query": QUERY, "variables": { "n": 1 } })).await;
    assert_eq!(code(&refused), "DOCUMENT_NOT_TRUSTED", "{refused}");
    assert!(refused["data"].is_null());

    let (hash, added) = app
        .state
        .services
        .documents
        .add_trusted(Some("Recent"), QUERY)
        .await
        .unwrap();
    assert!(added);
    assert_eq!(hash, sha256_hex(QUERY));
    let (_, again) = app
        .state
        .services
        .documents
        .add_trusted(Some("Recent"), QUERY)
        .await
        .unwrap();
    assert!(!again, "registering twice is harmless");

    // Registered meanwhile in SQL: found within the reload interval, by hash and in full.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, by_hash) = get_by_hash(&app, &hash, Some(json!({ "n": 1 }))).await;
    assert_eq!(status, StatusCode::OK, "{by_hash}");
    assert!(by_hash["data"]["articles"]["edges"].is_array(), "{by_hash}");
    let in_full = post(&app, json!({ "query": QUERY, "variables": { "n": 1 } })).await;
    assert!(in_full["errors"].is_null(), "{in_full}");

    // Anything else, even a one-character change, is refused.
    let edited = post(
        &app,
        json!({ "query": format!("{QUERY} "), "variables": { "n": 1 } }),
    )
    .await;
    assert_eq!(code(&edited), "DOCUMENT_NOT_TRUSTED");
}

#[tokio::test]
async fn with_persisted_queries_off_a_hash_is_refused() {
    let app = TestApp::spawn_with(|config| config.persisted_queries = PersistedMode::Off).await;
    let response = post(
        &app,
        json!({ "query": QUERY, "extensions": persisted(&sha256_hex(QUERY)) }),
    )
    .await;
    assert_eq!(code(&response), "PERSISTED_QUERY_NOT_SUPPORTED");
}

async fn documents_command(app: &TestApp, args: &[&str]) -> std::process::Output {
    crate::helpers::pulse_command()
        .arg("documents")
        .args(args)
        .env("DATABASE_URL", app.config.database_url())
        .env("REDIS_URL", crate::helpers::redis_url())
        .env(
            "PULSE_REDIS_PREFIX",
            app.config.redis_prefix.as_deref().unwrap(),
        )
        .env("PULSE_DATA_DIR", &app.config.data_dir)
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_documents_command_registers_lists_and_removes_and_refuses_what_does_not_parse() {
    let app = TestApp::spawn_with(|config| config.persisted_queries = PersistedMode::Trusted).await;
    let directory = app.config.data_dir.join("documents");
    std::fs::create_dir_all(&directory).unwrap();
    let good = directory.join("Recent.graphql");
    std::fs::write(&good, QUERY).unwrap();
    let broken = directory.join("Broken.graphql");
    std::fs::write(&broken, "{ articles(").unwrap();
    let manifest = directory.join("manifest.json");
    let typename = "query Type { __typename }";
    let apollo = json!({
        "format": "apollo-persisted-query-manifest",
        "version": 1,
        "operations": [{ "id": sha256_hex(typename), "name": "Type", "type": "query", "body": typename }]
    });
    std::fs::write(&manifest, apollo.to_string()).unwrap();

    let refused = documents_command(
        &app,
        &["add", good.to_str().unwrap(), broken.to_str().unwrap()],
    )
    .await;
    assert!(
        !refused.status.success(),
        "a document that does not parse fails the command"
    );
    let listed = documents_command(&app, &["list"]).await;
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "",
        "nothing was added"
    );

    let added = documents_command(&app, &["add", good.to_str().unwrap()]).await;
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let from_manifest =
        documents_command(&app, &["add", "--manifest", manifest.to_str().unwrap()]).await;
    assert!(
        from_manifest.status.success(),
        "{}",
        String::from_utf8_lossy(&from_manifest.stderr)
    );
    let listed = String::from_utf8(documents_command(&app, &["list"]).await.stdout).unwrap();
    assert!(
        listed.contains(&format!("{} Recent ", sha256_hex(QUERY))),
        "{listed}"
    );
    assert!(
        listed.contains(&format!("{} Type ", sha256_hex(typename))),
        "{listed}"
    );

    let by_hash = post(
        &app,
        json!({ "extensions": persisted(&sha256_hex(typename)) }),
    )
    .await;
    assert_eq!(by_hash["data"]["__typename"], "Query", "{by_hash}");

    let removed = documents_command(&app, &["remove", &sha256_hex(QUERY)]).await;
    assert!(removed.status.success());
    let listed = String::from_utf8(documents_command(&app, &["list"]).await.stdout).unwrap();
    assert!(!listed.contains(&sha256_hex(QUERY)), "{listed}");
    let again = documents_command(&app, &["remove", &sha256_hex(QUERY)]).await;
    assert!(
        !again.status.success(),
        "removing what is not there says so"
    );
}
