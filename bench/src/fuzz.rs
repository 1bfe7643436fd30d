//! `fuzz`: throws generated, hostile and mutated GraphQL requests at a real `pulse serve` process
//! over HTTP and websockets for a bounded time, and fails when the server exits, answers 5xx or
//! something that is not a coded GraphQL answer, takes longer than [`SLOW`], or grows past the
//! memory bound.
//!
//! Every case is generated from its own random stream, derived from the seed, the worker and the
//! case number, so `--seed S --case W:N` sends the same case again.

mod case;
mod checks;
mod generate;
mod hostile;
mod mutate;
mod schema;
mod ws;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rand::Rng;
use rand::distr::{Alphanumeric, SampleString as _};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};

use crate::FuzzArgs;
use crate::proc_stats;
use crate::record_view::graphql;
use crate::redis_util;
use crate::report::{MIB, print_table, thousands};
use crate::server::Server;
use case::{Auth, Case, Entry, Inputs, generate_case};
pub use case::{CaseId, Class};
use generate::Known;

/// An answer slower than this is a failure: a sign of work without bound.
pub const SLOW: Duration = Duration::from_secs(10);
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(500);
/// Below the server's default `PULSE_HTTP_HEADER_TIMEOUT` (10 s), by a wide margin.
const IDLE_CONNECTION_LIFETIME: Duration = Duration::from_secs(4);
const EXIT_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How often `/metrics` is scraped, as Prometheus would, to see the cost of what the labels hold.
const SCRAPE_INTERVAL: Duration = Duration::from_secs(2);
/// A larger `/metrics` answer is a failure: its size must not grow with what clients send (operation
/// names become labels). Pulse's own series at their bound stay well below.
const MAX_SCRAPE_BYTES: usize = 2 * 1024 * 1024;
/// Failures whose full request is written to a file, for replay.
const SAVED_FAILURES: usize = 20;

/// What one case got back: labels for the summary and the checks it failed.
#[derive(Default)]
pub struct Answer {
    labels: Vec<String>,
    failures: Vec<(&'static str, String)>,
}

impl Answer {
    pub fn label(&mut self, label: String) {
        self.labels.push(label);
    }

    pub fn fail(&mut self, kind: &'static str, detail: String) {
        self.failures.push((kind, detail));
    }

