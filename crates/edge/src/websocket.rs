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
//! | 4413 | a message past the send budget of a client that does not keep up, which is not an event of a running operation (a snapshot with no unsent one to replace, say) |
//! | 1001 | the server shuts down ("going away") |
//! | 1009 | a client message longer than a request body may be (`max_body_bytes`; "message too big") |
//!
//! Pings: every ping interval the server sends graphql-transport-ws's `ping`, which its clients
//! answer with `pong`; on the legacy protocol, whose clients answer nothing, a `ka` and a websocket
//! Ping frame, which every websocket stack answers with a Pong frame by itself. Any frame from the
//! client counts as an answer. 3008 is the registered "timeout" code, which clients such as
//! graphql-ws treat as worth a reconnect.
//!
//! Slow consumers: what the server sends waits in the connection's own queue until the socket
//! takes it, within [`Settings::send_budget`] bytes (beyond the socket's write buffer). A snapshot
//! ([`LiveKind::Snapshot`]) replaces its operation's unsent one in place, so a client that reads
//! again gets the latest. An event cannot be dropped without the client knowing: one past the
//! budget ends its operation alone, with a last `next` whose error is coded
//! [`RESYNC_REQUIRED`] (the same end a resumed stream whose history is gone has) and `complete`.
//! Its `extensions.cursor`, for a [`Settings::resumable`] field, is the cursor of the operation's
//! last event queued before it, the last the client receives: subscribing again after it resumes
//! with no gap. What was queued stays, the event and what would follow it are dropped; the socket
//! and its other operations go on. The ends may wait past the budget, up to twice it; an end past
//! that (a client that keeps subscribing without reading) closes the socket with 4413.
//!
//! Credentials that expire: when `on_init`'s data holds a [`CredentialsExpire`], the operations
//! that read something of the viewer (those selecting a field the settings'
//! [`Settings::viewer_fields`] names) end at that time with an `error` coded `UNAUTHENTICATED`
//! then `complete`, and a later one gets the same at once; the others go on.
//!
//! Groups: with [`Settings::groups`], a snapshot operation that reads nothing of the viewer runs
//! in the process's group of its request ([`crate::groups`]) instead of in async-graphql's stream
//! of the socket. The driver keeps its bookkeeping as for any other (the operations gauge, the
//! cap, 4409, the budget: a newer result replaces an unsent one) and answers a client's `complete`
//! (`stop`) of one itself, as async-graphql would. A group writes its results into the socket
//! itself, through the queue every message of the socket goes through; the connection's task
//! hears of it only when there is something for it to do (the socket did not take everything,
//! the budget was passed, the group's stream ended).
//!
//! Detached event streams: an operation on one of [`Settings::detached`]'s fields waits for its
//! events outside async-graphql, which runs one execution per event ([`crate::detached`]). The
//! driver keeps its bookkeeping as for any other, and answers a client's stop between events
//! itself.
//!
//! The caller upgrades the connection (offering the [`protocol`] the client asked for) and hands
//! the socket to [`serve`] with its executor, usually an `async_graphql::Schema`, and what to do
//! with the `connection_init` payload: typically authenticate it and return the connection's
//! `Data`.

use std::any::TypeId;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use async_graphql::http::{ClientMessage, WebSocketProtocols, WsMessage};
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Selection, SelectionSet,
};
use async_graphql::{Data, ErrorExtensionValues, Executor, Name};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::{HeaderMap, header};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::counted::Counted;
use crate::detached::{Detached, Polled};
use crate::groups::{Groups, Membership, Recipient};
use crate::guard;

/// The code of a legacy `connection_error` for a `connection_init` refused without a code of its
/// own, and of the error that ends an operation whose credentials expired.
const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
/// The code of a legacy `connection_error` for a protocol mistake (a second `connection_init`).
const CLIENT_ERROR: &str = "BAD_USER_INPUT";

/// The driver's metrics, which the server describes.
pub const SOCKETS_OPEN: &str = "pulse_live_sockets_open";
/// Operations running, by subscription field (`field`).
pub const OPERATIONS: &str = "pulse_live_operations";
/// Detached event operations (see [`crate::detached`]) whose source the driver holds.
pub const DETACHED_OPERATIONS: &str = "pulse_live_detached_operations";
pub const MESSAGES_SENT: &str = "pulse_live_messages_sent_total";
pub const BYTES_SENT: &str = "pulse_live_bytes_sent_total";
/// Bytes of messages waiting for sockets that have not taken them yet, all sockets together.
pub const QUEUED_BYTES: &str = "pulse_live_queued_bytes";
pub const SNAPSHOTS_REPLACED: &str = "pulse_live_snapshots_replaced_total";
pub const SLOW_CONSUMER_CLOSES: &str = "pulse_live_slow_consumer_closes_total";
/// Event streams ended with [`RESYNC_REQUIRED`] for falling more than the send budget behind.
pub const SLOW_CONSUMER_RESYNCS: &str = "pulse_live_slow_consumer_resyncs_total";
pub const PING_TIMEOUTS: &str = "pulse_live_ping_timeouts_total";

/// The close code of a socket from which nothing was heard within the pong timeout.
pub const PING_TIMEOUT: u16 = 3008;
/// The close code of a socket that fell more than its send budget behind on a message that is not
/// an event of a running operation. The client may reconnect and subscribe again.
pub const SLOW_CONSUMER: u16 = 4413;
/// The close code of a socket whose client sent a message past the size limit (RFC 6455's).
pub const MESSAGE_TOO_BIG: u16 = 1009;
/// The code of the error that ends an event stream whose client fell more than the send budget
/// behind: what it missed since `extensions.cursor` must be replayed or re-read.
pub const RESYNC_REQUIRED: &str = "RESYNC_REQUIRED";

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
    /// The schema's subscription fields and what they send. An operation on a field not listed
    /// is an event stream.
    pub live_fields: &'static [LiveField],
    /// Bytes of messages that may wait for a socket that does not keep up (beyond the socket's own
    /// write buffer; one larger message may wait alone). Past it, a snapshot replaces its
    /// operation's unsent one; an event ends its operation with [`RESYNC_REQUIRED`]; anything
    /// else closes the socket with [`SLOW_CONSUMER`].
    pub send_budget: usize,
    /// The event streams whose events carry a cursor to resume after, which the error that ends
    /// one fallen behind carries, and which an SSE client resumes with `Last-Event-ID`.
    pub resumable: &'static [crate::stream::Resumable],
    /// Where the snapshot operations that read nothing of the viewer run, one stream per distinct
    /// request shared by every socket (and distinct HTTP stream) that runs it; `None` runs each in
    /// its own stream.
    pub groups: Option<Arc<Groups>>,
    /// Event fields whose operations the driver runs itself between events (see
    /// [`crate::detached`]): their resolvers hand over their source when the data holds a
    /// [`crate::detached::Detach`].
    pub detached: &'static [&'static str],
}

/// A subscription field of the schema.
#[derive(Clone, Copy, Debug)]
pub struct LiveField {
    pub name: &'static str,
    pub kind: LiveKind,
}

/// What a subscription field sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveKind {
    /// Each message is the whole current state: one that was not sent yet is worthless once a
    /// newer one exists.
    Snapshot,
    /// Each message is a change the client cannot learn otherwise: none may be dropped.
    Event,
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

