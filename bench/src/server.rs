//! The server under test: a real `pulse serve` child process with its own data dir, SQLite file,
//! Redis prefix and port.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rand::distr::{Alphanumeric, SampleString as _};
use tokio::process::{Child, Command};

/// How long the server may take to answer `/readyz` with 200.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the server may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Server {
    child: Child,
    pid: u32,
    pub addr: SocketAddr,
    pub redis_prefix: String,
    data_dir: PathBuf,
}

/// How to start a server beyond the defaults of [`Server::start`].
#[derive(Default)]
pub struct Launch<'a> {
    /// The SQL database; unset: a fresh SQLite file in the server's own data dir.
    pub database_url: Option<&'a str>,
    /// The Redis key prefix; unset: a fresh one. A second process on the same data passes the
    /// first one's.
    pub redis_prefix: Option<&'a str>,
    /// More environment variables for the process, after the defaults (so they win).
    pub env: &'a [(&'a str, &'a str)],
}

impl Server {
    /// Starts `<bin> serve` on a fresh database and prefix and waits until it is ready.
    pub async fn start(
        bin: &Path,
        redis_url: &str,
        http: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        Self::launch(bin, redis_url, http, Launch::default()).await
    }

    /// Starts `<bin> serve` on the SQL database at `database_url`, a fresh prefix and `env`, and
    /// waits until it is ready: what most scenarios run against.
    pub async fn on_database(
        bin: &Path,
        redis_url: &str,
        http: &reqwest::Client,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let launch = Launch {
            database_url: Some(database_url),
            env,
            ..Launch::default()
        };
        Self::launch(bin, redis_url, http, launch).await
    }

    /// Starts `<bin> serve` as `launch` says and waits until it is ready.
    pub async fn launch(
        bin: &Path,
        redis_url: &str,
        http: &reqwest::Client,
        launch: Launch<'_>,
    ) -> anyhow::Result<Self> {
        if !bin.is_file() {
            bail!(
                "server binary {} not found: build it with `cargo build --release -p pulse` or pass --server-bin",
                bin.display()
            );
        }
        let run = crate::random_hex(12);
        let data_dir = std::env::temp_dir().join(format!("pulse-bench-{run}"));
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let addr = free_loopback_port()?;
        let redis_prefix = launch
            .redis_prefix
            .map_or_else(|| format!("pulse-bench:{run}:"), str::to_owned);
        let database_url = launch
            .database_url
            .map_or_else(|| sqlite_url(&data_dir.join("bench.sqlite")), str::to_owned);
        let token_secret = Alphanumeric.sample_string(&mut rand::rng(), 48);
        let mut command = Command::new(bin);
        command
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .env("REDIS_URL", redis_url)
            .env("PULSE_REDIS_PREFIX", &redis_prefix)
            .env("PULSE_LISTEN", addr.to_string())
            .env("PULSE_TOKEN_SECRET", token_secret)
            .env("PULSE_DATA_DIR", &data_dir)
            // The load presents its viewers through X-Forwarded-For, from loopback.
            .env("PULSE_TRUSTED_PROXIES", "127.0.0.1/32")
            .env("PULSE_AUTH_ATTEMPTS_PER_MINUTE", "0")
            .env("PULSE_VIEW_FLUSH_INTERVAL", "10s")
            .env("RUST_LOG", "warn");
        for (name, value) in launch.env {
            command.env(name, value);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let mut server = Self {
            child,
            pid,
            addr,
            redis_prefix,
            data_dir,
        };
        if let Err(err) = server.wait_ready(http).await {
            server.stop().await.ok();
            return Err(err);
        }
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How the server exited, if it has.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn wait_ready(&mut self, http: &reqwest::Client) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the server exited before it was ready ({status})");
            }
            if let Ok(response) = http.get(self.url("/readyz")).send().await
                && response.status() == reqwest::StatusCode::OK
            {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "the server did not answer /readyz with 200 within {}s",
                    READY_TIMEOUT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM (the server drains and flushes), SIGKILL if it is still running after 10 s; then
    /// removes its data dir.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let result = self.terminate().await;
        std::fs::remove_dir_all(&self.data_dir).ok();
        result
    }

    async fn terminate(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let sent = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        if matches!(sent, Ok(status) if status.success()) {
            match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
                Ok(status) => {
                    status?;
                    return Ok(());
                }
                Err(_) => eprintln!(
                    "warning: the server did not stop within {}s of SIGTERM; killing it",
                    STOP_TIMEOUT.as_secs()
                ),
            }
        }
        self.child.kill().await?;
        Ok(())
    }
}

/// The `DATABASE_URL` of a SQLite file, created if missing.
pub fn sqlite_url(file: &Path) -> String {
    format!("sqlite://{}?mode=rwc", file.display())
}

/// A loopback address with a port that was free a moment ago.
fn free_loopback_port() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?)
}