    /// Whether the connection broke under this case: the server may have gone with it.
    fn lost_connection(&self) -> bool {
        self.failures
            .iter()
            .any(|(kind, _)| LOST_CONNECTION.contains(kind))
    }
}

/// Failure kinds of a connection that broke while a case was in flight.
const LOST_CONNECTION: &[&str] = &["no answer", "ws abrupt close (1006)"];

/// A transport error with every cause under it: reqwest's own message ("error sending request")
/// does not say whether the server reset the connection, closed it, or sent something malformed.
fn causes(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Checks an HTTP answer's status and body.
pub fn check_http_body(status: u16, body: &[u8], answer: &mut Answer) {
    if status >= 500 {
        answer.fail(
            "5xx",
            format!(
                "status {status}: {}",
                checks::excerpt(&String::from_utf8_lossy(body))
            ),
        );
    }
    let value = match serde_json::from_slice::<Value>(body) {
        Ok(value) => value,
        Err(_) => {
            answer.label(format!("http {status} non-JSON"));
            return answer.fail(
                "non-JSON body",
                format!(
                    "status {status}: {}",
                    checks::excerpt(&String::from_utf8_lossy(body))
                ),
            );
        }
    };
    match checks::graphql_response(&value) {
        Ok(codes) => answer.label(format!("http {status} {}", checks::label(&codes))),
        Err(problem) => {
            answer.label(format!("http {status} {}", problem.kind));
            answer.fail(problem.kind, format!("status {status}: {}", problem.detail));
        }
    }
}

struct Target {
    http: reqwest::Client,
    graphql_url: String,
    ws_url: String,
    token: String,
}

fn authorization(auth: &Auth, token: &str) -> Option<HeaderValue> {
    match auth {
        Auth::None => None,
        Auth::Valid => HeaderValue::from_str(&format!("Bearer {token}")).ok(),
        Auth::Garbage(bytes) => HeaderValue::from_bytes(bytes).ok(),
    }
}

async fn send(case: &Case, target: &Target) -> Answer {
    let mut answer = Answer::default();
    match &case.entry {
        Entry::Http(body) => {
            let mut request = target
                .http
                .post(&target.graphql_url)
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(header) = authorization(&case.auth, &target.token) {
                request = request.header(AUTHORIZATION, header);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(err) if err.is_timeout() => {
                    answer.fail("slow", format!("no answer within {SLOW:?}"));
                    return answer;
                }
                Err(err) if err.is_connect() => {
                    answer.fail("no connection", causes(&err));
                    return answer;
                }
                Err(err) => {
                    answer.fail("no answer", causes(&err));
                    return answer;
                }
            };
            let status = response.status().as_u16();
            match response.bytes().await {
                Ok(bytes) => check_http_body(status, &bytes, &mut answer),
                Err(err) if err.is_timeout() => {
                    answer.fail("slow", format!("the body did not arrive within {SLOW:?}"))
                }
                Err(err) => answer.fail(
                    "no answer",
                    format!("status {status}, body: {}", causes(&err)),
                ),
            }
        }
        Entry::Ws(session) => {
            // Only the protocol class sends an Authorization header on the upgrade; documents
            // carry the token in connection_init, as browsers must. The websocket client refuses
            // header values that are not UTF-8 before anything is sent.
            let header = match case.class {
                Class::Protocol => authorization(&case.auth, &target.token)
                    .filter(|header| header.to_str().is_ok()),
                _ => None,
            };
            session
                .run(&target.ws_url, &target.token, header, &mut answer)
                .await;
        }
    }
    answer
}

struct Failure {
    kind: &'static str,
    detail: String,
    /// The case and its full description; none for the server-wide checks.
    case: Option<(CaseId, String)>,
    at: Duration,
}

#[derive(Default)]
struct Tally {
    cases_by_class: BTreeMap<String, u64>,
    requests_by_entry: BTreeMap<&'static str, u64>,
    answers: BTreeMap<String, u64>,
    failures: Vec<Failure>,
    failures_by_kind: BTreeMap<&'static str, u64>,
    /// Bytes of the largest `/metrics` answer.
    largest_scrape: usize,
}

struct Shared {
    stop: AtomicBool,
    tally: Mutex<Tally>,
    started: Instant,
}

impl Shared {
    fn record(&self, case: &Case, answer: Answer) {
        let mut tally = self.tally.lock().expect("tally lock poisoned");
        *tally.cases_by_class.entry(case.class.name()).or_default() += 1;
        *tally
            .requests_by_entry
            .entry(case.entry.name())
            .or_default() += 1;
        for label in answer.labels {
            *tally.answers.entry(label).or_default() += 1;
        }
        for (kind, detail) in answer.failures {
            *tally.failures_by_kind.entry(kind).or_default() += 1;
            tally.failures.push(Failure {
                kind,
                detail,
                case: Some((case.id, case.describe())),
                at: self.started.elapsed(),
            });
        }
    }

    fn fail(&self, kind: &'static str, detail: String) {
        let mut tally = self.tally.lock().expect("tally lock poisoned");
        *tally.failures_by_kind.entry(kind).or_default() += 1;
        tally.failures.push(Failure {
            kind,
            detail,
            case: None,
            at: self.started.elapsed(),
        });
    }
}

pub async fn run(args: FuzzArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    println!("fuzz seed: {seed}");
    let classes: Vec<Class> = <Class as clap::ValueEnum>::value_variants()
        .iter()
        .copied()
        .filter(|class| !args.skip.contains(class))
        .collect();
    if classes.is_empty() {
        bail!("--skip leaves no class to run");
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency as usize + 2)
        // The server closes a keep-alive connection idle for its header timeout (10 s by default).
        // A client reusing one at that moment sends into a closing socket and gets no answer, as
        // any client could; dropping idle connections well before keeps that race out of the run.
        .pool_idle_timeout(IDLE_CONNECTION_LIFETIME)
        .timeout(SLOW)
        .build()?;
    let (_target, mut redis) = redis_util::connect(&args.redis_url).await?;
    eprintln!("starting {} ...", args.server_bin.display());
    let mut server = Server::start(&args.server_bin, &args.redis_url, &http).await?;
    let result = fuzz(&args, seed, classes.clone(), &http, &mut server).await;
    let stopped = server.stop().await;
    let cleaned = redis_util::delete_prefix(&mut redis, &server.redis_prefix).await;
    let verdict = result?;
    stopped.context("cannot stop the server")?;
    cleaned.context("cannot delete the server's keys")?;
    if !verdict.suspects.is_empty() && args.case.is_none() {
        replay_suspects(&args, seed, &classes, &verdict.suspects, &http, &mut redis).await?;
    }
    if !verdict.passed {
        if let Some(id) = verdict.first_failed {
            println!(
                "\nreplay the first failed case: {}",
                replay_command(&args, seed, id)
            );
        }
        bail!("the fuzz run failed (seed {seed}); see above");
    }
    Ok(())
}

/// The command line that sends case `id` of this run again, alone.
fn replay_command(args: &FuzzArgs, seed: u64, id: CaseId) -> String {
    let mut command = format!("pulse-bench fuzz --seed {seed}");
    if !args.skip.is_empty() {
        let names: Vec<String> = args.skip.iter().map(|class| class.name()).collect();
        command.push_str(&format!(" --skip {}", names.join(",")));
    }
    command.push_str(&format!(" --case {id}"));
    command
}

/// A user and an article for the cases to act as and on: the user's token and both ids.
async fn sign_up_and_publish(http: &reqwest::Client, url: &str) -> anyhow::Result<(String, Known)> {
    let handle = format!("fuzz_{}", crate::random_hex(12));
    let password = Alphanumeric.sample_string(&mut rand::rng(), 24);
    let signed_up = graphql(
        http,
        url,
        None,
        "mutation($h:String!,$p:String!){ signUp(handle:$h,password:$p){ token user { id } } }",
        json!({ "h": handle, "p": password }),
    )
    .await
    .context("sign-up")?;
    let token = signed_up["data"]["signUp"]["token"]
        .as_str()
        .context("signUp returned no token")?
        .to_owned();
    let user_id = signed_up["data"]["signUp"]["user"]["id"]
        .as_str()
        .context("signUp returned no user id")?
        .to_owned();
    let published = graphql(
        http,
        url,
        Some(&token),
        r#"mutation { publishArticle(input: { title: "Fuzzed", body: "Target of generated ids." }) { id } }"#,
        Value::Null,
    )
    .await
    .context("publishArticle")?;
    let article_id = published["data"]["publishArticle"]["id"]
        .as_str()
        .context("publishArticle returned no id")?
        .to_owned();
    let known = Known {
        ids: vec![user_id, article_id],
    };
    Ok((token, known))
}

/// How a run went: whether every check held, and the cases to replay alone to find which one
/// took the server down or wedged it.
struct Verdict {
    passed: bool,
    suspects: Vec<CaseId>,
    first_failed: Option<CaseId>,
}

/// Suspects replayed at most: a replay of a case that wedges the server costs half a minute.
const MAX_SUSPECTS: usize = 8;
/// How long before the exit was seen a broken connection makes its case a suspect.
const SUSPECT_WINDOW: Duration = Duration::from_secs(2);

/// Runs the cases and prints the summary.
async fn fuzz(
    args: &FuzzArgs,
    seed: u64,
    classes: Vec<Class>,
    http: &reqwest::Client,
    server: &mut Server,
) -> anyhow::Result<Verdict> {
    let graphql_url = server.url("/graphql");
    let (token, known) = sign_up_and_publish(http, &graphql_url).await?;
    let inputs = Arc::new(Inputs {
        schema: schema::Schema::load(),
        known,
        corpus: mutate::corpus(),
        classes: classes.clone(),
    });
    let target = Arc::new(Target {
        http: http.clone(),
        ws_url: format!("ws://{}/graphql/ws", server.addr),
        graphql_url,
        token,
    });
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        tally: Mutex::new(Tally::default()),
        started: Instant::now(),
    });
    let duration = Duration::from_secs(args.seconds);
    let pid = server.pid().to_string();
    let ticks = proc_stats::clock_ticks_per_second();
    let cpu_before = proc_stats::cpu_ticks(&pid)?;
    let class_names: Vec<String> = classes.iter().map(|class| class.name()).collect();
    match args.case {
        Some(id) => println!("sending case {id} alone"),
        None => println!(
            "fuzzing for {}s with {} workers; classes: {}",
            args.seconds,
            args.concurrency,
            class_names.join(",")
        ),
    }

