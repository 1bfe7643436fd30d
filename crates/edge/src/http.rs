//! GraphQL over HTTP for any async-graphql executor: POST and GET on one path, the websocket
//! upgrade on another, with the media types and status codes of [`crate::media`], and the
//! streams of [`crate::stream`] (Server-Sent Events, multipart) on the GraphQL path for a client
//! that accepts one and at `{path}/stream`, `graphql-sse`'s path, for both of its modes.
//!
//! The server says who asks through a [`RequestHook`]: it builds each request's `Data` from the
//! request's head (its credentials, its peer) or refuses the request. Everything else here knows
//! nothing of the server: [`transport`] decides from the method and headers how a request at the
//! GraphQL path is carried, and each transport is one function.

use std::any::Any;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_graphql::http::WebSocketProtocols;
use async_graphql::{Data, ErrorExtensions as _, Executor};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{DefaultBodyLimit, FromRequest as _, FromRequestParts as _, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{any, get};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::media::{self, Accepted, HttpMethod, MediaType, Streamed};
use crate::pipeline::{CLIENT_QUERY_ERROR, shorten_message};
use crate::stream::{self, Bounds, Refused, Reservations, SlowConsumer};
use crate::websocket;

/// A request the hook let through: the data its operation sees.
pub struct Admitted {
    pub data: Data,
    /// The answer depends on the caller's credentials: a GET's answer is then `private, no-store`,
    /// so no cache hands it to anyone else.
    pub private: bool,
}

/// A request the hook turned away, answered with `status` and `error` in GraphQL's error shape.
pub struct Refusal {
    pub status: StatusCode,
    pub error: async_graphql::Error,
}

/// The future that answers a websocket's `connection_init` with the connection's data.
pub type InitFuture = Pin<Box<dyn Future<Output = async_graphql::Result<Data>> + Send>>;

type OnInit = Box<dyn FnOnce(serde_json::Value) -> InitFuture + Send>;
type OnUpgrade = Box<dyn FnOnce() -> Box<dyn Any + Send> + Send>;

/// A websocket upgrade the hook let through: how its `connection_init` payload becomes the data of
/// the connection's operations (or a refusal that closes it), and what the open socket holds.
pub struct SocketAdmission {
    on_init: OnInit,
    on_upgrade: Option<OnUpgrade>,
}

impl SocketAdmission {
    pub fn new<Init, Fut>(on_init: Init) -> Self
    where
        Init: FnOnce(serde_json::Value) -> Fut + Send + 'static,
        Fut: Future<Output = async_graphql::Result<Data>> + Send + 'static,
    {
        Self {
            on_init: Box::new(move |payload| Box::pin(on_init(payload))),
            on_upgrade: None,
        }
    }

    /// Calls `on_upgrade` once the socket is open and keeps what it returns until the socket
    /// closes: a count of open sockets, say, that a refused or failed upgrade never enters.
    pub fn holding<Held: Send + 'static>(
        mut self,
        on_upgrade: impl FnOnce() -> Held + Send + 'static,
    ) -> Self {
        self.on_upgrade = Some(Box::new(move || Box::new(on_upgrade())));
        self
    }
}

/// A stream the hook let through (an SSE stream, a multipart response, a single-connection
/// reservation): the data of its operation, and what it holds until it ends.
pub struct StreamAdmission {
    pub data: Data,
    /// Kept until the stream ends: a place under a cap of open streams, say.
    pub held: Box<dyn Any + Send>,
}

/// What the server decides about every request before it runs.
#[async_trait::async_trait]
pub trait RequestHook: Send + Sync + 'static {
    /// A POST or GET: its data, or why it is refused.
    async fn http(&self, head: &Parts) -> Result<Admitted, Refusal>;

    /// A request that opens a long-lived response (an SSE stream, a multipart subscription, a
    /// single-connection reservation), refused here before anything is held open. By default it
    /// is admitted as [`RequestHook::http`] admits it, and holds nothing.
    async fn stream(&self, head: &Parts) -> Result<StreamAdmission, Refusal> {
        let admitted = self.http(head).await?;
        Ok(StreamAdmission {
            data: admitted.data,
            held: Box::new(()),
        })
    }

    /// A websocket upgrade, before it is accepted: refused here, the client gets an HTTP answer
    /// instead of a socket.
    fn websocket(&self, head: &Parts) -> Result<SocketAdmission, Refusal>;
}

/// A page for a browser that opens the GraphQL path (GraphiQL, say), given the request's headers
/// for its caching.
pub type Page = fn(&HeaderMap) -> Response;

