//! The follow graph: idempotent follow and unfollow, counts, viewerFollows, keyset lists.

use std::collections::HashSet;

use serde_json::json;

use crate::feed::{token, user_id, users};
use crate::helpers::{TestApp, error_code};

const FOLLOW: &str = "mutation($u: ID!) { follow(userId: $u) { following } }";
const UNFOLLOW: &str = "mutation($u: ID!) { unfollow(userId: $u) { following } }";
const COUNTS: &str = "query($h: String!) { user(handle: $h) {
    followerCount followingCount viewerFollows
} }";

#[tokio::test]
async fn following_many_times_at_once_counts_once_and_unfollowing_likewise() {
    let app = TestApp::spawn().await;
    let people = users(&app, "idem", 2).await;
    let (fan, star) = (people[0], people[1]);
    let fan_token = token(&app, fan);
    let variables = json!({ "u": user_id(star) });
    let follows = (0..100).map(|_| app.graphql_as(Some(&fan_token), FOLLOW, variables.clone()));
    for response in futures_util::future::join_all(follows).await {
        assert_eq!(response["data"]["follow"]["following"], true, "{response}");
    }
    let star_counts = app
        .graphql_as(Some(&fan_token), COUNTS, json!({ "h": "idem1" }))
        .await;
    assert_eq!(
        star_counts["data"]["user"]["followerCount"], 1,
        "{star_counts}"
    );
    assert_eq!(star_counts["data"]["user"]["viewerFollows"], true);
    let fan_counts = app.graphql(COUNTS, json!({ "h": "idem0" })).await;
    assert_eq!(fan_counts["data"]["user"]["followingCount"], 1);
    assert_eq!(fan_counts["data"]["user"]["viewerFollows"], false);

    let unfollows = (0..100).map(|_| app.graphql_as(Some(&fan_token), UNFOLLOW, variables.clone()));
    for response in futures_util::future::join_all(unfollows).await {
        assert_eq!(
            response["data"]["unfollow"]["following"], false,
            "{response}"
        );
    }
    let star_counts = app
        .graphql_as(Some(&fan_token), COUNTS, json!({ "h": "idem1" }))
        .await;
    assert_eq!(
        star_counts["data"]["user"]["followerCount"], 0,
        "{star_counts}"
    );
    assert_eq!(star_counts["data"]["user"]["viewerFollows"], false);
    assert_eq!(app.count("follows").await, 0);
}

#[tokio::test]
async fn self_follows_unknown_users_and_anonymous_follows_are_refused_and_change_nothing() {
    let app = TestApp::spawn().await;
    let people = users(&app, "bad", 1).await;
    let me = token(&app, people[0]);
    let own = app
        .graphql_as(Some(&me), FOLLOW, json!({ "u": user_id(people[0]) }))
        .await;
    assert_eq!(error_code(&own), "BAD_USER_INPUT", "{own}");
    let unknown = app
        .graphql_as(Some(&me), FOLLOW, json!({ "u": user_id(people[0] + 1000) }))
        .await;
    assert_eq!(error_code(&unknown), "NOT_FOUND", "{unknown}");
    let anonymous = app
        .graphql(FOLLOW, json!({ "u": user_id(people[0]) }))
        .await;
    assert_eq!(error_code(&anonymous), "UNAUTHENTICATED", "{anonymous}");
    let not_a_user = app
        .graphql_as(Some(&me), FOLLOW, json!({ "u": "QXJ0aWNsZTox" }))
        .await;
    assert_eq!(error_code(&not_a_user), "BAD_USER_INPUT", "{not_a_user}");
    assert_eq!(app.count("follows").await, 0);
    assert_eq!(app.count("follow_counts").await, 0);
}

#[tokio::test]
async fn followers_and_following_page_newest_first_without_repeats_or_gaps() {
    let app = TestApp::spawn().await;
    let people = users(&app, "list", 26).await;
    let star = people[0];
    for &fan in &people[1..] {
        let response = app
            .graphql_as(
                Some(&token(&app, fan)),
                FOLLOW,
                json!({ "u": user_id(star) }),
            )
            .await;
        assert_eq!(response["data"]["follow"]["following"], true, "{response}");
    }
    let query = "query($h: String!, $after: String) { user(handle: $h) {
        followers(first: 10, after: $after) {
            edges { node { id handle following(first: 5) { edges { node { handle } } } } }
            pageInfo { hasNextPage endCursor }
        }
    } }";
    let mut handles = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let response = app
            .graphql(query, json!({ "h": "list0", "after": after }))
            .await;
        let followers = &response["data"]["user"]["followers"];
        for edge in followers["edges"].as_array().unwrap() {
            handles.push(edge["node"]["handle"].as_str().unwrap().to_owned());
            assert_eq!(
                edge["node"]["following"]["edges"][0]["node"]["handle"],
                "list0"
            );
        }
        if followers["pageInfo"]["hasNextPage"] == false {
            break;
        }
        after = followers["pageInfo"]["endCursor"]
            .as_str()
            .map(str::to_owned);
    }
    let expected: Vec<String> = (1..26).rev().map(|i| format!("list{i}")).collect();
    assert_eq!(handles, expected, "not newest follow first");
    assert_eq!(handles.iter().collect::<HashSet<_>>().len(), 25);

    let wrong_walk = app
        .graphql(
            "query($h: String!, $after: String) { user(handle: $h) { following(after: $after) { edges { cursor } } } }",
            json!({ "h": "list1", "after": after }),
        )
        .await;
    assert_eq!(error_code(&wrong_walk), "BAD_USER_INPUT", "{wrong_walk}");
}
