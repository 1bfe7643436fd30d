use serde_json::json;

use crate::helpers::{PASSWORD, TestApp, error_code};

const VIEWER: &str = "{ viewer { handle isAdmin } }";

#[tokio::test]
async fn signing_up_returns_a_token_that_identifies_the_viewer() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("Alice").await;

    let response = app.graphql_as(Some(&token), VIEWER, json!({})).await;
    assert_eq!(response["data"]["viewer"]["handle"], "alice");
    assert_eq!(response["data"]["viewer"]["isAdmin"], false);

    let anonymous = app.graphql(VIEWER, json!({})).await;
    assert!(anonymous["data"]["viewer"].is_null(), "{anonymous}");
}

#[tokio::test]
async fn signing_in_checks_the_password() {
    let app = TestApp::spawn().await;
    app.sign_up("bob").await;
    let sign_in =
        "mutation($p: String!) { signIn(handle: \"BOB\", password: $p) { token user { handle } } }";

    let ok = app.graphql(sign_in, json!({ "p": PASSWORD })).await;
    assert_eq!(ok["data"]["signIn"]["user"]["handle"], "bob");

    let wrong = app
        .graphql(sign_in, json!({ "p": "not the password" }))
        .await;
    assert_eq!(error_code(&wrong), "UNAUTHENTICATED");
    let unknown = app
        .graphql(
            "mutation { signIn(handle: \"nobody\", password: \"whatever1\") { token } }",
            json!({}),
        )
        .await;
    assert_eq!(error_code(&unknown), "UNAUTHENTICATED");
    assert_eq!(
        wrong["errors"][0]["message"],
        unknown["errors"][0]["message"]
    );
}

#[tokio::test]
async fn a_malformed_token_is_unauthenticated_even_where_anonymous_is_allowed() {
    let app = TestApp::spawn().await;
    for token in ["garbage", "eyJhbGciOiJIUzI1NiJ9.e30.AAAA"] {
        let (status, response) = app
            .post_raw(json!({ "query": VIEWER }).to_string(), Some(token))
            .await;
        assert_eq!(status, 401);
        assert_eq!(error_code(&response), "UNAUTHENTICATED");
    }
}

#[tokio::test]
async fn an_expired_token_is_unauthenticated() {
    let app = TestApp::spawn().await;
    app.sign_up("carol").await;
    let two_weeks_ago = chrono::Utc::now().timestamp() - 14 * 24 * 3600;
    let expired = app.state.tokens.issue_at(1, two_weeks_ago).unwrap();

    let (status, response) = app
        .post_raw(json!({ "query": VIEWER }).to_string(), Some(&expired))
        .await;
    assert_eq!(status, 401);
    assert_eq!(error_code(&response), "UNAUTHENTICATED");
    assert!(
        response["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
}

#[tokio::test]
async fn a_token_from_another_deployment_is_unauthenticated() {
    let app = TestApp::spawn().await;
    let other = TestApp::spawn().await;
    let (foreign_token, _) = other.sign_up("dave").await;

    let (status, response) = app
        .post_raw(json!({ "query": VIEWER }).to_string(), Some(&foreign_token))
        .await;
    assert_eq!(status, 401);
    assert_eq!(error_code(&response), "UNAUTHENTICATED");
}

#[tokio::test]
async fn invalid_sign_up_input_is_bad_user_input_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let sign_up =
        "mutation($h: String!, $p: String!) { signUp(handle: $h, password: $p) { token } }";
    let long_password = "p".repeat(129);
    let cases = [
        ("ab", PASSWORD, "handle"),
        ("no spaces", PASSWORD, "handle"),
        ("fine_handle", "short", "password"),
        ("fine_handle", long_password.as_str(), "password"),
    ];
    for (handle, password, field) in cases {
        let response = app
            .graphql(sign_up, json!({ "h": handle, "p": password }))
            .await;
        assert_eq!(
            error_code(&response),
            "BAD_USER_INPUT",
            "{handle}/{password}"
        );
        assert_eq!(response["errors"][0]["extensions"]["field"], field);
    }
    assert_eq!(app.count("users").await, 0);
}

#[tokio::test]
async fn concurrent_sign_ups_of_one_handle_create_one_user() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    let attempts = (0..40).map(|i| {
        let app = app.clone();
        tokio::spawn(async move {
            let handle = if i % 2 == 0 { "Erin" } else { "erin" };
            app.graphql(
                "mutation($h: String!, $p: String!) { signUp(handle: $h, password: $p) { token } }",
                json!({ "h": handle, "p": PASSWORD }),
            )
            .await
        })
    });
    let responses = futures_util::future::join_all(attempts).await;
    let succeeded = responses
        .iter()
        .filter(|r| r.as_ref().unwrap()["data"]["signUp"].is_object())
        .count();
    assert_eq!(succeeded, 1);
    for response in responses.iter().map(|r| r.as_ref().unwrap()) {
        if response["errors"].is_array() {
            assert_eq!(error_code(response), "BAD_USER_INPUT", "{response}");
        }
    }
    assert_eq!(app.count("users").await, 1);
}