/// How the endpoint is bounded.
#[derive(Clone)]
pub struct Settings {
    /// The largest body a POST may send.
    pub max_body_bytes: usize,
    /// How long a body may take to arrive once the headers are in.
    pub body_timeout: Duration,
    /// How each websocket is bounded: its init timeout, pings, operations.
    pub websocket: websocket::Settings,
    /// Cancelled when the server stops: open websockets then close with "going away".
    pub shutdown: CancellationToken,
    /// The status of the codes that are the server's own failure (see [`media::answer`]).
    pub server_failure: fn(&str) -> Option<StatusCode>,
}

/// How a request at the GraphQL path is carried, and in what media type it is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One operation in a POST's JSON body.
    Post(MediaType),
    /// One operation in the URL's parameters, which caches can keep.
    Get(MediaType),
    /// One operation (in a POST's body or a GET's URL) answered with Server-Sent Events.
    EventStream(HttpMethod),
    /// One operation answered as Apollo's multipart subscriptions do.
    Multipart(HttpMethod),
    /// A browser that opens the path without a query: the server's page.
    Page,
    /// The `Accept` header allows nothing this endpoint answers in.
    NotAcceptable,
}

/// The transport of a request with `method` and `headers` whose URL is `uri`. `page` says whether
/// the server has a page for browsers. Any method but POST reaches here only as GET or HEAD.
pub fn transport(method: &Method, headers: &HeaderMap, uri: &Uri, page: bool) -> Transport {
    if method == Method::POST {
        return match media::negotiate(headers, false) {
            Accepted::Graphql(media) => Transport::Post(media),
            Accepted::EventStream => Transport::EventStream(HttpMethod::Post),
            Accepted::Multipart => Transport::Multipart(HttpMethod::Post),
            Accepted::Html | Accepted::Nothing => Transport::NotAcceptable,
        };
    }
    match media::negotiate(headers, page) {
        Accepted::Graphql(media) => Transport::Get(media),
        Accepted::EventStream => Transport::EventStream(HttpMethod::Get),
        Accepted::Multipart => Transport::Multipart(HttpMethod::Get),
        Accepted::Html if asks_nothing(uri) => Transport::Page,
        // A GET URL with a query opened in a browser: the answer is what it asked for.
        Accepted::Html => Transport::Get(MediaType::Json),
        Accepted::Nothing => Transport::NotAcceptable,
    }
}

/// A URL with neither a query nor extensions (a persisted document's hash) in its parameters.
fn asks_nothing(uri: &Uri) -> bool {
    matches!(
        Query::<GetParameters>::try_from_uri(uri),
        Ok(Query(parameters)) if parameters.query.is_none() && parameters.extensions.is_none()
    )
}

/// GraphQL over HTTP for `executor`, with the server's `hook` and `settings`.
pub struct Endpoint<E, H> {
    executor: E,
    hook: H,
    settings: Settings,
    page: Option<NamedPage>,
    /// The GraphQL path, named in the hint of a GET without a query.
    path: String,
    /// What bounds every stream: the websocket's settings and the shutdown.
    bounds: Bounds,
    reservations: Reservations,
}

/// The server's page and what a browser sees there.
#[derive(Clone, Copy)]
struct NamedPage {
    name: &'static str,
    page: Page,
}

impl<E: Executor, H: RequestHook> Endpoint<E, H> {
    pub fn new(executor: E, hook: H, settings: Settings) -> Self {
        let bounds = Bounds {
            websocket: settings.websocket.clone(),
            shutdown: settings.shutdown.clone(),
        };
        Self {
            executor,
            hook,
            settings,
            page: None,
            path: String::new(),
            bounds,
            reservations: Reservations::default(),
        }
    }

    /// The page a browser gets when it opens the GraphQL path with no query; `name` says what it
    /// is in the hint to a client that sends a GET without one.
    pub fn page(mut self, name: &'static str, page: Page) -> Self {
        self.page = Some(NamedPage { name, page });
        self
    }

    /// The routes: POST and GET at `path`, the websocket upgrade at `websocket_path`, and
    /// `graphql-sse` at `{path}/stream`. A server merges them into its own router.
    pub fn routes<S: Clone + Send + Sync + 'static>(
        mut self,
        path: &str,
        websocket_path: &str,
    ) -> Router<S> {
        let max_body_bytes = self.settings.max_body_bytes;
        path.clone_into(&mut self.path);
        Router::new()
            .route(path, get(graphql::<E, H>).post(graphql::<E, H>))
            .route(websocket_path, get(upgrade::<E, H>))
            .route(&format!("{path}/stream"), any(event_stream::<E, H>))
            .layer(DefaultBodyLimit::max(max_body_bytes))
            .with_state(Arc::new(self))
    }
}

