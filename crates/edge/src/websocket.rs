//! A websocket driver for any async-graphql executor, speaking graphql-transport-ws and the legacy
//! subscriptions-transport-ws. async-graphql speaks both protocols but leaves these to its caller,
//! and the driver adds them, each with its close code:
//!
//! | code | when |
//! |---|---|
//! | 4408 | no `connection_init` within the init timeout |
//! | 4409 | a graphql-transport-ws `subscribe` under an id already running (async-graphql would silently replace it) |
//! | 1008 | a `subscribe` past the operations one socket may run at once (policy violation) |
//! | 3008 | nothing at all heard from the client within the pong timeout after a ping |
//! | 1001 | the server shuts down ("going away") |
//!
//! Pings: every ping interval the server sends graphql-transport-ws's `ping`, which its clients
//! answer with `pong`; on the legacy protocol, whose clients answer nothing, a `ka` and a websocket
//! Ping frame, which every websocket stack answers with a Pong frame by itself. Any frame from the
//! client counts as an answer. 3008 is the registered "timeout" code, which clients such as
//! graphql-ws treat as worth a reconnect.
//!
//! Credentials that expire: when `on_init`'s data holds a [`CredentialsExpire`], the operations
//! that read something of the viewer (those selecting a field the settings'
//! [`Settings::viewer_fields`] names) end at that time with an `error` coded `UNAUTHENTICATED`
//! then `complete`, and a later one gets the same at once; the others go on.
//!
//! The caller upgrades the connection (offering the [`protocol`] the client asked for) and hands
//! the socket to [`serve`] with its executor, usually an `async_graphql::Schema`, and what to do
//! with the `connection_init` payload: typically authenticate it and return the connection's
//! `Data`.

use std::any::TypeId;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_graphql::http::{ClientMessage, WebSocketProtocols, WsMessage};
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Selection, SelectionSet,
};
use async_graphql::{Data, ErrorExtensionValues, Executor, Name};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::{HeaderMap, header};
use futures_util::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The code of a legacy `connection_error` for a `connection_init` refused without a code of its
/// own, and of the error that ends an operation whose credentials expired.
const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
/// The code of a legacy `connection_error` for a protocol mistake (a second `connection_init`).
const CLIENT_ERROR: &str = "BAD_USER_INPUT";

/// The close code of a socket from which nothing was heard within the pong timeout.
pub const PING_TIMEOUT: u16 = 3008;

/// How a connection is bounded.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long a socket may take to send `connection_init` (then 4408).
    pub init_timeout: Duration,
    /// How often the server pings an acknowledged connection; zero sends no pings.
    pub ping_interval: Duration,
    /// How long after a ping the client has to send anything at all (then [`PING_TIMEOUT`]).
    pub pong_timeout: Duration,
    /// Operations one socket may run at once (one more closes it with 1008).
    pub max_subscriptions: usize,
    /// Whether a field's answer depends on who the viewer is: an operation selecting one, at any
    /// depth, ends when the connection's credentials expire.
    pub viewer_fields: fn(&str) -> bool,
}

/// When the credentials a connection was initialised with stop being valid. The server puts it in
/// the data its `connection_init` handler returns.
#[derive(Clone, Copy, Debug)]
pub struct CredentialsExpire(pub SystemTime);

/// How long a closed socket waits for the client's answering close frame. Closing the connection
/// while the client still sends would reset it, and a reset can take the close frame with it.
const CLOSE_REPLY_WAIT: Duration = Duration::from_secs(1);

/// Client messages read ahead of async-graphql.
const CLIENT_MESSAGES_AHEAD: usize = 8;

/// The protocol of the first `Sec-WebSocket-Protocol` the client offers that the driver speaks.
pub fn protocol(headers: &HeaderMap) -> Option<WebSocketProtocols> {
    headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)?
        .to_str()
        .ok()?
        .split(',')
        .find_map(|offered| offered.trim().parse().ok())
}

/// A message for async-graphql, with the place it holds if the client sent it.
type Forwarded = (
    Box<serde_json::Result<ClientMessage>>,
    Option<OwnedSemaphorePermit>,
);