    let mut workers = tokio::task::JoinSet::new();
    if let Some(id) = args.case {
        let (inputs, target, shared) = (inputs.clone(), target.clone(), shared.clone());
        workers.spawn(async move {
            let case = generate_case(seed, id, &inputs);
            println!("{}", checks::excerpt(&case.describe()));
            let answer = send(&case, &target).await;
            shared.record(&case, answer);
        });
    } else {
        for worker in 0..args.concurrency {
            let (inputs, target, shared) = (inputs.clone(), target.clone(), shared.clone());
            workers.spawn(async move {
                let mut number = 0;
                while !shared.stop.load(Ordering::Relaxed) && shared.started.elapsed() < duration {
                    let id = CaseId { worker, number };
                    let case = generate_case(seed, id, &inputs);
                    let answer = send(&case, &target).await;
                    let lost = answer.lost_connection();
                    shared.record(&case, answer);
                    number += 1;
                    if lost {
                        // Gives the monitor time to see whether the server is gone, so that
                        // the cases in flight when it went are the last ones recorded.
                        tokio::time::sleep(EXIT_CHECK_INTERVAL * 3).await;
                    }
                }
            });
        }
        let (target, shared) = (target.clone(), shared.clone());
        workers.spawn(async move { scrape_metrics(&target, &shared, duration).await });
    }

