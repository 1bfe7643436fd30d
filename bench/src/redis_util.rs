//! Small Redis helpers: INFO fields, deleting a prefix, and where the server is.

use anyhow::{Context as _, bail};
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo};

pub async fn connect(url: &str) -> anyhow::Result<(redis::Client, MultiplexedConnection)> {
    let client = redis::Client::open(url).context("invalid Redis URL")?;
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("cannot connect to Redis at {}", redacted(url)))?;
    Ok((client, conn))
}

/// One numeric field of `INFO <section>`.
pub async fn info_field(
    conn: &mut MultiplexedConnection,
    section: &str,
    field: &str,
) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
        .with_context(|| format!("INFO {section} has no numeric {field}"))
}

/// Redis's own CPU time so far (user + system), in seconds.
pub async fn cpu_seconds(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    Ok(info_field(conn, "cpu", "used_cpu_user").await?
        + info_field(conn, "cpu", "used_cpu_sys").await?)
}

/// Deletes every key that starts with `prefix` (which must hold no glob characters); returns how
/// many there were.
pub async fn delete_prefix(conn: &mut MultiplexedConnection, prefix: &str) -> anyhow::Result<u64> {
    if prefix.is_empty() || prefix.contains(['*', '?', '[', ']', '\\']) {
        bail!("refusing to delete by the prefix {prefix:?}");
    }
    let pattern = format!("{prefix}*");
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys) = scan_page(conn, cursor, &pattern).await?;
        if !keys.is_empty() {
            let removed: u64 = redis::cmd("UNLINK").arg(&keys).query_async(conn).await?;
            deleted += removed;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// Whether any key starts with `prefix` (which must hold no glob characters).
pub async fn prefix_in_use(conn: &mut MultiplexedConnection, prefix: &str) -> anyhow::Result<bool> {
    let pattern = format!("{prefix}*");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys) = scan_page(conn, cursor, &pattern).await?;
        if !keys.is_empty() {
            return Ok(true);
        }
        if next == 0 {
            return Ok(false);
        }
        cursor = next;
    }
}

/// An unused prefix exactly as long as the server's default one (`pulse:`), so that keys measured
/// for memory are as long as production's.
pub async fn fresh_prefix(conn: &mut MultiplexedConnection) -> anyhow::Result<String> {
    let len = pulse::Config::defaults().redis_prefix.len();
    let hex = len.saturating_sub(2).max(4);
    for _ in 0..10 {
        let prefix = format!("b{}:", crate::random_hex(hex));
        if !prefix_in_use(conn, &prefix).await? {
            return Ok(prefix);
        }
    }
    bail!("cannot find an unused key prefix")
}

/// Commands sent in pipelines of [`Batcher::CHUNK`], replies ignored: bulk writes of many
/// thousands of keys without one round trip each.
pub struct Batcher<'a> {
    conn: &'a mut MultiplexedConnection,
    pipe: redis::Pipeline,
    queued: usize,
}

impl<'a> Batcher<'a> {
    const CHUNK: usize = 10_000;

    pub fn new(conn: &'a mut MultiplexedConnection) -> Self {
        Self {
            conn,
            pipe: redis::pipe(),
            queued: 0,
        }
    }

    /// Queues `command`; sends the pipeline when it is full.
    pub async fn push(&mut self, command: redis::Cmd) -> anyhow::Result<()> {
        self.pipe.add_command(command).ignore();
        self.queued += 1;
        if self.queued == Self::CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends what is queued.
    pub async fn flush(&mut self) -> anyhow::Result<()> {
        if self.queued > 0 {
            let () = self.pipe.query_async(self.conn).await?;
            self.pipe.clear();
            self.queued = 0;
        }
        Ok(())
    }
}

/// `INFO memory` `used_memory`, once the connection's buffers have had time to shrink back after
/// bulk writes.
pub async fn settled_used_memory(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    info_field(conn, "memory", "used_memory").await
}

/// The stream of like shard `shard`'s archive job, as the like script appends to it.
pub fn like_archive_stream(keys: &pulse::redis::Keys, shard: u32) -> String {
    let spec = pulse::likes::archive::SPEC;
    keys.job_shard(spec.name, spec.tag, shard).stream()
}

/// The `redis-benchmark` flags that reach the same server as `info`.
pub fn benchmark_target_args(info: &ConnectionInfo) -> anyhow::Result<Vec<String>> {
    let mut args = match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            vec!["-h".into(), host.clone(), "-p".into(), port.to_string()]
        }
        ConnectionAddr::Unix(path) => vec!["-s".into(), path.display().to_string()],
        other => bail!("redis-benchmark ceiling: unsupported Redis address {other:?}"),
    };
    let settings = info.redis_settings();
    if let Some(password) = settings.password() {
        if let Some(user) = settings.username() {
            args.extend(["--user".into(), user.to_owned()]);
        }
        args.extend(["-a".into(), password.to_owned()]);
    }
    if settings.db() != 0 {
        args.extend(["--dbnum".into(), settings.db().to_string()]);
    }
    Ok(args)
}

/// A Redis URL without its password, fit for output.
pub fn redacted(url: &str) -> String {
    pulse::config::redacted_url(url)
}

/// One SCAN step over keys matching `pattern`: the next cursor (0 when done) and a page of keys.
async fn scan_page(
    conn: &mut MultiplexedConnection,
    cursor: u64,
    pattern: &str,
) -> anyhow::Result<(u64, Vec<String>)> {
    Ok(redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(10_000)
        .query_async(conn)
        .await?)
}
