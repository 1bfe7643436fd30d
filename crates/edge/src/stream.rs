//! GraphQL over long-lived HTTP responses, for any executor: Server-Sent Events as the
//! `graphql-sse` protocol frames them (both of its modes), and Apollo's multipart subscriptions.
//! Operations run through `Executor::execute_stream`, the entry the websocket driver's
//! async-graphql uses, so the same pipeline (guard, limits, persisted documents) sees them.
//!
//! **Distinct connections** (`graphql-sse`): a GET or POST that accepts `text/event-stream` runs
//! one operation; each result is an `event: next` whose data is the result, and the last an
//! `event: complete`. A document that does not validate, or is over a limit, is one `next` with
//! the errors then `complete`, as the protocol asks (an `EventSource` drops a 4xx unread).
//!
//! **Single connection** (`graphql-sse`): a PUT reserves a stream and answers 201 with its token
//! (text); a GET or POST that accepts `text/event-stream` and carries the token (header
//! [`TOKEN_HEADER`], or the `token` URL parameter for an `EventSource`) opens it; operations are
//! POSTed with the token and `extensions.operationId` (202), their events carry
//! `{"id", "payload"}`, and a DELETE with `?operationId=` stops one. An operation whose document
//! does not parse or validate, or is over a limit, is a 400 with its errors, as the protocol
//! suggests, and takes neither its id nor a place. A token nobody reserved is a
//! 404, a second stream on one token a 409, an operation id already running a 409, an operation
//! past [`crate::websocket::Settings::max_subscriptions`] a 429 coded
//! [`TOO_MANY_OPERATIONS`]. A reservation whose stream does not open within the websocket init
//! timeout lapses.
//!
//! **Multipart** (Apollo): a POST that accepts `multipart/mixed;subscriptionSpec="1.0"` is
//! answered `multipart/mixed;boundary="graphql";subscriptionSpec="1.0"`: each result is a part
//! `{"payload": result}`, a `{}` part every [`MULTIPART_HEARTBEAT`] keeps proxies from timing the
//! response out, and the final boundary ends it. Each part's closing boundary is written with it,
//! so a client parses a part as soon as it arrives.
//!
//! **Resuming** (distinct SSE streams): each `next` of a [`Resumable`] field carries the event's
//! cursor as its SSE `id`, and a request with `Last-Event-ID` (what an `EventSource` sends when it
//! reconnects) runs with that cursor as the field's argument: the value of the variable the
//! operation passes there, or written into the document in place of a literal or where the
//! argument is missing (not into a persisted document's text, which must keep its hash).
//!
//! Groups: a distinct SSE or multipart stream of a snapshot that reads nothing of the viewer joins
//! the group of its request as a websocket operation does ([`crate::groups`]), and frames the
//! group's serialized results without serializing them again.
//!
//! Credentials that expire end, as on a websocket, the operations that read the viewer: their
//! last result is an error coded `UNAUTHENTICATED`, then their end.
//!
//! Every stream is bounded as a websocket is: what the client has not read waits within the send
//! budget; a snapshot replaces its operation's unsent one in place; an event past the budget ends
//! its operation alone (the stream, for a distinct one) with a last result whose error is coded
//! `RESYNC_REQUIRED`, carrying in `extensions.cursor` the cursor of the operation's last event
//! queued before it, then its end; it and what would follow it are dropped. Ends may wait past
//! the budget, up to twice it. A snapshot past the budget with no unsent one to replace, or an end
//! past twice it, cuts the response (no `complete`, no final boundary), which clients take as a
//! network failure and reconnect. When the server shuts down, SSE streams end without `complete` (clients reconnect)
//! and multipart responses end with an error coded `SHUTTING_DOWN` in the part's `errors`.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use async_graphql::{Positioned, Response};
use axum::body::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::{BoxStream, Stream};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::counted::Counted;
use crate::groups::Groups;
use crate::websocket;

/// The header that names a single-connection stream's reservation.
pub const TOKEN_HEADER: &str = "x-graphql-event-stream-token";
/// The code of an operation past the most one stream may run at once.
pub const TOO_MANY_OPERATIONS: &str = "TOO_MANY_OPERATIONS";
/// The code of the error that ends an operation reading the viewer when its credentials expire.
const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
/// The code of the last part of a multipart response the server ended because it is stopping.
pub const SHUTTING_DOWN: &str = "SHUTTING_DOWN";

/// How often a multipart response sends `{}`: Apollo's spec names five seconds.
pub const MULTIPART_HEARTBEAT: Duration = Duration::from_secs(5);

/// The streams' metrics, by `transport` (`sse`, `multipart`), which the server describes.
pub const STREAMS_OPEN: &str = "pulse_live_streams_open";
/// Operations running on streams.
pub const STREAM_OPERATIONS: &str = "pulse_live_stream_operations";
pub const STREAM_MESSAGES_SENT: &str = "pulse_live_stream_messages_sent_total";
pub const STREAM_BYTES_SENT: &str = "pulse_live_stream_bytes_sent_total";
/// Bytes waiting for streams whose clients have not read them yet, all streams together.
pub const STREAM_QUEUED_BYTES: &str = "pulse_live_stream_queued_bytes";
pub const STREAM_SNAPSHOTS_REPLACED: &str = "pulse_live_stream_snapshots_replaced_total";
pub const STREAM_SLOW_CONSUMER_CUTS: &str = "pulse_live_stream_slow_consumer_cuts_total";
/// Event streams ended with `RESYNC_REQUIRED` for falling more than the send budget behind.
pub const STREAM_SLOW_CONSUMER_RESYNCS: &str = "pulse_live_stream_slow_consumer_resyncs_total";

/// How a stream's messages are framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Sse,
    Multipart,
}

