//! A websocket driver for any async-graphql executor, speaking graphql-transport-ws and the legacy
//! subscriptions-transport-ws. async-graphql speaks both protocols but leaves four things to its
//! caller: a socket that never sends `connection_init` would stay open for good (here it is closed
//! with 4408 after the init timeout); a graphql-transport-ws `subscribe` under an id already
//! running would silently replace that subscription (here it closes the socket with 4409, as the
//! protocol says); one socket could run any number of subscriptions, each a task and a channel on
//! the server (here the one past [`MAX_SUBSCRIPTIONS`] closes the socket with 1008, policy
//! violation); and at shutdown the socket would just be cut (here it gets a 1001 "going away"
//! close first).
//!
//! The caller upgrades the connection (offering the [`protocol`] the client asked for) and hands
//! the socket to [`serve`] with its executor, usually an `async_graphql::Schema`, and what to do
//! with the `connection_init` payload: typically authenticate it and return the connection's
//! `Data`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_graphql::http::{WebSocketProtocols, WsMessage};
use async_graphql::{Data, ErrorExtensionValues, Executor};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::{HeaderMap, header};
use futures_util::{SinkExt as _, StreamExt as _, future};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// The code of a legacy `connection_error` for a `connection_init` refused without a code of its
/// own.
const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
/// The code of a legacy `connection_error` for a protocol mistake (a second `connection_init`).
const CLIENT_ERROR: &str = "BAD_USER_INPUT";

/// Operations one socket may run at once.
pub const MAX_SUBSCRIPTIONS: usize = 100;

/// How long a closed socket waits for the client's answering close frame. Closing the connection
/// while the client still sends would reset it, and a reset can take the close frame with it.
const CLOSE_REPLY_WAIT: Duration = Duration::from_secs(1);

/// The protocol of the first `Sec-WebSocket-Protocol` the client offers that the driver speaks.
pub fn protocol(headers: &HeaderMap) -> Option<WebSocketProtocols> {
    headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)?
        .to_str()
        .ok()?
        .split(',')
        .find_map(|offered| offered.trim().parse().ok())
}

