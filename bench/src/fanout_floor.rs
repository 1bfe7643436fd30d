//! `fanout-floor`: how fast this machine can hand one small websocket message to N sockets when
//! the server does nothing else. A bare broadcaster (this binary again, as a separate process on
//! tokio's default runtime, as the server runs) writes one text frame stamped with the time its
//! fan-out began to each of N sockets in turn, once per tick; N clients from this process read
//! them. The latency of each (client, frame) pair is the time from the fan-out's start to the
//! client: the part of a live leaderboard's vote-to-client latency that no server can avoid on the
//! same cores, with the same client. `subscribers` measures Pulse on top of it (its latency also
//! holds the wait for the board's next read).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use futures_util::{SinkExt as _, StreamExt as _};
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::io::AsyncBufReadExt as _;
use tokio::net::{TcpListener, TcpSocket};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::proc_stats::{clock_ticks_per_second, cpu_ticks};
use crate::report::{print_table, thousands};
use crate::subscribers::SOCKETS_PER_SOURCE;

/// Frames the clients read before the measured ones: the fan-outs while the last sockets join.
const WARM_UP_TICKS: u32 = 5;

#[derive(Debug, Clone, clap::Args)]
pub struct FanoutFloorArgs {
    /// Websocket clients, one socket each.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub subscribers: u32,
    /// Time between fan-outs (Pulse's default leaderboard tick is 150 ms).
    #[arg(long, default_value = "150ms", value_parser = humantime::parse_duration)]
    pub tick: Duration,
    /// How long frames are measured.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Bytes of each frame (`subscribers`' leaderboard snapshot of 5 entries is about 450).
    #[arg(long, default_value_t = 450, value_parser = clap::value_parser!(u32).range(64..=1_000_000))]
    pub message_bytes: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// A tiny run (CI): 50 clients, 1 s.
    #[arg(long)]
    pub smoke: bool,
}

/// The hidden broadcaster's own arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BroadcasterArgs {
    #[arg(long)]
    pub tick: humantime::Duration,
    #[arg(long)]
    pub message_bytes: u32,
}

/// The broadcaster: prints its port, then accepts sockets and writes a stamped frame to each of
/// them once per tick, one socket after another, as a group hands a snapshot to its members.
pub async fn broadcast(args: BroadcasterArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    println!("{}", listener.local_addr()?.port());
    let (joined, mut joining) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors, most likely: the clients that got none fail and say so.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let joined = joined.clone();
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let config = WebSocketConfig::default().read_buffer_size(1024);
                // The clients send nothing after the handshake: the socket is only written.
                if let Ok(socket) =
                    tokio_tungstenite::accept_async_with_config(stream, Some(config)).await
                {
                    let _ = joined.send(socket);
                }
            });
        }
    });
    let padding = "x".repeat(args.message_bytes as usize);
    let mut sockets = Vec::new();
    let mut ticks = tokio::time::interval(*args.tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        while let Ok(socket) = joining.try_recv() {
            sockets.push(socket);
        }
        let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
        let mut frame = format!("{{\"t\":{stamp},\"pad\":\"");
        let rest = (args.message_bytes as usize).saturating_sub(frame.len() + 2);
        frame.push_str(&padding[..rest]);
        frame.push_str("\"}");
        let frame: tokio_tungstenite::tungstenite::Utf8Bytes = frame.into();
        let mut open = Vec::with_capacity(sockets.len());
        for mut socket in sockets.drain(..) {
            if socket.send(Message::Text(frame.clone())).await.is_ok() {
                open.push(socket);
            }
        }
        sockets = open;
    }
}

/// What one client saw: the latency of each measured frame, in microseconds.
struct Seen {
    latencies_us: Vec<u64>,
}

