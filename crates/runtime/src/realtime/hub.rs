//! One pub/sub connection per process, however many GraphQL subscriptions are open.
//!
//! Channels are reference-counted by local subscribers: the first subscriber of a channel makes the
//! connection SUBSCRIBE, the last one to leave makes it UNSUBSCRIBE. Messages fan out to local
//! subscribers through a tokio broadcast channel. When the connection drops, it is re-established
//! with backoff and every channel still wanted is subscribed again.
//!
//! On a Redis Cluster, a channel is [`Sharding::Broadcast`] (published with `PUBLISH`, which the
//! cluster copies to every node, so any node hears it) or [`Sharding::Sharded`] (named with the
//! hash tag of the keys whose change it announces and published with `SPUBLISH` in their slot:
//! only that slot's master and replicas carry it, so the cost of a message does not grow with the
//! nodes). The hub then uses one RESP3 cluster connection, which holds a connection to each node
//! it needs, sends each `SSUBSCRIBE` to the master of the channel's slot and subscribes again by
//! itself after a node comes back or a failover moves the slot. On one server both kinds are
//! published with `PUBLISH` and heard through one `SUBSCRIBE` connection.
//!
//! Each channel counts the times Redis confirmed its subscription (its generation): a subscriber
//! that keeps state derived from Redis (a coalescing watcher) reads it again after each
//! confirmation, since whatever was published while the connection was down is gone.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use redis::cluster::ClusterClientBuilder;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::redis::PubSubNodes;

/// Messages a slow subscriber may fall behind by before it skips ahead (and is told so in the logs).
const SUBSCRIBER_BUFFER: usize = 256;
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);

pub type Payload = Arc<[u8]>;

#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    channels: Mutex<HashMap<String, ChannelState>>,
    commands: mpsc::UnboundedSender<Command>,
}

struct ChannelState {
    sender: broadcast::Sender<Payload>,
    subscribers: usize,
    /// Bumped each time Redis confirms the channel's subscription (first, and after a reconnect).
    confirmed: watch::Sender<u64>,
    sharding: Sharding,
}

enum Command {
    Subscribe(String, Sharding),
    Unsubscribe(String, Sharding),
}

/// How a channel is published, so how it is subscribed to on a cluster.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sharding {
    /// `PUBLISH`: a cluster copies the message to every node, so any node hears it.
    Broadcast,
    /// Published with [`crate::redis::Target::sharded_publish`] (`SPUBLISH` on a cluster) on a
    /// channel named with its keys' hash tag: heard only at the master of that slot.
    Sharded,
}

impl Hub {
    /// Starts the connection task; it stops when `shutdown` is cancelled.
    pub fn start(nodes: PubSubNodes, shutdown: CancellationToken, tasks: &TaskTracker) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            channels: Mutex::new(HashMap::new()),
            commands,
        });
        let hub = Arc::downgrade(&inner);
        match nodes {
            PubSubNodes::Single(client) => {
                tasks.spawn(run_connection(vec![client], hub, receiver, shutdown));
            }
            PubSubNodes::Cluster(seeds) => {
                tasks.spawn(run_cluster(seeds, hub, receiver, shutdown));
            }
        }
        Self { inner }
    }

    /// A hub with no connection, for a process that builds services but serves no subscription
    /// (the one-shot commands): its subscriptions never yield.
    pub fn unconnected() -> Self {
        let (commands, _) = mpsc::unbounded_channel();
        Self {
            inner: Arc::new(Inner {
                channels: Mutex::new(HashMap::new()),
                commands,
            }),
        }
    }

    /// Messages published with `PUBLISH` on `channel` from now on, until the returned stream is
    /// dropped.
    pub fn subscribe(&self, channel: String) -> HubSubscription {
        self.subscribe_as(channel, Sharding::Broadcast)
    }

    /// Messages published on `channel` as `sharding` says, from now on, until the returned stream
    /// is dropped.
    pub fn subscribe_as(&self, channel: String, sharding: Sharding) -> HubSubscription {
        self.subscribe_buffered(channel, sharding, SUBSCRIBER_BUFFER)
    }

    /// As [`Self::subscribe_as`], on a channel whose subscribers each fall at most `buffer`
    /// messages behind before they skip ahead, when this is its first local subscriber (the
    /// channel keeps the buffer it was made with). A channel's buffer is allocated whole when it
    /// is made, 40 bytes a message: a channel of one subscriber's own, which carries few messages
    /// and whose reader catches up from a history when it skips, wants a small one.
    pub fn subscribe_buffered(
        &self,
        channel: String,
        sharding: Sharding,
        buffer: usize,
    ) -> HubSubscription {
        let mut channels = self.inner.channels.lock().expect("hub lock poisoned");
        let state = channels.entry(channel.clone()).or_insert_with(|| {
            metrics::gauge!("pulse_live_channels").increment(1);
            ChannelState {
                sender: broadcast::channel(buffer).0,
                subscribers: 0,
                confirmed: watch::channel(0).0,
                sharding,
            }
        });
        state.subscribers += 1;
        metrics::gauge!("pulse_live_hub_subscriptions").increment(1);
        let receiver = state.sender.subscribe();
        let confirmations = state.confirmed.subscribe();
        if state.subscribers == 1 {
            // Sent under the lock, so the connection task sees subscribe/unsubscribe in the order the
            // reference counts changed.
            let _ = self
                .inner
                .commands
                .send(Command::Subscribe(channel.clone(), sharding));
        }
        HubSubscription {
            messages: BroadcastStream::new(receiver),
            confirmations,
            _membership: Membership {
                inner: self.inner.clone(),
                channel,
                sharding,
            },
        }
    }

    /// How many local subscribers `channel` has (for tests and metrics).
    pub fn local_subscribers(&self, channel: &str) -> usize {
        let channels = self.inner.channels.lock().expect("hub lock poisoned");
        channels.get(channel).map_or(0, |state| state.subscribers)
    }
}

