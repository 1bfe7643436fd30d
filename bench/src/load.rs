//! The HTTP load: requests from many clients, as fast as possible (closed loop) or on a fixed
//! schedule (open loop); what each client sends is a [`Sender`] (`recordView` here, likes in
//! `like_toggle`).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use hyper::header::HeaderValue;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use reqwest::header::CONTENT_TYPE;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::http1::{Extra, GraphqlConnection};

/// Viewers are 10.x.y.z: at most 2^24 of them.
pub const MAX_VIEWERS: u32 = 1 << 24;

/// A desktop browser: not a crawler, so every first view counts.
pub const BROWSER_USER_AGENT: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36";

pub const RECORD_VIEW: &str = "mutation($a:ID!){ recordView(articleId:$a){ counted viewCount } }";

/// Highest latency the histogram holds, in microseconds; slower requests are clamped to it.
const MAX_LATENCY_US: u64 = 120_000_000;

/// The address of viewer `index` (below [`MAX_VIEWERS`]): inside 10.0.0.0/8.
pub fn viewer_ip(index: u32) -> Ipv4Addr {
    debug_assert!(index < MAX_VIEWERS);
    let [_, x, y, z] = index.to_be_bytes();
    Ipv4Addr::new(10, x, y, z)
}

/// The warm-up viewer: outside 10.0.0.0/8, so never one of the measured viewers.
pub const WARM_UP_VIEWER: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 1);

/// The request body of a view of `article` (a global id), built once per article.
pub fn record_view_body(article: &str) -> Bytes {
    serde_json::json!({ "query": RECORD_VIEW, "variables": { "a": article } })
        .to_string()
        .into()
}

/// A GraphQL answer as the tool checks it: typed, so that checking costs the load tool little CPU
/// (it shares the machine with the server it measures).
#[derive(Deserialize)]
struct Answer<D> {
    data: Option<D>,
    errors: Option<serde::de::IgnoredAny>,
}

/// Sends `request` and reads its answer's `data` as `D`, which `accept` must take. An error is a
/// transport failure, a non-200 status, a GraphQL `errors` array, or data that does not parse or
/// that `accept` refuses; it shows the start of the body.
pub async fn answer<D: DeserializeOwned, T>(
    request: reqwest::RequestBuilder,
    what: &str,
    accept: impl FnOnce(D) -> Option<T>,
) -> Result<T, String> {
    let response = request
        .header(CONTENT_TYPE, "application/json")
        .send()
        .await
        .map_err(|err| format!("transport: {err}"))?;
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|err| format!("reading the body: {err}"))?;
    judge(status, &bytes, what, accept)
}

/// Reads an answer's `data` as `D`, which `accept` must take (see [`answer`]).
pub fn judge<D: DeserializeOwned, T>(
    status: reqwest::StatusCode,
    bytes: &[u8],
    what: &str,
    accept: impl FnOnce(D) -> Option<T>,
) -> Result<T, String> {
    let shown = || String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
    if status != reqwest::StatusCode::OK {
        return Err(format!("HTTP {status}: {}", shown()));
    }
    match serde_json::from_slice::<Answer<D>>(bytes) {
        Ok(Answer {
            errors: Some(_), ..
        }) => Err(format!("GraphQL errors: {}", shown())),
        Ok(Answer {
            data: Some(data), ..
        }) => accept(data).ok_or_else(|| format!("unexpected {what} payload: {}", shown())),
        Ok(_) => Err(format!("{what} answer without data: {}", shown())),
        Err(err) => Err(format!(
            "the body is not a {what} answer ({err}): {}",
            shown()
        )),
    }
}

#[derive(Deserialize)]
struct RecordViewData {
    #[serde(rename = "recordView")]
    record_view: RecordViewAnswer,
}

#[derive(Deserialize)]
struct RecordViewAnswer {
    counted: bool,
    #[serde(rename = "viewCount")]
    view_count: i64,
}

/// Sends one view and answers whether it was counted; a view count below 1 is refused (every
/// article has at least its warm-up view).
pub async fn send_view(
    connection: &mut GraphqlConnection,
    body: &Bytes,
    viewer: Ipv4Addr,
) -> Result<bool, String> {
    let extra = Extra {
        forwarded_for: Some(
            HeaderValue::from_str(&viewer.to_string()).expect("an address is a valid header"),
        ),
        user_agent: Some(&HeaderValue::from_static(BROWSER_USER_AGENT)),
        ..Extra::default()
    };
    let (status, answer) = connection.post(body.clone(), extra).await?;
    judge(status, &answer, "recordView", |data: RecordViewData| {
        let view = data.record_view;
        (view.view_count >= 1).then_some(view.counted)
    })
}

/// What one load client sends: each call sends one request and answers whether it did the
/// measured work (a view counted, a like changed). Each client owns its own, so one that keeps
/// state (a liker's relations) needs no locking.
pub trait Sender: Send + 'static {
    fn send(&mut self, rng: &mut StdRng) -> impl Future<Output = Result<bool, String>> + Send;
}

/// `recordView` of a random article by a random viewer.
pub struct ViewSender {
    pub connection: GraphqlConnection,
    /// One body per article, shared by every request that sends it.
    pub bodies: Arc<[Bytes]>,
    pub viewers: u32,
}

impl Sender for ViewSender {
    async fn send(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        let body = &self.bodies[rng.random_range(0..self.bodies.len())];
        let viewer = viewer_ip(rng.random_range(0..self.viewers));
        send_view(&mut self.connection, body, viewer).await
    }
}

