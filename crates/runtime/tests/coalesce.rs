//! The coalescer on a real Redis: when it reads a key, counted, against announcements published by
//! hand. Each test's channel is its own; a test that kills connections has a Redis of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use pulse_runtime::realtime::{Coalesced, Coalescer, CoalescerConfig, Hub, Sharding, Snapshot};
use pulse_runtime::redis::PubSubNodes;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Long enough that nothing waiting for a tick's end can pass a test.
const NEVER: Duration = Duration::from_secs(3600);

fn redis_url() -> String {
    std::env::var("PULSE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A coalescer of one key whose every read returns `value` as it is then, announced on two
/// channels of its own (as a key whose changes come from two cluster slots is).
struct Watched {
    coalescer: Coalescer<i64, i64>,
    value: Arc<AtomicI64>,
    channels: [String; 2],
    redis: redis::aio::MultiplexedConnection,
    shutdown: CancellationToken,
}

impl Watched {
    async fn start(url: &str, tick: Duration) -> Self {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let client = redis::Client::open(url).unwrap();
        let hub = Hub::start(
            PubSubNodes::Single(client.clone()),
            shutdown.clone(),
            &tasks,
        );
        let channel = format!("test:coalesce:{:016x}", rand::random::<u64>());
        let channels = [format!("{channel}:a"), format!("{channel}:b")];
        let value = Arc::new(AtomicI64::new(0));
        let (announced_on, read_from) = (channels.to_vec(), value.clone());
        let coalescer = Coalescer::new(
            CoalescerConfig {
                kind: "test",
                tick,
                sharding: Sharding::Broadcast,
                hub: &hub,
                tasks: &tasks,
                shutdown: &shutdown,
            },
            move |_: &i64| announced_on.clone(),
            move |_: i64| {
                let value = read_from.load(Ordering::SeqCst);
                async move {
                    Ok(Snapshot {
                        version: value,
                        value,
                        refresh_at: None,
                    })
                }
                .boxed()
            },
        );
        Self {
            coalescer,
            value,
            channels,
            redis: client.get_multiplexed_async_connection().await.unwrap(),
            shutdown,
        }
    }

    /// Sets what the next read returns and announces it `times` times in one round trip, on the
    /// first channel.
    async fn change(&mut self, value: i64, times: usize) {
        self.change_on(0, value, times).await;
    }

    async fn change_on(&mut self, channel: usize, value: i64, times: usize) {
        self.value.store(value, Ordering::SeqCst);
        let mut pipe = redis::pipe();
        for _ in 0..times {
            pipe.cmd("PUBLISH")
                .arg(&self.channels[channel])
                .arg("")
                .ignore();
        }
        let () = pipe.query_async(&mut self.redis).await.unwrap();
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn next_value(subscriber: &mut Coalesced<i64, i64>) -> i64 {
    tokio::time::timeout(Duration::from_secs(10), subscriber.next())
        .await
        .expect("a snapshot within 10 s")
        .expect("the subscription goes on")
        .value
}

#[tokio::test]
async fn a_lone_change_after_a_quiet_spell_is_read_at_once_not_at_the_end_of_the_tick() {
    let mut watched = Watched::start(&redis_url(), NEVER).await;
    let mut subscriber = watched.coalescer.subscribe(1);
    // The first read waits for the subscription to be live, and is the only one.
    assert_eq!(next_value(&mut subscriber).await, 0);
    assert_eq!(watched.coalescer.reads(), 1);

    watched.change(7, 1).await;
    // Only a read at the announcement can show it: the tick ends in an hour.
    assert_eq!(next_value(&mut subscriber).await, 7);
    assert_eq!(watched.coalescer.reads(), 2);
}

#[tokio::test]
async fn a_change_announced_on_any_of_the_keys_channels_is_read() {
    // A short tick: the second change comes within the first one's tick and is read at its end.
    let mut watched = Watched::start(&redis_url(), Duration::from_millis(100)).await;
    let mut subscriber = watched.coalescer.subscribe(1);
    assert_eq!(next_value(&mut subscriber).await, 0);

    watched.change_on(1, 4, 1).await;
    assert_eq!(next_value(&mut subscriber).await, 4);
    watched.change_on(0, 5, 1).await;
    assert_eq!(next_value(&mut subscriber).await, 5);
    assert_eq!(watched.coalescer.reads(), 3);
}

#[tokio::test]
async fn a_storm_of_changes_within_a_tick_costs_one_read_at_once_and_one_at_the_tick() {
    let mut watched = Watched::start(&redis_url(), Duration::from_secs(2)).await;
    let mut subscriber = watched.coalescer.subscribe(1);
    assert_eq!(next_value(&mut subscriber).await, 0);

    watched.change(1, 1).await;
    assert_eq!(next_value(&mut subscriber).await, 1);
    assert_eq!(watched.coalescer.reads(), 2, "the storm's first change");
    // A hundred more announcements within the same tick: one read when it ends covers them all.
    watched.change(2, 100).await;
    assert_eq!(next_value(&mut subscriber).await, 2);
    assert_eq!(watched.coalescer.reads(), 3, "the rest of the storm");
}

#[tokio::test]
async fn many_subscribers_of_one_key_share_its_reads() {
    let mut watched = Watched::start(&redis_url(), NEVER).await;
    let mut subscribers: Vec<_> = (0..500).map(|_| watched.coalescer.subscribe(1)).collect();
    for subscriber in &mut subscribers {
        assert_eq!(next_value(subscriber).await, 0);
    }
    watched.change(3, 1).await;
    for subscriber in &mut subscribers {
        assert_eq!(next_value(subscriber).await, 3);
    }
    assert_eq!(watched.coalescer.reads(), 2);
    assert_eq!(watched.coalescer.watched(), 1);
}

#[tokio::test]
async fn a_change_made_while_the_pubsub_connection_was_killed_is_read_after_it_resubscribes() {
    let dir = std::env::temp_dir().join(format!("pulse-coalesce-{:016x}", rand::random::<u64>()));
    let private =
        pulse_runtime::redis::embedded::find_or_start(std::path::Path::new("redis-server"), &dir)
            .await
            .expect("redis-server is installed on test machines");
    let mut watched = Watched::start(private.url(), NEVER).await;
    let mut subscriber = watched.coalescer.subscribe(1);
    assert_eq!(next_value(&mut subscriber).await, 0);

    // Changed with no announcement anyone hears: as if it were published while the hub was away.
    watched.value.store(9, Ordering::SeqCst);
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut watched.redis)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the hub's one pub/sub connection");
    assert_eq!(next_value(&mut subscriber).await, 9);
    // And announcements are heard again, leading edge first.
    watched.change(10, 1).await;
    assert_eq!(next_value(&mut subscriber).await, 10);
    drop(watched);
    private.stop().await;
}