/// A stream of one channel's payloads. Dropping it releases the channel.
pub struct HubSubscription {
    messages: BroadcastStream<Payload>,
    confirmations: watch::Receiver<u64>,
    _membership: Membership,
}

impl HubSubscription {
    /// How many times Redis has confirmed the channel's subscription so far: 0 until the first
    /// confirmation, then one more after each reconnect. Messages are heard only once it is
    /// above 0, and those published between a loss and the next confirmation are never heard.
    pub fn confirmations(&self) -> watch::Receiver<u64> {
        self.confirmations.clone()
    }
}

impl Stream for HubSubscription {
    type Item = Payload;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Payload>> {
        loop {
            match self.messages.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(payload))) => return Poll::Ready(Some(payload)),
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(skipped)))) => {
                    metrics::counter!("pulse_live_messages_skipped_total").increment(skipped);
                    tracing::warn!(
                        skipped,
                        "a realtime subscriber fell behind and skipped messages"
                    );
                }
                other => return other.map(|_| None),
            }
        }
    }
}

struct Membership {
    inner: Arc<Inner>,
    channel: String,
    sharding: Sharding,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let Ok(mut channels) = self.inner.channels.lock() else {
            return;
        };
        let Some(state) = channels.get_mut(&self.channel) else {
            return;
        };
        state.subscribers -= 1;
        metrics::gauge!("pulse_live_hub_subscriptions").decrement(1);
        if state.subscribers == 0 {
            channels.remove(&self.channel);
            metrics::gauge!("pulse_live_channels").decrement(1);
            let _ = self
                .inner
                .commands
                .send(Command::Unsubscribe(self.channel.clone(), self.sharding));
        }
    }
}

