//! Websocket sessions at `/graphql/ws`: graphql-transport-ws and the legacy graphql-ws, with
//! fuzzed documents in `subscribe`/`start` messages, and protocol abuse (garbage frames, unknown
//! messages, duplicate ids, repeated `connection_init`, pings).

use std::time::{Duration, Instant};

use futures_util::{FutureExt as _, SinkExt as _, StreamExt as _};
use rand::Rng;
use rand::seq::IndexedRandom as _;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use super::checks::{self, excerpt};
use super::generate::{Operation, json_string};
use super::hostile::unicode_text;
use super::{Answer, SLOW};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    TransportWs,
    Legacy,
}

impl Protocol {
    fn accepted_close_codes(self) -> &'static [u16] {
        match self {
            Self::TransportWs => TRANSPORT_WS_CLOSE_CODES,
            Self::Legacy => LEGACY_CLOSE_CODES,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::TransportWs => "graphql-transport-ws",
            Self::Legacy => "graphql-ws",
        }
    }

    fn start(self) -> &'static str {
        match self {
            Self::TransportWs => "subscribe",
            Self::Legacy => "start",
        }
    }
}

/// What a `connection_init` carries.
#[derive(Clone, Debug)]
pub enum Init {
    Anonymous,
    /// The run's valid token, as `{"token": …}`.
    Token,
    /// Any JSON text as the whole message (garbage payloads, wrong types).
    Raw(String),
}

#[derive(Clone, Debug)]
pub enum Frame {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
}

#[derive(Clone, Debug)]
pub struct Session {
    pub protocol: Protocol,
    pub init: Option<Init>,
    pub frames: Vec<Frame>,
    /// Ids that must be answered (`next`/`data`/`error`/`complete`) unless the server closes.
    pub awaited: Vec<String>,
}

/// Close codes of the graphql-transport-ws protocol and of a normal websocket close, 1008 (policy
/// violation) for a socket running more operations at once than Pulse allows, and 4413 for one
/// whose answers passed its send budget unread: this client reads only between its own sends, so
/// a few large answers to documents it pipelines can pass it. 4500 is in the protocol but means
/// an internal error: a failure.
const TRANSPORT_WS_CLOSE_CODES: &[u16] =
    &[1000, 1001, 1008, 4400, 4401, 4403, 4408, 4409, 4413, 4429];
/// The legacy protocol names no close codes of its own: a message it cannot read is a websocket
/// protocol error (1002); Pulse's init timeout, its code for an operation started before the
/// acknowledgement (4401), its limit of operations at once (1008) and its send budget (4413) apply
/// to it too.
const LEGACY_CLOSE_CODES: &[u16] = &[1000, 1001, 1002, 1008, 4401, 4408, 4413];
/// The longest message Pulse reads from a socket: a request body's limit.
const MESSAGE_LIMIT: usize = 256 * 1024;
/// Its close code for a longer one, on either protocol.
const MESSAGE_TOO_BIG: u16 = 1009;

impl Session {
    /// A session that sends `operations` as subscriptions after an ordinary `connection_init`.
    pub fn documents(protocol: Protocol, init: Init, operations: &[Operation]) -> Self {
        let mut frames = Vec::new();
        let mut awaited = Vec::new();
        for (index, operation) in operations.iter().enumerate() {
            let id = index.to_string();
            frames.push(Frame::Text(format!(
                "{{\"id\":\"{id}\",\"type\":\"{}\",\"payload\":{}}}",
                protocol.start(),
                operation.to_json()
            )));
            if !operation.may_stay_open() {
                awaited.push(id);
            }
        }
        Self {
            protocol,
            init: Some(init),
            frames,
            awaited,
        }
    }

