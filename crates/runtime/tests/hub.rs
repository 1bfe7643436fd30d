//! The hub on a real Redis: what a subscriber that does not read keeps of its channel.

use std::time::Duration;

use futures_util::StreamExt as _;
use pulse_runtime::realtime::{Hub, HubSubscription, Sharding};
use pulse_runtime::redis::PubSubNodes;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn redis_url() -> String {
    std::env::var("PULSE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn next(subscription: &mut HubSubscription) -> String {
    let payload = tokio::time::timeout(Duration::from_secs(5), subscription.next())
        .await
        .expect("a message within 5 s")
        .expect("the subscription goes on");
    String::from_utf8(payload.to_vec()).unwrap()
}

#[tokio::test]
async fn a_subscriber_of_a_buffered_channel_falls_at_most_its_buffer_behind_then_skips_ahead() {
    let shutdown = CancellationToken::new();
    let client = redis::Client::open(redis_url()).unwrap();
    let hub = Hub::start(
        PubSubNodes::Single(client.clone()),
        shutdown.clone(),
        &TaskTracker::new(),
    );
    let channel = format!("test:hub:{:016x}", rand::random::<u64>());
    let marker = format!("{channel}:marker");
    let mut idle = hub.subscribe_buffered(channel.clone(), Sharding::Broadcast, 2);
    let mut marked = hub.subscribe_as(marker.clone(), Sharding::Broadcast);
    for subscription in [&idle, &marked] {
        subscription
            .confirmations()
            .wait_for(|&generation| generation > 0)
            .await
            .unwrap();
    }
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let mut publish = redis::pipe();
    for message in 1..=5 {
        publish.publish(&channel, message.to_string()).ignore();
    }
    publish.publish(&marker, "after").ignore();
    publish.query_async::<()>(&mut redis).await.unwrap();
    // The hub hands on what its one connection hears in order: the marker comes after the five.
    assert_eq!(next(&mut marked).await, "after");
    assert_eq!(next(&mut idle).await, "4");
    assert_eq!(next(&mut idle).await, "5");
    shutdown.cancel();
}
