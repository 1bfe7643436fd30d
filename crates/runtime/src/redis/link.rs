//! The one connection type every service uses, whether Redis is a single server or a Redis
//! Cluster, so domain code never branches on the deployment.
//!
//! `REDIS_URL` names a single server as usual (`redis://host:6379/0`) or a cluster by its seed
//! nodes: `redis+cluster://[user:password@]host:port[,host:port…]`. The `redis` crate has no URL
//! form for a seed list, and a scheme of our own keeps the whole setting in one variable.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot};
use redis::{
    Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

const CLUSTER_SCHEME: &str = "redis+cluster://";
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(3);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where Redis is.
#[derive(Clone)]
pub enum Target {
    Single(redis::Client),
    Cluster {
        client: Box<ClusterClient>,
        /// One client per seed node, for the pub/sub hub (see [`Target::pubsub`]).
        seeds: Vec<redis::Client>,
    },
}

impl Target {
    pub fn parse(url: &str) -> RedisResult<Self> {
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return Ok(Self::Single(redis::Client::open(url)?));
        };
        let (credentials, hosts) = match rest.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials), hosts),
            None => (None, rest),
        };
        let seeds: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .filter(|host| !host.is_empty())
            .map(|host| match credentials {
                Some(credentials) => format!("redis://{credentials}@{host}"),
                None => format!("redis://{host}"),
            })
            .collect();
        if seeds.is_empty() {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "a redis+cluster:// URL needs at least one host:port",
            )));
        }
        let clients = seeds
            .iter()
            .map(|seed| redis::Client::open(seed.as_str()))
            .collect::<RedisResult<Vec<_>>>()?;
        let client = ClusterClientBuilder::new(seeds)
            .connection_timeout(CONNECTION_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .retries(3)
            .build()?;
        Ok(Self::Cluster {
            client: Box::new(client),
            seeds: clients,
        })
    }

    /// A multiplexed connection that reconnects by itself (and, on a cluster, follows the slots
    /// as they move), with bounded waits.
    pub async fn connect(&self) -> RedisResult<Link> {
        match self {
            Self::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECTION_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_secs(2));
                Ok(Link::Single(
                    ConnectionManager::new_with_config(client.clone(), config).await?,
                ))
            }
            Self::Cluster { client, .. } => {
                Ok(Link::Cluster(ClusterLink(Arc::new(ClusterShared {
                    current: RwLock::new(client.get_async_connection().await?),
                    client: (**client).clone(),
                    last_replaced: Mutex::new(Instant::now()),
                }))))
            }
        }
    }

    /// Where the realtime hub listens: the one server, or the cluster by its seeds.
    pub fn pubsub(&self) -> PubSubNodes {
        match self {
            Self::Single(client) => PubSubNodes::Single(client.clone()),
            Self::Cluster { seeds, .. } => PubSubNodes::Cluster(seeds.clone()),
        }
    }

    /// The command that publishes on a sharded channel (one named with the hash tag of the keys
    /// whose change it announces): `SPUBLISH` on a cluster, where only the slot's master and its
    /// replicas carry the message instead of every node; `PUBLISH` on one server, where the two
    /// cost the same and a Redis before 7 knows only `PUBLISH`.
    pub fn sharded_publish(&self) -> &'static str {
        match self {
            Self::Single(_) => "PUBLISH",
            Self::Cluster { .. } => "SPUBLISH",
        }
    }
}

/// Where the realtime hub listens (see [`crate::realtime::Hub`]).
pub enum PubSubNodes {
    Single(redis::Client),
    /// Seed nodes: the hub finds each channel's node from them.
    Cluster(Vec<redis::Client>),
}

#[derive(Clone)]
pub enum Link {
    Single(ConnectionManager),
    Cluster(ClusterLink),
}

/// A cluster connection, replaced by a fresh one while it keeps failing. The `redis` crate's
/// cluster connection repairs itself after a failover, but not always: in the failover test it
/// sometimes kept timing out for a minute after the replica had been promoted (requests queued
/// behind repeated reconnects to the initial nodes), while a new connection, which discovers the
/// slots afresh, worked at once.
#[derive(Clone)]
pub struct ClusterLink(Arc<ClusterShared>);

struct ClusterShared {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    last_replaced: Mutex<Instant>,
}

/// How often, at most, a failing cluster connection is replaced.
const REPLACE_EVERY: Duration = Duration::from_secs(2);

impl ClusterLink {
    fn current(&self) -> ClusterConnection {
        self.0.current.read().expect("cluster link lock").clone()
    }