/// Serves GraphQL over `socket` until the client leaves, breaks the protocol, stops answering,
/// falls too far behind, or `shutdown` is cancelled. `on_init` gets the `connection_init` payload
/// and returns the data every operation of the connection sees, or the error that refuses the
/// connection (4403 on graphql-transport-ws).
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
    let (sink, mut stream) = socket.split();
    let _open = Counted::new(metrics::gauge!(SOCKETS_OPEN));
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
    let (forward, forwarded) = futures_channel::mpsc::unbounded::<Forwarded>();
    let mut forward = Some(forward);
    let input = forwarded.map(|(message, _place)| *message);
    let graphql = async_graphql::http::WebSocket::from_message_stream(executor, input, protocol)
        .on_connection_init(on_init);
    let mut graphql = std::pin::pin!(graphql);
    // Everything the server sends waits in the wire's queue until the socket takes it, so that a
    // client that does not read holds back nothing but its own queue.
    let wire = Arc::new(Wire {
        protocol,
        state: Mutex::new(WireState {
            sink,
            outbox: Outbox::new(settings.send_budget),
            waker: None,
            fault: None,
        }),
    });
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
    // The connection's grouped operations and the channel their groups' ends come on, made at its
    // first.
    let mut grouped: Option<Grouped> = None;
    let mut detached = Detached::default();
    // Made once: the loop wakes for every message a subscriber is sent, and a fresh wait on the
    // token each time registered and dropped a waiter on it.
    let mut shutting_down = std::pin::pin!(shutdown.cancelled());
    let close = loop {
        tokio::select! {
            biased;
            () = &mut shutting_down => break Some(close_frame(1001, "server shutting down")),
            () = &mut init_deadline, if awaiting_init => {
                if !lock(&session).initialised {
                    break Some(close_frame(4408, "Connection initialisation timeout"));
                }
                awaiting_init = false;
            }
            () = &mut pong_deadline, if awaiting_pong => {
                metrics::counter!(PING_TIMEOUTS).increment(1);
                break Some(close_frame(PING_TIMEOUT, "Ping timeout: nothing heard from the client"));
            }
            () = &mut expiry, if expiry_armed => {
                expiry_armed = false;
                let ended = lock(&session).expire();
                for id in ended {
                    detached.forget(&id);
                    if let Some(forward) = &forward {
                        let _ = forward.unbounded_send((Box::new(Ok(ClientMessage::Stop { id: id.clone() })), None));
                    }
                    wire.state().outbox.push_ended(protocol, &id);
                }
            }
            (received, place) = async {
                let place = ahead.clone().acquire_owned().await.expect("the semaphore is never closed");
                (stream.next().await, place)
            }, if forward.is_some() => {
                let message = match received {
                    Some(Ok(message)) => message,
                    Some(Err(err)) if too_big(&err) => {
                        break Some(close_frame(MESSAGE_TOO_BIG, "Message too big: more than a request body may hold"));
                    }
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
                let mut parsed = ClientMessage::from_bytes(&data);
                let admission = match &parsed {
                    Ok(message) => lock(&session).admit(message),
                    Err(_) => Admission::Forward,
                };
                // Whatever the client starts or stops under an id ends a detached operation that
                // had it.
                if let Ok(ClientMessage::Start { id, .. } | ClientMessage::Stop { id }) = &parsed {
                    detached.forget(id);
                }
                match admission {
                    Admission::Forward => {}
                    Admission::Detachable => {
                        if let Ok(ClientMessage::Start { id, payload }) = &mut parsed {
                            detached.offer(id, payload);
                        }
                    }
                    Admission::Close(frame) => break Some(frame),
                    Admission::Unauthenticated(id) => {
                        wire.state().outbox.push_ended(protocol, &id);
                        continue;
                    }
                    Admission::Join { replaces_forwarded } => {
                        let (Ok(ClientMessage::Start { id, payload }), Some(groups)) =
                            (parsed, &settings.groups)
                        else {
                            continue;
                        };
                        // A legacy `start` under the id of an operation async-graphql runs
                        // replaces it: async-graphql stops it, and the session drops its
                        // `complete`, which is not the new operation's.
                        if let (true, Some(forward)) = (replaces_forwarded, &forward) {
                            let _ = forward.unbounded_send((Box::new(Ok(ClientMessage::Stop { id: id.clone() })), None));
                        }
                        grouped
                            .get_or_insert_with(Grouped::new)
                            .join(groups, &wire, payload, id);
                        continue;
                    }
                    Admission::Leave(id) => {
                        let left = grouped.as_mut().and_then(|grouped| grouped.leave(&id));
                        // What async-graphql sends when a client stops an operation it runs.
                        let pushed = wire.state().outbox.push(complete_message(&id), None);
                        drop(left);
                        if pushed.is_err() {
                            break Some(slow_consumer(&mut wire.state().outbox, settings.send_budget));
                        }
                        continue;
                    }
                }
                // A legacy `start` under a grouped id replaces that operation.
                if let (Ok(ClientMessage::Start { id, .. }), Some(grouped)) = (&parsed, &mut grouped) {
                    grouped.leave(id);
                }
                if let Some(forward) = &forward {
                    let _ = forward.unbounded_send((Box::new(parsed), Some(place)));
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
                wire.state().outbox.push_ping(protocol);
            }
            written = std::future::poll_fn(|cx| wire.poll_for_task(cx)) => match written {
                Ok(()) => {}
                Err(Fault::Broken) => break None,
                Err(Fault::OverBudget) => {
                    break Some(slow_consumer(&mut wire.state().outbox, settings.send_budget));
                }
            },
            Some((id, token)) = async {
                match &mut grouped {
                    Some(grouped) => grouped.ended.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(grouped) = &mut grouped else { continue };
                // The end of a membership that ended first on this side: the id may run a newer
                // operation now.
                if !grouped.is_current(&id, token) {
                    continue;
                }
                let left = grouped.leave(&id);
                lock(&session).stop(&id);
                let pushed = wire.state().outbox.push(complete_message(&id), None);
                drop(left);
                if pushed.is_err() {
                    break Some(slow_consumer(&mut wire.state().outbox, settings.send_budget));
                }
            }
            polled = std::future::poll_fn(|cx| detached.poll_next(cx)), if !detached.is_empty() => match polled {
                Polled::Event(id, request) => {
                    lock(&session).delivering(&id);
                    if let Some(forward) = &forward {
                        let _ = forward.unbounded_send((Box::new(Ok(ClientMessage::Start { id, payload: *request })), None));
                    }
                }
                Polled::Ended(id) => {
                    lock(&session).stop(&id);
                    let mut state = wire.state();
                    if state.outbox.push(complete_message(&id), None).is_err() {
                        break Some(slow_consumer(&mut state.outbox, settings.send_budget));
                    }
                }
            },
            message = graphql.next() => match message {
                Some(WsMessage::Text(text)) => {
                    let (outgoing, expires) = {
                        let mut session = lock(&session);
                        (session.outgoing(text), session.expires.filter(|_| !session.expired))
                    };
                    if let (Some(expires), false) = (expires, expiry_armed) {
                        let left = expires.duration_since(SystemTime::now()).unwrap_or_default();
                        expiry.as_mut().reset(Instant::now() + left);
                        expiry_armed = true;
                    }
                    let mut state = wire.state();
                    let outbox = &mut state.outbox;
                    let pushed = match outgoing {
                        Outgoing::Send(text) => outbox.push(text, None),
                        Outgoing::Snapshot(text, id) => outbox.push(text, Some(id.into())),
                        Outgoing::Event { text, id, cursor } => {
                            if outbox.push(text, None).is_ok() {
                                lock(&session).queued(&id, cursor);
                                continue;
                            }
                            let cursor = lock(&session).fell_behind(&id);
                            detached.forget(&id);
                            if let Some(forward) = &forward {
                                let _ = forward.unbounded_send((Box::new(Ok(ClientMessage::Stop { id: id.clone() })), None));
                            }
                            if outbox.push_resync(protocol, &id, cursor).is_ok() {
                                metrics::counter!(SLOW_CONSUMER_RESYNCS).increment(1);
                                continue;
                            }
                            Err(OverBudget)
                        }
                        Outgoing::Detaching { text, id } => {
                            if detached.take_over(&id) {
                                lock(&session).detached(&id);
                                continue;
                            }
                            lock(&session).stop(&id);
                            outbox.push(text, None)
                        }
                        Outgoing::Delivered(id) => {
                            detached.delivered(&id);
                            continue;
                        }
                        Outgoing::Drop => continue,
                    };
                    if pushed.is_err() {
                        break Some(slow_consumer(outbox, settings.send_budget));
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
    // Leaving the groups now, rather than after the close, spares them writing to a connection
    // that will not read it, and puts nothing of theirs after the close.
    if let Some(grouped) = &mut grouped {
        grouped.leave_all();
    }
    drop(grouped);
    let Some(close) = close else { return };
    wire.state().outbox.push_close(close);
    // The close waits behind what the network already holds, which a slow client may take a
    // while to read; one that reads nothing holds it no longer than a silent one is kept.
    let closed = tokio::time::timeout(
        settings.pong_timeout.max(CLOSE_REPLY_WAIT),
        std::future::poll_fn(|cx| {
            let mut state = wire.state();
            let WireState { sink, outbox, .. } = &mut *state;
            outbox.poll_drain(sink, cx)
        }),
    )
    .await;
    if matches!(closed, Ok(Ok(()))) {
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

/// The connection's socket and what waits for it, shared by the connection's task with the groups
/// its operations are members of. A group writes its result into the socket itself rather than
/// wake the task for each message: with thousands of members, the wake-up and the task's poll
/// cost as much as the write. The task is woken only for what is its to do: the rest of a message
/// the socket did not take at once, a budget passed, a broken socket.
struct Wire {
    protocol: WebSocketProtocols,
    state: Mutex<WireState>,
}

struct WireState {
    sink: SplitSink<WebSocket, Message>,
    outbox: Outbox,
    /// The connection's task, as it last waited.
    waker: Option<Waker>,
    /// What a group's write left for the task.
    fault: Option<Fault>,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// A group's result past the budget, with no unsent one of its operation to replace.
    OverBudget,
    /// The socket failed a write.
    Broken,
}

impl Wire {
    fn state(&self) -> MutexGuard<'_, WireState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The task's side: notes the task to wake, reports what a group's write left for it, and
    /// moves what waits into the socket. Pending while nothing waits.
    fn poll_for_task(&self, cx: &mut Context<'_>) -> Poll<Result<(), Fault>> {
        let mut state = self.state();
        let state = &mut *state;
        if !state
            .waker
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
        {
            state.waker = Some(cx.waker().clone());
        }
        if let Some(fault) = state.fault {
            return Poll::Ready(Err(fault));
        }
        if !state.outbox.busy() {
            return Poll::Pending;
        }
        std::task::ready!(state.outbox.poll_drain(&mut state.sink, cx))
            .map_err(|_| Fault::Broken)?;
        Poll::Ready(Ok(()))
    }

    /// A group's side: queues its result for `seat`'s operation, replacing an unsent one, and
    /// writes what the socket takes now. What it does not take, the socket wakes the task for.
    fn write_shared(&self, seat: &Seat, id: &Arc<str>, payload: &str) {
        let text = shared_message(self.protocol, id, payload);
        let mut state = self.state();
        // Read under the lock, which the task takes after clearing it to queue what follows the
        // end: nothing of an ended membership comes after that.
        if !seat.current.load(Ordering::Relaxed) || state.fault.is_some() {
            return;
        }
        let state = &mut *state;
        let fault = if state.outbox.push(text, Some(id.clone())).is_err() {
            Some(Fault::OverBudget)
        } else if let Some(waker) = &state.waker {
            let mut cx = Context::from_waker(waker);
            match state.outbox.poll_drain(&mut state.sink, &mut cx) {
                Poll::Ready(Err(_)) => Some(Fault::Broken),
                Poll::Ready(Ok(())) | Poll::Pending => None,
            }
        } else {
            None
        };
        if let Some(fault) = fault {
            state.fault = Some(fault);
            if let Some(waker) = &state.waker {
                waker.wake_by_ref();
            }
        }
    }
}

/// A grouped operation's place on its connection.
struct Seat {
    wire: Arc<Wire>,
    ends: futures_channel::mpsc::UnboundedSender<(Arc<str>, u64)>,
    /// Cleared by the task when the operation ends on its side; its group's results then go
    /// nowhere.
    current: AtomicBool,
}

impl Recipient for Seat {
    fn deliver(&self, id: &Arc<str>, token: u64, payload: Option<&Arc<str>>) {
        match payload {
            Some(payload) => self.wire.write_shared(self, id, payload),
            // The end of the group's stream ends the operation, which is the task's bookkeeping.
            None => {
                let _ = self.ends.unbounded_send((id.clone(), token));
            }
        }
    }
}

/// The operations of a connection that run in groups, by id, and the channel of their groups'
/// ends.
struct Grouped {
    ends: futures_channel::mpsc::UnboundedSender<(Arc<str>, u64)>,
    ended: futures_channel::mpsc::UnboundedReceiver<(Arc<str>, u64)>,
    members: HashMap<String, (Membership, Arc<Seat>)>,
}

impl Grouped {
    fn new() -> Self {
        let (ends, ended) = futures_channel::mpsc::unbounded();
        Self {
            ends,
            ended,
            members: HashMap::new(),
        }
    }

    fn join(
        &mut self,
        groups: &Arc<Groups>,
        wire: &Arc<Wire>,
        request: async_graphql::Request,
        id: String,
    ) {
        let seat = Arc::new(Seat {
            wire: wire.clone(),
            ends: self.ends.clone(),
            current: AtomicBool::new(true),
        });
        // A legacy `start` may replace a grouped operation under its id: nothing of the old one
        // may follow the new one's first result, which joining may write at once.
        let replaced = self.leave(&id);
        let membership = groups.join(request, &id, seat.clone());
        self.members.insert(id, (membership, seat));
        drop(replaced);
    }

    fn is_current(&self, id: &str, token: u64) -> bool {
        self.members
            .get(id)
            .is_some_and(|(membership, _)| membership.token() == token)
    }

    /// Ends operation `id`'s membership: from now on its group's results go nowhere. The caller
    /// drops the membership (which locks its group) once it no longer holds the wire.
    fn leave(&mut self, id: &str) -> Option<Membership> {
        let (membership, seat) = self.members.remove(id)?;
        seat.current.store(false, Ordering::Relaxed);
        Some(membership)
    }

    fn leave_all(&mut self) {
        for (_, seat) in self.members.values() {
            seat.current.store(false, Ordering::Relaxed);
        }
    }
}

/// The `next` (`data` on the legacy protocol) message of operation `id` around a group's
/// serialized result: byte for byte what async-graphql writes for the same result, built without
/// parsing the result again.
fn shared_message(protocol: WebSocketProtocols, id: &str, payload: &str) -> String {
    let kind = match protocol {
        WebSocketProtocols::GraphQLWS => "next",
        WebSocketProtocols::SubscriptionsTransportWS => "data",
    };
    let id = serde_json::Value::from(id).to_string();
    let mut text = String::with_capacity(payload.len() + id.len() + 40);
    text.push_str(r#"{"type":""#);
    text.push_str(kind);
    text.push_str(r#"","id":"#);
    text.push_str(&id);
    text.push_str(r#","payload":"#);
    text.push_str(payload);
    text.push('}');
    text
}

/// The `complete` of operation `id`, as async-graphql writes it.
fn complete_message(id: &str) -> String {
    format!(
        r#"{{"type":"complete","id":{}}}"#,
        serde_json::Value::from(id)
    )
}

/// Whether a read failed on a message past the socket's size limit (the request body's).
fn too_big(err: &axum::Error) -> bool {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<tungstenite::Error>())
        .is_some_and(|err| matches!(err, tungstenite::Error::Capacity(_)))
}

/// Closes a socket that fell more than its send budget behind on a message nothing could replace.
fn slow_consumer(outbox: &mut Outbox, budget: usize) -> CloseFrame {
    metrics::counter!(SLOW_CONSUMER_CLOSES).increment(1);
    outbox.clear();
    let reason = format!("Slow consumer: more than {budget} bytes waiting to be sent");
    close_frame(SLOW_CONSUMER, &reason)
}

/// What waits for the socket: at most a budget of bytes, or one message if it is larger.
struct Outbox {
    queue: VecDeque<Queued>,
    /// The bytes of the text messages in `queue`.
    bytes: usize,
    budget: usize,
    /// A message went into the socket since it was last flushed.
    unflushed: bool,
    /// [`QUEUED_BYTES`], kept in step with `bytes`.
    queued: metrics::Gauge,
    /// [`MESSAGES_SENT`] and [`BYTES_SENT`], held rather than looked up per message.
    messages_sent: metrics::Counter,
    bytes_sent: metrics::Counter,
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.queued.decrement(self.bytes as f64);
    }
}

struct Queued {
    message: Message,
    /// The operation whose snapshot this is: a newer one replaces it while it waits.
    snapshot_of: Option<Arc<str>>,
}

/// A message past the budget, which could replace nothing.
#[derive(Debug)]
struct OverBudget;

impl Outbox {
    fn new(budget: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            budget,
            unflushed: false,
            queued: metrics::gauge!(QUEUED_BYTES),
            messages_sent: metrics::counter!(MESSAGES_SENT),
            bytes_sent: metrics::counter!(BYTES_SENT),
        }
    }

    fn busy(&self) -> bool {
        self.unflushed || !self.queue.is_empty()
    }

    /// Queues `text`; a snapshot replaces the unsent one of its operation, in its place.
    fn push(&mut self, text: String, snapshot_of: Option<Arc<str>>) -> Result<(), OverBudget> {
        let text = exact_size(text);
        if let Some(id) = &snapshot_of {
            let waiting = self
                .queue
                .iter_mut()
                .find(|queued| queued.snapshot_of.as_ref() == Some(id));
            if let Some(waiting) = waiting {
                let (added, removed) = (text.len(), message_bytes(&waiting.message));
                waiting.message = Message::Text(text.into());
                self.bytes = self.bytes - removed + added;
                self.queued.increment(added as f64);
                self.queued.decrement(removed as f64);
                metrics::counter!(SNAPSHOTS_REPLACED).increment(1);
                return Ok(());
            }
        }
        // What nothing waits ahead of goes to the socket as soon as it takes anything, whatever its
        // size: the budget bounds what piles up behind it.
        if !self.queue.is_empty() && self.bytes + text.len() > self.budget {
            return Err(OverBudget);
        }
        self.bytes += text.len();
        self.queued.increment(text.len() as f64);
        self.queue.push_back(Queued {
            message: Message::Text(text.into()),
            snapshot_of,
        });
        Ok(())
    }

    /// Control messages are a few bytes each and one at a time: they are never refused.
    fn push_control(&mut self, message: Message) {
        self.bytes += message_bytes(&message);
        self.queued.increment(message_bytes(&message) as f64);
        self.queue.push_back(Queued {
            message,
            snapshot_of: None,
        });
    }

    fn push_ping(&mut self, protocol: WebSocketProtocols) {
        if protocol == WebSocketProtocols::GraphQLWS {
            self.push_control(Message::Text(r#"{"type":"ping"}"#.into()));
            return;
        }
        self.push_control(Message::Text(r#"{"type":"ka"}"#.into()));
        self.push_control(Message::Ping(Default::default()));
    }

    /// The end of event stream `id`, fallen behind: a last result whose error is coded
    /// [`RESYNC_REQUIRED`], with the cursor of the last event queued before it, then `complete`.
    /// Ends wait past the budget, but not past twice it: a client that keeps subscribing without
    /// reading would otherwise pile them up.
    fn push_resync(
        &mut self,
        protocol: WebSocketProtocols,
        id: &str,
        cursor: Option<String>,
    ) -> Result<(), OverBudget> {
        let mut extensions = serde_json::json!({ "code": RESYNC_REQUIRED });
        if let Some(cursor) = cursor {
            extensions["cursor"] = cursor.into();
        }
        let result = serde_json::json!({
            "data": null,
            "errors": [{
                "message": "the client fell more than its send budget behind; subscribe again \
                            after extensions.cursor (or, without one, read again)",
                "extensions": extensions,
            }],
        });
        let kind = match protocol {
            WebSocketProtocols::GraphQLWS => "next",
            WebSocketProtocols::SubscriptionsTransportWS => "data",
        };
        let next = serde_json::json!({ "type": kind, "id": id, "payload": result }).to_string();
        let complete = serde_json::json!({ "type": "complete", "id": id }).to_string();
        if self.bytes + next.len() + complete.len() > 2 * self.budget {
            return Err(OverBudget);
        }
        self.push_control(Message::Text(next.into()));
        self.push_control(Message::Text(complete.into()));
        Ok(())
    }

    /// The end of operation `id` for want of valid credentials: an `error` coded
    /// `UNAUTHENTICATED`, then `complete`.
    fn push_ended(&mut self, protocol: WebSocketProtocols, id: &str) {
        let error = serde_json::json!({
            "message": "the connection's credentials expired; sign in again and subscribe anew",
            "extensions": { "code": UNAUTHENTICATED },
        });
        // graphql-transport-ws's `error` carries a list of errors, the legacy protocol's one.
        let payload = match protocol {
            WebSocketProtocols::GraphQLWS => serde_json::json!([error]),
            WebSocketProtocols::SubscriptionsTransportWS => error,
        };
        let error = serde_json::json!({ "type": "error", "id": id, "payload": payload });
        let complete = serde_json::json!({ "type": "complete", "id": id });
        self.push_control(Message::Text(error.to_string().into()));
        self.push_control(Message::Text(complete.to_string().into()));
    }

    fn push_close(&mut self, frame: CloseFrame) {
        self.push_control(Message::Close(Some(frame)));
    }

    fn clear(&mut self) {
        self.queue.clear();
        self.queued.decrement(self.bytes as f64);
        self.bytes = 0;
    }

    /// Moves what waits into the socket as far as it takes it, and flushes.
    fn poll_drain<S>(&mut self, sink: &mut S, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>>
    where
        S: futures_util::Sink<Message> + Unpin,
    {
        while !self.queue.is_empty() {
            std::task::ready!(sink.poll_ready_unpin(cx))?;
            let Queued { message, .. } = self.queue.pop_front().expect("not empty");
            let bytes = message_bytes(&message);
            self.bytes -= bytes;
            self.queued.decrement(bytes as f64);
            sink.start_send_unpin(message)?;
            self.unflushed = true;
            self.messages_sent.increment(1);
            self.bytes_sent.increment(bytes as u64);
        }
        std::task::ready!(sink.poll_flush_unpin(cx))?;
        self.unflushed = false;
        Poll::Ready(Ok(()))
    }
}

/// `text` in an allocation of its own length. A message built by doubling a buffer (serde_json's
/// writer) can hold up to twice its length; while it waits, the budget, counted in message bytes,
/// would not see the rest (a stalled socket held 2.6 times its queued bytes). The allocator's own
/// rounding (an eighth at most) is left: a copy for it would cost more than it saves.
fn exact_size(text: String) -> String {
    if text.capacity() - text.len() > text.len() / 8 {
        return text.as_str().to_owned();
    }
    text
}

fn message_bytes(message: &Message) -> usize {
    match message {
        Message::Text(text) => text.len(),
        _ => 0,
    }
}

pub(crate) fn credentials_expire(data: &Data) -> Option<SystemTime> {
    let value = data.get(&TypeId::of::<CredentialsExpire>())?;
    (**value)
        .downcast_ref::<CredentialsExpire>()
        .map(|expire| expire.0)
}

/// What the driver knows of a running operation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Operation {
    /// Its subscription field, as the metrics name it (`other` for what the settings do not list,
    /// so that a client cannot invent label values).
    field: &'static str,
    /// It selects a field whose answer depends on the viewer.
    reads_viewer: bool,
    /// Each of its messages is a whole snapshot.
    snapshot: bool,
    /// Where its events carry their cursor, for a resumable field.
    resume: Option<crate::stream::Resume>,
    /// The cursor of its last event queued for the client.
    last_cursor: Option<String>,
    /// It runs in a group (see [`crate::groups`]), not in async-graphql's stream of the socket.
    grouped: bool,
    detach: Detachment,
}

/// Where an operation on a [`Settings::detached`] field stands (see [`crate::detached`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Detachment {
    /// Not such an operation, or one that did not detach.
    No,
    /// Its first execution runs, which hands over its source or ends it.
    Awaiting,
    /// The driver polls its source.
    Idle,
    /// An execution of one of its events runs.
    Delivering,
}

/// The operation `request` runs. A document that does not parse here (or a persisted one, sent by
/// its hash alone) counts as reading the viewer and sending events, the cautious guess.
fn classify(request: &async_graphql::Request, settings: &SessionSettings) -> Operation {
    let unknown = Operation {
        field: "other",
        reads_viewer: true,
        snapshot: false,
        resume: None,
        last_cursor: None,
        grouped: false,
        detach: Detachment::No,
    };
    // The parser recurses once per nesting level: a document nested past the guard's limit would
    // overflow the stack here, before the pipeline refuses it.
    if guard::check_nesting(&request.query).is_err() {
        return unknown;
    }
    let Ok(document) = async_graphql::parser::parse_query(&request.query) else {
        return unknown;
    };
    let operation = match &document.operations {
        DocumentOperations::Single(operation) => Some(operation),
        DocumentOperations::Multiple(operations) => match request.operation_name.as_deref() {
            Some(name) => operations.get(name),
            None => None,
        },
    };
    let Some(operation) = operation else {
        return unknown;
    };
    let root = &operation.node.selection_set.node;
    let fields: Vec<Option<&LiveField>> = root
        .items
        .iter()
        .filter_map(|item| match &item.node {
            Selection::Field(field) if field.node.name.node != "__typename" => {
                let name = field.node.name.node.as_str();
                Some(settings.live_fields.iter().find(|live| live.name == name))
            }
            Selection::Field(_) => None,
            // A fragment at the root is not looked into: its fields count as unknown.
            _ => Some(None),
        })
        .collect();
    Operation {
        field: match fields.as_slice() {
            [Some(live)] => live.name,
            _ => "other",
        },
        reads_viewer: selects(
            root,
            &document,
            settings.viewer_fields,
            &mut HashSet::new(),
            0,
        ),
        snapshot: !fields.is_empty()
            && fields
                .iter()
                .all(|live| live.is_some_and(|live| live.kind == LiveKind::Snapshot)),
        resume: crate::stream::Resume::of(request, settings.resumable),
        last_cursor: None,
        grouped: false,
        detach: Detachment::No,
    }
}

/// Whether `set` selects a field `wanted` names, at any depth. Past [`guard::MAX_NESTING`] levels
/// (a chain of fragments can nest deeper than any one of them) it answers yes, the cautious guess,
/// rather than recurse further.
fn selects(
    set: &SelectionSet,
    document: &ExecutableDocument,
    wanted: fn(&str) -> bool,
    spread: &mut HashSet<Name>,
    depth: usize,
) -> bool {
    if depth > guard::MAX_NESTING {
        return true;
    }
    set.items.iter().any(|item| match &item.node {
        Selection::Field(field) => {
            wanted(field.node.name.node.as_str())
                || selects(
                    &field.node.selection_set.node,
                    document,
                    wanted,
                    spread,
                    depth + 1,
                )
        }
        Selection::InlineFragment(fragment) => selects(
            &fragment.node.selection_set.node,
            document,
            wanted,
            spread,
            depth + 1,
        ),
        Selection::FragmentSpread(fragment) => {
            let name = &fragment.node.fragment_name.node;
            spread.insert(name.clone())
                && document.fragments.get(name).is_some_and(|fragment| {
                    selects(
                        &fragment.node.selection_set.node,
                        document,
                        wanted,
                        spread,
                        depth + 1,
                    )
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
    /// A snapshot operation reading nothing of the viewer: it joins its group. It replaces, under
    /// its id, an operation async-graphql runs (a legacy `start` may).
    Join { replaces_forwarded: bool },
    /// The client stopped this grouped operation (or a detached one between its events): it
    /// leaves its group, and the driver answers the stop.
    Leave(String),
    /// On to async-graphql, with a [`crate::detached::Detach`] for its resolver.
    Detachable,
}

/// What of the settings a session reads.
struct SessionSettings {
    max_subscriptions: usize,
    viewer_fields: fn(&str) -> bool,
    live_fields: &'static [LiveField],
    resumable: &'static [crate::stream::Resumable],
    /// Whether operations that may be grouped are.
    grouping: bool,
    detached: &'static [&'static str],
}

impl SessionSettings {
    fn of(settings: &Settings) -> Self {
        Self {
            max_subscriptions: settings.max_subscriptions,
            viewer_fields: settings.viewer_fields,
            live_fields: settings.live_fields,
            resumable: settings.resumable,
            grouping: settings.groups.is_some(),
            detached: settings.detached,
        }
    }
}

/// Whether each result of `request` is a whole snapshot, which a newer one may replace unsent,
/// and whether it reads the viewer, so that it ends when the credentials expire.
pub(crate) fn snapshot_and_viewer(
    request: &async_graphql::Request,
    settings: &Settings,
) -> (bool, bool) {
    let operation = classify(request, &SessionSettings::of(settings));
    (operation.snapshot, operation.reads_viewer)
}

/// A connection's running operations, by id. Most connections run one or a few: a list is searched
/// as fast as a map hashes, and holds one operation in a sixth of the room of a map's smallest
/// table (four slots), which every idle subscriber kept.
#[derive(Default)]
struct Running(Vec<(String, Operation)>);

impl Running {
    /// Runs `operation` under `id`; the one it replaces, if any.
    fn insert(&mut self, id: String, operation: Operation) -> Option<Operation> {
        if let Some(running) = self.get_mut(&id) {
            return Some(std::mem::replace(running, operation));
        }
        if self.0.is_empty() {
            self.0.reserve_exact(1);
        }
        self.0.push((id, operation));
        None
    }

    fn remove(&mut self, id: &str) -> Option<Operation> {
        let index = self.0.iter().position(|(running, _)| running == id)?;
        Some(self.0.swap_remove(index).1)
    }

    fn get(&self, id: &str) -> Option<&Operation> {
        self.0
            .iter()
            .find_map(|(running, operation)| (running == id).then_some(operation))
    }

    fn get_mut(&mut self, id: &str) -> Option<&mut Operation> {
        self.0
            .iter_mut()
            .find_map(|(running, operation)| (running == id).then_some(operation))
    }

    fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &Operation)> {
        self.0.iter().map(|(id, operation)| (id, operation))
    }

    fn values(&self) -> impl Iterator<Item = &Operation> {
        self.0.iter().map(|(_, operation)| operation)
    }
}

#[cfg(test)]
impl std::ops::Index<&str> for Running {
    type Output = Operation;

    fn index(&self, id: &str) -> &Operation {
        self.get(id).expect("the operation runs")
    }
}

/// What the driver must know of the conversation that async-graphql keeps to itself.
struct Session {
    protocol: WebSocketProtocols,
    settings: SessionSettings,
    initialised: bool,
    /// Whether the server has sent `connection_ack`.
    acknowledged: bool,
    /// The operations still running, by id: from the client's `subscribe` (`start` on the legacy
    /// protocol) until the client's or the server's `complete` (`stop`).
    running: Running,
    /// Operations the driver ended (their credentials expired, or they fell behind) whose end
    /// async-graphql has not yet confirmed: what it still sends for them is dropped.
    ended: HashSet<String>,
    /// How many `complete`s async-graphql still owes, by id, for operations the client stopped: its
    /// echo of the stop. A client may start a new operation under the id before the echo comes out,
    /// and the echo must not end that one.
    echoes: HashMap<String, u32>,
    /// When the credentials of the connection expire, and whether they have.
    expires: Option<SystemTime>,
    expired: bool,
    /// The extensions of the error that refused `connection_init`, which async-graphql leaves out
    /// of the legacy protocol's `connection_error`.
    init_refusal: Option<ErrorExtensionValues>,
}

impl Drop for Session {
    fn drop(&mut self) {
        for operation in self.running.values() {
            metrics::gauge!(OPERATIONS, "field" => operation.field).decrement(1.0);
        }
    }
}

/// The fields of a server message the driver looks at; the payload is skipped unparsed.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    id: Option<String>,
}

/// What becomes of a server message.
#[derive(Debug, PartialEq, Eq)]
enum Outgoing {
    Send(String),
    /// A snapshot of the operation with this id.
    Snapshot(String, String),
    /// An event of the operation with this id, and its cursor if the operation is resumable.
    Event {
        text: String,
        id: String,
        cursor: Option<String>,
    },
    /// A message of an operation the driver ended.
    Drop,
    /// The end of a detachable operation's first execution: the operation goes on without
    /// async-graphql if its resolver handed over its source, else it ends with this `complete`.
    Detaching {
        text: String,
        id: String,
    },
    /// The end of the execution of one of a detached operation's events.
    Delivered(String),
}

impl Session {
    fn new(protocol: WebSocketProtocols, settings: &Settings) -> Self {
        Self {
            protocol,
            settings: SessionSettings::of(settings),
            initialised: false,
            acknowledged: false,
            running: Running::default(),
            ended: HashSet::new(),
            echoes: HashMap::new(),
            expires: None,
            expired: false,
            init_refusal: None,
        }
    }

    /// Notes `operation` running under `id`; the one it replaces, if any.
    fn start(&mut self, id: String, operation: Operation) -> Option<Operation> {
        metrics::gauge!(OPERATIONS, "field" => operation.field).increment(1.0);
        let replaced = self.running.insert(id, operation);
        if let Some(replaced) = &replaced {
            metrics::gauge!(OPERATIONS, "field" => replaced.field).decrement(1.0);
        }
        replaced
    }

    fn stop(&mut self, id: &str) -> Option<Operation> {
        let stopped = self.running.remove(id);
        if let Some(stopped) = &stopped {
            metrics::gauge!(OPERATIONS, "field" => stopped.field).decrement(1.0);
        }
        stopped
    }

    fn admit(&mut self, message: &ClientMessage) -> Admission {
        match message {
            ClientMessage::ConnectionInit { .. } => self.initialised = true,
            ClientMessage::Start { id, payload } => {
                let running = self.running.contains_key(id);
                if running && self.protocol == WebSocketProtocols::GraphQLWS {
                    let reason = format!("Subscriber for {id} already exists");
                    return Admission::Close(close_frame(4409, &reason));
                }
                let max = self.settings.max_subscriptions;
                if !running && self.running.len() >= max {
                    let reason = format!("more than {max} operations at once on one connection");
                    return Admission::Close(close_frame(1008, &reason));
                }
                let mut operation = classify(payload, &self.settings);
                if operation.reads_viewer && self.expired {
                    return Admission::Unauthenticated(id.clone());
                }
                // Before the acknowledgement async-graphql decides (a `subscribe` before
                // `connection_init` closes the socket; one after it waits for the init, which may
                // refuse the connection).
                operation.grouped = self.settings.grouping
                    && self.acknowledged
                    && operation.snapshot
                    && !operation.reads_viewer;
                let grouped = operation.grouped;
                let detachable = !grouped
                    && self.acknowledged
                    && self.settings.detached.contains(&operation.field);
                if detachable {
                    operation.detach = Detachment::Awaiting;
                }
                // An id the driver ended stays in `ended` until async-graphql's `complete` for the
                // operation it had, which comes before anything of this one (it reads the stop
                // that precedes this start first).
                let replaced = self.start(id.clone(), operation);
                if grouped {
                    let replaces_forwarded = replaced.is_some_and(|replaced| !replaced.grouped);
                    return Admission::Join { replaces_forwarded };
                }
                if detachable {
                    return Admission::Detachable;
                }
            }
            ClientMessage::Stop { id } => match self.stop(id) {
                Some(stopped) if stopped.grouped || stopped.detach == Detachment::Idle => {
                    return Admission::Leave(id.clone());
                }
                Some(_) => *self.echoes.entry(id.clone()).or_default() += 1,
                None => {}
            },
            _ => {}
        }
        Admission::Forward
    }

    /// The credentials expired: the operations reading the viewer end, and their ids are free.
    fn expire(&mut self) -> Vec<String> {
        self.expired = true;
        let ended: Vec<String> = self
            .running
            .iter()
            .filter(|(_, operation)| operation.reads_viewer)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ended {
            // async-graphql runs nothing of a detached operation between its events: no
            // `complete` of it will come to be dropped.
            let between_events = self
                .running
                .get(id)
                .is_some_and(|operation| operation.detach == Detachment::Idle);
            self.stop(id);
            if !between_events {
                self.ended.insert(id.clone());
            }
        }
        ended
    }

    /// Detached operation `id`'s source is the driver's now.
    fn detached(&mut self, id: &str) {
        self.set_detachment(id, Detachment::Idle);
    }

    /// An execution of one of detached operation `id`'s events runs.
    fn delivering(&mut self, id: &str) {
        self.set_detachment(id, Detachment::Delivering);
    }

    fn set_detachment(&mut self, id: &str, detach: Detachment) {
        if let Some(operation) = self.running.get_mut(id) {
            operation.detach = detach;
        }
    }

    /// Event stream `id`'s event with `cursor` is queued for the client.
    fn queued(&mut self, id: &str, cursor: Option<String>) {
        if let (Some(operation), Some(cursor)) = (self.running.get_mut(id), cursor) {
            operation.last_cursor = Some(cursor);
        }
    }

    /// Event stream `id` fell behind: it ends, and what async-graphql still sends for it is
    /// dropped. The cursor of its last event the client receives.
    fn fell_behind(&mut self, id: &str) -> Option<String> {
        let cursor = self
            .running
            .get_mut(id)
            .and_then(|operation| operation.last_cursor.take());
        self.stop(id);
        self.ended.insert(id.to_owned());
        cursor
    }

    /// A server message on its way out, if it still goes: noted, and on the legacy protocol a
    /// `connection_error` given a code like every other error (async-graphql sends the message
    /// alone).
    fn outgoing(&mut self, text: String) -> Outgoing {
        if self.protocol == WebSocketProtocols::SubscriptionsTransportWS
            && text.contains("connection_error")
        {
            return Outgoing::Send(self.coded_connection_error(&text).unwrap_or(text));
        }
        self.sent(text)
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

    /// Notes a server message: the `connection_ack`, and a `complete` that frees its id for reuse;
    /// says whether it is a snapshot, or a message of an operation the driver ended, which the
    /// client must not see.
    fn sent(&mut self, text: String) -> Outgoing {
        if self.acknowledged
            && self.running.is_empty()
            && self.ended.is_empty()
            && self.echoes.is_empty()
        {
            return Outgoing::Send(text);
        }
        let Ok(Envelope { kind, id }) = serde_json::from_str(&text) else {
            return Outgoing::Send(text);
        };
        match (kind.as_str(), id) {
            ("connection_ack", _) => self.acknowledged = true,
            // The driver sent this operation's `complete` itself.
            ("complete", Some(id)) if self.ended.remove(&id) => return Outgoing::Drop,
            // The echo of a client's stop ends nothing the driver still runs: under a reused id it
            // would end the new operation for the client, so it goes only where the id is free
            // (the arms below then send it, stopping nothing).
            ("complete", Some(id)) if self.echo_came(&id) && self.running.contains_key(&id) => {
                return Outgoing::Drop;
            }
            // async-graphql runs no grouped operation: what it sends under a grouped id is the end
            // of an older operation of that id, which the client stopped or a legacy `start`
            // replaced.
            (_, Some(id))
                if self
                    .running
                    .get(&id)
                    .is_some_and(|operation| operation.grouped) =>
            {
                return Outgoing::Drop;
            }
            // The end of a detachable operation's first execution, or of one of its events': the
            // driver's to decide, or to drop.
            ("complete", Some(id)) => match self.running.get_mut(&id).map(|operation| {
                let detach = operation.detach;
                if detach == Detachment::Delivering {
                    operation.detach = Detachment::Idle;
                }
                detach
            }) {
                Some(Detachment::Awaiting) => return Outgoing::Detaching { text, id },
                Some(Detachment::Delivering) => return Outgoing::Delivered(id),
                _ => {
                    self.stop(&id);
                }
            },
            (_, Some(id)) if self.ended.contains(&id) => return Outgoing::Drop,
            ("next" | "data", Some(id)) => match self.running.get(&id) {
                Some(operation) if operation.snapshot => return Outgoing::Snapshot(text, id),
                Some(operation) => {
                    let cursor = operation.resume.as_ref().and_then(|resume| {
                        let message: serde_json::Value = serde_json::from_str(&text).ok()?;
                        resume.cursor_in(&message["payload"]).map(str::to_owned)
                    });
                    return Outgoing::Event { text, id, cursor };
                }
                None => {}
            },
            _ => {}
        }
        Outgoing::Send(text)
    }

    /// Whether a `complete` of `id` is the echo of a client's stop, which it then no longer awaits.
    /// Exactly one `complete` of the stopped operation follows a stop: the echo, or async-graphql's
    /// own end of it if the operation ended as the client stopped it.
    fn echo_came(&mut self, id: &str) -> bool {
        let Some(awaited) = self.echoes.get_mut(id) else {
            return false;
        };
        *awaited -= 1;
        if *awaited == 0 {
            self.echoes.remove(id);
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
            live_fields: &[
                LiveField {
                    name: "board",
                    kind: LiveKind::Snapshot,
                },
                LiveField {
                    name: "news",
                    kind: LiveKind::Event,
                },
            ],
            send_budget: 1024,
            resumable: &[],
            groups: None,
            detached: &[],
        }
    }

    fn operation(query: &str) -> Operation {
        let session = new_session(WebSocketProtocols::GraphQLWS);
        classify(&async_graphql::Request::new(query), &session.settings)
    }

    #[test]
    fn an_operation_is_a_snapshot_only_when_all_its_fields_are_and_named_only_when_listed() {
        let board = operation("subscription { board { top } __typename }");
        assert_eq!((board.field, board.snapshot), ("board", true));
        let news = operation("subscription { news { title } }");
        assert_eq!((news.field, news.snapshot), ("news", false));
        let both = operation("subscription { board { top } news { title } }");
        assert_eq!((both.field, both.snapshot), ("other", false));
        let invented = operation("subscription { inventedByTheClient }");
        assert_eq!((invented.field, invented.snapshot), ("other", false));
    }

    #[test]
    fn a_document_nested_past_the_guard_is_not_parsed_and_counts_as_unknown() {
        // Deep enough to overflow a worker thread's stack in the parser (the fuzzer's case).
        let depth = 100_000;
        let nested = format!(
            "subscription {{ board {}{} }}",
            "{ a ".repeat(depth),
            "}".repeat(depth)
        );
        let unknown = operation(&nested);
        assert_eq!(
            (unknown.field, unknown.reads_viewer, unknown.snapshot),
            ("other", true, false)
        );

        // A chain of fragments nests deeper than any one of them: the walk stops, cautiously.
        let chain = (0..2 * guard::MAX_NESTING)
            .map(|n| format!("fragment F{n} on Board {{ ...F{} }}", n + 1))
            .collect::<String>();
        let spread = operation(&format!("subscription {{ board {{ ...F0 }} }} {chain}"));
        assert!(spread.reads_viewer);
    }

    #[test]
    fn a_waiting_snapshot_is_replaced_in_place_and_nothing_else_passes_the_budget() {
        let mut outbox = Outbox::new(100);
        outbox.push("a".repeat(40), Some("board".into())).unwrap();
        outbox.push("e".repeat(40), None).unwrap();
        outbox.push("b".repeat(50), Some("board".into())).unwrap();
        assert_eq!((outbox.bytes, outbox.queue.len()), (90, 2));
        assert!(
            matches!(&outbox.queue[0].message, Message::Text(text) if text.as_str().starts_with('b'))
        );
        assert!(outbox.push("e".repeat(20), None).is_err());
        assert!(
            outbox
                .push("c".repeat(20), Some("other board".into()))
                .is_err()
        );
        assert_eq!(outbox.bytes, 90);

        let mut empty = Outbox::new(100);
        empty.push("l".repeat(500), None).unwrap();
        assert!(empty.push("e".to_owned(), None).is_err());
    }

    #[test]
    fn a_waiting_message_holds_no_more_than_an_eighth_past_its_length() {
        let mut doubled = String::with_capacity(32 * 1024);
        doubled.push_str(&"d".repeat(16_511));
        let held = exact_size(doubled);
        assert_eq!((held.len(), held.capacity()), (16_511, 16_511));

        let mut close = String::with_capacity(1_100);
        close.push_str(&"c".repeat(1_000));
        assert_eq!(
            exact_size(close).capacity(),
            1_100,
            "not copied for a small rounding"
        );
    }

    #[test]
    fn an_event_stream_fallen_behind_ends_with_its_cursor_and_ends_wait_up_to_twice_the_budget() {
        let mut outbox = Outbox::new(1000);
        outbox.push("e".repeat(900), None).unwrap();
        outbox
            .push_resync(WebSocketProtocols::GraphQLWS, "1", Some("c7".to_owned()))
            .unwrap();
        let Message::Text(end) = &outbox.queue[1].message else {
            panic!("not text");
        };
        let end: serde_json::Value = serde_json::from_str(end.as_str()).unwrap();
        assert_eq!(end["type"], "next");
        assert_eq!(end["payload"]["data"], serde_json::Value::Null);
        let extensions = &end["payload"]["errors"][0]["extensions"];
        assert_eq!(extensions["code"], RESYNC_REQUIRED);
        assert_eq!(extensions["cursor"], "c7");
        assert!(
            matches!(&outbox.queue[2].message, Message::Text(text) if text.as_str() == r#"{"id":"1","type":"complete"}"#)
        );
        let mut ends = 1;
        while outbox
            .push_resync(WebSocketProtocols::GraphQLWS, "2", None)
            .is_ok()
        {
            ends += 1;
        }
        assert!(ends > 1, "an end waits past the budget");
        assert!(outbox.bytes <= 2000, "{} bytes", outbox.bytes);
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
        let complete = || r#"{"type":"complete","id":"1"}"#.to_owned();
        let mut session = new_session(WebSocketProtocols::GraphQLWS);
        assert!(admit(&mut session, subscribe("1")));
        assert!(admit(
            &mut session,
            serde_json::json!({ "type": "complete", "id": "1" })
        ));
        assert!(admit(&mut session, subscribe("1")));
        // async-graphql's echo of the stop comes after the new subscribe: it must not end the new
        // operation, for the client or for the driver.
        assert_eq!(session.sent(complete()), Outgoing::Drop);
        assert_eq!(closed_with(&mut session, subscribe("1")).code, 4409);
        assert_eq!(session.sent(complete()), Outgoing::Send(complete()));
        assert!(admit(&mut session, subscribe("1")));
    }

    #[test]
    fn the_echo_of_a_stop_goes_to_the_client_when_the_id_was_not_reused() {
        let complete = || r#"{"type":"complete","id":"1"}"#.to_owned();
        let mut session = new_session(WebSocketProtocols::GraphQLWS);
        assert!(admit(&mut session, subscribe("1")));
        assert!(admit(&mut session, subscribe("2")));
        assert!(admit(
            &mut session,
            serde_json::json!({ "type": "complete", "id": "1" })
        ));
        assert_eq!(session.sent(complete()), Outgoing::Send(complete()));
        assert!(session.echoes.is_empty());
        assert!(admit(&mut session, subscribe("1")));
        assert_eq!(session.sent(complete()), Outgoing::Send(complete()));
        assert!(
            admit(&mut session, subscribe("1")),
            "the server's own end freed the id"
        );
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
        let sent = |session: &mut Session, text: &str| session.sent(text.to_owned());
        assert_eq!(
            sent(
                &mut session,
                r#"{"type":"next","id":"direct","payload":{}}"#
            ),
            Outgoing::Drop
        );
        assert_eq!(
            sent(&mut session, r#"{"type":"complete","id":"direct"}"#),
            Outgoing::Drop
        );
        // The operation that goes on is a snapshot of the `board` field.
        assert!(matches!(
            sent(
                &mut session,
                r#"{"type":"next","id":"public","payload":{}}"#
            ),
            Outgoing::Snapshot(_, id) if id == "public"
        ));
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
        match session.outgoing(sent.to_owned()) {
            Outgoing::Send(text) => serde_json::from_str(&text).unwrap(),
            other => panic!("not sent: {other:?}"),
        }
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
        session.sent(r#"{"type":"connection_ack"}"#.to_owned());
        let error = connection_error(&mut session);
        assert_eq!(error["payload"]["extensions"]["code"], "BAD_USER_INPUT");
    }

    #[test]
    fn only_snapshots_reading_nothing_of_the_viewer_are_grouped_and_the_driver_ends_them() {
        for (protocol, start, stop) in [
            (WebSocketProtocols::GraphQLWS, "subscribe", "complete"),
            (
                WebSocketProtocols::SubscriptionsTransportWS,
                "start",
                "stop",
            ),
        ] {
            let mut session = new_session(protocol);
            session.settings.grouping = true;
            let board = serde_json::json!({ "type": start, "id": "0", "payload": { "query": "subscription { board { top } }" } });
            assert!(admit(&mut session, board), "not acknowledged yet");
            session.sent(r#"{"type":"connection_ack"}"#.to_owned());
            let mut started = |id: &str, query: &str| {
                let message =
                    serde_json::json!({ "type": start, "id": id, "payload": { "query": query } });
                admission(&mut session, message)
            };
            let board = "subscription { board { top } }";
            assert!(matches!(
                started("1", board),
                Admission::Join {
                    replaces_forwarded: false
                }
            ));
            assert!(matches!(
                started("2", "subscription { board { viewerLikes } }"),
                Admission::Forward
            ));
            assert!(matches!(
                started("3", "subscription { news { title } }"),
                Admission::Forward
            ));
            let stopped = |session: &mut Session, id: &str| {
                admission(session, serde_json::json!({ "type": stop, "id": id }))
            };
            assert!(matches!(stopped(&mut session, "1"), Admission::Leave(id) if id == "1"));
            assert!(!session.running.contains_key("1"));

            // The client stops an operation async-graphql runs and reuses its id for a grouped
            // one: async-graphql's `complete` of the old one is not the new one's end.
            assert!(matches!(stopped(&mut session, "3"), Admission::Forward));
            let mut session_started = |id: &str| {
                let message =
                    serde_json::json!({ "type": start, "id": id, "payload": { "query": board } });
                admission(&mut session, message)
            };
            assert!(matches!(session_started("3"), Admission::Join { .. }));
            assert_eq!(
                session.sent(r#"{"type":"complete","id":"3"}"#.to_owned()),
                Outgoing::Drop
            );
            assert!(session.running["3"].grouped);
        }

        // A legacy `start` may replace a running operation under its id: async-graphql's one is
        // stopped for the grouped one that replaces it.
        let mut session = new_session(WebSocketProtocols::SubscriptionsTransportWS);
        session.settings.grouping = true;
        session.sent(r#"{"type":"connection_ack"}"#.to_owned());
        let start = |query: &str| serde_json::json!({ "type": "start", "id": "1", "payload": { "query": query } });
        assert!(admit(
            &mut session,
            start("subscription { news { title } }")
        ));
        assert!(matches!(
            admission(&mut session, start("subscription { board { top } }")),
            Admission::Join {
                replaces_forwarded: true
            }
        ));
    }

    #[test]
    fn a_detached_operation_is_the_drivers_between_its_events() {
        let complete = |id: &str| format!(r#"{{"type":"complete","id":"{id}"}}"#);
        let news = |id: &str| serde_json::json!({ "type": "subscribe", "id": id, "payload": { "query": "subscription { news { title } }" } });
        let stop = |id: &str| serde_json::json!({ "type": "complete", "id": id });
        let mut session = new_session(WebSocketProtocols::GraphQLWS);
        session.settings.detached = &["news"];
        // Before the acknowledgement async-graphql decides, as for a group.
        assert!(matches!(
            admission(&mut session, news("early")),
            Admission::Forward
        ));
        session.sent(r#"{"type":"connection_ack"}"#.to_owned());
        assert!(matches!(
            admission(&mut session, news("1")),
            Admission::Detachable
        ));
        assert!(matches!(
            admission(&mut session, subscribe("plain")),
            Admission::Forward
        ));

        // The end of the first execution is the driver's to decide.
        assert_eq!(
            session.sent(complete("1")),
            Outgoing::Detaching {
                text: complete("1"),
                id: "1".into()
            }
        );
        session.detached("1");
        // An event's execution: its result goes out as an event, its end is the driver's.
        session.delivering("1");
        let next = r#"{"type":"next","id":"1","payload":{"data":{"news":{"title":"t"}}}}"#;
        assert!(matches!(
            session.sent(next.to_owned()),
            Outgoing::Event { .. }
        ));
        assert_eq!(session.sent(complete("1")), Outgoing::Delivered("1".into()));
        assert_eq!(session.running["1"].detach, Detachment::Idle);

        // Between events async-graphql runs nothing of it: the driver answers the stop.
        assert!(matches!(admission(&mut session, stop("1")), Admission::Leave(id) if id == "1"));
        assert!(session.echoes.is_empty());
        // During an event's execution async-graphql does, and its `complete` is the answer.
        assert!(matches!(
            admission(&mut session, news("2")),
            Admission::Detachable
        ));
        session.sent(complete("2"));
        session.detached("2");
        session.delivering("2");
        assert!(matches!(
            admission(&mut session, stop("2")),
            Admission::Forward
        ));
        assert_eq!(session.sent(complete("2")), Outgoing::Send(complete("2")));

        // Credentials that expire end it; between events no `complete` of it is awaited, so a new
        // operation under its id is not silenced.
        let private = serde_json::json!({ "type": "subscribe", "id": "3", "payload": { "query": "subscription { news { viewerLikes } }" } });
        assert!(matches!(
            admission(&mut session, private),
            Admission::Detachable
        ));
        session.sent(complete("3"));
        session.detached("3");
        assert!(session.expire().contains(&"3".to_owned()));
        assert!(!session.ended.contains("3"));

        // A first execution whose resolver handed nothing over ends the operation.
        let mut session = new_session(WebSocketProtocols::GraphQLWS);
        session.settings.detached = &["news"];
        session.sent(r#"{"type":"connection_ack"}"#.to_owned());
        assert!(matches!(
            admission(&mut session, news("4")),
            Admission::Detachable
        ));
        assert!(matches!(
            session.sent(complete("4")),
            Outgoing::Detaching { .. }
        ));
    }

    #[tokio::test]
    async fn a_shared_result_is_wrapped_byte_for_byte_as_async_graphql_writes_it() {
        use async_graphql::{EmptyMutation, Object, Schema, Subscription};

        struct Query;
        #[Object]
        impl Query {
            async fn zero(&self) -> i32 {
                0
            }
        }
        struct Board;
        #[Subscription]
        impl Board {
            async fn board(&self) -> impl futures_util::Stream<Item = String> + use<> {
                futures_util::stream::iter(["a \"quoted\" é\n".to_owned()])
            }
        }
        let schema = Schema::build(Query, EmptyMutation, Board).finish();
        let query = "subscription { board }";
        let response = schema
            .execute_stream(async_graphql::Request::new(query))
            .next()
            .await
            .expect("a result");
        let payload = serde_json::to_string(&response).unwrap();
        let id = "an \"odd\" id ✓";
        for (protocol, start) in [
            (WebSocketProtocols::GraphQLWS, "subscribe"),
            (WebSocketProtocols::SubscriptionsTransportWS, "start"),
        ] {
            let messages = [
                serde_json::json!({ "type": "connection_init" }),
                serde_json::json!({ "type": start, "id": id, "payload": { "query": query } }),
            ];
            let input = futures_util::stream::iter(
                messages.map(|message| ClientMessage::from_bytes(message.to_string())),
            )
            .chain(futures_util::stream::pending());
            let socket = async_graphql::http::WebSocket::from_message_stream(
                schema.clone(),
                input,
                protocol,
            );
            let mut socket = std::pin::pin!(socket);
            let mut texts = Vec::new();
            while texts.len() < 3 {
                match socket.next().await {
                    Some(WsMessage::Text(text)) => texts.push(text),
                    other => panic!("not a text message: {other:?}"),
                }
            }
            assert_eq!(texts[1], shared_message(protocol, id, &payload));
            assert_eq!(texts[2], complete_message(id));
        }
    }

    #[test]
    fn the_legacy_protocol_keeps_its_own_rules_for_ids() {
        let mut session = new_session(WebSocketProtocols::SubscriptionsTransportWS);
        let start = serde_json::json!({ "type": "start", "id": "1", "payload": { "query": "{ __typename }" } });
        assert!(admit(&mut session, start.clone()));
        assert!(admit(&mut session, start));
    }
}