async fn graphql<E: Executor, H: RequestHook>(
    State(endpoint): State<Arc<Endpoint<E, H>>>,
    request: Request<Body>,
) -> Response {
    let (head, body) = request.into_parts();
    let page = endpoint.page;
    match transport(&head.method, &head.headers, &head.uri, page.is_some()) {
        Transport::Post(media) => post(&endpoint, head, body, media).await,
        Transport::Get(media) => get_query(&endpoint, head, media).await,
        Transport::EventStream(method) => {
            one_stream(&endpoint, head, body, method, stream::Transport::Sse).await
        }
        Transport::Multipart(method) => {
            one_stream(&endpoint, head, body, method, stream::Transport::Multipart).await
        }
        Transport::Page => match page {
            Some(NamedPage { page, .. }) => page(&head.headers),
            None => not_acceptable(),
        },
        Transport::NotAcceptable => not_acceptable(),
    }
}

/// A failure before execution, in the shape GraphQL clients already parse.
fn transport_error(status: StatusCode, media: MediaType, error: &async_graphql::Error) -> Response {
    let body = json!({ "errors": [{ "message": error.message, "extensions": error.extensions }] });
    media::json_response(status, media, body.to_string())
}

/// A request this endpoint does not serve, the client's to fix. A parser's message can quote the
/// request, so it is cut short.
fn malformed(status: StatusCode, media: MediaType, mut message: String) -> Response {
    shorten_message(&mut message);
    let error = async_graphql::Error::new(message).extend_with(|_, extensions| {
        extensions.set("code", CLIENT_QUERY_ERROR);
    });
    transport_error(status, media, &error)
}

fn not_acceptable() -> Response {
    let message = format!(
        "the Accept header allows no type this endpoint answers in; accept `{}` or `{}`",
        media::GRAPHQL_RESPONSE_JSON,
        media::JSON
    );
    malformed(StatusCode::NOT_ACCEPTABLE, MediaType::Json, message)
}

/// A POST must say its body is JSON: GraphQL over HTTP requires `application/json`, and refusing the
/// rest keeps browsers from sending queries as "simple" cross-site requests without a preflight.
fn check_content_type(headers: &HeaderMap) -> Result<(), String> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok());
    let Some(content_type) = content_type else {
        return Err("a POST needs `Content-Type: application/json`".to_owned());
    };
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    let charset_ok = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    if essence.eq_ignore_ascii_case("application/json") && charset_ok {
        return Ok(());
    }
    Err(format!(
        "unsupported Content-Type `{content_type}`; send `application/json` (UTF-8)"
    ))
}

/// The body of a POST, read within the body timeout and the size limit.
async fn read_body(
    settings: &Settings,
    head: &Parts,
    body: Body,
    media: MediaType,
) -> Result<Bytes, Response> {
    let declared_length = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    let mut request = Request::new(body);
    // The size limit travels as an extension of the request.
    *request.extensions_mut() = head.extensions.clone();
    // The clock runs from the end of the headers, so a client trickling its body in holds the
    // connection for at most this long.
    let read = tokio::time::timeout(settings.body_timeout, Bytes::from_request(request, &())).await;
    match read {
        Err(_) => {
            let message = format!(
                "the request body did not arrive within {}",
                humantime::format_duration(settings.body_timeout)
            );
            let mut response = malformed(StatusCode::REQUEST_TIMEOUT, media, message);
            // The rest of the body may still be on its way; the connection cannot serve another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(response)
        }
        Ok(Ok(body)) => Ok(body),
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let limit = settings.max_body_bytes;
            let message = match declared_length {
                Some(length) => {
                    format!("request body of {length} bytes exceeds the limit of {limit} bytes")
                }
                None => format!("request body exceeds the limit of {limit} bytes"),
            };
            Err(malformed(StatusCode::PAYLOAD_TOO_LARGE, media, message))
        }
        Ok(Err(rejection)) => {
            let message = format!("cannot read the request body: {rejection}");
            Err(malformed(rejection.status(), media, message))
        }
    }
}

async fn post<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: Parts,
    body: Body,
    media: MediaType,
) -> Response {
    match read_request(endpoint, &head, body, media).await {
        Ok(request) => execute(endpoint, &head, request, HttpMethod::Post, media).await,
        Err(response) => response,
    }
}