async fn run_connection(
    nodes: Vec<redis::Client>,
    hub: std::sync::Weak<Inner>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    for client in nodes.iter().cycle() {
        let connected = tokio::select! {
            _ = shutdown.cancelled() => return,
            connected = client.get_async_pubsub() => connected,
        };
        match connected {
            Ok(pubsub) => {
                delay = Duration::from_millis(100);
                let ended = serve_connection(pubsub, &hub, &mut commands, &shutdown).await;
                match ended {
                    Ended::Shutdown => return,
                    Ended::ConnectionLost => {
                        metrics::counter!("pulse_live_pubsub_reconnects_total").increment(1);
                        tracing::warn!("realtime pub/sub connection lost; reconnecting")
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, "realtime pub/sub cannot connect; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RECONNECT_DELAY);
    }
}

enum Ended {
    Shutdown,
    ConnectionLost,
}

async fn serve_connection(
    pubsub: redis::aio::PubSub,
    hub: &std::sync::Weak<Inner>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    shutdown: &CancellationToken,
) -> Ended {
    let (mut sink, mut messages) = pubsub.split();
    let Some(wanted) = hub.upgrade().map(|inner| {
        let channels = inner.channels.lock().expect("hub lock poisoned");
        channels.keys().cloned().collect::<Vec<_>>()
    }) else {
        return Ended::Shutdown;
    };
    if !wanted.is_empty() {
        if sink.subscribe(&wanted).await.is_err() {
            return Ended::ConnectionLost;
        }
        confirm(hub, &wanted);
    }
    // Commands queued while the connection was down may name channels just subscribed above:
    // subscribing twice would confirm twice, and each confirmation costs a watcher a read.
    let mut subscribed: HashSet<String> = wanted.into_iter().collect();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ended::Shutdown,
            command = commands.recv() => {
                let sent = match command {
                    None => return Ended::Shutdown,
                    // One server hears both kinds through SUBSCRIBE: they are published with PUBLISH.
                    Some(Command::Subscribe(channel, _)) if !subscribed.contains(&channel) => {
                        let sent = sink.subscribe(&channel).await;
                        if sent.is_ok() {
                            confirm(hub, std::slice::from_ref(&channel));
                            subscribed.insert(channel);
                        }
                        sent
                    }
                    Some(Command::Unsubscribe(channel, _)) if subscribed.remove(&channel) => {
                        sink.unsubscribe(channel).await
                    }
                    Some(_) => Ok(()),
                };
                if sent.is_err() {
                    return Ended::ConnectionLost;
                }
            }
            message = messages.next() => {
                let Some(message) = message else { return Ended::ConnectionLost };
                metrics::counter!("pulse_live_messages_received_total").increment(1);
                let Some(inner) = hub.upgrade() else { return Ended::Shutdown };
                let channels = inner.channels.lock().expect("hub lock poisoned");
                if let Some(state) = channels.get(message.get_channel_name()) {
                    let _ = state.sender.send(Payload::from(message.get_payload_bytes()));
                }
            }
        }
    }
}

/// Tells the channels' subscribers that Redis confirmed their subscription.
fn confirm(hub: &std::sync::Weak<Inner>, channels: &[String]) {
    let Some(inner) = hub.upgrade() else { return };
    let states = inner.channels.lock().expect("hub lock poisoned");
    for channel in channels {
        if let Some(state) = states.get(channel) {
            state.confirmed.send_modify(|generation| *generation += 1);
        }
    }
}

/// The hub's listener on a Redis Cluster: one RESP3 cluster connection, which keeps a connection
/// per node it needs and sends each `SSUBSCRIBE` to the master of the channel's slot, so a
/// sharded message crosses no cluster bus; confirmations arrive as pushes, like the messages.
/// The `redis` crate subscribes again by itself when a node's connection comes back, but with no
/// other traffic it does not notice a failover (in the failover test it never re-subscribed at
/// the promoted replica), so when a node's connection drops, the hub makes a fresh connection,
/// which reads the slots anew, and subscribes every channel again, retrying with backoff until
/// the slots have a master each.
async fn run_cluster(
    seeds: Vec<redis::Client>,
    hub: std::sync::Weak<Inner>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
) {
    let seeds: Vec<redis::ConnectionInfo> = seeds
        .iter()
        .map(|seed| seed.get_connection_info().clone())
        .collect();
    let mut conn: Option<redis::cluster_async::ClusterConnection> = None;
    // Each connection has its own pushes, so a dropped one's farewells are not taken for news.
    let mut pushes: Option<mpsc::UnboundedReceiver<PushInfo>> = None;
    // Commands not sent yet, in order: those queued while the cluster refused one.
    let mut waiting: Vec<Command> = Vec::new();
    let mut delay = Duration::from_millis(100);
    let mut retry_at: Option<tokio::time::Instant> = Some(tokio::time::Instant::now());
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let push = async {
            match pushes.as_mut() {
                Some(pushes) => pushes.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            command = commands.recv() => {
                let Some(command) = command else { return };
                waiting.push(command);
                if retry_at.is_none() && !send_waiting(&mut conn, &mut waiting).await {
                    retry_at = Some(tokio::time::Instant::now() + delay);
                }
            }
            _ = retry => {
                if conn.is_none() {
                    match connect_cluster(&seeds).await {
                        Ok((fresh, fresh_pushes)) => {
                            conn = Some(fresh);
                            pushes = Some(fresh_pushes);
                            waiting = resubscriptions(&hub);
                        }
                        Err(err) => tracing::warn!(error = %err, "realtime pub/sub cannot reach the cluster; retrying"),
                    }
                }
                if conn.is_some() && send_waiting(&mut conn, &mut waiting).await {
                    retry_at = None;
                    delay = Duration::from_millis(100);
                } else {
                    delay = (delay * 2).min(MAX_RECONNECT_DELAY);
                    retry_at = Some(tokio::time::Instant::now() + delay);
                }
            }
            push = push => {
                let Some(push) = push else {
                    pushes = None;
                    continue;
                };
                if push.kind == PushKind::Disconnection {
                    metrics::counter!("pulse_live_pubsub_reconnects_total").increment(1);
                    tracing::warn!("a realtime pub/sub connection to a cluster node was lost; reconnecting");
                    conn = None;
                    pushes = None;
                    retry_at = Some(tokio::time::Instant::now() + delay);
                } else if !deliver_push(&hub, push) {
                    return;
                }
            }
        }
    }
}

/// A fresh cluster connection (the slots read anew) with its own pushes.
async fn connect_cluster(
    seeds: &[redis::ConnectionInfo],
) -> redis::RedisResult<(
    redis::cluster_async::ClusterConnection,
    mpsc::UnboundedReceiver<PushInfo>,
)> {
    let (pushes_in, pushes) = mpsc::unbounded_channel::<PushInfo>();
    let client = ClusterClientBuilder::new(seeds.to_vec())
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushes_in)
        .connection_timeout(Duration::from_secs(3))
        .response_timeout(Duration::from_secs(5))
        .retries(1)
        .build()?;
    Ok((client.get_async_connection().await?, pushes))
}

/// Every channel wanted now, to subscribe on a fresh connection.
fn resubscriptions(hub: &std::sync::Weak<Inner>) -> Vec<Command> {
    let Some(inner) = hub.upgrade() else {
        return Vec::new();
    };
    let channels = inner.channels.lock().expect("hub lock poisoned");
    channels
        .iter()
        .map(|(channel, state)| Command::Subscribe(channel.clone(), state.sharding))
        .collect()
}

/// Sends the waiting commands in order; false (keeping the unsent ones) when the cluster refused
/// one or there is no connection.
async fn send_waiting(
    conn: &mut Option<redis::cluster_async::ClusterConnection>,
    waiting: &mut Vec<Command>,
) -> bool {
    let Some(connection) = conn.as_mut() else {
        return false;
    };
    let mut commands = std::mem::take(waiting).into_iter();
    while let Some(command) = commands.next() {
        if let Err(command) = send_to_cluster(connection, command).await {
            waiting.push(command);
            waiting.extend(commands);
            // The slot map may name a master that is gone: a fresh connection reads it anew.
            *conn = None;
            return false;
        }
    }
    true
}

/// Sends one (un)subscription; hands it back when the cluster refused it.
async fn send_to_cluster(
    conn: &mut redis::cluster_async::ClusterConnection,
    command: Command,
) -> Result<(), Command> {
    let sent = match &command {
        Command::Subscribe(channel, Sharding::Sharded) => conn.ssubscribe(channel).await,
        Command::Unsubscribe(channel, Sharding::Sharded) => conn.sunsubscribe(channel).await,
        Command::Subscribe(channel, Sharding::Broadcast) => conn.subscribe(channel).await,
        Command::Unsubscribe(channel, Sharding::Broadcast) => conn.unsubscribe(channel).await,
    };
    sent.map_err(|err| {
        tracing::warn!(error = %err, "realtime pub/sub cannot reach a channel's node; retrying");
        command
    })
}

/// Hands a push from the cluster to the channel's listeners; false once the hub is gone.
fn deliver_push(hub: &std::sync::Weak<Inner>, push: PushInfo) -> bool {
    let Some(inner) = hub.upgrade() else {
        return false;
    };
    let channel = match push.data.first() {
        Some(Value::BulkString(channel)) => String::from_utf8_lossy(channel).into_owned(),
        _ => return true,
    };
    match push.kind {
        PushKind::SMessage | PushKind::Message => {
            metrics::counter!("pulse_live_messages_received_total").increment(1);
            let payload = match push.data.get(1) {
                Some(Value::BulkString(payload)) => Payload::from(payload.as_slice()),
                _ => Payload::from(&[][..]),
            };
            let channels = inner.channels.lock().expect("hub lock poisoned");
            if let Some(state) = channels.get(&channel) {
                let _ = state.sender.send(payload);
            }
        }
        PushKind::SSubscribe | PushKind::Subscribe => {
            drop(inner);
            confirm(hub, &[channel]);
        }
        _ => {}
    }
    true
}
