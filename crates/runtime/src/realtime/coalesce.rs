//! Coalesced live snapshots: however many local subscribers watch a key and however many changes
//! are announced for it, a process reads the key's snapshot at most twice per tick (a storm's first
//! change at once, the rest at the tick's end).
//!
//! For each key `K` with local subscribers, a process runs one watcher. The watcher listens to the
//! key's pub/sub channels through the [`Hub`] (one Redis subscription per channel per process;
//! several channels where changes of the key are announced from different cluster slots, each on
//! the one of its own slot) and reads the key (the `read` closure given at construction) once
//! every one of those subscriptions is live, so no
//! change falls between its first read and the first announcement it hears; after a reconnect it
//! reads again, since what was announced while the connection was down is gone. An announcement
//! after a quiet tick is read at once (the leading edge: a lone vote reaches its dashboards within
//! a round trip, not half a tick later on average); those that follow within the tick are read
//! together at its end, so a storm of changes costs one read at its start and at most one per
//! tick after, however many subscribers and changes. A read is handed to the subscribers only if
//! its value differs from the last one handed out, so a change nobody can see sends nothing. A
//! subscriber gets the last snapshot at once (or the first one as soon as it is read), then each
//! new one; a slow subscriber skips to the latest rather than queueing stale ones. The watcher
//! stops with its last subscriber.
//!
//! Each snapshot carries a version that its reader takes from the same atomic read as the value
//! (e.g. a sequence that grows with every change), so versions compare across processes: a client
//! that reconnects to another process drops a snapshot older than the last one it showed.
//!
//! A read may also say when it goes stale without any announcement (a period that ends): the
//! watcher then reads again at that time.
//!
//! Usage (one `Coalescer` per kind of key, shared by the process):
//!
//! ```text
//! let stats = Coalescer::new(CoalescerConfig { kind: "article_stats", tick, sharding: Sharding::Broadcast, hub, tasks, shutdown },
//!     move |article: &i64| keys.article_stats_channels(*article),
//!     move |article: i64| { let service = service.clone(); async move { service.stats_snapshot(article).await }.boxed() });
//! let stream = stats.subscribe(article_id); // Stream<Item = Arc<Snapshot<Stats>>>
//! ```

use std::collections::HashMap;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Hub, Sharding};
use crate::error::AppResult;

/// One read of a key.
#[derive(Clone, Debug)]
pub struct Snapshot<T> {
    /// Grows with every change of what was read; comparable across processes.
    pub version: i64,
    pub value: T,
    /// Read again at this time even if nothing is announced.
    pub refresh_at: Option<Instant>,
}

/// Where a coalescer's watchers run, and how often they may read.
pub struct CoalescerConfig<'a> {
    /// Names the metrics' `kind` label.
    pub kind: &'static str,
    pub tick: Duration,
    /// How the keys' channels are published.
    pub sharding: Sharding,
    pub hub: &'a Hub,
    pub tasks: &'a TaskTracker,
    pub shutdown: &'a CancellationToken,
}

type ChannelsOf<K> = dyn Fn(&K) -> Vec<String> + Send + Sync;
type ReadOf<K, T> = dyn Fn(K) -> BoxFuture<'static, AppResult<Snapshot<T>>> + Send + Sync;
type Latest<T> = Option<Arc<Snapshot<T>>>;

pub struct Coalescer<K, T> {
    inner: Arc<Inner<K, T>>,
}

impl<K, T> Clone for Coalescer<K, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K, T> {
    kind: &'static str,
    tick: Duration,
    sharding: Sharding,
    hub: Hub,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    channels: Box<ChannelsOf<K>>,
    read: Box<ReadOf<K, T>>,
    watchers: Mutex<HashMap<K, Watcher<T>>>,
    reads: AtomicU64,
}

struct Watcher<T> {
    latest: watch::Sender<Latest<T>>,
    subscribers: usize,
    stop: CancellationToken,
}

