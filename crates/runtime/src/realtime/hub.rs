//! One pub/sub connection per process, however many GraphQL subscriptions are open.
//!
//! Channels are reference-counted by local subscribers: the first subscriber of a channel makes the
//! connection SUBSCRIBE, the last one to leave makes it UNSUBSCRIBE. Messages fan out to local
//! subscribers through a tokio broadcast channel. When the connection drops, it is re-established
//! with backoff (to the next node, on a cluster) and every channel still wanted is subscribed
//! again.
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
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
}

enum Command {
    Subscribe(String),
    Unsubscribe(String),
}

impl Hub {
    /// Starts the connection task; it stops when `shutdown` is cancelled.
    /// `nodes` are tried in turn (see [`crate::redis::Target::pubsub_nodes`]).
    pub fn start(
        nodes: Vec<redis::Client>,
        shutdown: CancellationToken,
        tasks: &TaskTracker,
    ) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            channels: Mutex::new(HashMap::new()),
            commands,
        });
        tasks.spawn(run_connection(
            nodes,
            Arc::downgrade(&inner),
            receiver,
            shutdown,
        ));
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

    /// Messages published on `channel` from now on, until the returned stream is dropped.
    pub fn subscribe(&self, channel: String) -> HubSubscription {
        let mut channels = self.inner.channels.lock().expect("hub lock poisoned");
        let state = channels.entry(channel.clone()).or_insert_with(|| {
            metrics::gauge!("pulse_live_channels").increment(1);
            ChannelState {
                sender: broadcast::channel(SUBSCRIBER_BUFFER).0,
                subscribers: 0,
                confirmed: watch::channel(0).0,
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
                .send(Command::Subscribe(channel.clone()));
        }
        HubSubscription {
            messages: BroadcastStream::new(receiver),
            confirmations,
            _membership: Membership {
                inner: self.inner.clone(),
                channel,
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
                .send(Command::Unsubscribe(self.channel.clone()));
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
                    Some(Command::Subscribe(channel)) if !subscribed.contains(&channel) => {
                        let sent = sink.subscribe(&channel).await;
                        if sent.is_ok() {
                            confirm(hub, std::slice::from_ref(&channel));
                            subscribed.insert(channel);
                        }
                        sent
                    }
                    Some(Command::Unsubscribe(channel)) if subscribed.remove(&channel) => {
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