impl Transport {
    /// The value of the metrics' `transport` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Sse => "sse",
            Self::Multipart => "multipart",
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Self::Sse => "text/event-stream; charset=utf-8",
            Self::Multipart => r#"multipart/mixed;boundary="graphql";subscriptionSpec="1.0""#,
        }
    }

    /// What opens the response: an SSE comment, which some browsers need before they show the
    /// stream as open, or the first boundary.
    fn opening(self) -> Bytes {
        match self {
            Self::Sse => Bytes::from_static(b":\n\n"),
            Self::Multipart => Bytes::from_static(b"\r\n--graphql"),
        }
    }

    fn heartbeat(self) -> Bytes {
        match self {
            Self::Sse => Bytes::from_static(b":\n\n"),
            Self::Multipart => part("{}"),
        }
    }
}

/// One SSE event; `data` is compact JSON, which holds no line break.
fn sse_event(event: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// One multipart part with its closing boundary.
fn part(json: &str) -> Bytes {
    Bytes::from(format!(
        "\r\ncontent-type: application/json; charset=utf-8\r\n\r\n{json}\r\n--graphql"
    ))
}

/// A subscription field whose events a client can resume from: `cursor`, a field of its result,
/// is each event's SSE `id`, and `argument` is where the field takes a cursor to resume after.
#[derive(Clone, Copy, Debug)]
pub struct Resumable {
    pub field: &'static str,
    pub cursor: &'static str,
    pub argument: &'static str,
}

/// Where a resumable operation's cursor is in each result, and how a cursor to resume after
/// reaches its argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resume {
    /// The field's key in the result: its alias, or its name.
    key: String,
    cursor: &'static str,
    argument: &'static str,
    fill: Fill,
}

/// How `Last-Event-ID` becomes the resumable field's argument.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fill {
    /// The argument is this variable: the cursor is its value.
    Variable(String),
    /// The argument is a literal, or absent: the cursor is written into the document in place of
    /// the bytes `at` (an empty range where it is inserted), in parentheses when the field has no
    /// argument list.
    Text {
        at: Range<usize>,
        parenthesized: bool,
    },
}

impl Resume {
    /// The resumable field `request` subscribes to, alone at its root. A document nested past
    /// the guard's limit is not parsed here (the pipeline refuses it).
    pub(crate) fn of(request: &async_graphql::Request, resumable: &[Resumable]) -> Option<Self> {
        use async_graphql::parser::types::{DocumentOperations, Selection};
        crate::guard::check_nesting(&request.query).ok()?;
        let document = async_graphql::parser::parse_query(&request.query).ok()?;
        let operation = match &document.operations {
            DocumentOperations::Single(operation) => operation,
            DocumentOperations::Multiple(operations) => {
                operations.get(request.operation_name.as_deref()?)?
            }
        };
        let [item] = operation.node.selection_set.node.items.as_slice() else {
            return None;
        };
        let Selection::Field(field) = &item.node else {
            return None;
        };
        let field = &field.node;
        let resumable = resumable
            .iter()
            .find(|resumable| resumable.field == field.name.node.as_str())?;
        let key = field.alias.as_ref().unwrap_or(&field.name).node.to_string();
        let query = request.query.as_str();
        let start_of = |name: &Positioned<async_graphql::Name>| offset(query, name.pos, &name.node);
        let argument = field
            .arguments
            .iter()
            .position(|(name, _)| name.node == resumable.argument);
        let fill = match argument {
            Some(index) => {
                let (name, value) = &field.arguments[index];
                if let async_graphql_value::Value::Variable(variable) = &value.node {
                    Fill::Variable(variable.to_string())
                } else {
                    let start = start_of(name)?;
                    let end = match field.arguments.get(index + 1) {
                        Some((next, _)) => start_of(next)?,
                        None => closing_parenthesis(query, start)?,
                    };
                    Fill::Text {
                        at: start..end,
                        parenthesized: false,
                    }
                }
            }
            None => match field.arguments.first() {
                Some((first, _)) => {
                    let at = start_of(first)?;
                    Fill::Text {
                        at: at..at,
                        parenthesized: false,
                    }
                }
                None => {
                    let end = start_of(&field.name)? + field.name.node.len();
                    Fill::Text {
                        at: end..end,
                        parenthesized: true,
                    }
                }
            },
        };
        Some(Self {
            key,
            cursor: resumable.cursor,
            argument: resumable.argument,
            fill,
        })
    }

    /// Resumes after `last_event_id`, which is newer than any cursor the document names: the
    /// event the client received last. A variable takes it as its value; a literal is replaced by
    /// it and a missing argument added, except in a persisted document, whose text must keep its
    /// hash (it must take the argument as a variable to resume).
    pub(crate) fn after(&self, request: &mut async_graphql::Request, last_event_id: &str) {
        match &self.fill {
            Fill::Variable(variable) => {
                request.variables.insert(
                    async_graphql::Name::new(variable),
                    async_graphql::Value::String(last_event_id.to_owned()),
                );
            }
            Fill::Text { at, parenthesized } => {
                if request.extensions.contains_key("persistedQuery") {
                    return;
                }
                let cursor = serde_json::to_string(last_event_id).expect("a string serializes");
                let argument = if *parenthesized {
                    format!("({}: {cursor})", self.argument)
                } else {
                    format!("{}: {cursor} ", self.argument)
                };
                request.query.replace_range(at.clone(), &argument);
            }
        }
    }

    /// The cursor of the event in `result`, a result serialized as JSON.
    pub(crate) fn cursor_in<'r>(&self, result: &'r serde_json::Value) -> Option<&'r str> {
        result["data"][self.key.as_str()][self.cursor].as_str()
    }

    /// The cursor of the event in `response`, if it has one that fits on an `id:` line.
    fn event_id<'r>(&self, response: &'r Response) -> Option<&'r str> {
        let async_graphql::Value::Object(data) = &response.data else {
            return None;
        };
        let async_graphql::Value::Object(event) = data.get(self.key.as_str())? else {
            return None;
        };
        match event.get(self.cursor)? {
            async_graphql::Value::String(cursor) if !cursor.contains(['\n', '\r', '\0']) => {
                Some(cursor)
            }
            _ => None,
        }
    }
}

