//! The browser side, built into the binary: the demo app at `/`, GraphiQL for a browser's
//! `GET /graphql`, and their assets under `/assets/`.
//!
//! `frontend-demo` (Vite) builds them into `frontend-demo/dist`, which is committed, with a gzip
//! and a brotli copy beside every file that compresses well; the binary embeds the directory as
//! it is, so `pulse serve` needs no Node and no second web server. Asset names carry their
//! content's hash, so browsers may keep them for a year; the two HTML pages name the current
//! assets and are revalidated on every load (cheap: their ETag answers 304). The demo app routes
//! in the URL's fragment (`/#/feed`), so the server knows no page paths: anything else is a 404.

use std::borrow::Cow;

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rust_embed::{EmbeddedFile, RustEmbed};

#[derive(RustEmbed)]
#[folder = "frontend-demo/dist"]
struct Bundle;

const APP_PAGE: &str = "index.html";
const GRAPHIQL_PAGE: &str = "graphiql.html";

/// What the pages may load: only this origin (the API included), plus the inline styles and
/// `data:` fonts that GraphiQL's editor uses. A page that tried another host would be refused.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; \
     font-src 'self' data:; img-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; \
     object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

/// `GET /`: the demo app.
pub async fn app(headers: HeaderMap) -> Response {
    page(APP_PAGE, &headers)
}

/// GraphiQL, for a browser's `GET /graphql` without a query.
pub fn graphiql(headers: &HeaderMap) -> Response {
    page(GRAPHIQL_PAGE, headers)
}

/// `GET /assets/{*path}`: a hashed script, stylesheet, worker or font.
pub async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&format!("assets/{path}"), &headers, Caching::Immutable)
}

fn page(name: &str, headers: &HeaderMap) -> Response {
    let mut response = serve(name, headers, Caching::Revalidate);
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

#[derive(Clone, Copy)]
enum Caching {
    /// The name changes with the content: keep it for a year.
    Immutable,
    /// The name stays while the content changes with each build: ask every time.
    Revalidate,
}

impl Caching {
    fn header(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Caching::Immutable => "public, max-age=31536000, immutable",
            Caching::Revalidate => "no-cache",
        })
    }
}

/// A stored encoding of a file: the precompressed copies sit beside it as `<name>.br`, `.gz`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Encoding {
    Brotli,
    Gzip,
    Identity,
}

impl Encoding {
    fn suffix(self) -> &'static str {
        match self {
            Encoding::Brotli => ".br",
            Encoding::Gzip => ".gz",
            Encoding::Identity => "",
        }
    }

    fn token(self) -> &'static str {
        match self {
            Encoding::Brotli => "br",
            Encoding::Gzip => "gzip",
            Encoding::Identity => "identity",
        }
    }
}

fn serve(name: &str, headers: &HeaderMap, caching: Caching) -> Response {
    let Some(original) = Bundle::get(name) else {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    };
    let digest = original.metadata.sha256_hash();
    let accepted = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let (encoding, file) = [Encoding::Brotli, Encoding::Gzip]
        .into_iter()
        .filter(|encoding| accepts(accepted, encoding.token()))
        .find_map(|encoding| {
            Some((
                encoding,
                Bundle::get(&format!("{name}{}", encoding.suffix()))?,
            ))
        })
        .unwrap_or((Encoding::Identity, original));
    // Strong validators differ between encodings of one file (RFC 9110, 8.8.3).
    let etag = format!("\"{}{}\"", hex_prefix(&digest), encoding.suffix());
    let mut response_headers = HeaderMap::new();
    response_headers.insert(header::CACHE_CONTROL, caching.header());
    response_headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    response_headers.insert(
        header::ETAG,
        HeaderValue::from_str(&etag).expect("a hex ETag is a valid header value"),
    );
    if matches_etag(headers, &etag) {
        return (StatusCode::NOT_MODIFIED, response_headers).into_response();
    }
    response_headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(name)),
    );
    if encoding != Encoding::Identity {
        response_headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(encoding.token()),
        );
    }
    response_headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    (StatusCode::OK, response_headers, body(file)).into_response()
}

fn body(file: EmbeddedFile) -> Body {
    match file.data {
        Cow::Borrowed(bytes) => Body::from(Bytes::from_static(bytes)),
        Cow::Owned(bytes) => Body::from(bytes),
    }
}

/// The first 16 bytes of a digest in hex: plenty to tell builds apart.
fn hex_prefix(digest: &[u8]) -> String {
    digest
        .iter()
        .take(16)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Whether an `If-None-Match` header names this ETag (or `*`).
fn matches_etag(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|candidate| candidate.trim().trim_start_matches("W/"))
        .any(|candidate| candidate == etag || candidate == "*")
}

/// Whether an `Accept-Encoding` value accepts `coding`: listed (or `*`) without `q=0`.
fn accepts(accept_encoding: &str, coding: &str) -> bool {
    let mut wildcard = false;
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or_default().trim();
        let refused = parts.any(|parameter| {
            parameter
                .trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        if name.eq_ignore_ascii_case(coding) {
            return !refused;
        }
        if name == "*" {
            wildcard = !refused;
        }
    }
    wildcard
}

/// The media type of a bundle file, by its extension: the few kinds a Vite build writes.
fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, extension)| extension) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("woff") => "font/woff",
        Some("ttf") => "font/ttf",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::accepts;

    #[test]
    fn an_encoding_is_accepted_when_listed_or_wildcarded_without_q_zero() {
        assert!(accepts("gzip, deflate, br, zstd", "br"));
        assert!(accepts("gzip;q=0.5", "gzip"));
        assert!(!accepts("gzip, deflate", "br"));
        assert!(!accepts("br;q=0, gzip", "br"));
        assert!(accepts("*", "br"));
        assert!(!accepts("*;q=0", "gzip"));
        assert!(!accepts("*, gzip;q=0", "gzip"));
        assert!(!accepts("", "gzip"));
    }
}