pub async fn run(args: FanoutFloorArgs) -> anyhow::Result<()> {
    let (subscribers, duration) = if args.smoke {
        (50, Duration::from_secs(1))
    } else {
        (args.subscribers, args.duration)
    };
    rlimit::increase_nofile_limit(u64::MAX).context("cannot raise the descriptor limit")?;
    let mut broadcaster = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "fanout-floor-broadcaster",
            "--tick",
            &humantime::format_duration(args.tick).to_string(),
            "--message-bytes",
            &args.message_bytes.to_string(),
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the broadcaster")?;
    let pid = broadcaster
        .id()
        .context("the broadcaster has no pid")?
        .to_string();
    let mut lines =
        tokio::io::BufReader::new(broadcaster.stdout.take().context("no stdout")?).lines();
    let port: u16 = lines
        .next_line()
        .await?
        .context("the broadcaster printed no port")?
        .parse()?;
    let server = SocketAddr::from((Ipv4Addr::LOCALHOST, port));

    let measuring = Arc::new(AtomicBool::new(false));
    let source_octet = 1 + rand::random::<u8>() % 250;
    let mut clients = Vec::with_capacity(subscribers as usize);
    for index in 0..subscribers {
        let source = Ipv4Addr::new(127, source_octet, 0, 1 + (index / SOCKETS_PER_SOURCE) as u8);
        let measuring = measuring.clone();
        clients.push(tokio::spawn(client(server, source, measuring)));
        if index % 256 == 255 {
            tokio::task::yield_now().await;
        }
    }
    eprintln!("connecting {subscribers} clients to the broadcaster ...");
    tokio::time::sleep(
        args.tick * WARM_UP_TICKS + Duration::from_millis(u64::from(subscribers) / 5),
    )
    .await;
    let ticks_per_second = clock_ticks_per_second();
    let (broadcaster_before, tool_before) = (cpu_ticks(&pid)?, cpu_ticks("self")?);
    measuring.store(true, Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::SeqCst);
    let seconds = started.elapsed().as_secs_f64();
    let broadcaster_cpu = (cpu_ticks(&pid)? - broadcaster_before) as f64 / ticks_per_second;
    let tool_cpu = (cpu_ticks("self")? - tool_before) as f64 / ticks_per_second;
    broadcaster.kill().await.ok();

    let mut histogram = Histogram::<u64>::new(3)?;
    let mut failures = 0u32;
    for client in clients {
        match client.await? {
            Ok(seen) => {
                for latency in seen.latencies_us {
                    histogram.record(latency.max(1))?;
                }
            }
            Err(_) => failures += 1,
        }
    }
    if histogram.is_empty() {
        bail!("no client read a measured frame ({failures} failed)");
    }
    let ms = |quantile: f64| histogram.value_at_quantile(quantile) as f64 / 1000.0;
    let messages = histogram.len();
    let per_thousand = |cpu: f64| cpu / messages as f64 * 1_000_000.0;
    if args.json {
        println!(
            "{}",
            json!({
                "scenario": "fanout-floor",
                "subscribers": subscribers,
                "tick_ms": args.tick.as_secs_f64() * 1000.0,
                "message_bytes": args.message_bytes,
                "messages": messages,
                "messages_per_s": messages as f64 / seconds,
                "latency_ms": { "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "max": histogram.max() as f64 / 1000.0 },
                "broadcaster_cpu_ms_per_1k_messages": per_thousand(broadcaster_cpu),
                "broadcaster_cores": broadcaster_cpu / seconds,
                "tool_cpu_ms_per_1k_messages": per_thousand(tool_cpu),
                "client_failures": failures,
                "smoke": args.smoke,
            })
        );
    } else {
        print_table(
            &format!(
                "pulse-bench fanout-floor: {subscribers} sockets, one {}-byte frame each every {:?}",
                args.message_bytes, args.tick
            ),
            &[
                (
                    "frames read",
                    format!(
                        "{} ({:.0}/s)",
                        thousands(messages as f64),
                        messages as f64 / seconds
                    ),
                ),
                (
                    "fan-out start to client",
                    format!(
                        "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                        ms(0.5),
                        ms(0.9),
                        ms(0.99),
                        histogram.max() as f64 / 1000.0
                    ),
                ),
                (
                    "broadcaster CPU",
                    format!(
                        "{:.2} ms per 1,000 frames ({:.2} cores busy)",
                        per_thousand(broadcaster_cpu),
                        broadcaster_cpu / seconds
                    ),
                ),
                (
                    "tool CPU",
                    format!(
                        "{:.2} ms per 1,000 frames ({:.2} cores busy)",
                        per_thousand(tool_cpu),
                        tool_cpu / seconds
                    ),
                ),
                ("client failures", failures.to_string()),
            ],
        );
    }
    if failures > 0 {
        bail!("{failures} of {subscribers} clients failed");
    }
    Ok(())
}

/// One socket: reads frames until the measurement ends, keeping the latency of those that arrive
/// while it runs.
async fn client(
    server: SocketAddr,
    source: Ipv4Addr,
    measuring: Arc<AtomicBool>,
) -> anyhow::Result<Seen> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    socket.set_nodelay(true)?;
    let stream = socket.connect(server).await?;
    let config = WebSocketConfig::default().read_buffer_size(4096);
    let (mut socket, _) = tokio_tungstenite::client_async_with_config(
        format!("ws://{server}/"),
        stream,
        Some(config),
    )
    .await?;
    let mut seen = Seen {
        latencies_us: Vec::new(),
    };
    let mut started = false;
    while let Some(message) = socket.next().await {
        let text = match message {
            Ok(Message::Text(text)) => text,
            Ok(_) => continue,
            // The broadcaster is stopped once the measurement ends.
            Err(_) if started => break,
            Err(err) => return Err(err.into()),
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
        let measured = measuring.load(Ordering::Relaxed);
        if !measured && started {
            break;
        }
        if !measured {
            continue;
        }
        started = true;
        let stamp: u128 = text
            .strip_prefix("{\"t\":")
            .and_then(|rest| rest.split(',').next())
            .and_then(|digits| digits.parse().ok())
            .context("a frame without its stamp")?;
        seen.latencies_us
            .push(u64::try_from(now.saturating_sub(stamp) / 1000).unwrap_or(u64::MAX));
    }
    Ok(seen)
}
