//! Small Redis helpers: INFO fields, deleting a prefix, and where the server is. The same helpers
//! serve a single server and a Redis Cluster (`redis+cluster://host:port,…`): what must see every
//! key or every server (scans, INFO) visits each master in turn, as [`Link::masters`] lists them.

use anyhow::{Context as _, bail};
use pulse::redis::{Link, Target};
use redis::ConnectionAddr;

/// One server to send a command to: a cluster's master, or `None` for the single server (the
/// items of [`Link::masters`]).
pub type Node = Option<(String, u16)>;

/// Where Redis is and one connection to it (to a single server or to a cluster).
pub async fn connect(url: &str) -> anyhow::Result<(Target, Link)> {
    let target = Target::parse(url).context("invalid Redis URL")?;
    let conn = target
        .connect()
        .await
        .with_context(|| format!("cannot connect to Redis at {}", redacted(url)))?;
    Ok((target, conn))
}

/// Whether `url` names a Redis Cluster (`redis+cluster://…`) rather than a single server.
pub fn is_cluster(url: &str) -> anyhow::Result<bool> {
    let target = Target::parse(url).context("invalid Redis URL")?;
    Ok(matches!(target, Target::Cluster { .. }))
}

/// Fails with a clear message when `url` names a Redis Cluster: for the scenarios that can only
/// measure a single server. `why` says what needs one.
pub fn require_single_server(url: &str, scenario: &str, why: &str) -> anyhow::Result<()> {
    if is_cluster(url)? {
        bail!(
            "{scenario} needs a single Redis server, not a cluster ({}): {why}. \
             Pass --redis-url redis://host:port; record-view runs on a cluster (without its \
             redis-benchmark ceiling)",
            redacted(url)
        );
    }
    Ok(())
}

/// A connection for a scenario that measures Redis's memory, which only a single server gives.
pub async fn connect_for_memory(url: &str, scenario: &str) -> anyhow::Result<Link> {
    require_single_server(
        url,
        scenario,
        "bytes per item come from one server's used_memory, and the sum over a cluster's \
         masters also moves with replication and their other traffic",
    )?;
    Ok(connect(url).await?.1)
}

/// Where `node` is, for messages: `host:port`, or `Redis` for the single server.
pub fn node_name(node: &Node) -> String {
    match node {
        Some((host, port)) => format!("{host}:{port}"),
        None => "Redis".into(),
    }
}

/// Numeric fields of `INFO <section>` of one server, in the order of `fields`.
pub async fn info_fields<const N: usize>(
    conn: &mut Link,
    node: &Node,
    section: &str,
    fields: [&str; N],
) -> anyhow::Result<[f64; N]> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    let reply = conn
        .on_node(node, cmd)
        .await
        .with_context(|| format!("INFO {section} of {}", node_name(node)))?;
    let info: String = redis::from_redis_value(reply)?;
    let mut values = [0.0; N];
    for (value, field) in values.iter_mut().zip(fields) {
        *value = info
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse().ok())
            .with_context(|| {
                format!(
                    "INFO {section} of {} has no numeric {field}",
                    node_name(node)
                )
            })?;
    }
    Ok(values)
}

/// One numeric field of `INFO <section>`, summed over every master of a cluster (the one server's
/// own otherwise).
pub async fn info_field(conn: &mut Link, section: &str, field: &str) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for node in conn.masters().await? {
        let [value] = info_fields(conn, &node, section, [field]).await?;
        sum += value;
    }
    Ok(sum)
}

/// Redis's own CPU time so far (user + system), in seconds: the sum over every master of a
/// cluster (replicas left out).
pub async fn cpu_seconds(conn: &mut Link) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for node in conn.masters().await? {
        let [user, sys] =
            info_fields(conn, &node, "cpu", ["used_cpu_user", "used_cpu_sys"]).await?;
        sum += user + sys;
    }
    Ok(sum)
}

/// Deletes every key that starts with `prefix` (which must hold no glob characters), on every
/// master of a cluster; returns how many there were.
pub async fn delete_prefix(conn: &mut Link, prefix: &str) -> anyhow::Result<u64> {
    if prefix.is_empty() || prefix.contains(['*', '?', '[', ']', '\\']) {
        bail!("refusing to delete by the prefix {prefix:?}");
    }
    let mut deleted = 0;
    let mut scan = conn.scan(format!("{prefix}*"));
    while let Some(keys) = scan.next_batch().await? {
        if !keys.is_empty() {
            // On a cluster the connection splits a multi-key command by slot.
            let removed: u64 = redis::cmd("UNLINK").arg(&keys).query_async(conn).await?;
            deleted += removed;
        }
    }
    Ok(deleted)
}

/// Whether any key starts with `prefix` (which must hold no glob characters), on any master of a
/// cluster.
pub async fn prefix_in_use(conn: &mut Link, prefix: &str) -> anyhow::Result<bool> {
    let mut scan = conn.scan(format!("{prefix}*"));
    while let Some(keys) = scan.next_batch().await? {
        if !keys.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// An unused prefix exactly as long as the server's default one (`pulse:`), so that keys measured
/// for memory are as long as production's.
pub async fn fresh_prefix(conn: &mut Link) -> anyhow::Result<String> {
    let len = pulse::ownership::DEFAULT_PREFIX.len();
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
    conn: &'a mut Link,
    pipe: redis::Pipeline,
    queued: usize,
}

impl<'a> Batcher<'a> {
    const CHUNK: usize = 10_000;

    pub fn new(conn: &'a mut Link) -> Self {
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
pub async fn settled_used_memory(conn: &mut Link) -> anyhow::Result<f64> {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    info_field(conn, "memory", "used_memory").await
}

/// The stream of like shard `shard`'s archive job, as the like script appends to it.
pub fn like_archive_stream(keys: &pulse::redis::Keys, shard: u32) -> String {
    let spec = pulse::likes::archive::SPEC;
    keys.job_shard(spec.name, spec.tag, shard).stream()
}

/// The `redis-benchmark` flags that reach the server `target` names. redis-benchmark sends every
/// call to one server, so a cluster is refused (its keys live on several masters).
pub fn benchmark_target_args(target: &Target) -> anyhow::Result<Vec<String>> {
    let info = match target {
        Target::Single(client) => client.get_connection_info(),
        Target::Cluster { .. } => bail!(
            "redis-benchmark ceiling: the Redis URL names a cluster; redis-benchmark needs a \
             single server"
        ),
    };
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