    // Watches the server while the workers run: its exit and its memory.
    let max_rss = args.max_rss_mib * 1024 * 1024;
    let mut peak_rss = 0;
    let mut exited = None;
    let mut last_sample: Option<Instant> = None;
    while !workers.is_empty() {
        if let Some(status) = server.try_wait()? {
            exited = Some((status, shared.started.elapsed()));
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        if last_sample.is_none_or(|sampled| sampled.elapsed() >= RSS_SAMPLE_INTERVAL) {
            last_sample = Some(Instant::now());
            if let Ok((rss, _)) = proc_stats::memory(&pid) {
                peak_rss = peak_rss.max(rss);
                if rss > max_rss && !shared.stop.swap(true, Ordering::Relaxed) {
                    shared.fail(
                        "memory",
                        format!(
                            "server RSS {:.0} MiB is above --max-rss-mib {}",
                            rss as f64 / MIB,
                            args.max_rss_mib
                        ),
                    );
                }
            }
        }
        tokio::select! {
            joined = workers.join_next() => {
                if let Some(Err(err)) = joined {
                    bail!("a fuzz worker failed: {err}");
                }
            }
            () = tokio::time::sleep(EXIT_CHECK_INTERVAL) => {}
        }
    }
    if shared.stop.load(Ordering::Relaxed) {
        // Cases in flight get their answer (or their timeout) and are counted.
        let _ = tokio::time::timeout(SLOW + Duration::from_secs(2), async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        workers.abort_all();
    }
    if exited.is_none() {
        exited = server
            .try_wait()?
            .map(|status| (status, shared.started.elapsed()));
    }
    let cpu_seconds = proc_stats::cpu_ticks(&pid)
        .ok()
        .map(|after| (after - cpu_before) as f64 / ticks);
    if let Ok((rss, hwm)) = proc_stats::memory(&pid) {
        peak_rss = peak_rss.max(rss);
        let reported = tally_has(&shared, "memory");
        if hwm > max_rss && exited.is_none() && !reported {
            shared.fail(
                "memory",
                format!(
                    "server peak RSS (VmHWM) {:.0} MiB is above --max-rss-mib {}",
                    hwm as f64 / MIB,
                    args.max_rss_mib
                ),
            );
        }
    }
    let elapsed = shared.started.elapsed();
    let tally = std::mem::take(&mut *shared.tally.lock().expect("tally lock poisoned"));
    summarize(
        seed,
        elapsed,
        &tally,
        peak_rss,
        cpu_seconds,
        exited.map(|(status, _)| status.to_string()),
    );
    let passed = exited.is_none() && tally.failures.is_empty();
    if !passed {
        report_failures(seed, &tally, exited.map(|(status, _)| status.to_string()));
    }
    // A case that took the server down broke its connection just before the exit was seen; a
    // case that wedged it was slow, and so was every case queued behind it.
    let suspect = |failure: &Failure| match exited {
        Some((_, seen_at)) => {
            LOST_CONNECTION.contains(&failure.kind) && failure.at + SUSPECT_WINDOW >= seen_at
        }
        None => failure.kind == "slow",
    };
    let mut suspects = Vec::new();
    for failure in tally.failures.iter().filter(|failure| suspect(failure)) {
        if let Some((id, _)) = &failure.case
            && !suspects.contains(id)
            && suspects.len() < MAX_SUSPECTS
        {
            suspects.push(*id);
        }
    }
    let first_failed = tally
        .failures
        .iter()
        .find_map(|failure| failure.case.as_ref().map(|(id, _)| *id));
    Ok(Verdict {
        passed,
        suspects,
        first_failed,
    })
}

/// Sends each suspect alone to a fresh server and says which of them fails on its own.
async fn replay_suspects(
    args: &FuzzArgs,
    seed: u64,
    classes: &[Class],
    suspects: &[CaseId],
    http: &reqwest::Client,
    redis: &mut pulse::redis::Link,
) -> anyhow::Result<()> {
    println!(
        "\nreplaying {} suspect cases one at a time, each on a fresh server ...",
        suspects.len()
    );
    let mut culprits = 0;
    for id in suspects {
        let mut server = Server::start(&args.server_bin, &args.redis_url, http).await?;
        let outcome = alone(seed, classes, *id, http, &mut server).await;
        server.stop().await.ok();
        redis_util::delete_prefix(redis, &server.redis_prefix).await?;
        let (answer, exited) = outcome?;
        let mut fails: Vec<String> = answer
            .failures
            .iter()
            .map(|(kind, _)| (*kind).to_owned())
            .collect();
        if let Some(status) = exited {
            fails.push(format!("the server exited ({status})"));
        }
        if !fails.is_empty() {
            culprits += 1;
            println!(
                "  case {id} alone: {}; replay: {}",
                fails.join(", "),
                replay_command(args, seed, *id)
            );
        }
    }
    if culprits == 0 {
        println!("  none fails alone: it takes several cases at once, or timing");
    }
    Ok(())
}

/// How long after its answer a replayed case's server is watched for an exit.
const REPLAY_WATCH: Duration = Duration::from_secs(1);

/// Sends case `id` alone; its answer, and the server's exit status if it exited.
async fn alone(
    seed: u64,
    classes: &[Class],
    id: CaseId,
    http: &reqwest::Client,
    server: &mut Server,
) -> anyhow::Result<(Answer, Option<std::process::ExitStatus>)> {
    let graphql_url = server.url("/graphql");
    let (token, known) = sign_up_and_publish(http, &graphql_url).await?;
    let inputs = Inputs {
        schema: schema::Schema::load(),
        known,
        corpus: mutate::corpus(),
        classes: classes.to_vec(),
    };
    let target = Target {
        http: http.clone(),
        ws_url: format!("ws://{}/graphql/ws", server.addr),
        graphql_url,
        token,
    };
    let answer = send(&generate_case(seed, id, &inputs), &target).await;
    let watched = Instant::now();
    while watched.elapsed() < REPLAY_WATCH {
        if let Some(status) = server.try_wait()? {
            return Ok((answer, Some(status)));
        }
        tokio::time::sleep(EXIT_CHECK_INTERVAL).await;
    }
    Ok((answer, None))
}

fn tally_has(shared: &Shared, kind: &str) -> bool {
    let tally = shared.tally.lock().expect("tally lock poisoned");
    tally.failures_by_kind.contains_key(kind)
}

async fn scrape_metrics(target: &Target, shared: &Shared, duration: Duration) {
    let url = target.graphql_url.replace("/graphql", "/metrics");
    while !shared.stop.load(Ordering::Relaxed) && shared.started.elapsed() < duration {
        tokio::time::sleep(SCRAPE_INTERVAL).await;
        let scraped = match target.http.get(&url).send().await {
            Ok(response) if response.status().is_success() => response.bytes().await,
            Ok(response) => {
                shared.fail(
                    "metrics",
                    format!("/metrics answered {}", response.status()),
                );
                continue;
            }
            Err(err) => Err(err),
        };
        match scraped {
            Ok(body) => {
                if body.len() > MAX_SCRAPE_BYTES {
                    shared.fail(
                        "metrics",
                        format!(
                            "/metrics is {} bytes, above {MAX_SCRAPE_BYTES}",
                            thousands(body.len() as f64)
                        ),
                    );
                }
                let mut tally = shared.tally.lock().expect("tally lock poisoned");
                *tally.requests_by_entry.entry("GET /metrics").or_default() += 1;
                tally.largest_scrape = tally.largest_scrape.max(body.len());
            }
            Err(err) if err.is_timeout() => {
                shared.fail("slow", format!("/metrics did not answer within {SLOW:?}"))
            }
            Err(err) => shared.fail("no answer", format!("/metrics: {}", causes(&err))),
        }
    }
}

fn summarize(
    seed: u64,
    elapsed: Duration,
    tally: &Tally,
    peak_rss: u64,
    cpu_seconds: Option<f64>,
    exited: Option<String>,
) {
    let lines = |map: &BTreeMap<String, u64>| {
        map.iter()
            .map(|(name, count)| format!("{name}: {}", thousands(*count as f64)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let entries: BTreeMap<String, u64> = tally
        .requests_by_entry
        .iter()
        .map(|(name, count)| ((*name).to_owned(), *count))
        .collect();
    let failures: BTreeMap<String, u64> = tally
        .failures_by_kind
        .iter()
        .map(|(name, count)| ((*name).to_owned(), *count))
        .collect();
    let rows = [
        ("seed", seed.to_string()),
        ("elapsed", format!("{:.1} s", elapsed.as_secs_f64())),
        ("cases by class", lines(&tally.cases_by_class)),
        ("requests by entry point", lines(&entries)),
        ("answers", lines(&tally.answers)),
        (
            "largest /metrics scrape",
            format!("{} bytes", thousands(tally.largest_scrape as f64)),
        ),
        (
            "server peak RSS",
            format!("{:.1} MiB", peak_rss as f64 / MIB),
        ),
        (
            "server CPU",
            cpu_seconds.map_or("unknown (exited)".to_owned(), |seconds| {
                format!("{seconds:.1} s")
            }),
        ),
        ("server exited", exited.unwrap_or_else(|| "no".to_owned())),
        (
            "failures",
            if failures.is_empty() {
                "none".to_owned()
            } else {
                lines(&failures)
            },
        ),
    ];
    print_table("pulse-bench fuzz", &rows);
}

fn report_failures(seed: u64, tally: &Tally, exited: Option<String>) {
    let directory = std::env::temp_dir().join(format!("pulse-fuzz-{seed}"));
    let saved = std::fs::create_dir_all(&directory).is_ok();
    if let Some(status) = exited {
        println!("\nFAILED: the server exited ({status}).");
        println!("Cases in flight when it went (one of them took it down):");
        for failure in &tally.failures {
            if let Some((_, case)) = &failure.case
                && LOST_CONNECTION.contains(&failure.kind)
            {
                println!(
                    "  at {:.1} s: {}",
                    failure.at.as_secs_f64(),
                    checks::excerpt(case)
                );
            }
        }
    }
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, failure) in tally.failures.iter().enumerate() {
        let times = shown.entry(failure.kind).or_default();
        *times += 1;
        if *times > 3 {
            continue;
        }
        println!(
            "\nFAILED [{}] at {:.1} s (seed {seed}): {}",
            failure.kind,
            failure.at.as_secs_f64(),
            failure.detail
        );
        let Some((_, case)) = &failure.case else {
            continue;
        };
        println!("request: {}", checks::excerpt(case));
        if saved && index < SAVED_FAILURES {
            let path: PathBuf = directory.join(format!("failure-{index}.txt"));
            if std::fs::write(&path, case).is_ok() {
                println!("full request: {}", path.display());
            }
        }
    }
}
