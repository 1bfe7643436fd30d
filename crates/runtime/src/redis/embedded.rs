//! Finding a Redis when none is configured: the Redis at the probe address if one answers there,
//! else the private `redis-server` of the data dir.
//!
//! A data dir has at most one private server, shared by every `pulse` process on that dir (`serve`,
//! a second `serve`, `seed-demo`, `rebuild`, `admin`): two servers on one append-only file would be
//! two writers of it, and a command would change a Redis the server does not read. In `<data dir>/redis`:
//! - `address` names the running server (its URL and run id), written atomically by the process that
//!   started it. It is believed only if a server answers there and reports this directory as its
//!   `dir` and the recorded run id, so a file left by a crash never blocks a start.
//! - `start.lock`, held exclusively, serialises "find or start" and "leave and maybe stop".
//! - `users.lock` is held shared by every process using the server, for as long as it uses it.
//!
//! The server runs in its own process group, not tied to the process that started it (Ctrl-C on
//! `serve` in a terminal reaches only `serve`). Whoever leaves last, i.e. takes `users.lock`
//! exclusively once its own share is gone, asks it to save and exit, so `seed-demo` run beside `serve`
//! leaves it to `serve`, and `serve`'s shutdown stops it. Locks die with their process: a server whose
//! users all crashed keeps running and is found and adopted by the next process on the dir.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::Command;

/// The private `redis-server` of a data dir, used by this process until `stop`.
pub struct PrivateRedis {
    url: String,
    dir: PathBuf,
    /// This process's share of `users.lock`; dropping it (at exit, even a crash) ends the share.
    users: File,
}

impl PrivateRedis {
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's data directory, absolute.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops using the server; the last process using it asks it to save and exit, and waits.
    pub async fn stop(self) {
        let Self { url, dir, users } = self;
        let leave = tokio::task::spawn_blocking(move || -> anyhow::Result<(File, bool)> {
            let start = lock_exclusive(&dir.join(START_LOCK))?;
            drop(users);
            let last = open_lock_file(&dir.join(USERS_LOCK))?.try_lock().is_ok();
            if last {
                // Nobody may adopt a server that is about to exit.
                let _ = std::fs::remove_file(dir.join(ADDRESS_FILE));
            }
            Ok((start, last))
        })
        .await;
        let (start, last) = match leave.map_err(anyhow::Error::from).and_then(|left| left) {
            Ok(left) => left,
            Err(err) => {
                tracing::warn!(error = %err, "cannot leave the private redis-server; it keeps running");
                return;
            }
        };
        if last {
            shut_down(&url).await;
        } else {
            tracing::info!(url = %url, "the private redis-server stays up for the other pulse processes of the data dir");
        }
        // Held until the server is gone, so that no process attaches to it while it stops.
        drop(start);
    }
}

/// Where Redis is for this process: the configured URL, the one at the probe address, or private.
pub enum RedisLocation {
    Configured(String),
    LocalDefault(String),
    Private(PrivateRedis),
}

impl RedisLocation {
    pub fn url(&self) -> &str {
        match self {
            Self::Configured(url) | Self::LocalDefault(url) => url,
            Self::Private(private) => private.url(),
        }
    }
}

pub async fn locate(
    configured: Option<&str>,
    probe: SocketAddr,
    server_binary: &Path,
    data_dir: &Path,
) -> anyhow::Result<RedisLocation> {
    if let Some(url) = configured {
        return Ok(RedisLocation::Configured(url.to_owned()));
    }
    if answers_ping(probe).await {
        tracing::info!(address = %probe, "using the local Redis");
        return Ok(RedisLocation::LocalDefault(format!("redis://{probe}")));
    }
    let private = find_or_start(server_binary, &data_dir.join("redis")).await?;
    Ok(RedisLocation::Private(private))
}

const ADDRESS_FILE: &str = "address";
const START_LOCK: &str = "start.lock";
const USERS_LOCK: &str = "users.lock";

/// The private `redis-server` whose data is in `dir`: the running one if there is one, else a new one
/// on a free loopback port, started and waited for.
pub async fn find_or_start(server_binary: &Path, dir: &Path) -> anyhow::Result<PrivateRedis> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the Redis data directory {}", dir.display()))?;
    let dir = std::fs::canonicalize(dir)?;
    let start = {
        let path = dir.join(START_LOCK);
        tokio::task::spawn_blocking(move || lock_exclusive(&path)).await??
    };
    // Only a process holding `start.lock` takes `users.lock` exclusively, so this never waits.
    let users = open_lock_file(&dir.join(USERS_LOCK))?;
    users
        .try_lock_shared()
        .context("cannot share the private redis-server's users.lock")?;
    let url = match running_server(&dir).await {
        Some(url) => {
            tracing::info!(url = %url, dir = %dir.display(), "using the data dir's running private redis-server");
            url
        }
        None => start_server(server_binary, &dir).await?,
    };
    drop(start);
    Ok(PrivateRedis { url, dir, users })
}