/// The byte offset in `query` of the token at `pos` that starts with `token`. The parser counts
/// lines at `\n` and starts a column again after a `\r`, so a position can name more than one
/// offset; the token tells them apart.
fn offset(query: &str, pos: async_graphql::Pos, token: &str) -> Option<usize> {
    let (mut line, mut column) = (1, 1);
    for (at, character) in query.char_indices() {
        if line == pos.line && column == pos.column && query[at..].starts_with(token) {
            return Some(at);
        }
        match character {
            '\n' => (line, column) = (line + 1, 1),
            '\r' => column = 1,
            _ => column += 1,
        }
    }
    None
}

/// The offset of the `)` that closes an argument list, scanning from within it: parentheses
/// appear in values only inside strings, and in comments.
fn closing_parenthesis(query: &str, from: usize) -> Option<usize> {
    let bytes = query.as_bytes();
    let mut at = from;
    while at < bytes.len() {
        match bytes[at] {
            b')' => return Some(at),
            b'#' => at += query[at..].find(['\n', '\r']).unwrap_or(query.len() - at),
            b'"' if query[at..].starts_with("\"\"\"") => {
                at += 3;
                loop {
                    let rest = &query[at..];
                    let end = rest.find("\"\"\"")?;
                    at += end + 3;
                    // `\"""` is an escaped quote, not the end of the block string.
                    if !rest[..end].ends_with('\\') {
                        break;
                    }
                }
                continue;
            }
            b'"' => {
                at += 1;
                while *bytes.get(at)? != b'"' {
                    at += if bytes[at] == b'\\' { 2 } else { 1 };
                }
            }
            _ => {}
        }
        at += 1;
    }
    None
}

/// Where an operation's messages go, and how each is framed.
#[derive(Debug)]
enum Framing {
    /// The operation is the stream: `next` carries the result (and, resumable, its cursor as the
    /// event's `id`), `complete` ends the stream.
    Distinct,
    /// One of a single-connection stream's operations, by its id.
    Single(String),
    Multipart,
}

impl Framing {
    /// A result's message; `cursor`, the event's, is its SSE `id` on a distinct stream.
    fn next(&self, response: &Response, cursor: Option<&str>) -> Bytes {
        let result = serde_json::to_string(response).expect("a GraphQL response serializes");
        self.serialized(&result, cursor)
    }