    /// A session that abuses the protocol.
    pub fn abuse(rng: &mut impl Rng, protocol: Protocol) -> Self {
        let init = match rng.random_range(0..8) {
            0 => None,
            1 => Some(Init::Anonymous),
            2 => Some(Init::Token),
            _ => Some(Init::Raw(garbage_init(rng))),
        };
        let frames = (0..rng.random_range(1..8))
            .map(|_| garbage_frame(rng, protocol))
            .collect();
        Self {
            protocol,
            init,
            frames,
            awaited: Vec::new(),
        }
    }

    pub fn describe(&self) -> String {
        let mut text = format!("{} init={:?}", self.protocol.name(), self.init);
        for frame in &self.frames {
            match frame {
                Frame::Text(text_frame) => text.push_str(&format!("\n  text {text_frame}")),
                Frame::Binary(bytes) => {
                    text.push_str(&format!("\n  binary {}", String::from_utf8_lossy(bytes)))
                }
                Frame::Ping(bytes) => text.push_str(&format!("\n  ping {} bytes", bytes.len())),
            }
        }
        text
    }

    /// Runs the session; `header` is an `Authorization` value for the upgrade request.
    pub async fn run(
        &self,
        url: &str,
        token: &str,
        header: Option<HeaderValue>,
        answer: &mut Answer,
    ) {
        let mut request = url.into_client_request().expect("a websocket URL");
        request.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static(self.protocol.name()),
        );
        if let Some(header) = header {
            request.headers_mut().insert("authorization", header);
        }
        let connected = tokio::time::timeout(SLOW, tokio_tungstenite::connect_async(request)).await;
        let mut socket = match connected {
            Err(_) => return answer.fail("slow", format!("no upgrade within {SLOW:?}")),
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) => {
                let status = response.status().as_u16();
                answer.label(format!("ws upgrade {status}"));
                if status >= 500 {
                    answer.fail("5xx", format!("upgrade answered {status}"));
                }
                if let Some(body) = response.body() {
                    super::check_http_body(status, body, answer);
                }
                return;
            }
            Ok(Err(tokio_tungstenite::tungstenite::Error::Io(err)))
                if err.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                return answer.fail("no connection", format!("upgrade: {err}"));
            }
            Ok(Err(err)) => return answer.fail("no answer", format!("upgrade failed: {err}")),
            Ok(Ok((socket, _))) => socket,
        };

        let mut outgoing: Vec<Message> = Vec::new();
        if let Some(init) = &self.init {
            let text = match init {
                Init::Anonymous => "{\"type\":\"connection_init\",\"payload\":{}}".to_owned(),
                Init::Token => format!(
                    "{{\"type\":\"connection_init\",\"payload\":{{\"token\":{}}}}}",
                    json_string(token)
                ),
                Init::Raw(text) => text.clone(),
            };
            outgoing.push(Message::Text(text.into()));
        }
        outgoing.extend(self.frames.iter().map(|frame| match frame {
            Frame::Text(text) => Message::Text(text.clone().into()),
            Frame::Binary(bytes) => Message::Binary(Bytes::from(bytes.clone())),
            Frame::Ping(bytes) => Message::Ping(Bytes::from(bytes.clone())),
        }));

        let mut state = Reading {
            protocol: self.protocol,
            oversized: outgoing.iter().any(|message| message.len() > MESSAGE_LIMIT),
            pending: self.awaited.clone(),
            closed: None,
            write_failed: false,
        };
        for message in outgoing {
            if state.closed.is_some() {
                break;
            }
            if socket.send(message).await.is_err() {
                state.write_failed = true;
                break;
            }
            // Whatever the server already said (a close, above all) before sending more.
            while let Some(Some(received)) = socket.next().now_or_never() {
                if !state.receive(received, answer) {
                    break;
                }
            }
        }

        let sent_at = Instant::now();
        while state.closed.is_none() {
            let quiet = if state.pending.is_empty() {
                Duration::from_millis(100)
            } else {
                SLOW.saturating_sub(sent_at.elapsed())
            };
            match tokio::time::timeout(quiet, socket.next()).await {
                Err(_) if state.pending.is_empty() => break,
                Err(_) => {
                    answer.fail(
                        "slow",
                        format!(
                            "ids {:?} not answered within {SLOW:?} over {}",
                            state.pending,
                            self.protocol.name()
                        ),
                    );
                    break;
                }
                Ok(received) => {
                    if !state.receive_next(received, answer) {
                        break;
                    }
                }
            }
        }
        match state.closed {
            Some(Closed::Frame(code)) => answer.label(format!("ws close {code}")),
            Some(Closed::Abrupt(reason)) if state.write_failed => {
                answer.label(format!("ws reset after a refused write ({reason})"))
            }
            Some(Closed::Abrupt(reason)) if reason.contains("Control frame too big") => {
                answer.label("ws invalid close frame".to_owned());
                answer.fail(
                    "ws invalid close frame",
                    format!("the server sent a control frame RFC 6455 forbids: {reason}"),
                );
            }
            // Closing on a message past the limit leaves the rest of what the client sent unread,
            // and TCP answers that with a reset, which may overtake the close frame (an HTTP body
            // past its limit fares the same).
            Some(Closed::Abrupt(reason)) if state.oversized && reason.contains("reset") => answer
                .label(format!(
                    "ws reset after a message past the limit ({reason})"
                )),
            Some(Closed::Abrupt(reason)) => {
                answer.label("ws abrupt end".to_owned());
                answer.fail(
                    "ws abrupt close (1006)",
                    format!("the server dropped the connection without a close frame: {reason}"),
                );
            }
            None => {
                answer.label("ws closed by us".to_owned());
                socket
                    .close(Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "".into(),
                    }))
                    .await
                    .ok();
                // Drains the server's side of the closing handshake; nothing more is checked.
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    while socket.next().await.is_some() {}
                })
                .await;
            }
        }
    }
}