    /// Replaces the connection (in the background) when `result` says the cluster is out of reach
    /// and the last replacement is old enough.
    fn observe<T>(&self, result: &RedisResult<T>) {
        let Err(err) = result else {
            return;
        };
        if !is_unreachable(err) {
            return;
        }
        {
            let mut last = self.0.last_replaced.lock().expect("cluster link lock");
            if last.elapsed() < REPLACE_EVERY {
                return;
            }
            *last = Instant::now();
        }
        let shared = self.0.clone();
        tokio::spawn(async move {
            match shared.client.get_async_connection().await {
                Ok(fresh) => {
                    *shared.current.write().expect("cluster link lock") = fresh;
                    tracing::warn!("Redis Cluster unreachable: replaced the connection");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "Redis Cluster unreachable: no new connection yet")
                }
            }
        });
    }

    async fn run<T>(
        &self,
        request: impl AsyncFnOnce(ClusterConnection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let result = request(self.current()).await;
        self.observe(&result);
        result
    }
}

/// Redis out of reach for now: connections down or timing out, and on a cluster the time between
/// a master's failure and its replica's promotion (no connection to the slot's node, CLUSTERDOWN,
/// TRYAGAIN, a replica not yet writable) or a node still loading its data.
pub fn is_unreachable(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_cluster_error()
        || matches!(
            err.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::BusyLoading
                )
        )
}