impl<K, T> Coalescer<K, T>
where
    K: Clone + Eq + Hash + Send + Sync + std::fmt::Debug + 'static,
    T: PartialEq + Send + Sync + 'static,
{
    /// `channels` names the pub/sub channels announcing changes of a key (at least one); `read`
    /// reads its snapshot (one read per call: the coalescer counts calls).
    pub fn new(
        config: CoalescerConfig<'_>,
        channels: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
        read: impl Fn(K) -> BoxFuture<'static, AppResult<Snapshot<T>>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                kind: config.kind,
                tick: config.tick,
                sharding: config.sharding,
                hub: config.hub.clone(),
                tasks: config.tasks.clone(),
                shutdown: config.shutdown.clone(),
                channels: Box::new(channels),
                read: Box::new(read),
                watchers: Mutex::new(HashMap::new()),
                reads: AtomicU64::new(0),
            }),
        }
    }

    /// The key's snapshots from now on: the latest at once, then each one that differs.
    pub fn subscribe(&self, key: K) -> Coalesced<K, T> {
        let mut watchers = self.inner.lock();
        let watcher = watchers.entry(key.clone()).or_insert_with(|| {
            let (latest, _) = watch::channel(None);
            let stop = self.inner.shutdown.child_token();
            let task = watch_key(
                self.inner.clone(),
                key.clone(),
                latest.clone(),
                stop.clone(),
            );
            self.inner.tasks.spawn(task);
            metrics::gauge!("pulse_live_watchers", "kind" => self.inner.kind).increment(1);
            Watcher {
                latest,
                subscribers: 0,
                stop,
            }
        });
        watcher.subscribers += 1;
        metrics::gauge!("pulse_live_subscribers", "kind" => self.inner.kind).increment(1);
        let snapshots = WatchStream::new(watcher.latest.subscribe());
        Coalesced {
            snapshots,
            membership: Membership {
                inner: self.inner.clone(),
                key,
            },
        }
    }

    /// Snapshot reads this coalescer has made (for tests and metrics).
    pub fn reads(&self) -> u64 {
        self.inner.reads.load(Ordering::SeqCst)
    }

    /// Keys watched now.
    pub fn watched(&self) -> usize {
        self.inner.lock().len()
    }

    pub fn tick(&self) -> Duration {
        self.inner.tick
    }
}