enum Closed {
    Frame(u16),
    Abrupt(String),
}

struct Reading {
    protocol: Protocol,
    /// A message sent is past the server's limit, which it answers with 1009 (message too big).
    oversized: bool,
    pending: Vec<String>,
    closed: Option<Closed>,
    write_failed: bool,
}

type Received = Result<Message, tokio_tungstenite::tungstenite::Error>;

impl Reading {
    fn receive_next(&mut self, received: Option<Received>, answer: &mut Answer) -> bool {
        match received {
            Some(received) => self.receive(received, answer),
            None => {
                self.closed = Some(Closed::Abrupt("end of stream".to_owned()));
                false
            }
        }
    }

    /// Checks one message; false once the connection is over.
    fn receive(&mut self, received: Received, answer: &mut Answer) -> bool {
        let message = match received {
            Ok(message) => message,
            Err(err) => {
                self.closed = Some(Closed::Abrupt(err.to_string()));
                return false;
            }
        };
        match message {
            Message::Text(text) => self.text(text.as_str(), answer),
            Message::Binary(bytes) => {
                answer.fail(
                    "ws non-JSON message",
                    format!(
                        "a binary frame: {}",
                        excerpt(&String::from_utf8_lossy(&bytes))
                    ),
                );
            }
            Message::Close(frame) => {
                let code = frame.map_or(1005, |frame| u16::from(frame.code));
                let accepted = self.protocol.accepted_close_codes();
                if !(accepted.contains(&code) || self.oversized && code == MESSAGE_TOO_BIG) {
                    answer.fail(
                        "ws close code",
                        format!(
                            "{} closed with {code}, not one of {accepted:?}",
                            self.protocol.name()
                        ),
                    );
                }
                self.closed = Some(Closed::Frame(code));
                return false;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
        true
    }

    fn text(&mut self, text: &str, answer: &mut Answer) {
        let Ok(message) = serde_json::from_str::<Value>(text) else {
            return answer.fail("ws non-JSON message", excerpt(text));
        };
        let kind = message["type"].as_str().unwrap_or_default().to_owned();
        if let Some(id) = message["id"].as_str() {
            self.pending.retain(|pending| pending != id);
        }
        let checked = match kind.as_str() {
            "connection_ack" | "complete" | "pong" | "ping" | "ka" => {
                return answer.label(format!("ws {kind}"));
            }
            "next" | "data" => checks::graphql_response(&message["payload"]),
            "error" => match message["payload"].as_array() {
                Some(errors) => errors.iter().map(checks::error_code).collect(),
                None => checks::error_code(&message["payload"]).map(|code| vec![code]),
            },
            "connection_error" => checks::error_code(&message["payload"]).map(|code| vec![code]),
            _ => Ok(Vec::new()),
        };
        match checked {
            Ok(codes) => answer.label(format!("ws {kind} {}", checks::label(&codes))),
            Err(problem) => answer.fail(problem.kind, format!("ws {kind}: {}", problem.detail)),
        }
    }
}

fn garbage_init(rng: &mut impl Rng) -> String {
    let payload = [
        "{\"token\":\"garbage\"}",
        "{\"token\":5}",
        "{\"token\":null}",
        "{\"authToken\":\"a.b.c\"}",
        "{\"Authorization\":\"Basic eDp5\"}",
        "{\"Authorization\":\"Bearer\"}",
        "{\"authorization\":[]}",
        "\"token\"",
        "[1,2]",
        "42",
        "null",
    ]
    .choose(rng)
    .expect("not empty");
    match rng.random_range(0..4) {
        0 => {
            let length = rng.random_range(1..2000);
            format!(
                "{{\"type\":\"connection_init\",\"payload\":{{\"token\":{}}}}}",
                json_string(&unicode_text(rng, length))
            )
        }
        1 => "{\"type\":\"connection_init\",\"payload\":".to_owned(),
        _ => format!("{{\"type\":\"connection_init\",\"payload\":{payload}}}"),
    }
}

fn garbage_frame(rng: &mut impl Rng, protocol: Protocol) -> Frame {
    let start = protocol.start();
    let text = match rng.random_range(0..16) {
        0 => {
            let length = rng.random_range(1..100);
            unicode_text(rng, length)
        }
        1 => {
            return Frame::Binary(
                (0..rng.random_range(1..500))
                    .map(|_| rng.random::<u8>())
                    .collect(),
            );
        }
        2 => {
            return Frame::Ping(
                (0..rng.random_range(0..125))
                    .map(|_| rng.random())
                    .collect(),
            );
        }
        3 => "{\"type\":\"fuzz\"}".to_owned(),
        4 => format!("{{\"type\":\"{start}\"}}"),
        5 => format!(
            "{{\"id\":1,\"type\":\"{start}\",\"payload\":{{\"query\":\"{{__typename}}\"}}}}"
        ),
        6 => format!("{{\"id\":\"d\",\"type\":\"{start}\",\"payload\":\"q\"}}"),
        7 | 8 => format!(
            "{{\"id\":\"dup\",\"type\":\"{start}\",\"payload\":{{\"query\":\"subscription {{ articlePublished {{ id }} }}\"}}}}"
        ),
        9 => "{\"type\":\"connection_init\",\"payload\":{}}".to_owned(),
        10 => "{\"type\":\"ping\",\"payload\":{\"x\":[1,2,3]}}".to_owned(),
        11 => "{\"type\":\"pong\"}".to_owned(),
        12 => "{\"id\":\"nope\",\"type\":\"complete\"}".to_owned(),
        13 => {
            let depth = rng.random_range(100..3000);
            format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
        }
        14 => format!(
            "{{\"id\":\"big\",\"type\":\"{start}\",\"payload\":{{\"query\":{}}}}}",
            json_string(&"{__typename}".repeat(rng.random_range(1..100_000)))
        ),
        _ => "{\"type\":\"connection_terminate\"}".to_owned(),
    };
    Frame::Text(text)
}