/// Serves GraphQL over `socket` until the client leaves, breaks the protocol, or `shutdown` is
/// cancelled. `on_init` gets the `connection_init` payload and returns the data every operation of
/// the connection sees, or the error that refuses the connection (4403 on graphql-transport-ws).
pub async fn serve<E, OnInit, InitFuture>(
    socket: WebSocket,
    protocol: WebSocketProtocols,
    executor: E,
    init_timeout: Duration,
    shutdown: CancellationToken,
    on_init: OnInit,
) where
    E: Executor,
    OnInit: FnOnce(serde_json::Value) -> InitFuture + Send + 'static,
    InitFuture: Future<Output = async_graphql::Result<Data>> + Send + 'static,
{
    let (mut sink, mut stream) = socket.split();
    let session = Arc::new(Mutex::new(Session::new(protocol)));
    let on_init = {
        let session = session.clone();
        move |payload| {
            let init = on_init(payload);
            async move {
                let data = init.await;
                if let Err(error) = &data {
                    lock(&session).init_refusal =
                        Some(error.extensions.clone().unwrap_or_default());
                }
                data
            }
        }
    };
    let close = {
        let watched = session.clone();
        let input = stream
            .by_ref()
            .take_while(|received| future::ready(received.is_ok()))
            .filter_map(|received| {
                future::ready(match received {
                    Ok(message @ (Message::Text(_) | Message::Binary(_))) => {
                        Some(message.into_data())
                    }
                    _ => None,
                })
            })
            // A refused message ends the input, and with it the exchange, before async-graphql sees it.
            .take_while(move |data| future::ready(lock(&watched).admit(data)));
        let graphql = async_graphql::http::WebSocket::new(executor, input, protocol)
            .on_connection_init(on_init);
        let mut graphql = std::pin::pin!(graphql);
        let mut init_deadline = std::pin::pin!(tokio::time::sleep(init_timeout));
        let mut awaiting_init = true;
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break Some(close_frame(1001, "server shutting down")),
                () = &mut init_deadline, if awaiting_init => {
                    if !lock(&session).initialised {
                        break Some(close_frame(4408, "Connection initialisation timeout"));
                    }
                    awaiting_init = false;
                }
                message = graphql.next() => match message {
                    Some(WsMessage::Text(text)) => {
                        let text = lock(&session).outgoing(text);
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
                    None => {
                        let refusal = lock(&session).refusal.take();
                        break Some(refusal.unwrap_or_else(|| close_frame(1000, "")));
                    }
                },
            }
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

/// What the driver must know of the conversation that async-graphql keeps to itself.
struct Session {
    protocol: WebSocketProtocols,
    initialised: bool,
    /// Whether the server has sent `connection_ack`.
    acknowledged: bool,
    /// Ids whose operation is still running: from the client's `subscribe` (`start` on the legacy
    /// protocol) until the client's or the server's `complete` (`stop`).
    running: HashSet<String>,
    /// The close a refused message calls for.
    refusal: Option<CloseFrame>,
    /// The extensions of the error that refused `connection_init`, which async-graphql leaves out
    /// of the legacy protocol's `connection_error`.
    init_refusal: Option<ErrorExtensionValues>,
}

/// The two fields of a protocol message the driver looks at; the payload is skipped unparsed.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    id: Option<String>,
}

impl Session {
    fn new(protocol: WebSocketProtocols) -> Self {
        Self {
            protocol,
            initialised: false,
            acknowledged: false,
            running: HashSet::new(),
            refusal: None,
            init_refusal: None,
        }
    }

    /// Whether a client message may go on to async-graphql. Messages that are not JSON go on too:
    /// async-graphql closes the socket for those with its own code.
    fn admit(&mut self, data: &[u8]) -> bool {
        let Ok(Envelope { kind, id }) = serde_json::from_slice(data) else {
            return true;
        };
        match (kind.as_str(), id) {
            ("connection_init", _) => self.initialised = true,
            ("subscribe" | "start", Some(id)) => {
                let running = self.running.contains(&id);
                if running && self.protocol == WebSocketProtocols::GraphQLWS {
                    let reason = format!("Subscriber for {id} already exists");
                    self.refusal = Some(close_frame(4409, &reason));
                    return false;
                }
                if !running && self.running.len() >= MAX_SUBSCRIPTIONS {
                    let reason = format!(
                        "more than {MAX_SUBSCRIPTIONS} operations at once on one connection"
                    );
                    self.refusal = Some(close_frame(1008, &reason));
                    return false;
                }
                self.running.insert(id);
            }
            ("complete" | "stop", Some(id)) => {
                self.running.remove(&id);
            }
            _ => {}
        }
        true
    }

    /// A server message on its way out: noted, and on the legacy protocol a `connection_error`
    /// given a code like every other error (async-graphql sends the message alone).
    fn outgoing(&mut self, text: String) -> String {
        if self.protocol == WebSocketProtocols::SubscriptionsTransportWS
            && text.contains("connection_error")
        {
            return self.coded_connection_error(&text).unwrap_or(text);
        }
        self.sent(&text);
        text
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
    fn sent(&mut self, text: &str) {
        if self.acknowledged && self.running.is_empty() {
            return;
        }
        let Ok(Envelope { kind, id }) = serde_json::from_str(text) else {
            return;
        };
        match (kind.as_str(), id) {
            ("connection_ack", _) => self.acknowledged = true,
            ("complete", Some(id)) => {
                self.running.remove(&id);
            }
            _ => {}
        }
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

    fn admit(session: &mut Session, message: serde_json::Value) -> bool {
        session.admit(message.to_string().as_bytes())
    }

    fn subscribe(id: &str) -> serde_json::Value {
        serde_json::json!({ "type": "subscribe", "id": id, "payload": { "query": "{ __typename }" } })
    }

    #[test]
    fn a_running_id_cannot_be_subscribed_again() {
        let mut session = Session::new(WebSocketProtocols::GraphQLWS);
        assert!(admit(&mut session, subscribe("1")));
        assert!(!admit(&mut session, subscribe("1")));
        let refusal = session.refusal.expect("a close frame");
        assert_eq!(refusal.code, 4409);
        assert_eq!(refusal.reason.as_str(), "Subscriber for 1 already exists");
    }

    #[test]
    fn an_id_completed_by_either_side_may_be_reused() {
        let mut session = Session::new(WebSocketProtocols::GraphQLWS);
        assert!(admit(&mut session, subscribe("1")));
        assert!(admit(
            &mut session,
            serde_json::json!({ "type": "complete", "id": "1" })
        ));
        assert!(admit(&mut session, subscribe("1")));
        session.sent(r#"{"type":"complete","id":"1"}"#);
        assert!(admit(&mut session, subscribe("1")));
    }

    #[test]
    fn a_socket_runs_at_most_so_many_operations_at_once_on_either_protocol() {
        for (protocol, start) in [
            (WebSocketProtocols::GraphQLWS, "subscribe"),
            (WebSocketProtocols::SubscriptionsTransportWS, "start"),
        ] {
            let mut session = Session::new(protocol);
            let message = |id: usize| serde_json::json!({ "type": start, "id": id.to_string() });
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
            assert!(!admit(&mut session, message(MAX_SUBSCRIPTIONS + 1)));
            let refusal = session.refusal.expect("a close frame");
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
        serde_json::from_str(&session.outgoing(sent.to_owned())).unwrap()
    }

    #[test]
    fn a_legacy_connection_error_carries_the_refusals_extensions_or_a_code_for_its_cause() {
        let legacy = WebSocketProtocols::SubscriptionsTransportWS;
        let mut session = Session::new(legacy);
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

        let mut session = Session::new(legacy);
        session.init_refusal = Some(ErrorExtensionValues::default());
        let error = connection_error(&mut session);
        assert_eq!(error["payload"]["extensions"]["code"], "UNAUTHENTICATED");

        let mut session = Session::new(legacy);
        session.sent(r#"{"type":"connection_ack"}"#);
        let error = connection_error(&mut session);
        assert_eq!(error["payload"]["extensions"]["code"], "BAD_USER_INPUT");
    }

    #[test]
    fn the_legacy_protocol_keeps_its_own_rules_for_ids() {
        let mut session = Session::new(WebSocketProtocols::SubscriptionsTransportWS);
        let start = serde_json::json!({ "type": "start", "id": "1", "payload": { "query": "{ __typename }" } });
        assert!(admit(&mut session, start.clone()));
        assert!(admit(&mut session, start));
    }
}
