//! The peak loads' HTTP client: one keep-alive HTTP/1.1 connection per load client, on hyper's
//! connection API. The load tool shares two cores with the server it measures, so every
//! microsecond it spends per request is taken from the server. reqwest adds a shared connection
//! pool to check out of and back into and a URL to parse per request; here each client owns its
//! connection, and the bodies and header values are built once per run. The ceiling's client,
//! redis-benchmark, is as lean as a client gets, so the server's side gets a lean client too.
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A request that takes longer than this fails (the server is stuck, not slow).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers some scenarios add: a bearer token, a forwarded client address, a browser's name.
#[derive(Default)]
pub struct Extra<'a> {
    pub authorization: Option<&'a HeaderValue>,
    pub forwarded_for: Option<HeaderValue>,
    pub user_agent: Option<&'a HeaderValue>,
}

/// One connection to the server's `/graphql`, opened on first use and again after a failure.
pub struct GraphqlConnection {
    addr: SocketAddr,
    host: HeaderValue,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl GraphqlConnection {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            host: HeaderValue::from_str(&addr.to_string()).expect("an address is a valid header"),
            sender: None,
        }
    }

    /// The server it sends to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// POSTs `body` as JSON and answers the status and the whole response body.
    pub async fn post(
        &mut self,
        body: Bytes,
        extra: Extra<'_>,
    ) -> Result<(StatusCode, Bytes), String> {
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(body, extra)).await;
        let answer = sent.unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")));
        if answer.is_err() {
            // The connection may be half-used; the next request starts on a new one.
            self.sender = None;
        }
        answer
    }

    async fn exchange(
        &mut self,
        body: Bytes,
        extra: Extra<'_>,
    ) -> Result<(StatusCode, Bytes), String> {
        let sender = match &mut self.sender {
            Some(sender) => sender,
            slot => slot.insert(connect(self.addr).await?),
        };
        sender
            .ready()
            .await
            .map_err(|err| format!("transport: {err}"))?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri("/graphql")
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json");
        if let Some(authorization) = extra.authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        if let Some(forwarded_for) = extra.forwarded_for {
            request = request.header("x-forwarded-for", forwarded_for);
        }
        if let Some(user_agent) = extra.user_agent {
            request = request.header(USER_AGENT, user_agent);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|err| format!("building the request: {err}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|err| format!("transport: {err}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|err| format!("reading the body: {err}"))?
            .to_bytes();
        Ok((status, body))
    }
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|err| format!("connecting to {addr}: {err}"))?;
    stream
        .set_nodelay(true)
        .map_err(|err| format!("TCP_NODELAY: {err}"))?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| format!("HTTP handshake: {err}"))?;
    // Drives the connection; it ends when the sender is dropped or the server closes it.
    tokio::spawn(connection);
    Ok(sender)
}