/// The GraphQL request in a POST's body, or the answer that refuses it.
async fn read_request<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: &Parts,
    body: Body,
    media: MediaType,
) -> Result<async_graphql::Request, Response> {
    if let Err(message) = check_content_type(&head.headers) {
        return Err(malformed(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            media,
            message,
        ));
    }
    let body = read_body(&endpoint.settings, head, body, media).await?;
    match serde_json::from_slice::<async_graphql::Request>(&body) {
        Ok(request)
            if request.query.trim().is_empty()
                && !request.extensions.contains_key("persistedQuery") =>
        {
            Err(malformed(
                StatusCode::BAD_REQUEST,
                media,
                "the request has no `query`".to_owned(),
            ))
        }
        Ok(request) => Ok(request),
        Err(_) if body.first() == Some(&b'[') => {
            let message = "batched requests are not supported; send one operation per request";
            Err(malformed(
                StatusCode::BAD_REQUEST,
                media,
                message.to_owned(),
            ))
        }
        Err(err) => {
            let message = format!("the body is not a GraphQL request in JSON: {err}");
            Err(malformed(StatusCode::BAD_REQUEST, media, message))
        }
    }
}

/// The parameters of a GraphQL request sent with GET, as the GraphQL over HTTP spec names them.
#[derive(Deserialize)]
struct GetParameters {
    query: Option<String>,
    #[serde(rename = "operationName")]
    operation_name: Option<String>,
    variables: Option<String>,
    extensions: Option<String>,
}

async fn get_query<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: Parts,
    media: MediaType,
) -> Response {
    let request = match get_request(&head.uri, &endpoint.path, endpoint.page) {
        Ok(request) => request,
        Err(message) => return malformed(StatusCode::BAD_REQUEST, media, message),
    };
    execute(endpoint, &head, request, HttpMethod::Get, media).await
}

/// The GraphQL request in a GET's URL, or why there is none.
fn get_request(
    uri: &Uri,
    path: &str,
    page: Option<NamedPage>,
) -> Result<async_graphql::Request, String> {
    let parameters = match Query::<GetParameters>::try_from_uri(uri) {
        Ok(Query(parameters)) => parameters,
        Err(rejection) => {
            return Err(format!(
                "the URL's parameters are not a GraphQL request: {rejection}"
            ));
        }
    };
    if parameters.query.is_none() && parameters.extensions.is_none() {
        return Err(match page {
            Some(NamedPage { name, .. }) => {
                format!(
                    "the request has no `query` parameter (open {path} in a browser for {name})"
                )
            }
            None => "the request has no `query` parameter".to_owned(),
        });
    }
    let mut request = async_graphql::Request::new(parameters.query.unwrap_or_default());
    if let Some(name) = parameters.operation_name.filter(|name| !name.is_empty()) {
        request = request.operation_name(name);
    }
    if let Some(variables) = parameters.variables.filter(|v| !v.is_empty()) {
        let variables = json_object(&variables)
            .ok_or_else(|| "`variables` must be a JSON object".to_owned())?;
        request = request.variables(async_graphql::Variables::from_json(variables));
    }
    if let Some(extensions) = parameters.extensions.filter(|e| !e.is_empty()) {
        let Some(serde_json::Value::Object(extensions)) = json_object(&extensions) else {
            return Err("`extensions` must be a JSON object".to_owned());
        };
        for (name, value) in extensions {
            if let Ok(value) = async_graphql::Value::from_json(value) {
                request.extensions.insert(name, value);
            }
        }
    }
    Ok(request)
}

/// A URL parameter holding a JSON object (or null).
fn json_object(text: &str) -> Option<serde_json::Value> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value @ (serde_json::Value::Object(_) | serde_json::Value::Null)) => Some(value),
        _ => None,
    }
}

async fn execute<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: &Parts,
    mut request: async_graphql::Request,
    method: HttpMethod,
    media: MediaType,
) -> Response {
    let admitted = match endpoint.hook.http(head).await {
        Ok(admitted) => admitted,
        Err(refusal) => return transport_error(refusal.status, media, &refusal.error),
    };
    request.data = admitted.data;
    request.data.insert(method);
    let response = endpoint.executor.execute(request).await;
    let mut answer = media::answer(response, media, method, endpoint.settings.server_failure);
    if method == HttpMethod::Get {
        let headers = answer.headers_mut();
        // Answers differ by who asks and in what type; a cache must not hand one to the other.
        headers.insert(
            header::VARY,
            HeaderValue::from_static("Accept, Authorization"),
        );
        if admitted.private {
            headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
        }
    }
    answer
}

/// The request of a stream: in a POST's body or a GET's URL. Errors before the stream starts are
/// answered in JSON, the one type every streaming client reads.
async fn stream_request<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: &Parts,
    body: Body,
    method: HttpMethod,
) -> Result<async_graphql::Request, Response> {
    match method {
        HttpMethod::Post => read_request(endpoint, head, body, MediaType::Json).await,
        HttpMethod::Get => get_request(&head.uri, &endpoint.path, None)
            .map_err(|message| malformed(StatusCode::BAD_REQUEST, MediaType::Json, message)),
    }
}

