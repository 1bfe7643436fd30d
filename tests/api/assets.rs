//! The embedded browser bundle: the demo app at `/`, GraphiQL at `GET /graphql` for a browser,
//! hashed assets under `/assets/`, each precompressed and cached as its name allows.

use reqwest::StatusCode;
use reqwest::header::{
    ACCEPT, ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_SECURITY_POLICY,
    CONTENT_TYPE, ETAG, IF_NONE_MATCH, VARY,
};

use crate::helpers::TestApp;

const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

/// A file of the committed bundle, as the build wrote it.
fn bundle_file(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("frontend-demo/dist")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The `/assets/…` path of the first module script a page loads whose name starts with `stem`.
fn script_of(html: &str, stem: &str) -> String {
    let start = html
        .find(&format!("/assets/{stem}-"))
        .unwrap_or_else(|| panic!("the page loads no {stem} script: {html}"));
    let end = start + html[start..].find('"').expect("a quoted src");
    html[start..end].to_owned()
}

/// Every script a page loads or preloads.
fn scripts_of(html: &str) -> Vec<String> {
    html.split('"')
        .filter(|part| part.starts_with("/assets/") && part.ends_with(".js"))
        .map(str::to_owned)
        .collect()
}

async fn get(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = app.http.get(app.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

fn header(response: &reqwest::Response, name: reqwest::header::HeaderName) -> &str {
    response
        .headers()
        .get(&name)
        .map(|value| value.to_str().unwrap())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_demo_app_is_served_at_the_root_and_revalidated_on_every_load() {
    let app = TestApp::spawn().await;
    let page = get(&app, "/", &[]).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(header(&page, CONTENT_TYPE), "text/html; charset=utf-8");
    assert_eq!(header(&page, CACHE_CONTROL), "no-cache");
    assert_eq!(header(&page, VARY), "Accept-Encoding");
    assert!(header(&page, CONTENT_SECURITY_POLICY).contains("default-src 'self'"));
    assert_eq!(header(&page, CONTENT_ENCODING), "");
    let etag = header(&page, ETAG).to_owned();
    assert!(etag.starts_with('"') && etag.len() > 20, "{etag}");
    assert_eq!(page.bytes().await.unwrap(), bundle_file("index.html"));

    let again = get(&app, "/", &[(IF_NONE_MATCH.as_str(), &etag)]).await;
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(header(&again, ETAG), etag);
    assert!(again.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn hashed_assets_are_immutable_and_sent_in_the_best_accepted_encoding() {
    let app = TestApp::spawn().await;
    let html = get(&app, "/", &[]).await.text().await.unwrap();
    let script = script_of(&html, "app");
    let name = script.trim_start_matches('/');

    let brotli = get(
        &app,
        &script,
        &[(ACCEPT_ENCODING.as_str(), "gzip, deflate, br")],
    )
    .await;
    assert_eq!(brotli.status(), StatusCode::OK);
    assert_eq!(
        header(&brotli, CACHE_CONTROL),
        "public, max-age=31536000, immutable"
    );
    assert_eq!(
        header(&brotli, CONTENT_TYPE),
        "text/javascript; charset=utf-8"
    );
    assert_eq!(header(&brotli, CONTENT_ENCODING), "br");
    assert_eq!(header(&brotli, VARY), "Accept-Encoding");
    let brotli_etag = header(&brotli, ETAG).to_owned();
    assert_eq!(
        brotli.bytes().await.unwrap(),
        bundle_file(&format!("{name}.br"))
    );

    let gzip = get(&app, &script, &[(ACCEPT_ENCODING.as_str(), "gzip")]).await;
    assert_eq!(header(&gzip, CONTENT_ENCODING), "gzip");
    let gzip_etag = header(&gzip, ETAG).to_owned();
    assert_eq!(
        gzip.bytes().await.unwrap(),
        bundle_file(&format!("{name}.gz"))
    );

    let refused = get(
        &app,
        &script,
        &[(ACCEPT_ENCODING.as_str(), "br;q=0, gzip;q=0")],
    )
    .await;
    assert_eq!(header(&refused, CONTENT_ENCODING), "");
    let identity_etag = header(&refused, ETAG).to_owned();
    assert_eq!(refused.bytes().await.unwrap(), bundle_file(name));

    // One file, three representations: a cache must never answer one with another's validator.
    assert_ne!(brotli_etag, gzip_etag);
    assert_ne!(gzip_etag, identity_etag);
    let revalidated = get(
        &app,
        &script,
        &[
            (ACCEPT_ENCODING.as_str(), "gzip"),
            (IF_NONE_MATCH.as_str(), &gzip_etag),
        ],
    )
    .await;
    assert_eq!(revalidated.status(), StatusCode::NOT_MODIFIED);
    let other_encoding = get(
        &app,
        &script,
        &[
            (ACCEPT_ENCODING.as_str(), "br"),
            (IF_NONE_MATCH.as_str(), &gzip_etag),
        ],
    )
    .await;
    assert_eq!(other_encoding.status(), StatusCode::OK);
}

#[tokio::test]
async fn unknown_paths_are_404() {
    let app = TestApp::spawn().await;
    for path in [
        "/assets/app-00000000.js",
        "/assets/../Cargo.toml",
        "/index.html.br",
        "/feed",
        "/assets/",
    ] {
        let response = get(&app, path, &[]).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn a_browser_gets_the_self_hosted_graphiql_wired_for_subscriptions() {
    let app = TestApp::spawn().await;
    let page = get(&app, "/graphql", &[(ACCEPT.as_str(), BROWSER_ACCEPT)]).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(header(&page, CACHE_CONTROL), "no-cache");
    let html = page.text().await.unwrap();
    assert!(html.contains("<title>Pulse GraphiQL</title>"), "{html}");
    // Every script and stylesheet comes from this server.
    assert!(!html.contains("://"), "the page names another host: {html}");
    let mut code = String::new();
    for script in scripts_of(&html) {
        code += &get(&app, &script, &[]).await.text().await.unwrap();
    }
    assert!(code.contains("/graphql/ws"), "subscriptions are not wired");

    let query = get(
        &app,
        "/graphql?query=%7B__typename%7D",
        &[(ACCEPT.as_str(), BROWSER_ACCEPT)],
    )
    .await;
    assert_eq!(
        query.text().await.unwrap(),
        r#"{"data":{"__typename":"Query"}}"#
    );
}