    /// The message of a result already serialized.
    fn serialized(&self, result: &str, cursor: Option<&str>) -> Bytes {
        match self {
            Self::Distinct => match cursor {
                Some(id) => Bytes::from(format!("id: {id}\nevent: next\ndata: {result}\n\n")),
                None => sse_event("next", result),
            },
            Self::Single(id) => {
                let id = serde_json::to_string(id).expect("a string serializes");
                sse_event("next", &format!(r#"{{"id":{id},"payload":{result}}}"#))
            }
            Self::Multipart => part(&format!(r#"{{"payload":{result}}}"#)),
        }
    }

    /// The end of the operation, if it is said in a message (the multipart end is the final
    /// boundary, written when the body ends).
    fn complete(&self) -> Option<Bytes> {
        match self {
            // `data:` with nothing after it, so that an `EventSource` dispatches the event.
            Self::Distinct => Some(Bytes::from_static(b"event: complete\ndata:\n\n")),
            Self::Single(id) => {
                let id = serde_json::json!({ "id": id });
                Some(sse_event("complete", &id.to_string()))
            }
            Self::Multipart => None,
        }
    }
}

/// How a stream ends once what waits is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The body ends (with the final boundary for multipart).
    Finished,
    /// The body fails, so that the client sees a broken response rather than a finished one.
    Cut,
}

/// What waits for one stream's client.
struct Queue {
    transport: Transport,
    items: VecDeque<Queued>,
    /// The bytes of `items`.
    bytes: usize,
    budget: usize,
    end: Option<End>,
    waker: Option<Waker>,
    queued: metrics::Gauge,
}

struct Queued {
    bytes: Bytes,
    /// The operation whose snapshot this is: a newer one replaces it while it waits.
    snapshot_of: Option<String>,
}

impl Queue {
    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    fn enqueue(&mut self, bytes: Bytes, snapshot_of: Option<String>) {
        self.bytes += bytes.len();
        self.queued.increment(bytes.len() as f64);
        self.items.push_back(Queued { bytes, snapshot_of });
        self.wake();
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.queued.decrement(self.bytes as f64);
    }
}

/// A message past the budget, which could replace nothing.
#[derive(Debug, PartialEq, Eq)]
struct OverBudget;

/// The producing side of a stream: operations push their messages here.
#[derive(Clone)]
struct Inlet {
    queue: Arc<Mutex<Queue>>,
    /// Cancelled when the body is dropped: the client left, or the server let the response go.
    gone: CancellationToken,
}

/// The response body of a stream: what the client reads.
struct Outlet {
    queue: Arc<Mutex<Queue>>,
    cut: bool,
    _gone: DropGuard,
    /// What the stream holds while it is open (a place under a per-address cap, say).
    _held: Box<dyn Any + Send>,
    /// Counts the stream in [`STREAMS_OPEN`].
    _open: Counted,
    messages_sent: metrics::Counter,
    bytes_sent: metrics::Counter,
}

/// A new stream's two ends, within `budget` bytes of unread messages.
fn channel(transport: Transport, budget: usize, held: Box<dyn Any + Send>) -> (Inlet, Outlet) {
    let label = transport.label();
    let mut queue = Queue {
        transport,
        items: VecDeque::new(),
        bytes: 0,
        budget,
        end: None,
        waker: None,
        queued: metrics::gauge!(STREAM_QUEUED_BYTES, "transport" => label),
    };
    queue.enqueue(transport.opening(), None);
    let queue = Arc::new(Mutex::new(queue));
    let gone = CancellationToken::new();
    let outlet = Outlet {
        queue: queue.clone(),
        cut: false,
        _gone: gone.clone().drop_guard(),
        _held: held,
        _open: Counted::new(metrics::gauge!(STREAMS_OPEN, "transport" => label)),
        messages_sent: metrics::counter!(STREAM_MESSAGES_SENT, "transport" => label),
        bytes_sent: metrics::counter!(STREAM_BYTES_SENT, "transport" => label),
    };
    (Inlet { queue, gone }, outlet)
}

fn lock(queue: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Inlet {
    /// Queues `bytes`; a snapshot replaces the unsent one of its operation, in its place. What
    /// comes after the stream ended is dropped: nobody will read it.
    fn push(&self, bytes: Bytes, snapshot_of: Option<&str>) -> Result<(), OverBudget> {
        let mut queue = lock(&self.queue);
        if queue.end.is_some() {
            return Ok(());
        }
        if let Some(id) = snapshot_of {
            let waiting = queue
                .items
                .iter_mut()
                .find(|queued| queued.snapshot_of.as_deref() == Some(id));
            if let Some(waiting) = waiting {
                let (added, removed) = (bytes.len(), waiting.bytes.len());
                waiting.bytes = bytes;
                queue.bytes = queue.bytes - removed + added;
                queue.queued.increment(added as f64);
                queue.queued.decrement(removed as f64);
                let transport = queue.transport.label();
                metrics::counter!(STREAM_SNAPSHOTS_REPLACED, "transport" => transport).increment(1);
                return Ok(());
            }
        }
        // What nothing waits ahead of goes out whatever its size: the budget bounds what piles up
        // behind it.
        if !queue.items.is_empty() && queue.bytes + bytes.len() > queue.budget {
            return Err(OverBudget);
        }
        queue.enqueue(bytes, snapshot_of.map(str::to_owned));
        Ok(())
    }

    fn transport(&self) -> Transport {
        lock(&self.queue).transport
    }

    /// Messages of the protocol itself (a `complete`, an error) are a few bytes each and never
    /// refused.
    fn push_control(&self, bytes: Bytes) {
        let mut queue = lock(&self.queue);
        if queue.end.is_none() {
            queue.enqueue(bytes, None);
        }
    }

    /// The end of an operation that fell behind, past the budget but not past twice it: a client
    /// that keeps starting operations without reading would otherwise pile ends up.
    fn push_end(&self, bytes: Bytes) -> Result<(), OverBudget> {
        let mut queue = lock(&self.queue);
        if queue.end.is_none() {
            if queue.bytes + bytes.len() > 2 * queue.budget {
                return Err(OverBudget);
            }
            queue.enqueue(bytes, None);
        }
        Ok(())
    }

    /// A heartbeat, unless something is waiting already (which shows the stream alive as well).
    fn heartbeat(&self) {
        let transport = {
            let queue = lock(&self.queue);
            if !queue.items.is_empty() {
                return;
            }
            queue.transport
        };
        self.push_control(transport.heartbeat());
    }

    /// The body ends once what waits is read.
    fn finish(&self) {
        let mut queue = lock(&self.queue);
        if queue.end.is_none() {
            if queue.transport == Transport::Multipart {
                queue.enqueue(Bytes::from_static(b"--\r\n"), None);
            }
            queue.end = Some(End::Finished);
            queue.wake();
        }
    }

    /// The client fell more than its budget behind on events: what waits is dropped and the body
    /// fails.
    fn cut(&self) {
        let mut queue = lock(&self.queue);
        if queue.end.is_some() {
            return;
        }
        let transport = queue.transport.label();
        metrics::counter!(STREAM_SLOW_CONSUMER_CUTS, "transport" => transport).increment(1);
        queue.items.clear();
        queue.queued.decrement(queue.bytes as f64);
        queue.bytes = 0;
        queue.end = Some(End::Cut);
        queue.wake();
    }

    /// On shutdown: a multipart response says why it ends, an SSE stream just ends (clients of
    /// `graphql-sse` reconnect when a stream ends without `complete`).
    fn shut_down(&self) {
        let transport = lock(&self.queue).transport;
        if transport == Transport::Multipart {
            let error = serde_json::json!({
                "payload": null,
                "errors": [{
                    "message": "the server is shutting down; subscribe again",
                    "extensions": { "code": SHUTTING_DOWN },
                }],
            });
            self.push_control(part(&error.to_string()));
        }
        self.finish();
    }
}

/// Why a stream's body failed: the client did not keep up.
#[derive(Debug, thiserror::Error)]
#[error("the client fell more than its send budget behind on an event stream")]
pub struct SlowConsumer;

impl Stream for Outlet {
    type Item = Result<Bytes, SlowConsumer>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.cut {
            return Poll::Ready(None);
        }
        let queue = self.queue.clone();
        let mut queue = lock(&queue);
        if let Some(Queued { bytes, .. }) = queue.items.pop_front() {
            queue.bytes -= bytes.len();
            queue.queued.decrement(bytes.len() as f64);
            self.messages_sent.increment(1);
            self.bytes_sent.increment(bytes.len() as u64);
            return Poll::Ready(Some(Ok(bytes)));
        }
        match queue.end {
            Some(End::Finished) => Poll::Ready(None),
            Some(End::Cut) => {
                drop(queue);
                self.cut = true;
                Poll::Ready(Some(Err(SlowConsumer)))
            }
            None => {
                queue.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// What streams share: the websocket's bounds and the server's shutdown.
#[derive(Clone)]
pub(crate) struct Bounds {
    pub(crate) websocket: websocket::Settings,
    pub(crate) shutdown: CancellationToken,
}

impl Bounds {
    /// The operation counted as running, and what its pump must know of it.
    fn live(&self, transport: Transport, request: &async_graphql::Request) -> (Counted, Live) {
        (running(transport), self.live_of(request))
    }

    /// What an operation's pump must know of it.
    fn live_of(&self, request: &async_graphql::Request) -> Live {
        let (snapshot, reads_viewer) = websocket::snapshot_and_viewer(request, &self.websocket);
        let expires = reads_viewer
            .then(|| websocket::credentials_expire(&request.data))
            .flatten();
        Live {
            snapshot,
            shareable: snapshot && !reads_viewer,
            expires,
            resume: Resume::of(request, self.websocket.resumable),
        }
    }

    pub(crate) fn resumable(&self) -> &'static [Resumable] {
        self.websocket.resumable
    }
}

/// What an operation's pump knows of it.
struct Live {
    /// Each of its results is a whole snapshot.
    snapshot: bool,
    /// A snapshot reading nothing of the viewer: a group's results serve it.
    shareable: bool,
    /// When it ends for want of credentials: when those it runs with expire, if it reads the
    /// viewer.
    expires: Option<SystemTime>,
    /// Where its events carry their cursor, for a resumable field.
    resume: Option<Resume>,
}

/// The last result of an event stream whose client fell more than the send budget behind:
/// `cursor` is that of the last event the client receives before it.
fn fell_behind(cursor: Option<String>) -> Response {
    let mut error = async_graphql::ServerError::new(
        "the client fell more than its send budget behind; subscribe again after \
         extensions.cursor (or, without one, read again)",
        None,
    );
    let extensions = error.extensions.get_or_insert_with(Default::default);
    extensions.set("code", websocket::RESYNC_REQUIRED);
    if let Some(cursor) = cursor {
        extensions.set("cursor", cursor);
    }
    Response::from_errors(vec![error])
}

/// The last result of an operation whose credentials expired.
fn credentials_expired() -> Response {
    let mut error = async_graphql::ServerError::new(
        "the credentials expired; sign in again and subscribe anew",
        None,
    );
    error
        .extensions
        .get_or_insert_with(Default::default)
        .set("code", UNAUTHENTICATED);
    Response::from_errors(vec![error])
}

/// An operation counted in [`STREAM_OPERATIONS`] while it runs.
fn running(transport: Transport) -> Counted {
    Counted::new(metrics::gauge!(STREAM_OPERATIONS, "transport" => transport.label()))
}

/// How an operation's pump stopped.
#[derive(Debug, PartialEq, Eq)]
enum Pumped {
    /// The operation sent its last result; its end is queued.
    Completed,
    /// The stream is over (client gone, cut, shut down) or the client stopped the operation.
    Stopped,
}

/// Moves one operation's results into `inlet` until it completes, `stop` is cancelled, the
/// client goes, or the credentials expire (then an error coded `UNAUTHENTICATED` is its last
/// result). An event past the budget is dropped with whatever would follow it, and the operation
/// ends with an error coded `RESYNC_REQUIRED` carrying the cursor of its last event queued; a
/// snapshot past the budget, which had no unsent one to replace, cuts the stream.
async fn pump(
    mut responses: BoxStream<'static, Resolved>,
    framing: &Framing,
    snapshot_of: Option<&str>,
    live: &Live,
    inlet: &Inlet,
    stop: &CancellationToken,
) -> Pumped {
    let expiry = async {
        match live.expires {
            Some(at) => {
                let left = at.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::time::sleep(left).await;
            }
            None => std::future::pending().await,
        }
    };
    let mut expiry = std::pin::pin!(expiry);
    let mut last_cursor = None;
    loop {
        let response = tokio::select! {
            biased;
            () = inlet.gone.cancelled() => return Pumped::Stopped,
            () = stop.cancelled() => return Pumped::Stopped,
            () = &mut expiry => {
                inlet.push_control(framing.next(&credentials_expired(), None));
                None
            }
            response = responses.next() => response,
        };
        let Some(response) = response else {
            if let Some(complete) = framing.complete() {
                inlet.push_control(complete);
            }
            return Pumped::Completed;
        };
        let (message, cursor) = match &response {
            Resolved::Own(response) => {
                let cursor = live
                    .resume
                    .as_ref()
                    .and_then(|resume| resume.event_id(response));
                (framing.next(response, cursor), cursor)
            }
            Resolved::Shared(result) => (framing.serialized(result, None), None),
        };
        match inlet.push(message, snapshot_of) {
            Ok(()) => {
                if let Some(cursor) = cursor {
                    last_cursor = Some(cursor.to_owned());
                }
            }
            Err(OverBudget) if snapshot_of.is_none() => {
                let mut end = framing.next(&fell_behind(last_cursor), None).to_vec();
                if let Some(complete) = framing.complete() {
                    end.extend_from_slice(&complete);
                }
                if inlet.push_end(Bytes::from(end)).is_err() {
                    inlet.cut();
                    return Pumped::Stopped;
                }
                let transport = inlet.transport().label();
                metrics::counter!(STREAM_SLOW_CONSUMER_RESYNCS, "transport" => transport)
                    .increment(1);
                return Pumped::Completed;
            }
            Err(OverBudget) => {
                inlet.cut();
                return Pumped::Stopped;
            }
        }
    }
}

/// A response body that runs one operation (distinct SSE or multipart) and ends with it.
pub(crate) fn one_operation<E: async_graphql::Executor>(
    executor: &E,
    request: async_graphql::Request,
    transport: Transport,
    bounds: &Bounds,
    held: Box<dyn Any + Send>,
) -> impl Stream<Item = Result<Bytes, SlowConsumer>> + Send + 'static {
    let (inlet, outlet) = channel(transport, bounds.websocket.send_budget, held);
    let (running, live) = bounds.live(transport, &request);
    let snapshot = live.snapshot.then_some("");
    let responses = match &bounds.websocket.groups {
        Some(groups) if live.shareable => shared(groups, request),
        _ => executor
            .execute_stream(request, None)
            .map(|response| Resolved::Own(Box::new(response)))
            .boxed(),
    };
    let framing = match transport {
        Transport::Sse => Framing::Distinct,
        Transport::Multipart => Framing::Multipart,
    };
    let heartbeat = match transport {
        Transport::Sse => bounds.websocket.ping_interval,
        Transport::Multipart => MULTIPART_HEARTBEAT,
    };
    let shutdown = bounds.shutdown.clone();
    tokio::spawn(async move {
        let _running = running;
        let stop = CancellationToken::new();
        let pumped = {
            let pumping = pump(responses, &framing, snapshot, &live, &inlet, &stop);
            let mut pumping = std::pin::pin!(pumping);
            let mut beats = heartbeats(heartbeat);
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        inlet.shut_down();
                        break None;
                    }
                    pumped = &mut pumping => break Some(pumped),
                    _ = beats.next() => inlet.heartbeat(),
                }
            }
        };
        if pumped == Some(Pumped::Completed) {
            inlet.finish();
        }
    });
    outlet
}

/// A result of an operation: resolved for it alone, or its group's, serialized once for all.
enum Resolved {
    Own(Box<Response>),
    Shared(Arc<str>),
}

/// The results of the group of `request`, which a stream joins alone, on a channel of its own.
fn shared(groups: &Arc<Groups>, request: async_graphql::Request) -> BoxStream<'static, Resolved> {
    let (deliveries, received) = mpsc::unbounded_channel();
    let membership = groups.join(request, "", Arc::new(deliveries));
    futures_util::stream::unfold(
        (received, membership),
        |(mut received, membership)| async move {
            let result = received.recv().await?.payload?;
            Some((Resolved::Shared(result), (received, membership)))
        },
    )
    .boxed()
}

/// Ticks every `period`, the first after one period; never, for a zero period.
fn heartbeats(period: Duration) -> BoxStream<'static, ()> {
    if period.is_zero() {
        return futures_util::stream::pending().boxed();
    }
    let start = tokio::time::Instant::now() + period;
    let mut interval = tokio::time::interval_at(start, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures_util::stream::unfold(interval, |mut interval| async move {
        interval.tick().await;
        Some(((), interval))
    })
    .boxed()
}

/// Single-connection streams by token, reserved, open or lapsing.
#[derive(Clone, Default)]
pub(crate) struct Reservations(Arc<Mutex<HashMap<String, Reservation>>>);

struct Reservation {
    inlet: Inlet,
    /// The body, until the stream opens and takes it.
    outlet: Option<Outlet>,
    opened: CancellationToken,
    /// The running operations by id, each with what stops it.
    operations: Arc<Mutex<HashMap<String, Arc<CancellationToken>>>>,
}

/// Why a single-connection request is refused.
#[derive(Debug, PartialEq)]
pub(crate) enum Refused {
    /// No reservation has this token (404).
    UnknownToken,
    /// The reservation's stream is open already (409).
    StreamOpen,
    /// An operation with this id runs on the stream already (409).
    DuplicateOperation,
    /// The stream runs as many operations as it may (429).
    TooManyOperations(usize),
    /// The operation's document does not parse or validate, or is over a limit (400): the
    /// errors, coded as a response's are.
    Invalid(Vec<async_graphql::ServerError>),
}

impl Refused {
    pub(crate) fn message(&self) -> String {
        match self {
            Self::UnknownToken => "no event stream is reserved under this token".to_owned(),
            Self::StreamOpen => "the event stream of this token is open already".to_owned(),
            Self::DuplicateOperation => "an operation with this id runs already".to_owned(),
            Self::TooManyOperations(max) => {
                format!("more than {max} operations at once on one event stream")
            }
            Self::Invalid(_) => "the operation does not validate".to_owned(),
        }
    }
}

fn lock_map<T>(map: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Reservations {
    /// Reserves a stream and returns its token. The reservation lapses if its stream does not
    /// open within the websocket init timeout, and ends with its stream.
    pub(crate) fn reserve(&self, bounds: &Bounds, held: Box<dyn Any + Send>) -> String {
        let token = new_token();
        let (inlet, outlet) = channel(Transport::Sse, bounds.websocket.send_budget, held);
        let opened = CancellationToken::new();
        let reservation = Reservation {
            inlet: inlet.clone(),
            outlet: Some(outlet),
            opened: opened.clone(),
            operations: Arc::default(),
        };
        lock_map(&self.0).insert(token.clone(), reservation);
        let (reservations, token_kept) = (self.clone(), token.clone());
        let (init_timeout, ping) = (
            bounds.websocket.init_timeout,
            bounds.websocket.ping_interval,
        );
        let shutdown = bounds.shutdown.clone();
        tokio::spawn(async move {
            let opened_in_time = tokio::select! {
                () = opened.cancelled() => true,
                () = tokio::time::sleep(init_timeout) => false,
                () = shutdown.cancelled() => false,
            };
            if opened_in_time {
                let mut beats = heartbeats(ping);
                loop {
                    tokio::select! {
                        biased;
                        () = inlet.gone.cancelled() => break,
                        () = shutdown.cancelled() => {
                            inlet.shut_down();
                            break;
                        }
                        _ = beats.next() => inlet.heartbeat(),
                    }
                }
            }
            // Dropping a reservation whose stream never opened drops its body, and with it what
            // the body holds; the operations see the body gone and stop.
            let removed = lock_map(&reservations.0).remove(&token_kept);
            drop(removed);
        });
        token
    }

    /// The body of the stream reserved under `token`, once.
    pub(crate) fn open(
        &self,
        token: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, SlowConsumer>> + Send + 'static, Refused> {
        let mut reservations = lock_map(&self.0);
        let reservation = reservations.get_mut(token).ok_or(Refused::UnknownToken)?;
        let outlet = reservation.outlet.take().ok_or(Refused::StreamOpen)?;
        reservation.opened.cancel();
        Ok(outlet)
    }

    /// Runs `request` on the stream reserved under `token` as operation `id`, once its document
    /// validated: one that does not (or is over a limit) is refused with its errors and holds
    /// nothing, neither its id nor a place under the cap.
    pub(crate) async fn start<E: async_graphql::Executor>(
        &self,
        token: &str,
        id: String,
        executor: &E,
        mut request: async_graphql::Request,
        bounds: &Bounds,
    ) -> Result<(), Refused> {
        let (inlet, operations) = {
            let reservations = lock_map(&self.0);
            let reservation = reservations.get(token).ok_or(Refused::UnknownToken)?;
            (reservation.inlet.clone(), reservation.operations.clone())
        };
        let max = bounds.websocket.max_subscriptions;
        let room = |running: &HashMap<String, Arc<CancellationToken>>| {
            if running.contains_key(&id) {
                return Err(Refused::DuplicateOperation);
            }
            if running.len() >= max {
                return Err(Refused::TooManyOperations(max));
            }
            Ok(())
        };
        room(&lock_map(&operations))?;
        let live = bounds.live_of(&request);
        let (validated, verdict) = Validated::new();
        request.data.insert(validated);
        let mut responses = executor.execute_stream(request, None);
        let first = admitted(&mut responses, verdict).await?;
        let stop = Arc::new(CancellationToken::new());
        {
            // Checked again: another request may have taken the id or the last place meanwhile.
            let mut running = lock_map(&operations);
            room(&running)?;
            running.insert(id.clone(), stop.clone());
        }
        let counted = running(Transport::Sse);
        let responses = futures_util::stream::iter(first)
            .chain(responses)
            .map(|response| Resolved::Own(Box::new(response)))
            .boxed();
        tokio::spawn(async move {
            let _counted = counted;
            let framing = Framing::Single(id.clone());
            let snapshot_of = live.snapshot.then_some(id.as_str());
            pump(responses, &framing, snapshot_of, &live, &inlet, &stop).await;
            let mut running = lock_map(&operations);
            // A stopped id may have been reused already: only this run's entry goes.
            if running
                .get(&id)
                .is_some_and(|entry| Arc::ptr_eq(entry, &stop))
            {
                running.remove(&id);
            }
        });
        Ok(())
    }

    /// Stops operation `id` of the stream reserved under `token`; an id not running is no error
    /// (it may have completed on its own meanwhile).
    pub(crate) fn stop(&self, token: &str, id: &str) -> Result<(), Refused> {
        let operations = {
            let reservations = lock_map(&self.0);
            let reservation = reservations.get(token).ok_or(Refused::UnknownToken)?;
            reservation.operations.clone()
        };
        if let Some(stop) = lock_map(&operations).remove(id) {
            stop.cancel();
        }
        Ok(())
    }
}

/// Whether a request's document validated, limits included, as the pipeline tells it: what a
/// single-connection operation waits for before it is accepted.
pub struct Validated(Mutex<Option<tokio::sync::oneshot::Sender<bool>>>);

impl Validated {
    fn new() -> (Self, tokio::sync::oneshot::Receiver<bool>) {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        (Self(Mutex::new(Some(sender))), receiver)
    }

    /// The validation's verdict, once.
    pub(crate) fn tell(&self, valid: bool) {
        if let Some(sender) = lock_map(&self.0).take() {
            let _ = sender.send(valid);
        }
    }
}

/// Waits for the verdict on the document of `responses`, driving it meanwhile: `Ok` with what it
/// sent already (a query's result may come at once) if it validated, else its errors. A document
/// refused before validation (it does not parse, a limit of the guard) never gets a verdict, but
/// its errors come as the first response.
async fn admitted(
    responses: &mut BoxStream<'static, Response>,
    mut verdict: tokio::sync::oneshot::Receiver<bool>,
) -> Result<Option<Response>, Refused> {
    let refusal = tokio::select! {
        biased;
        told = &mut verdict => match told {
            Ok(true) => return Ok(None),
            _ => responses.next().await,
        },
        first = responses.next() => {
            if verdict.try_recv() == Ok(true) {
                return Ok(first);
            }
            first
        }
    };
    Err(Refused::Invalid(
        refusal.map(|response| response.errors).unwrap_or_default(),
    ))
}

/// An unguessable token: 128 random bits in hex.
fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drained(outlet: &mut Outlet) -> Vec<Result<Bytes, SlowConsumer>> {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        while let Poll::Ready(Some(item)) = Pin::new(&mut *outlet).poll_next(&mut cx) {
            out.push(item);
        }
        out
    }

    fn text(items: &[Result<Bytes, SlowConsumer>]) -> String {
        items
            .iter()
            .map(|item| String::from_utf8(item.as_ref().unwrap().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_waiting_snapshot_is_replaced_in_place_and_an_event_past_the_budget_is_refused() {
        let (inlet, mut outlet) = channel(Transport::Sse, 100, Box::new(()));
        // The opening comment waits ahead of everything.
        inlet.push(Bytes::from("a".repeat(40)), Some("1")).unwrap();
        inlet.push(Bytes::from("e".repeat(40)), None).unwrap();
        inlet.push(Bytes::from("b".repeat(40)), Some("1")).unwrap();
        assert_eq!(
            inlet.push(Bytes::from("e".repeat(40)), None),
            Err(OverBudget)
        );
        let sent = text(&drained(&mut outlet));
        assert_eq!(sent, format!(":\n\n{}{}", "b".repeat(40), "e".repeat(40)));
    }

    #[test]
    fn a_cut_stream_drops_what_waits_and_fails_its_body_once() {
        let (inlet, mut outlet) = channel(Transport::Sse, 100, Box::new(()));
        inlet.push(Bytes::from("x"), None).unwrap();
        inlet.cut();
        inlet.push(Bytes::from("late"), None).unwrap();
        let items = drained(&mut outlet);
        assert_eq!(items.len(), 1);
        assert!(items[0].is_err());
    }

    #[test]
    fn a_finished_multipart_body_ends_with_the_final_boundary_and_a_heartbeat_waits_for_room() {
        let (inlet, mut outlet) = channel(Transport::Multipart, 1000, Box::new(()));
        // The opening boundary waits: a heartbeat would add nothing.
        inlet.heartbeat();
        let framed = Framing::Multipart.next(&Response::new(async_graphql::Value::Null), None);
        inlet.push(framed, None).unwrap();
        inlet.finish();
        let sent = text(&drained(&mut outlet));
        assert_eq!(
            sent,
            "\r\n--graphql\r\ncontent-type: application/json; charset=utf-8\r\n\r\n{\"payload\":{\"data\":null}}\r\n--graphql--\r\n"
        );
        inlet.heartbeat();
        assert!(drained(&mut outlet).is_empty());
    }

    #[test]
    fn single_connection_events_name_their_operation_and_distinct_ones_do_not() {
        let response = Response::new(async_graphql::Value::from(1));
        let single = Framing::Single("op \"1\"".to_owned());
        assert_eq!(
            single.next(&response, Some("c1")),
            "event: next\ndata: {\"id\":\"op \\\"1\\\"\",\"payload\":{\"data\":1}}\n\n"
        );
        assert_eq!(
            single.complete().unwrap(),
            "event: complete\ndata: {\"id\":\"op \\\"1\\\"\"}\n\n"
        );
        assert_eq!(
            Framing::Distinct.next(&response, None),
            "event: next\ndata: {\"data\":1}\n\n"
        );
        assert_eq!(
            Framing::Distinct.complete().unwrap(),
            "event: complete\ndata:\n\n"
        );
    }

    const RESUMABLE: &[Resumable] = &[Resumable {
        field: "news",
        cursor: "cursor",
        argument: "after",
    }];

    #[test]
    fn a_resumable_event_carries_its_cursor_as_its_id_and_last_event_id_becomes_its_argument() {
        let query = "subscription($from: String) { latest: news(after: $from) { cursor } }";
        let resume = Resume::of(&async_graphql::Request::new(query), RESUMABLE).unwrap();
        let mut request = async_graphql::Request::new(query);
        resume.after(&mut request, "c41");
        assert_eq!(
            request.variables.get(&async_graphql::Name::new("from")),
            Some(&async_graphql::Value::from("c41"))
        );
        let data = serde_json::json!({ "latest": { "cursor": "c42" } });
        let response = Response::new(async_graphql::Value::from_json(data).unwrap());
        assert_eq!(
            Framing::Distinct.next(&response, resume.event_id(&response)),
            "id: c42\nevent: next\ndata: {\"data\":{\"latest\":{\"cursor\":\"c42\"}}}\n\n"
        );

        let resumed = |query: &str| {
            let mut request = async_graphql::Request::new(query);
            Resume::of(&request, RESUMABLE)
                .unwrap()
                .after(&mut request, "c\"41");
            request.query
        };
        // The header names the event received last, newer than any cursor the document holds.
        assert_eq!(
            resumed("subscription { news(after: \"c1\", first: 2) { cursor } }"),
            "subscription { news(after: \"c\\\"41\" first: 2) { cursor } }"
        );
        assert_eq!(
            resumed(
                "subscription {\r\n  news(first: 2,\r\n after: \"\"\"a)\\\"\"\"b\"\"\" # )\n) { cursor } }"
            ),
            "subscription {\r\n  news(first: 2,\r\n after: \"c\\\"41\" ) { cursor } }"
        );
        assert_eq!(
            resumed("subscription { n: news(first: 2) { cursor } }"),
            "subscription { n: news(after: \"c\\\"41\" first: 2) { cursor } }"
        );
        assert_eq!(
            resumed("subscription { news @skip(if: false) { cursor } }"),
            "subscription { news(after: \"c\\\"41\") @skip(if: false) { cursor } }"
        );
        let persisted = "subscription { news { cursor } }";
        let mut request = async_graphql::Request::new(persisted);
        request
            .extensions
            .insert("persistedQuery".to_owned(), async_graphql::Value::Null);
        Resume::of(&request, RESUMABLE)
            .unwrap()
            .after(&mut request, "c41");
        assert_eq!(request.query, persisted, "a persisted text keeps its hash");
        let two = "subscription { news { cursor } board { top } }";
        assert_eq!(
            Resume::of(&async_graphql::Request::new(two), RESUMABLE),
            None
        );
    }

    #[test]
    fn an_end_waits_past_the_budget_up_to_twice_it() {
        let (inlet, _outlet) = channel(Transport::Sse, 100, Box::new(()));
        // The opening comment's 3 bytes and these 97 fill the budget.
        inlet.push(Bytes::from("e".repeat(97)), None).unwrap();
        assert_eq!(inlet.push(Bytes::from("e"), None), Err(OverBudget));
        assert_eq!(inlet.push_end(Bytes::from("x".repeat(60))), Ok(()));
        assert_eq!(inlet.push_end(Bytes::from("x".repeat(60))), Err(OverBudget));
    }

    #[test]
    fn the_body_going_away_is_seen_by_the_producer() {
        let (inlet, outlet) = channel(Transport::Sse, 100, Box::new(()));
        assert!(!inlet.gone.is_cancelled());
        drop(outlet);
        assert!(inlet.gone.is_cancelled());
    }
}