/// One operation answered as a stream of its results: `graphql-sse`'s distinct connections mode,
/// or a multipart subscription. The hook admits it before anything is held open.
async fn one_stream<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: Parts,
    body: Body,
    method: HttpMethod,
    transport: stream::Transport,
) -> Response {
    let mut request = match stream_request(endpoint, &head, body, method).await {
        Ok(request) => request,
        Err(response) => return response,
    };
    let admission = match endpoint.hook.stream(&head).await {
        Ok(admission) => admission,
        Err(refusal) => return transport_error(refusal.status, MediaType::Json, &refusal.error),
    };
    request.data = admission.data;
    request.data.insert(method);
    request.data.insert(Streamed);
    let resume = match transport {
        stream::Transport::Sse => stream::Resume::of(&request, endpoint.bounds.resumable()),
        stream::Transport::Multipart => None,
    };
    let last_event_id = head
        .headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty());
    if let (Some(resume), Some(last_event_id)) = (&resume, last_event_id) {
        resume.after(&mut request, last_event_id);
    }
    let body = stream::one_operation(
        &endpoint.executor,
        request,
        transport,
        &endpoint.bounds,
        admission.held,
    );
    stream_response(transport, body)
}

fn stream_response(
    transport: stream::Transport,
    body: impl futures_util::Stream<Item = Result<Bytes, SlowConsumer>> + Send + 'static,
) -> Response {
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(transport.content_type()),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // nginx holds a proxied response back until it has a buffer's worth, unless told not to.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The token of a single-connection stream: its header, or the URL parameter an `EventSource`
/// (which sends no headers of its own) carries it in.
fn stream_token(head: &Parts) -> Option<String> {
    if let Some(token) = head.headers.get(stream::TOKEN_HEADER) {
        return token.to_str().ok().map(str::to_owned);
    }
    url_parameter(&head.uri, "token")
}

fn url_parameter(uri: &Uri, name: &str) -> Option<String> {
    let Query(mut parameters) =
        Query::<std::collections::HashMap<String, String>>::try_from_uri(uri).ok()?;
    parameters.remove(name).filter(|value| !value.is_empty())
}

/// `graphql-sse` at `{path}/stream`: both modes, told apart by the token.
async fn event_stream<E: Executor, H: RequestHook>(
    State(endpoint): State<Arc<Endpoint<E, H>>>,
    request: Request<Body>,
) -> Response {
    let (head, body) = request.into_parts();
    let token = stream_token(&head);
    let wants_stream = media::negotiate(&head.headers, false) == Accepted::EventStream;
    let method = if head.method == Method::GET {
        HttpMethod::Get
    } else if head.method == Method::POST {
        HttpMethod::Post
    } else if head.method == Method::PUT {
        return reserve(&endpoint, &head).await;
    } else if head.method == Method::DELETE {
        return stop_operation(&endpoint, &head, token.as_deref());
    } else {
        let mut response = malformed(
            StatusCode::METHOD_NOT_ALLOWED,
            MediaType::Json,
            "the event stream path takes GET, POST, PUT and DELETE".to_owned(),
        );
        response.headers_mut().insert(
            header::ALLOW,
            HeaderValue::from_static("GET, POST, PUT, DELETE"),
        );
        return response;
    };
    match (wants_stream, token, method) {
        (true, Some(token), _) => match endpoint.reservations.open(&token) {
            Ok(body) => stream_response(stream::Transport::Sse, body),
            Err(refused) => refused_response(&refused),
        },
        (true, None, _) => one_stream(&endpoint, head, body, method, stream::Transport::Sse).await,
        (false, Some(token), HttpMethod::Post) => {
            start_operation(&endpoint, head, body, &token).await
        }
        _ => malformed(
            StatusCode::NOT_ACCEPTABLE,
            MediaType::Json,
            format!(
                "accept `{}`, or POST an operation with the `{}` header of a reserved stream",
                media::EVENT_STREAM,
                stream::TOKEN_HEADER
            ),
        ),
    }
}

/// A refusal of the single-connection mode, with the status `graphql-sse` gives it.
fn refused_response(refused: &Refused) -> Response {
    let (status, code) = match refused {
        Refused::Invalid(errors) => {
            let body = json!({ "errors": errors });
            return media::json_response(
                StatusCode::BAD_REQUEST,
                MediaType::Json,
                body.to_string(),
            );
        }
        Refused::UnknownToken => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        Refused::StreamOpen | Refused::DuplicateOperation => {
            (StatusCode::CONFLICT, CLIENT_QUERY_ERROR)
        }
        Refused::TooManyOperations(_) => {
            (StatusCode::TOO_MANY_REQUESTS, stream::TOO_MANY_OPERATIONS)
        }
    };
    let error = async_graphql::Error::new(refused.message())
        .extend_with(|_, extensions| extensions.set("code", code));
    transport_error(status, MediaType::Json, &error)
}

/// A PUT: a stream reserved for the caller the hook admits, its token in the body.
async fn reserve<E: Executor, H: RequestHook>(endpoint: &Endpoint<E, H>, head: &Parts) -> Response {
    let admission = match endpoint.hook.stream(head).await {
        Ok(admission) => admission,
        Err(refusal) => return transport_error(refusal.status, MediaType::Json, &refusal.error),
    };
    let token = endpoint
        .reservations
        .reserve(&endpoint.bounds, admission.held);
    let mut response = Response::new(Body::from(token));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A POST of an operation for a reserved stream: 202, and its results on the stream.
async fn start_operation<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: Parts,
    body: Body,
    token: &str,
) -> Response {
    let mut request = match read_request(endpoint, &head, body, MediaType::Json).await {
        Ok(request) => request,
        Err(response) => return response,
    };
    let id = match request.extensions.get("operationId") {
        Some(async_graphql::Value::String(id)) if !id.is_empty() => id.clone(),
        Some(async_graphql::Value::Number(id)) => id.to_string(),
        _ => {
            let message = "the request has no `extensions.operationId`".to_owned();
            return malformed(StatusCode::BAD_REQUEST, MediaType::Json, message);
        }
    };
    let admitted = match endpoint.hook.http(&head).await {
        Ok(admitted) => admitted,
        Err(refusal) => return transport_error(refusal.status, MediaType::Json, &refusal.error),
    };
    request.data = admitted.data;
    request.data.insert(HttpMethod::Post);
    request.data.insert(Streamed);
    let started = endpoint
        .reservations
        .start(token, id, &endpoint.executor, request, &endpoint.bounds)
        .await;
    match started {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(refused) => refused_response(&refused),
    }
}

/// A DELETE: the operation named by `operationId` stops.
fn stop_operation<E: Executor, H: RequestHook>(
    endpoint: &Endpoint<E, H>,
    head: &Parts,
    token: Option<&str>,
) -> Response {
    let Some(token) = token else {
        return refused_response(&Refused::UnknownToken);
    };
    let Some(id) = url_parameter(&head.uri, "operationId") else {
        let message = "the request has no `operationId` parameter".to_owned();
        return malformed(StatusCode::BAD_REQUEST, MediaType::Json, message);
    };
    match endpoint.reservations.stop(token, &id) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(refused) => refused_response(&refused),
    }
}