#[tokio::test]
async fn authentication_attempts_are_rate_limited_per_client() {
    let app = TestApp::spawn_with(|config| config.auth_attempts_per_minute = 3).await;
    let sign_in = "mutation { signIn(handle: \"frank\", password: \"wrong-password\") { token } }";
    for _ in 0..3 {
        assert_eq!(
            error_code(&app.graphql(sign_in, json!({})).await),
            "UNAUTHENTICATED"
        );
    }
    let limited = app.graphql(sign_in, json!({})).await;
    assert_eq!(error_code(&limited), "RATE_LIMITED");
    let retry_after = limited["errors"][0]["extensions"]["retryAfterSeconds"]
        .as_u64()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{limited}");
}

#[tokio::test]
async fn the_admin_role_is_read_fresh_from_sql() {
    let app = TestApp::spawn().await;
    let (_, user_id) = app.sign_up("grace").await;
    let accounts = &app.state.services.accounts;
    let id =
        pulse::graphql::ids::decode(&user_id.clone().into(), pulse::accounts::USER, "id").unwrap();

    assert_eq!(
        accounts.require_admin(id).await.unwrap_err().code(),
        "FORBIDDEN"
    );
    accounts.set_admin("grace", true).await.unwrap();
    accounts.require_admin(id).await.unwrap();
    let unknown = accounts.set_admin("nobody_here", true).await.unwrap_err();
    assert_eq!(unknown.code(), "NOT_FOUND");
    assert_eq!(unknown.to_string(), "no user has the handle `nobody_here`");
}

#[tokio::test]
async fn signing_in_or_up_shows_the_user_their_own_admin_role() {
    let app = TestApp::spawn().await;
    let query = "mutation($h: String!, $p: String!) { signUp(handle: $h, password: $p) { user { isAdmin } } }";
    let response = app
        .graphql(query, json!({ "h": "kim", "p": crate::helpers::PASSWORD }))
        .await;
    assert_eq!(
        response["data"]["signUp"]["user"]["isAdmin"], false,
        "{response}"
    );
    app.state
        .services
        .accounts
        .set_admin("kim", true)
        .await
        .unwrap();
    let query = "mutation($h: String!, $p: String!) { signIn(handle: $h, password: $p) { user { isAdmin } } }";
    let response = app
        .graphql(query, json!({ "h": "kim", "p": crate::helpers::PASSWORD }))
        .await;
    assert_eq!(
        response["data"]["signIn"]["user"]["isAdmin"], true,
        "{response}"
    );
}

#[tokio::test]
async fn admins_named_in_the_config_are_granted_at_start_up() {
    let app = TestApp::spawn().await;
    let (token, _) = app.sign_up("heidi").await;
    let mut config = app.config.clone();
    app.stop().await.unwrap();

    config.admins = vec!["Heidi".into()];
    let restarted = TestApp::start(config).await;
    let response = restarted.graphql_as(Some(&token), VIEWER, json!({})).await;
    assert_eq!(response["data"]["viewer"]["isAdmin"], true, "{response}");
}

#[tokio::test]
async fn nobody_sees_whether_another_user_is_an_admin() {
    let app = TestApp::spawn().await;
    app.sign_up("ivan").await;
    app.state
        .services
        .accounts
        .set_admin("ivan", true)
        .await
        .unwrap();
    let (judy, _) = app.sign_up("judy").await;

    let response = app
        .graphql_as(
            Some(&judy),
            "{ user(handle: \"ivan\") { handle isAdmin } }",
            json!({}),
        )
        .await;
    assert_eq!(response["data"]["user"]["handle"], "ivan");
    assert!(response["data"]["user"]["isAdmin"].is_null(), "{response}");
}