pub struct LoadPlan {
    pub stop: Stop,
    /// Open loop: requests/s over all clients.
    pub rate: Option<f64>,
}

#[derive(Clone, Copy, Debug)]
pub enum Stop {
    After(Duration),
    Requests(u64),
}

pub struct LoadResult {
    pub elapsed: Duration,
    /// Latency in microseconds of every request, failed ones included.
    pub latency: Histogram<u64>,
    pub ok: u64,
    /// Requests that did the measured work (a view counted, a like changed).
    pub counted: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
}

impl LoadResult {
    /// The latency at `quantile`, in milliseconds.
    pub fn ms(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }

    /// The report's latency rows.
    pub fn latency_rows(&self) -> [(&'static str, String); 2] {
        [
            (
                "latency p50 / p99 / max",
                format!(
                    "{:.2} / {:.2} / {:.2} ms",
                    self.ms(0.50),
                    self.ms(0.99),
                    self.latency.max() as f64 / 1000.0
                ),
            ),
            (
                "latency p90 / p99.9 / mean",
                format!(
                    "{:.2} / {:.2} / {:.2} ms",
                    self.ms(0.90),
                    self.ms(0.999),
                    self.latency.mean() / 1000.0
                ),
            ),
        ]
    }

    /// The latency figures of the JSON report, in milliseconds.
    pub fn latency_json(&self) -> serde_json::Value {
        serde_json::json!({
            "p50": self.ms(0.50),
            "p90": self.ms(0.90),
            "p99": self.ms(0.99),
            "p999": self.ms(0.999),
            "max": self.latency.max() as f64 / 1000.0,
            "mean": self.latency.mean() / 1000.0,
        })
    }

    fn empty() -> Self {
        Self {
            elapsed: Duration::ZERO,
            latency: new_histogram(),
            ok: 0,
            counted: 0,
            errors: 0,
            first_errors: Vec::new(),
        }
    }

    fn merge(&mut self, other: Self) {
        self.latency
            .add(&other.latency)
            .expect("histograms of equal bounds merge");
        self.ok += other.ok;
        self.counted += other.counted;
        self.errors += other.errors;
        for error in other.first_errors {
            if self.first_errors.len() < 5 {
                self.first_errors.push(error);
            }
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Runs the load: one task per sender, all sharing the senders' keep-alive HTTP client.
pub async fn run<S: Sender>(senders: Vec<S>, plan: LoadPlan) -> LoadResult {
    let clients = senders.len().max(1) as u32;
    let remaining = Arc::new(AtomicI64::new(match plan.stop {
        Stop::Requests(total) => total as i64,
        Stop::After(_) => i64::MAX,
    }));
    let started = Instant::now();
    let deadline = match plan.stop {
        Stop::After(duration) => Some(started + duration),
        Stop::Requests(_) => None,
    };
    // Open loop: every client sends every `clients / rate` seconds, the clients staggered evenly.
    let interval = plan
        .rate
        .map(|rate| Duration::from_secs_f64(f64::from(clients) / rate));
    let mut tasks = tokio::task::JoinSet::new();
    for (client, sender) in senders.into_iter().enumerate() {
        let remaining = remaining.clone();
        let first_send =
            interval.map(|interval| started + interval.mul_f64(client as f64 / f64::from(clients)));
        tasks.spawn(async move {
            client_loop(sender, &remaining, deadline, interval, first_send).await
        });
    }
    let mut result = LoadResult::empty();
    while let Some(joined) = tasks.join_next().await {
        result.merge(joined.expect("a load task does not panic"));
    }
    result.elapsed = started.elapsed();
    result
}

async fn client_loop<S: Sender>(
    mut sender: S,
    remaining: &AtomicI64,
    deadline: Option<Instant>,
    interval: Option<Duration>,
    mut next_send: Option<Instant>,
) -> LoadResult {
    let mut rng = StdRng::from_os_rng();
    let mut result = LoadResult::empty();
    loop {
        // Open loop: wait for this request's slot. When the previous answer came after the slot,
        // the server held this request back, so latency counts from the slot (a slow server cannot
        // hide its queueing by delaying the requests that would have measured it). When the client
        // was idle, it counts from the actual send: the timer wakes up to a millisecond late, and
        // that lateness is the load tool's, not the server's.
        let scheduled = match (next_send, interval) {
            (Some(at), Some(interval)) => {
                if deadline.is_some_and(|deadline| at >= deadline) {
                    break;
                }
                let held_back = Instant::now() > at;
                tokio::time::sleep_until(at.into()).await;
                next_send = Some(at + interval);
                if held_back { at } else { Instant::now() }
            }
            _ => Instant::now(),
        };
        if deadline.is_some_and(|deadline| scheduled >= deadline) {
            break;
        }
        if remaining.fetch_sub(1, Ordering::Relaxed) <= 0 {
            break;
        }
        let answer = sender.send(&mut rng).await;
        let micros = scheduled
            .elapsed()
            .as_micros()
            .clamp(1, u128::from(MAX_LATENCY_US));
        result.latency.saturating_record(micros as u64);
        match answer {
            Ok(counted) => {
                result.ok += 1;
                result.counted += u64::from(counted);
            }
            Err(error) => {
                result.errors += 1;
                if result.first_errors.len() < 5 {
                    result.first_errors.push(error);
                }
            }
        }
    }
    result
}
