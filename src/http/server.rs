//! The accept loop. `axum::serve` has no header timeout and no connection cap, so a client that
//! opens connections and never finishes a request could hold a task and a descriptor each for as
//! long as it liked. Here every connection holds one of a fixed number of slots (past the cap, new
//! connections wait in the kernel's accept backlog), must finish its request headers within the
//! header timeout, and between keep-alive requests may stay idle only as long again: hyper restarts
//! the header timer as soon as a response is written.
//!
//! A request answered before its body was read to the end (a refusal of its type or size) is
//! answered with `Connection: close`: hyper closes such a connection after the answer, and without
//! the header a keep-alive client would send its next request into the closing socket and get no
//! answer (found by `pulse-bench fuzz`, whose oversized bodies left the next case without one).

use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, header};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

const OPEN_CONNECTIONS: &str = "pulse_http_connections_open";
const REQUESTS_IN_FLIGHT: &str = "pulse_http_requests_in_flight";

/// The open connections of one server, counted for operators (the `/metrics` gauges) and tests.
#[derive(Clone)]
pub struct Connections(Arc<Shared>);

struct Shared {
    max: u32,
    slots: Arc<Semaphore>,
    open: AtomicUsize,
    websockets: AtomicUsize,
    requests: AtomicUsize,
}

impl Connections {
    pub fn new(max: u32) -> Self {
        Self(Arc::new(Shared {
            max,
            slots: Arc::new(Semaphore::new(max as usize)),
            open: AtomicUsize::new(0),
            websockets: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
        }))
    }

    /// Connections accepted and not yet closed, websockets among them.
    pub fn open(&self) -> usize {
        self.0.open.load(Ordering::Relaxed)
    }

    pub fn open_websockets(&self) -> usize {
        self.0.websockets.load(Ordering::Relaxed)
    }

    /// Requests whose headers have been read and whose response is not yet ready: those a graceful
    /// shutdown lets finish.
    pub fn requests_in_flight(&self) -> usize {
        self.0.requests.load(Ordering::Relaxed)
    }

    fn request_started(&self) -> RequestInFlight {
        self.0.requests.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(REQUESTS_IN_FLIGHT).increment(1.0);
        RequestInFlight(self.clone())
    }

    /// Completes once every connection, upgraded ones included, has closed.
    pub async fn closed(&self) {
        let _all = self.0.slots.acquire_many(self.0.max).await;
    }

    fn occupy(&self, permit: OwnedSemaphorePermit) -> ConnectionSlot {
        self.0.open.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(OPEN_CONNECTIONS).increment(1.0);
        ConnectionSlot(Arc::new(Slot {
            _permit: permit,
            connections: self.clone(),
        }))
    }
}

/// A connection's place under the cap. The connection holds it, and so does each request (as an
/// extension), so that a websocket upgraded from the connection keeps the place after hyper is done.
#[derive(Clone)]
pub struct ConnectionSlot(Arc<Slot>);

struct Slot {
    _permit: OwnedSemaphorePermit,
    connections: Connections,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.0.open.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(OPEN_CONNECTIONS).decrement(1.0);
    }
}

impl ConnectionSlot {
    /// Marks the connection as a websocket for as long as the returned guard lives.
    pub fn websocket(self) -> OpenWebsocket {
        self.0
            .connections
            .0
            .websockets
            .fetch_add(1, Ordering::Relaxed);
        OpenWebsocket(self)
    }
}

struct RequestInFlight(Connections);

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        self.0.0.requests.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(REQUESTS_IN_FLIGHT).decrement(1.0);
    }
}

pub struct OpenWebsocket(ConnectionSlot);

impl Drop for OpenWebsocket {
    fn drop(&mut self) {
        let connections = &self.0.0.connections;
        connections.0.websockets.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Accepts connections until `stop` completes; then returns, dropping the listener so that no
/// connection is accepted any more. Connections already open get `shutdown` to drain by.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    connections: Connections,
    header_timeout: Duration,
    shutdown: CancellationToken,
    stop: impl Future<Output = ()>,
) {
    let mut stop = pin!(stop);
    loop {
        // A slot is taken before `accept`, so past the cap connections wait in the kernel's backlog
        // rather than costing this process a descriptor and a task: a burst is served as soon as
        // slots free up, and a flood costs only the kernel's bounded queue.
        let permit = tokio::select! {
            () = &mut stop => return,
            permit = connections.0.slots.clone().acquire_owned() => {
                permit.expect("the slot semaphore is never closed")
            }
        };
        let accepted = tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let slot = connections.occupy(permit);
                tokio::spawn(serve_connection(
                    stream,
                    peer,
                    slot,
                    router.clone(),
                    header_timeout,
                    shutdown.clone(),
                ));
            }
            Err(err) => wait_after_accept_error(err).await,
        }
    }
}

/// An error of one connection (reset before it was accepted) is that connection's; anything else,
/// most likely running out of descriptors, is the process's, and retrying at once would spin.
async fn wait_after_accept_error(err: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::error!(error = %err, "cannot accept connections; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    slot: ConnectionSlot,
    router: Router,
    header_timeout: Duration,
    shutdown: CancellationToken,
) {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let in_flight = slot.0.connections.request_started();
        let (mut head, body) = request.into_parts();
        head.extensions.insert(ConnectInfo(peer));
        head.extensions.insert(slot.clone());
        let body = WatchedBody::new(body);
        let read_to_end = body.read_to_end.clone();
        let response = router
            .clone()
            .oneshot(hyper::Request::from_parts(head, body));
        async move {
            let mut response = response.await;
            drop(in_flight);
            if let Ok(response) = &mut response
                && !read_to_end.load(Ordering::Relaxed)
            {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let mut connection = pin!(
        builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
    );
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(err) = served {
        tracing::debug!(error = %err, "connection closed with an error");
    }
}

/// A request's body that records whether it was read to its end.
struct WatchedBody {
    inner: Incoming,
    read_to_end: Arc<AtomicBool>,
}

impl WatchedBody {
    fn new(inner: Incoming) -> Self {
        let read_to_end = Arc::new(AtomicBool::new(inner.is_end_stream()));
        Self { inner, read_to_end }
    }
}

impl http_body::Body for WatchedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read_to_end.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