async fn upgrade<E: Executor, H: RequestHook>(
    State(endpoint): State<Arc<Endpoint<E, H>>>,
    request: Request<Body>,
) -> Response {
    let (mut head, _) = request.into_parts();
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut head, &()).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    let Some(protocol) = websocket::protocol(&head.headers) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let admission = match endpoint.hook.websocket(&head) {
        Ok(admission) => admission,
        Err(refusal) => return transport_error(refusal.status, MediaType::Json, &refusal.error),
    };
    serve_socket(endpoint, upgrade, protocol, admission)
}

/// tungstenite reserves a socket's whole read buffer up front and keeps it for the socket's life
/// (128 KiB by default, most of what an idle subscriber cost: 146 KiB each at 10,000 in Pulse's
/// bench). What a client sends is small (connection_init with its token, subscribe, pong: a few
/// hundred bytes each); a larger message grows this socket's buffer and is read in a few more calls.
const WEBSOCKET_READ_BUFFER: usize = 1024;
/// Messages out are written through once this much is buffered (128 KiB by default); a snapshot is
/// a few hundred bytes, so a small buffer still batches a burst.
const WEBSOCKET_WRITE_BUFFER: usize = 8 * 1024;

fn serve_socket<E: Executor, H: RequestHook>(
    endpoint: Arc<Endpoint<E, H>>,
    upgrade: WebSocketUpgrade,
    protocol: WebSocketProtocols,
    admission: SocketAdmission,
) -> Response {
    upgrade
        .protocols([protocol.sec_websocket_protocol()])
        .read_buffer_size(WEBSOCKET_READ_BUFFER)
        .write_buffer_size(WEBSOCKET_WRITE_BUFFER)
        // A client's message is a request, held to a request body's limit: tungstenite's own
        // (64 MiB) let an anonymous socket make the server hold 256 times what a POST may. A
        // frame is read whole before its message is found too long, so that the client, its
        // frame taken, reads the close (1009) rather than a reset; past four limits, a frame is
        // refused from its header and the client may see the reset.
        .max_message_size(endpoint.settings.max_body_bytes)
        .max_frame_size(endpoint.settings.max_body_bytes.saturating_mul(4))
        .on_upgrade(move |socket| async move {
            let _held = admission.on_upgrade.map(|on_upgrade| on_upgrade());
            let settings = &endpoint.settings;
            websocket::serve(
                socket,
                protocol,
                endpoint.executor.clone(),
                settings.websocket.clone(),
                settings.shutdown.clone(),
                admission.on_init,
            )
            .await;
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(accept: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(accept) = accept {
            headers.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        }
        headers
    }

    const BROWSER: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

    #[test]
    fn a_post_is_answered_in_the_type_it_accepts_and_never_with_the_page() {
        let uri = Uri::from_static("/graphql");
        let spec = Some("application/graphql-response+json");
        assert_eq!(
            transport(&Method::POST, &headers(spec), &uri, true),
            Transport::Post(MediaType::GraphqlResponseJson)
        );
        assert_eq!(
            transport(&Method::POST, &headers(None), &uri, true),
            Transport::Post(MediaType::Json)
        );
        assert_eq!(
            transport(&Method::POST, &headers(Some("text/html")), &uri, true),
            Transport::NotAcceptable
        );
    }

    #[test]
    fn a_browser_gets_the_page_only_without_a_query_and_only_where_there_is_one() {
        let bare = Uri::from_static("/graphql");
        let asking = Uri::from_static("/graphql?query=%7B__typename%7D");
        let persisted = Uri::from_static("/graphql?extensions=%7B%7D");
        let browser = headers(Some(BROWSER));
        assert_eq!(
            transport(&Method::GET, &browser, &bare, true),
            Transport::Page
        );
        assert_eq!(
            transport(&Method::GET, &browser, &asking, true),
            Transport::Get(MediaType::Json)
        );
        assert_eq!(
            transport(&Method::GET, &browser, &persisted, true),
            Transport::Get(MediaType::Json)
        );
        assert_eq!(
            transport(&Method::GET, &browser, &bare, false),
            Transport::Get(MediaType::Json)
        );
        assert_eq!(
            transport(&Method::GET, &headers(Some("text/html")), &bare, false),
            Transport::NotAcceptable
        );
        assert_eq!(
            transport(
                &Method::GET,
                &headers(Some("application/graphql-response+json")),
                &bare,
                true
            ),
            Transport::Get(MediaType::GraphqlResponseJson)
        );
    }

    #[test]
    fn only_json_in_utf_8_is_a_posts_content_type() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
            check_content_type(&headers)
        };
        assert!(with("application/json").is_ok());
        assert!(with("Application/JSON; charset=\"UTF-8\"").is_ok());
        assert!(with("application/json; charset=latin1").is_err());
        assert!(with("text/plain").is_err());
        assert!(with("application/x-www-form-urlencoded").is_err());
        assert!(check_content_type(&HeaderMap::new()).is_err());
    }

    #[test]
    fn a_gets_parameters_become_one_request_or_a_reason() {
        let page = NamedPage {
            name: "GraphiQL",
            page: |_| Response::new(Body::empty()),
        };
        let uri = Uri::from_static(
            "/graphql?query=query%20Q(%24n%3AInt)%7Ba%7D&operationName=Q&variables=%7B%22n%22%3A1%7D",
        );
        let request = get_request(&uri, "/graphql", None).unwrap();
        assert_eq!(request.query, "query Q($n:Int){a}");
        assert_eq!(request.operation_name.as_deref(), Some("Q"));
        assert_eq!(
            request.variables.get(&async_graphql::Name::new("n")),
            Some(&async_graphql::Value::from(1))
        );

        let bare = Uri::from_static("/graphql");
        assert_eq!(
            get_request(&bare, "/graphql", Some(page)).unwrap_err(),
            "the request has no `query` parameter (open /graphql in a browser for GraphiQL)"
        );
        assert_eq!(
            get_request(&bare, "/graphql", None).unwrap_err(),
            "the request has no `query` parameter"
        );
        let listed = Uri::from_static("/graphql?query=%7Ba%7D&variables=%5B1%5D");
        assert_eq!(
            get_request(&listed, "/graphql", None).unwrap_err(),
            "`variables` must be a JSON object"
        );
        let hashed = Uri::from_static(
            "/graphql?extensions=%7B%22persistedQuery%22%3A%7B%22version%22%3A1%7D%7D",
        );
        let request = get_request(&hashed, "/graphql", None).unwrap();
        assert!(request.query.is_empty());
        assert!(request.extensions.contains_key("persistedQuery"));
    }

    /// Who asks, as the test hook's data says.
    struct Caller(&'static str);

    struct Query;

    #[async_graphql::Object]
    impl Query {
        async fn caller(&self, context: &async_graphql::Context<'_>) -> &'static str {
            context.data_unchecked::<Caller>().0
        }
    }

    type TinySchema = async_graphql::Schema<
        Query,
        async_graphql::EmptyMutation,
        async_graphql::EmptySubscription,
    >;

    /// Admits `Authorization: alice` as a private caller and an anonymous request, refuses any
    /// other credentials with a 401.
    struct Hook;

    #[async_trait::async_trait]
    impl RequestHook for Hook {
        async fn http(&self, head: &Parts) -> Result<Admitted, Refusal> {
            let (caller, private) = match head.headers.get(header::AUTHORIZATION) {
                None => ("anonymous", false),
                Some(value) if value == "alice" => ("alice", true),
                Some(_) => {
                    return Err(Refusal {
                        status: StatusCode::UNAUTHORIZED,
                        error: async_graphql::Error::new("who?")
                            .extend_with(|_, e| e.set("code", "UNAUTHENTICATED")),
                    });
                }
            };
            let mut data = Data::default();
            data.insert(Caller(caller));
            Ok(Admitted { data, private })
        }

        fn websocket(&self, _: &Parts) -> Result<SocketAdmission, Refusal> {
            Ok(SocketAdmission::new(|_| async { Ok(Data::default()) }))
        }
    }

    fn router(body_timeout: Duration) -> Router {
        let schema = TinySchema::new(
            Query,
            async_graphql::EmptyMutation,
            async_graphql::EmptySubscription,
        );
        let settings = Settings {
            max_body_bytes: 1024,
            body_timeout,
            websocket: websocket::Settings {
                init_timeout: Duration::from_secs(5),
                ping_interval: Duration::from_secs(15),
                pong_timeout: Duration::from_secs(10),
                max_subscriptions: 100,
                viewer_fields: |_| false,
                live_fields: &[],
                send_budget: 64 * 1024,
                resumable: &[],
                groups: None,
                detached: &[],
            },
            shutdown: CancellationToken::new(),
            server_failure: |_| None,
        };
        Endpoint::new(schema, Hook, settings).routes("/graphql", "/graphql/ws")
    }

    async fn send(
        router: Router,
        request: Request<Body>,
    ) -> (StatusCode, HeaderMap, serde_json::Value) {
        use tower::ServiceExt as _;
        let response = router.oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        (
            parts.status,
            parts.headers,
            serde_json::from_slice(&body).unwrap(),
        )
    }

    fn get_caller(authorization: Option<&str>) -> Request<Body> {
        let mut request = Request::get("/graphql?query=%7Bcaller%7D");
        if let Some(authorization) = authorization {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        request.body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn the_hooks_data_reaches_the_resolvers_and_a_private_answer_is_not_cached() {
        let (status, headers, body) = send(router(Duration::from_secs(5)), get_caller(None)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["data"]["caller"], "anonymous");
        assert_eq!(headers[header::VARY], "Accept, Authorization");
        assert!(headers.get(header::CACHE_CONTROL).is_none());

        let (status, headers, body) =
            send(router(Duration::from_secs(5)), get_caller(Some("alice"))).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["data"]["caller"], "alice");
        assert_eq!(headers[header::CACHE_CONTROL], "private, no-store");
    }

    #[tokio::test]
    async fn a_refusal_of_the_hook_is_answered_with_its_status_before_anything_runs() {
        let (status, _, body) =
            send(router(Duration::from_secs(5)), get_caller(Some("mallory"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["errors"][0]["message"], "who?");
        assert_eq!(body["errors"][0]["extensions"]["code"], "UNAUTHENTICATED");
        assert!(body.get("data").is_none(), "{body}");
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_a_408_that_closes_the_connection() {
        let never = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
        let request = Request::post("/graphql")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(never))
            .unwrap();
        let (status, headers, body) = send(router(Duration::from_millis(50)), request).await;
        assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(headers[header::CONNECTION], "close");
        assert_eq!(
            body["errors"][0]["message"],
            "the request body did not arrive within 50ms"
        );
        assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_a_413_naming_both_sizes() {
        let request = Request::post("/graphql")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, "2048")
            .body(Body::from(vec![b' '; 2048]))
            .unwrap();
        let (status, _, body) = send(router(Duration::from_secs(5)), request).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            body["errors"][0]["message"],
            "request body of 2048 bytes exceeds the limit of 1024 bytes"
        );
    }
}