/// The URL in the address file, if the server there is this dir's and answers.
async fn running_server(dir: &Path) -> Option<String> {
    let recorded = std::fs::read_to_string(dir.join(ADDRESS_FILE)).ok()?;
    let (url, run_id) = recorded.trim().split_once('\n')?;
    let check = async {
        let client = redis::Client::open(url).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let (_, served_dir): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("dir")
            .query_async(&mut conn)
            .await
            .ok()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok()?;
        let served_run_id = info.lines().find_map(|line| line.strip_prefix("run_id:"))?;
        (Path::new(&served_dir) == dir && served_run_id.trim() == run_id.trim()).then_some(())
    };
    match tokio::time::timeout(Duration::from_millis(500), check).await {
        Ok(Some(())) => Some(url.to_owned()),
        _ => {
            tracing::info!(dir = %dir.display(), "the recorded private redis-server is gone");
            None
        }
    }
}

async fn start_server(server_binary: &Path, dir: &Path) -> anyhow::Result<String> {
    let port = free_port()?;
    // Not this process's stderr: the server outlives it, and would hold a pipe read by whoever
    // started this process open until the server exits.
    let early_errors = File::options()
        .create(true)
        .append(true)
        .open(dir.join("redis.log"))
        .context("cannot open redis.log")?;
    let child = Command::new(server_binary)
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .arg("--dir")
        .arg(dir)
        // Append-only with fsync every second: losing the process loses at most a second of writes.
        .args(["--appendonly", "yes", "--appendfsync", "everysec"])
        .args(["--save", "300 1"])
        .args(["--daemonize", "no", "--logfile", "redis.log"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(early_errors)
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!(
            "no Redis is configured, nothing answers at the probe address (PULSE_REDIS_PROBE), and `{}` was not found.\n\
             Either install Redis (Debian/Ubuntu: `apt-get install redis-server`; macOS: `brew install redis`),\n\
             point PULSE_REDIS_SERVER at a redis-server binary, or set REDIS_URL (e.g. redis://127.0.0.1:6379).",
            server_binary.display()
        ),
        Err(err) => return Err(err).context("cannot start redis-server"),
    };
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if let Some(run_id) = run_id(&url).await {
            record_address(dir, &url, &run_id)?;
            tracing::info!(url = %url, dir = %dir.display(), "started a private redis-server");
            // Dropping the handle neither kills nor orphans it as a zombie: tokio reaps it on exit.
            return Ok(url);
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "redis-server exited at start-up ({status}); see {}",
                dir.join("redis.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill().await;
    bail!(
        "redis-server did not answer within 5 s; see {}",
        dir.join("redis.log").display()
    )
}

/// Written to a temporary file and renamed, so a reader never sees half an address.
fn record_address(dir: &Path, url: &str, run_id: &str) -> anyhow::Result<()> {
    let temporary = dir.join(format!("{ADDRESS_FILE}.tmp"));
    std::fs::write(&temporary, format!("{url}\n{run_id}\n"))?;
    std::fs::rename(&temporary, dir.join(ADDRESS_FILE))
        .context("cannot record the private redis-server's address")
}

async fn run_id(url: &str) -> Option<String> {
    let query = async {
        let client = redis::Client::open(url).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_millis(500), query)
        .await
        .ok()
        .flatten()
}

/// Asks the server to save and exit, and waits until its port is closed.
async fn shut_down(url: &str) {
    if let Ok(client) = redis::Client::open(url)
        && let Ok(mut conn) = client.get_multiplexed_async_connection().await
    {
        // The server closes the connection instead of replying, so the error is expected.
        let _ = redis::cmd("SHUTDOWN")
            .arg("SAVE")
            .query_async::<()>(&mut conn)
            .await;
    }
    let address = url.trim_start_matches("redis://");
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(address).await.is_err() {
            tracing::info!(url = %url, "stopped the private redis-server");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(url = %url, "the private redis-server did not stop within 10 s");
}

async fn answers_ping(address: SocketAddr) -> bool {
    let probe = async {
        let client = redis::Client::open(format!("redis://{address}")).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), probe).await,
        Ok(Some(_))
    )
}

fn open_lock_file(path: &Path) -> anyhow::Result<File> {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

fn lock_exclusive(path: &Path) -> anyhow::Result<File> {
    let file = open_lock_file(path)?;
    file.lock()
        .with_context(|| format!("cannot lock {}", path.display()))?;
    Ok(file)
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}
