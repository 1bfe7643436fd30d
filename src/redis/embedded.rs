//! Finding a Redis when none is configured: the local default port if something answers there, else
//! a private `redis-server` child on a free port, its data kept under the data dir and stopped with
//! the process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

const DEFAULT_LOCAL_REDIS: &str = "127.0.0.1:6379";

/// A `redis-server` this process started and owns.
pub struct PrivateRedis {
    child: Child,
    url: String,
}

impl PrivateRedis {
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Asks the server to save and exit, then waits for it; kills it if it does not stop in time.
    pub async fn stop(mut self) {
        if let Ok(client) = redis::Client::open(self.url.as_str())
            && let Ok(mut conn) = client.get_multiplexed_async_connection().await
        {
            // The server closes the connection instead of replying, so the error is expected.
            let _ = redis::cmd("SHUTDOWN")
                .arg("SAVE")
                .query_async::<()>(&mut conn)
                .await;
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!("private redis-server did not stop in time; killing it");
            let _ = self.child.kill().await;
        }
    }
}

/// Where Redis is for this process: the configured URL, the local default, or a private child.
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
    server_binary: &Path,
    data_dir: &Path,
) -> anyhow::Result<RedisLocation> {
    if let Some(url) = configured {
        return Ok(RedisLocation::Configured(url.to_owned()));
    }
    let local: SocketAddr = DEFAULT_LOCAL_REDIS.parse().expect("a valid socket address");
    if answers_ping(local).await {
        tracing::info!(address = %local, "using the local Redis");
        return Ok(RedisLocation::LocalDefault(format!("redis://{local}")));
    }
    let private = start_private(server_binary, &data_dir.join("redis")).await?;
    Ok(RedisLocation::Private(private))
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

/// Starts `redis-server` on a free loopback port with its data in `dir`, and waits until it answers.
pub async fn start_private(server_binary: &Path, dir: &Path) -> anyhow::Result<PrivateRedis> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the Redis data directory {}", dir.display()))?;
    let port = free_port()?;
    let child = Command::new(server_binary)
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .arg("--dir")
        .arg(absolute(dir)?)
        // Append-only with fsync every second: losing the process loses at most a second of writes.
        .args(["--appendonly", "yes", "--appendfsync", "everysec"])
        .args(["--save", "300 1"])
        .args(["--daemonize", "no", "--logfile", "redis.log"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!(
            "no Redis is configured, nothing answers on {DEFAULT_LOCAL_REDIS}, and `{}` was not found.\n\
             Either install Redis (Debian/Ubuntu: `apt-get install redis-server`; macOS: `brew install redis`),\n\
             point PULSE_REDIS_SERVER at a redis-server binary, or set REDIS_URL (e.g. redis://127.0.0.1:6379).",
            server_binary.display()
        ),
        Err(err) => return Err(err).context("cannot start redis-server"),
    };
    let url = format!("redis://127.0.0.1:{port}");
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut private = PrivateRedis { child, url };
    for _ in 0..100 {
        if answers_ping(address).await {
            tracing::info!(url = %private.url, dir = %dir.display(), "started a private redis-server");
            return Ok(private);
        }
        if let Some(status) = private.child.try_wait()? {
            bail!(
                "redis-server exited at start-up ({status}); see {}",
                dir.join("redis.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = private.child.kill().await;
    bail!(
        "redis-server did not answer within 5 s; see {}",
        dir.join("redis.log").display()
    )
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

fn absolute(dir: &Path) -> anyhow::Result<PathBuf> {
    Ok(std::fs::canonicalize(dir)?)
}