impl Link {
    /// The masters' addresses on a cluster (each holds its own keys, so a scan visits them all);
    /// `[None]`, the one server, otherwise.
    pub async fn masters(&mut self) -> RedisResult<Vec<Option<(String, u16)>>> {
        let Self::Cluster(link) = self else {
            return Ok(vec![None]);
        };
        let slots: Value = link
            .run(async |mut conn| {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let mut masters = Vec::new();
        if let Value::Array(ranges) = slots {
            for range in ranges {
                let Value::Array(fields) = range else {
                    continue;
                };
                if let Some(Value::Array(master)) = fields.get(2)
                    && let [host, port, ..] = master.as_slice()
                {
                    let host: String = redis::from_redis_value_ref(host)?;
                    let port: u16 = redis::from_redis_value_ref(port)?;
                    if !masters.contains(&Some((host.clone(), port))) {
                        masters.push(Some((host, port)));
                    }
                }
            }
        }
        Ok(masters)
    }

    /// Every key matching `pattern`, a `SCAN` step at a time (on every master of a cluster).
    pub fn scan(&self, pattern: impl Into<String>) -> KeyScan {
        KeyScan {
            link: self.clone(),
            pattern: pattern.into(),
            nodes: None,
            cursor: 0,
        }
    }

    /// `cmd` on one node of [`Link::masters`].
    pub async fn on_node(&mut self, node: &Option<(String, u16)>, cmd: Cmd) -> RedisResult<Value> {
        match (self, node) {
            (Self::Cluster(link), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                link.run(async |mut conn| conn.route_command(cmd, routing).await)
                    .await
            }
            (link, _) => link.req_packed_command(&cmd).await,
        }
    }
}

/// Keys to read through a [`Link::scan`]; like `SCAN` itself, a key may come twice, and keys
/// written during the scan may or may not come.
pub struct KeyScan {
    link: Link,
    pattern: String,
    /// Nodes still to scan, the current one last; filled by the first step.
    nodes: Option<Vec<Option<(String, u16)>>>,
    cursor: u64,
}

/// Keys one `SCAN` step asks a node to look at.
const SCAN_COUNT: usize = 1000;

impl KeyScan {
    /// The next batch of keys (possibly empty), or `None` once every node has been scanned.
    pub async fn next_batch(&mut self) -> redis::RedisResult<Option<Vec<String>>> {
        if self.nodes.is_none() {
            let mut nodes = self.link.masters().await?;
            nodes.reverse();
            self.nodes = Some(nodes);
        }
        let nodes = self.nodes.as_mut().expect("filled above");
        let Some(node) = nodes.last() else {
            return Ok(None);
        };
        let mut step = redis::cmd("SCAN");
        step.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let reply = self.link.on_node(node, step).await?;
        let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
        self.cursor = next;
        if next == 0 {
            nodes.pop();
        }
        Ok(Some(keys))
    }

    /// Every key left, collected.
    pub async fn collect(mut self) -> redis::RedisResult<Vec<String>> {
        let mut all = Vec::new();
        while let Some(keys) = self.next_batch().await? {
            all.extend(keys);
        }
        Ok(all)
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if let Err(err) = script_keys_share_a_slot(cmd) {
            return Box::pin(async move { Err(err) });
        }
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(link) => {
                let link = link.clone();
                Box::pin(async move {
                    link.run(async |mut conn| conn.req_packed_command(cmd).await)
                        .await
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if let Err(err) = pipeline.cmd_iter().try_for_each(script_keys_share_a_slot) {
            return Box::pin(async move { Err(err) });
        }
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(link) => {
                let link = link.clone();
                Box::pin(async move {
                    link.run(async |mut conn| {
                        // A transaction must stay in one slot, and the cluster connection says
                        // so if not.
                        if pipeline.is_transaction() {
                            conn.req_packed_commands(pipeline, offset, count).await
                        } else {
                            let replies = across_slots(conn, pipeline).await?;
                            Ok(replies.into_iter().skip(offset).take(count).collect())
                        }
                    })
                    .await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(_) => 0,
        }
    }
}

/// A pipeline that spans slots (shards' rankings, many users' keys) on a cluster. Each slot's
/// commands go as one pipeline to their node, in their order (a later command may read what an
/// earlier one wrote), all slots at once. A command with no single slot (no key, keys in several
/// slots) goes alone, once everything before it has answered and before anything after it is
/// sent, so the pipeline's order holds for it too; the cluster connection routes it (and splits a
/// multi-key command by slot) as when sent alone.
async fn across_slots(conn: ClusterConnection, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
    let commands: Vec<&Cmd> = pipeline.cmd_iter().collect();
    let mut replies: Vec<Option<Value>> = vec![None; commands.len()];
    let mut start = 0;
    while start < commands.len() {
        let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
        let mut end = start;
        while end < commands.len() {
            let Some(slot) = slot_of(commands[end]) else {
                break;
            };
            match groups.iter_mut().find(|(group, _)| *group == slot) {
                Some((_, members)) => members.push(end),
                None => groups.push((slot, vec![end])),
            }
            end += 1;
        }
        let sent = groups.into_iter().map(|(_, members)| {
            let mut conn = conn.clone();
            let mut group = redis::pipe();
            for &index in &members {
                group.add_command(commands[index].clone());
            }
            async move {
                let values = conn.req_packed_commands(&group, 0, members.len()).await?;
                RedisResult::Ok(members.into_iter().zip(values))
            }
        });
        for (index, value) in try_join_all(sent).await?.into_iter().flatten() {
            replies[index] = Some(value);
        }
        if end < commands.len() {
            let mut conn = conn.clone();
            replies[end] = Some(conn.req_packed_command(commands[end]).await?);
            end += 1;
        }
        start = end;
    }
    replies
        .into_iter()
        .map(|reply| {
            reply.ok_or_else(|| {
                RedisError::from((ErrorKind::Client, "a pipeline reply went missing"))
            })
        })
        .collect()
}

/// The one slot `cmd` touches, when it is sure: the first key of a script call, every key of the
/// multi-key commands when they agree, else the first argument (where Redis puts the key of
/// nearly every command). `None` for the commands with no key, keys elsewhere, or keys in several
/// slots.
fn slot_of(cmd: &Cmd) -> Option<Slot> {
    let args = arguments(cmd);
    let (name, rest) = args.split_first()?;
    let upper = name.to_ascii_uppercase();
    let is = |names: &[&str]| {
        names
            .iter()
            .any(|known| known.as_bytes() == upper.as_slice())
    };
    let keys: &[&[u8]] = if let Some(keys) = script_keys(name, rest) {
        keys
    } else if is(&[
        "DEL", "UNLINK", "EXISTS", "MGET", "TOUCH", "PFCOUNT", "RENAME", "RENAMENX",
    ]) {
        rest
    } else if is(&[
        "PING",
        "PUBLISH",
        "SCRIPT",
        "INFO",
        "CONFIG",
        "CLUSTER",
        "TIME",
        "ECHO",
        "CLIENT",
        "COMMAND",
        "MEMORY",
        "DBSIZE",
        "FLUSHDB",
        "FLUSHALL",
        "SCAN",
        "KEYS",
        "XREAD",
        "XREADGROUP",
        "WAIT",
        "MULTI",
        "EXEC",
    ]) {
        return None;
    } else {
        rest.get(..1)?
    };
    let (first, others) = keys.split_first()?;
    let slot = Slot::for_key(first);
    others
        .iter()
        .all(|key| Slot::for_key(key) == slot)
        .then_some(slot)
}

/// The simple arguments of `cmd`, its name first.
fn arguments(cmd: &Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .filter_map(|arg| match arg {
            Arg::Simple(arg) => Some(arg),
            _ => None,
        })
        .collect()
}

/// The declared keys of a script call (`EVAL`, `EVALSHA` and their read-only forms), given the
/// arguments after its name; `None` for any other command.
fn script_keys<'a>(name: &[u8], rest: &'a [&'a [u8]]) -> Option<&'a [&'a [u8]]> {
    let is_script = [b"EVALSHA".as_slice(), b"EVAL", b"EVALSHA_RO", b"EVAL_RO"]
        .iter()
        .any(|script| name.eq_ignore_ascii_case(script));
    if !is_script {
        return None;
    }
    let count: usize = std::str::from_utf8(rest.get(1)?).ok()?.parse().ok()?;
    rest.get(2..2 + count)
}

/// Refuses a script call whose keys lie in more than one hash slot. A cluster refuses such a
/// call too, but only when the keys happen to sit on different nodes; checking every call, on a
/// single server as well, makes each test that runs a script a check that it keeps the rule.
fn script_keys_share_a_slot(cmd: &Cmd) -> RedisResult<()> {
    let args = arguments(cmd);
    let Some((name, rest)) = args.split_first() else {
        return Ok(());
    };
    let Some((first, others)) = script_keys(name, rest).and_then(<[_]>::split_first) else {
        return Ok(());
    };
    let slot = Slot::for_key(first);
    match others.iter().find(|key| Slot::for_key(key) != slot) {
        None => Ok(()),
        Some(stray) => Err(RedisError::from((
            ErrorKind::Client,
            "CROSSSLOT: a script's keys must share one hash slot",
            format!(
                "{} and {} hash to different slots",
                String::from_utf8_lossy(first),
                String::from_utf8_lossy(stray)
            ),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script_call(keys: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("0123456789abcdef0123456789abcdef01234567")
            .arg(keys.len())
            .arg(keys)
            .arg("argument {other}");
        cmd
    }

    #[test]
    fn script_keys_under_one_hash_tag_pass_and_keys_across_two_slots_are_refused() {
        assert!(script_keys_share_a_slot(&script_call(&["p:{v:1}:a", "p:{v:1}:b"])).is_ok());
        // Arguments are not keys: only the declared keys count.
        assert!(script_keys_share_a_slot(&script_call(&["p:{v:1}:a"])).is_ok());
        let refused = script_keys_share_a_slot(&script_call(&["p:{v:1}:a", "p:{v:2}:b"]))
            .expect_err("keys of two tags span two slots");
        assert!(refused.to_string().contains("p:{v:2}:b"), "{refused}");
        // Other commands are left to the cluster connection's own routing.
        assert!(script_keys_share_a_slot(redis::cmd("MGET").arg("a").arg("b")).is_ok());
    }

    #[test]
    fn a_command_has_one_slot_only_when_all_its_keys_agree() {
        let tagged = Slot::for_key("{t}");
        assert_eq!(
            slot_of(redis::cmd("ZADD").arg("x:{t}").arg(1).arg("m")),
            Some(tagged)
        );
        assert_eq!(slot_of(&script_call(&["a{t}", "b{t}"])), Some(tagged));
        assert_eq!(
            slot_of(redis::cmd("DEL").arg("a{t}").arg("b{t}")),
            Some(tagged)
        );
        assert_eq!(slot_of(redis::cmd("DEL").arg("a{t}").arg("b{u}")), None);
        assert_eq!(slot_of(redis::cmd("PUBLISH").arg("x{t}").arg("m")), None);
        assert_eq!(slot_of(&script_call(&[])), None);
    }

    #[test]
    fn cluster_urls_name_their_seeds_and_others_are_single_servers() {
        let target = Target::parse("redis+cluster://u:secret@127.0.0.1:7000,127.0.0.1:7001/")
            .expect("a seed list parses");
        let Target::Cluster { seeds, .. } = &target else {
            panic!("a redis+cluster:// URL is a cluster");
        };
        let addresses: Vec<String> = seeds
            .iter()
            .map(|seed| seed.get_connection_info().addr().to_string())
            .collect();
        assert_eq!(addresses, ["127.0.0.1:7000", "127.0.0.1:7001"]);
        assert!(matches!(
            Target::parse("redis://127.0.0.1:6379/2"),
            Ok(Target::Single(_))
        ));
        assert!(Target::parse("redis+cluster://").is_err());
    }
}