/// Serves GraphQL over `socket` until the client leaves, breaks the protocol, stops answering, or
/// `shutdown` is cancelled. `on_init` gets the `connection_init` payload and returns the data every
/// operation of the connection sees, or the error that refuses the connection (4403 on
/// graphql-transport-ws).
pub async fn serve<E, OnInit, InitFuture>(
    socket: WebSocket,
    protocol: WebSocketProtocols,
    executor: E,
    settings: Settings,
    shutdown: CancellationToken,
    on_init: OnInit,
) where
    E: Executor,
    OnInit: FnOnce(serde_json::Value) -> InitFuture + Send + 'static,
    InitFuture: Future<Output = async_graphql::Result<Data>> + Send + 'static,
{
    let (mut sink, mut stream) = socket.split();
    let session = Arc::new(Mutex::new(Session::new(protocol, &settings)));
    let on_init = {
        let session = session.clone();
        move |payload| {
            let init = on_init(payload);
            async move {
                let data = init.await;
                let mut session = lock(&session);
                match &data {
                    Ok(data) => session.expires = credentials_expire(data),
                    Err(error) => {
                        session.init_refusal = Some(error.extensions.clone().unwrap_or_default());
                    }
                }
                data
            }
        }
    };
    // The driver reads the client and hands async-graphql what it admits, and what it decides
    // itself (the end of an operation whose credentials expired), through one queue, so both
    // arrive in the order the driver saw them.
    // A client message holds one of a few places until async-graphql takes it, so a client that
    // floods the socket is held back by TCP rather than queued here.
    let ahead = Arc::new(Semaphore::new(CLIENT_MESSAGES_AHEAD));
    let (forward, forwarded) = mpsc::unbounded_channel::<Forwarded>();
    let mut forward = Some(forward);
    let input = futures_util::stream::unfold(forwarded, |mut forwarded| async move {
        let (message, _place) = forwarded.recv().await?;
        Some((*message, forwarded))
    });
    let graphql = async_graphql::http::WebSocket::from_message_stream(executor, input, protocol)
        .on_connection_init(on_init);
    let mut graphql = std::pin::pin!(graphql);
    let mut init_deadline = std::pin::pin!(tokio::time::sleep(settings.init_timeout));
    let mut awaiting_init = true;
    let pinging = !settings.ping_interval.is_zero();
    let period = settings.ping_interval.max(Duration::from_millis(1));
    let mut ping = tokio::time::interval_at(Instant::now() + period, period);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pong_deadline = std::pin::pin!(tokio::time::sleep(settings.pong_timeout));
    let mut awaiting_pong = false;
    let mut expiry = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    let mut expiry_armed = false;
    let close = loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break Some(close_frame(1001, "server shutting down")),
            () = &mut init_deadline, if awaiting_init => {
                if !lock(&session).initialised {
                    break Some(close_frame(4408, "Connection initialisation timeout"));
                }
                awaiting_init = false;
            }
            () = &mut pong_deadline, if awaiting_pong => {
                break Some(close_frame(PING_TIMEOUT, "Ping timeout: nothing heard from the client"));
            }
            () = &mut expiry, if expiry_armed => {
                expiry_armed = false;
                let ended = lock(&session).expire();
                for id in ended {
                    if let Some(forward) = &forward {
                        let _ = forward.send((Box::new(Ok(ClientMessage::Stop { id: id.clone() })), None));
                    }
                    if send_ended(&mut sink, protocol, &id).await.is_err() {
                        break;
                    }
                }
            }
            (received, place) = async {
                let place = ahead.clone().acquire_owned().await.expect("the semaphore is never closed");
                (stream.next().await, place)
            }, if forward.is_some() => {
                let message = match received {
                    Some(Ok(message)) => message,
                    // The client's input ended: so does async-graphql's, which then ends the exchange.
                    _ => {
                        forward = None;
                        continue;
                    }
                };
                awaiting_pong = false;
                let data = match message {
                    Message::Text(_) | Message::Binary(_) => message.into_data(),
                    _ => continue,
                };
                // A message that is not one of the protocol's goes on as it is: async-graphql closes
                // the socket for it with its own code.
                let parsed = ClientMessage::from_bytes(&data);
                if let Ok(message) = &parsed {
                    let admission = lock(&session).admit(message);
                    match admission {
                        Admission::Forward => {}
                        Admission::Close(frame) => break Some(frame),
                        Admission::Unauthenticated(id) => {
                            if send_ended(&mut sink, protocol, &id).await.is_err() {
                                break None;
                            }
                            continue;
                        }
                    }
                }
                if let Some(forward) = &forward {
                    let _ = forward.send((Box::new(parsed), Some(place)));
                }
            }
            _ = ping.tick(), if pinging => {
                if !lock(&session).acknowledged {
                    continue;
                }
                if !awaiting_pong {
                    awaiting_pong = true;
                    pong_deadline.as_mut().reset(Instant::now() + settings.pong_timeout);
                }
                if send_ping(&mut sink, protocol).await.is_err() {
                    break None;
                }
            }
            message = graphql.next() => match message {
                Some(WsMessage::Text(text)) => {
                    let (text, expires) = {
                        let mut session = lock(&session);
                        (session.outgoing(text), session.expires.filter(|_| !session.expired))
                    };
                    if let (Some(expires), false) = (expires, expiry_armed) {
                        let left = expires.duration_since(SystemTime::now()).unwrap_or_default();
                        expiry.as_mut().reset(Instant::now() + left);
                        expiry_armed = true;
                    }
                    let Some(text) = text else { continue };
                    if sink.send(Message::Text(text.into())).await.is_err() {
                        break None;
                    }
                }
                Some(WsMessage::Close(code, reason)) => {
                    break Some(lock(&session).protocol_close(code, &reason));
                }
                // async-graphql ends without a close frame after a legacy `connection_error`
                // and when the client's input ends; a close frame tells the client it was on
                // purpose (and goes nowhere if the client is gone).
                None => break Some(close_frame(1000, "")),
            },
        }
    };
    let Some(close) = close else { return };
    if sink.send(Message::Close(Some(close))).await.is_ok() {
        let _ = tokio::time::timeout(CLOSE_REPLY_WAIT, async {
            while let Some(Ok(message)) = stream.next().await {
                if matches!(message, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
}

fn credentials_expire(data: &Data) -> Option<SystemTime> {
    let value = data.get(&TypeId::of::<CredentialsExpire>())?;
    (**value)
        .downcast_ref::<CredentialsExpire>()
        .map(|expire| expire.0)
}

/// The ping of `protocol`: graphql-transport-ws clients answer its `ping`; legacy clients answer
/// nothing of theirs, but their websocket answers a Ping frame.
async fn send_ping<S>(sink: &mut S, protocol: WebSocketProtocols) -> Result<(), S::Error>
where
    S: futures_util::Sink<Message> + Unpin,
{
    if protocol == WebSocketProtocols::GraphQLWS {
        return sink.send(Message::Text(r#"{"type":"ping"}"#.into())).await;
    }
    sink.feed(Message::Text(r#"{"type":"ka"}"#.into())).await?;
    sink.send(Message::Ping(Default::default())).await
}

/// The end of operation `id` for want of valid credentials: an `error` coded `UNAUTHENTICATED`,
/// then `complete`.
async fn send_ended<S>(sink: &mut S, protocol: WebSocketProtocols, id: &str) -> Result<(), S::Error>
where
    S: futures_util::Sink<Message> + Unpin,
{
    let error = serde_json::json!({
        "message": "the connection's credentials expired; sign in again and subscribe anew",
        "extensions": { "code": UNAUTHENTICATED },
    });
    // graphql-transport-ws's `error` carries a list of errors, the legacy protocol's one error.
    let payload = match protocol {
        WebSocketProtocols::GraphQLWS => serde_json::json!([error]),
        WebSocketProtocols::SubscriptionsTransportWS => error,
    };
    let error = serde_json::json!({ "type": "error", "id": id, "payload": payload });
    let complete = serde_json::json!({ "type": "complete", "id": id });
    sink.feed(Message::Text(error.to_string().into())).await?;
    sink.send(Message::Text(complete.to_string().into())).await
}

/// Whether the operation `request` runs selects a field `viewer_fields` names. A document that
/// does not parse here (or a persisted one, sent by its hash alone) counts as reading the viewer.
fn reads_viewer(request: &async_graphql::Request, viewer_fields: fn(&str) -> bool) -> bool {
    let Ok(document) = async_graphql::parser::parse_query(&request.query) else {
        return true;
    };
    let mut spread = HashSet::new();
    match &document.operations {
        DocumentOperations::Single(operation) => selects(
            &operation.node.selection_set.node,
            &document,
            viewer_fields,
            &mut spread,
        ),
        DocumentOperations::Multiple(operations) => operations
            .iter()
            .filter(|(name, _)| {
                request
                    .operation_name
                    .as_deref()
                    .is_none_or(|wanted| name.as_str() == wanted)
            })
            .any(|(_, operation)| {
                selects(
                    &operation.node.selection_set.node,
                    &document,
                    viewer_fields,
                    &mut spread,
                )
            }),
    }
}

fn selects(
    set: &SelectionSet,
    document: &ExecutableDocument,
    wanted: fn(&str) -> bool,
    spread: &mut HashSet<Name>,
) -> bool {
    set.items.iter().any(|item| match &item.node {
        Selection::Field(field) => {
            wanted(field.node.name.node.as_str())
                || selects(&field.node.selection_set.node, document, wanted, spread)
        }
        Selection::InlineFragment(fragment) => {
            selects(&fragment.node.selection_set.node, document, wanted, spread)
        }
        Selection::FragmentSpread(fragment) => {
            let name = &fragment.node.fragment_name.node;
            spread.insert(name.clone())
                && document.fragments.get(name).is_some_and(|fragment| {
                    selects(&fragment.node.selection_set.node, document, wanted, spread)
                })
        }
    })
}

/// Longest close reason: a control frame carries at most 125 bytes, two of them the code. A longer
/// reason (an error message quoting the client, a client's long subscription id) would make the
/// frame invalid, and the client would see a broken connection instead of the code.
const MAX_CLOSE_REASON_BYTES: usize = 123;

fn close_frame(code: u16, reason: &str) -> CloseFrame {
    let mut end = reason.len().min(MAX_CLOSE_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame {
        code,
        reason: reason[..end].into(),
    }
}

fn lock(session: &Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    session
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the driver does with a client message.
#[derive(Debug)]
enum Admission {
    /// On to async-graphql.
    Forward,
    /// The socket closes with this frame.
    Close(CloseFrame),
    /// An operation reading the viewer, started after the credentials expired: ended at once.
    Unauthenticated(String),
}

/// What the driver must know of the conversation that async-graphql keeps to itself.
struct Session {
    protocol: WebSocketProtocols,
    max_subscriptions: usize,
    viewer_fields: fn(&str) -> bool,
    initialised: bool,
    /// Whether the server has sent `connection_ack`.
    acknowledged: bool,
    /// Ids whose operation is still running: from the client's `subscribe` (`start` on the legacy
    /// protocol) until the client's or the server's `complete` (`stop`).
    running: HashSet<String>,
    /// The running operations that read the viewer.
    reading_viewer: HashSet<String>,
    /// Operations the driver ended (their credentials expired) whose end async-graphql has not
    /// yet confirmed: what it still sends for them is dropped.
    ended: HashSet<String>,
    /// When the credentials of the connection expire, and whether they have.
    expires: Option<SystemTime>,
    expired: bool,
    /// The extensions of the error that refused `connection_init`, which async-graphql leaves out
    /// of the legacy protocol's `connection_error`.
    init_refusal: Option<ErrorExtensionValues>,
}

/// The fields of a server message the driver looks at; the payload is skipped unparsed.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    id: Option<String>,
}

impl Session {
    fn new(protocol: WebSocketProtocols, settings: &Settings) -> Self {
        Self {
            protocol,
            max_subscriptions: settings.max_subscriptions,
            viewer_fields: settings.viewer_fields,
            initialised: false,
            acknowledged: false,
            running: HashSet::new(),
            reading_viewer: HashSet::new(),
            ended: HashSet::new(),
            expires: None,
            expired: false,
            init_refusal: None,
        }
    }

    fn admit(&mut self, message: &ClientMessage) -> Admission {
        match message {
            ClientMessage::ConnectionInit { .. } => self.initialised = true,
            ClientMessage::Start { id, payload } => {
                let running = self.running.contains(id);
                if running && self.protocol == WebSocketProtocols::GraphQLWS {
                    let reason = format!("Subscriber for {id} already exists");
                    return Admission::Close(close_frame(4409, &reason));
                }
                if !running && self.running.len() >= self.max_subscriptions {
                    let reason = format!(
                        "more than {} operations at once on one connection",
                        self.max_subscriptions
                    );
                    return Admission::Close(close_frame(1008, &reason));
                }
                let reading_viewer = reads_viewer(payload, self.viewer_fields);
                if reading_viewer && self.expired {
                    return Admission::Unauthenticated(id.clone());
                }
                self.running.insert(id.clone());
                if reading_viewer {
                    self.reading_viewer.insert(id.clone());
                } else {
                    self.reading_viewer.remove(id);
                }
            }
            ClientMessage::Stop { id } => {
                self.running.remove(id);
                self.reading_viewer.remove(id);
            }
            _ => {}
        }
        Admission::Forward
    }

    /// The credentials expired: the operations reading the viewer end, and their ids are free.
    fn expire(&mut self) -> Vec<String> {
        self.expired = true;
        let ended: Vec<String> = self.reading_viewer.drain().collect();
        for id in &ended {
            self.running.remove(id);
            self.ended.insert(id.clone());
        }
        ended
    }

    /// A server message on its way out, if it still goes: noted, and on the legacy protocol a
    /// `connection_error` given a code like every other error (async-graphql sends the message
    /// alone).
    fn outgoing(&mut self, text: String) -> Option<String> {
        if self.protocol == WebSocketProtocols::SubscriptionsTransportWS
            && text.contains("connection_error")
        {
            return Some(self.coded_connection_error(&text).unwrap_or(text));
        }
        self.sent(&text).then_some(text)
    }
    fn coded_connection_error(&self, text: &str) -> Option<String> {
        let mut message: serde_json::Value = serde_json::from_str(text).ok()?;
        if message["type"] != "connection_error" {
            return None;
        }
        // Before the acknowledgement the error is the refused `connection_init`, with the caller's
        // extensions; one without a code refused the payload, where clients authenticate. After the
        // acknowledgement, it is a second `connection_init`: the client's mistake.
        let extensions = match &self.init_refusal {
            Some(refusal) if !self.acknowledged => {
                let mut extensions = serde_json::to_value(refusal).ok()?;
                if extensions.get("code").is_none() {
                    extensions["code"] = UNAUTHENTICATED.into();
                }
                extensions
            }
            _ if !self.acknowledged => serde_json::json!({ "code": UNAUTHENTICATED }),
            _ => serde_json::json!({ "code": CLIENT_ERROR }),
        };
        message["payload"]["extensions"] = extensions;
        Some(message.to_string())
    }

    /// Notes a server message: the `connection_ack`, and a `complete` that frees its id for reuse.
    /// False for a message of an operation the driver ended, which the client must not see.
    fn sent(&mut self, text: &str) -> bool {
        if self.acknowledged && self.running.is_empty() && self.ended.is_empty() {
            return true;
        }
        let Ok(Envelope { kind, id }) = serde_json::from_str(text) else {
            return true;
        };
        match (kind.as_str(), id) {
            ("connection_ack", _) => self.acknowledged = true,
            // The driver sent this operation's `complete` itself.
            ("complete", Some(id)) if self.ended.remove(&id) => return false,
            ("complete", Some(id)) => {
                self.running.remove(&id);
            }
            (_, Some(id)) => return !self.ended.contains(&id),
            _ => {}
        }
        true
    }

    /// The close frame for a close async-graphql asks for. On graphql-transport-ws it uses generic
    /// codes where the protocol names specific ones, which clients act on: a refused
    /// `connection_init` is 4403, a `subscribe` before the acknowledgement 4401, a message that is
    /// not one of the protocol's 4400.
    fn protocol_close(&self, code: u16, reason: &str) -> CloseFrame {
        // 1011 says the server failed, but async-graphql means the client started an operation
        // before its `connection_init` was acknowledged; the legacy protocol has no code for that,
        // so both get graphql-transport-ws's.
        if code == 1011 {
            return close_frame(4401, "Unauthorized");
        }
        if self.protocol != WebSocketProtocols::GraphQLWS {
            return close_frame(code, reason);
        }
        match code {
            1002 if self.initialised && !self.acknowledged => close_frame(4403, reason),
            1002 => close_frame(4400, reason),
            _ => close_frame(code, reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_cut_to_fit_a_control_frame_on_a_character_boundary() {
        let frame = close_frame(
            4409,
            &format!("Subscriber for {} already exists", "é".repeat(200)),
        );
        assert!(frame.reason.len() <= MAX_CLOSE_REASON_BYTES);
        assert!(frame.reason.as_str().starts_with("Subscriber for é"));
    }

    const MAX_SUBSCRIPTIONS: usize = 100;

    fn settings() -> Settings {
        Settings {
            init_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(15),
            pong_timeout: Duration::from_secs(10),
            max_subscriptions: MAX_SUBSCRIPTIONS,
            viewer_fields: |field| field.starts_with("viewer"),
        }
    }

    fn new_session(protocol: WebSocketProtocols) -> Session {
        Session::new(protocol, &settings())
    }

    fn admission(session: &mut Session, message: serde_json::Value) -> Admission {
        let message = ClientMessage::from_bytes(message.to_string()).expect("a protocol message");
        session.admit(&message)
    }

    fn admit(session: &mut Session, message: serde_json::Value) -> bool {
        matches!(admission(session, message), Admission::Forward)
    }

    fn closed_with(session: &mut Session, message: serde_json::Value) -> CloseFrame {
        match admission(session, message) {
            Admission::Close(frame) => frame,
            other => panic!("admitted: {other:?}"),
        }
    }

    fn subscribe(id: &str) -> serde_json::Value {
        serde_json::json!({ "type": "subscribe", "id": id, "payload": { "query": "{ __typename }" } })
    }

    #[test]
    fn a_running_id_cannot_be_subscribed_again() {
        let mut session = new_session(WebSocketProtocols::GraphQLWS);
        assert!(admit(&mut session, subscribe("1")));
        let refusal = closed_with(&mut session, subscribe("1"));
        assert_eq!(refusal.code, 4409);
        assert_eq!(refusal.reason.as_str(), "Subscriber for 1 already exists");
    }

    #[test]
    fn an_id_completed_by_either_side_may_be_reused() {
        let mut session = new_session(WebSocketProtocols::GraphQLWS);
        assert!(admit(&mut session, subscribe("1")));
        assert!(admit(
            &mut session,
            serde_json::json!({ "type": "complete", "id": "1" })
        ));
        assert!(admit(&mut session, subscribe("1")));
        assert!(session.sent(r#"{"type":"complete","id":"1"}"#));
        assert!(admit(&mut session, subscribe("1")));
    }

    #[test]
    fn when_credentials_expire_only_operations_reading_the_viewer_end_and_later_ones_at_once() {
        let mut session = new_session(WebSocketProtocols::GraphQLWS);
        let query = |id: &str, query: &str| serde_json::json!({ "type": "subscribe", "id": id, "payload": { "query": query } });
        let spread =
            "subscription { board { ...Mine } } fragment Mine on Board { top { viewerLikes } }";
        assert!(admit(
            &mut session,
            query("public", "subscription { board { top { name } } }")
        ));
        assert!(admit(
            &mut session,
            query("direct", "subscription { viewerFeed { id } }")
        ));
        assert!(admit(&mut session, query("spread", spread)));
        assert!(admit(&mut session, query("garbled", "subscription {")));
        let mut ended = session.expire();
        ended.sort();
        assert_eq!(ended, ["direct", "garbled", "spread"]);
        // What async-graphql still sends for an ended operation, its `complete` included, is dropped.
        assert!(!session.sent(r#"{"type":"next","id":"direct","payload":{}}"#));
        assert!(!session.sent(r#"{"type":"complete","id":"direct"}"#));
        assert!(session.sent(r#"{"type":"next","id":"public","payload":{}}"#));
        assert!(matches!(
            admission(&mut session, query("later", "subscription { viewerFeed { id } }")),
            Admission::Unauthenticated(id) if id == "later"
        ));
        // The ended ids are free again for operations that do not read the viewer.
        assert!(admit(
            &mut session,
            query("direct", "subscription { board { top { name } } }")
        ));
    }

    #[test]
    fn a_socket_runs_at_most_so_many_operations_at_once_on_either_protocol() {
        for (protocol, start) in [
            (WebSocketProtocols::GraphQLWS, "subscribe"),
            (WebSocketProtocols::SubscriptionsTransportWS, "start"),
        ] {
            let mut session = new_session(protocol);
            let message = |id: usize| {
                serde_json::json!({ "type": start, "id": id.to_string(),
                                    "payload": { "query": "subscription { a }" } })
            };
            for id in 0..MAX_SUBSCRIPTIONS {
                assert!(admit(&mut session, message(id)));
            }
            // Ending one makes room for another.
            let stop = if start == "start" { "stop" } else { "complete" };
            assert!(admit(
                &mut session,
                serde_json::json!({ "type": stop, "id": "0" })
            ));
            assert!(admit(&mut session, message(MAX_SUBSCRIPTIONS)));
            let refusal = closed_with(&mut session, message(MAX_SUBSCRIPTIONS + 1));
            assert_eq!(refusal.code, 1008);
            assert!(
                refusal.reason.contains("more than 100"),
                "{}",
                refusal.reason
            );
        }
    }

    fn connection_error(session: &mut Session) -> serde_json::Value {
        let sent = r#"{"type":"connection_error","payload":{"message":"refused"}}"#;
        serde_json::from_str(&session.outgoing(sent.to_owned()).expect("sent")).unwrap()
    }

    #[test]
    fn a_legacy_connection_error_carries_the_refusals_extensions_or_a_code_for_its_cause() {
        let legacy = WebSocketProtocols::SubscriptionsTransportWS;
        let mut session = new_session(legacy);
        let mut extensions = ErrorExtensionValues::default();
        extensions.set("code", "FORBIDDEN");
        extensions.set("retryAfterSeconds", 3);
        session.init_refusal = Some(extensions);
        assert_eq!(
            connection_error(&mut session)["payload"],
            serde_json::json!({
                "message": "refused",
                "extensions": { "code": "FORBIDDEN", "retryAfterSeconds": 3 }
            })
        );

        let mut session = new_session(legacy);
        session.init_refusal = Some(ErrorExtensionValues::default());
        let error = connection_error(&mut session);
        assert_eq!(error["payload"]["extensions"]["code"], "UNAUTHENTICATED");

        let mut session = new_session(legacy);
        session.sent(r#"{"type":"connection_ack"}"#);
        let error = connection_error(&mut session);
        assert_eq!(error["payload"]["extensions"]["code"], "BAD_USER_INPUT");
    }

    #[test]
    fn the_legacy_protocol_keeps_its_own_rules_for_ids() {
        let mut session = new_session(WebSocketProtocols::SubscriptionsTransportWS);
        let start = serde_json::json!({ "type": "start", "id": "1", "payload": { "query": "{ __typename }" } });
        assert!(admit(&mut session, start.clone()));
        assert!(admit(&mut session, start));
    }
}