impl<K, T> Inner<K, T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Watcher<T>>> {
        self.watchers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The watcher of one key: reads it once its channel's subscription is live, then on
/// announcements, leading edge first and at most once per tick after.
async fn watch_key<K, T>(
    inner: Arc<Inner<K, T>>,
    key: K,
    latest: watch::Sender<Latest<T>>,
    stop: CancellationToken,
) where
    K: Clone + std::fmt::Debug + Send + Sync + 'static,
    T: PartialEq + Send + Sync + 'static,
{
    let subscriptions: Vec<_> = (inner.channels)(&key)
        .into_iter()
        .map(|channel| inner.hub.subscribe_as(channel, inner.sharding))
        .collect();
    let mut confirmations: Vec<_> = subscriptions
        .iter()
        .map(|subscription| subscription.confirmations())
        .collect();
    let mut announcements = futures_util::stream::select_all(subscriptions);
    // Read once every subscription is live (at once if other watchers of the channels made them
    // so), so that no change falls between the read and the first message heard; and again after
    // each reconnect, since what was announced meanwhile is gone.
    let mut catch_up = all_live(&mut confirmations);
    let mut announced = false;
    // An announcement after a quiet tick is read at once; the ones that follow within the tick
    // wait for its end, so a storm costs one read at its start and one per tick after.
    let mut next_announced_read = Instant::now();
    let mut refresh_at: Option<Instant> = None;
    loop {
        let due = if catch_up {
            Some(Instant::now())
        } else if announced {
            Some(next_announced_read)
        } else {
            refresh_at
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            announcement = announcements.next() => match announcement {
                Some(_) => {
                    if announced || catch_up {
                        metrics::counter!("pulse_live_announcements_coalesced_total", "kind" => inner.kind).increment(1);
                    }
                    announced = true;
                }
                None => break,
            },
            confirmed = any_changed(&mut confirmations) => match confirmed {
                Ok(()) => catch_up = all_live(&mut confirmations),
                Err(_) => break,
            },
            _ = sleep_until_due(due) => {
                let throttled = !catch_up;
                catch_up = false;
                announced = false;
                if throttled {
                    next_announced_read = Instant::now() + inner.tick;
                }
                inner.reads.fetch_add(1, Ordering::SeqCst);
                metrics::counter!("pulse_live_snapshot_reads_total", "kind" => inner.kind).increment(1);
                match (inner.read)(key.clone()).await {
                    Ok(snapshot) => {
                        refresh_at = snapshot.refresh_at;
                        let changed = latest.send_if_modified(|current| {
                            let changed = current.as_ref().is_none_or(|shown| shown.value != snapshot.value);
                            if changed {
                                *current = Some(Arc::new(snapshot));
                            }
                            changed
                        });
                        if !changed {
                            metrics::counter!("pulse_live_snapshots_unchanged_total", "kind" => inner.kind).increment(1);
                        }
                    }
                    Err(err) => {
                        announced = true;
                        next_announced_read = Instant::now() + inner.tick;
                        tracing::warn!(kind = inner.kind, key = ?key, error = %err, "cannot read a live snapshot; retrying next tick");
                    }
                }
            }
        }
    }
    metrics::gauge!("pulse_live_watchers", "kind" => inner.kind).decrement(1);
}

/// Whether Redis has confirmed every channel's subscription. Marks every confirmation seen, the
/// ones after an unconfirmed channel too: one left unseen would wake `any_changed` at once, again
/// and again, while the other channel waits.
fn all_live(confirmations: &mut [watch::Receiver<u64>]) -> bool {
    let mut live = true;
    for receiver in confirmations {
        live &= *receiver.borrow_and_update() > 0;
    }
    live
}

/// Waits until some channel's subscription is confirmed again; an error once the hub is gone.
async fn any_changed(
    confirmations: &mut [watch::Receiver<u64>],
) -> Result<(), watch::error::RecvError> {
    if confirmations.is_empty() {
        return std::future::pending().await;
    }
    let changes = confirmations
        .iter_mut()
        .map(|receiver| Box::pin(receiver.changed()));
    futures_util::future::select_all(changes).await.0
}

/// Waits until `due`, or forever without one.
async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// A subscriber's stream of snapshots. Dropping it lets the watcher stop once no one else watches.
pub struct Coalesced<K: Eq + Hash, T> {
    snapshots: WatchStream<Latest<T>>,
    membership: Membership<K, T>,
}

// Nothing in a `Coalesced` is pinned structurally: the watch stream is `Unpin`, the membership a
// plain value.
impl<K: Eq + Hash, T> Unpin for Coalesced<K, T> {}

impl<K: Eq + Hash, T: Send + Sync + 'static> Stream for Coalesced<K, T> {
    type Item = Arc<Snapshot<T>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.snapshots.poll_next_unpin(cx) {
                Poll::Ready(Some(Some(snapshot))) => return Poll::Ready(Some(snapshot)),
                // Nothing read yet.
                Poll::Ready(Some(None)) => {}
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<K: Eq + Hash, T> Coalesced<K, T> {
    pub fn key(&self) -> &K {
        &self.membership.key
    }
}

struct Membership<K: Eq + Hash, T> {
    inner: Arc<Inner<K, T>>,
    key: K,
}

impl<K: Eq + Hash, T> Drop for Membership<K, T> {
    fn drop(&mut self) {
        let mut watchers = self.inner.lock();
        let Some(watcher) = watchers.get_mut(&self.key) else {
            return;
        };
        watcher.subscribers -= 1;
        metrics::gauge!("pulse_live_subscribers", "kind" => self.inner.kind).decrement(1);
        if watcher.subscribers == 0
            && let Some(watcher) = watchers.remove(&self.key)
        {
            watcher.stop.cancel();
        }
    }
}
