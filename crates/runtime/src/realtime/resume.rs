//! Resumable event streams: a live source of events joined to a history that replays what a client
//! missed since a position it holds, with no gap and no duplicate where the two meet.
//!
//! Every event has a position (an integer that grows with the stream, such as an id minted in
//! publication order). The live source is subscribed first and its subscription confirmed by Redis
//! before the history is read, so an event is in the history read, or heard live, or both: events
//! heard while the replay is read are buffered, and those the replay carried are dropped by
//! position. Each time the live source is confirmed again (its pub/sub connection was lost and
//! re-established, and whatever was published meanwhile is gone), the stream catches up the same
//! way from the last position it sent. Where the history cannot reach back to the position (or
//! more events were missed than one replay may carry), the stream sends one resync error and ends,
//! so a client learns that it must re-read instead of living with a silent gap.

use std::collections::HashSet;
use std::future::Future;

use futures_util::{Stream, StreamExt as _};
use tokio::sync::watch;

use crate::error::{AppError, AppResult};

/// What a history holds after a position.
pub enum Replay<T> {
    /// Every event after the position, oldest first.
    Events(Vec<T>),
    /// The history no longer reaches back to the position, or more events follow it than one
    /// replay carries.
    Unreachable,
}

/// The confirmations of every channel a live source listens to (one per channel, see
/// [`super::HubSubscription::confirmations`]).
pub struct Confirmations(Vec<watch::Receiver<u64>>);

impl Confirmations {
    pub fn new(receivers: Vec<watch::Receiver<u64>>) -> Self {
        Self(receivers)
    }

    /// Waits until Redis has confirmed every channel once. Returns false when the hub is gone.
    async fn all_confirmed(&mut self) -> bool {
        for receiver in &mut self.0 {
            if receiver
                .wait_for(|&generation| generation > 0)
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Waits until some channel is confirmed again; never returns when the hub is gone, since the
    /// live source then ends by itself.
    async fn reconfirmed(&mut self) {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        let changes = self
            .0
            .iter_mut()
            .map(|receiver| Box::pin(receiver.changed()));
        if futures_util::future::select_all(changes).await.0.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// What the live side of a stream did next.
enum Step<T> {
    Event(Option<T>),
    Reconfirmed,
}

/// How a resumable stream reads its history and words its resync.
pub struct Resume<T, R> {
    /// The position the client holds (it has every event up to it), or `None` to start live.
    pub after: Option<i64>,
    /// An event's position.
    pub position: fn(&T) -> i64,
    /// Reads the history after a position.
    pub replay: R,
    /// Most live events buffered while a replay is read; past it the stream resyncs.
    pub buffer: usize,
    /// The resync error, telling the client what to re-read.
    pub resync: fn() -> AppError,
}

/// `live` (already subscribed, its channels' `confirmations` given) resumed after `resume.after`:
/// the replay of what was missed, then live events, each once, in the order of the replay and
/// then of arrival. Ends after an error (the history could not be read, or a resync).
pub fn resumable<T, L, R, F>(
    live: L,
    mut confirmations: Confirmations,
    resume: Resume<T, R>,
) -> impl Stream<Item = AppResult<T>> + Send + use<T, L, R, F>
where
    T: Send + 'static,
    L: Stream<Item = T> + Send + 'static,
    R: FnMut(i64) -> F + Send + 'static,
    F: Future<Output = AppResult<Replay<T>>> + Send,
{
    let Resume {
        after,
        position,
        mut replay,
        buffer,
        resync,
    } = resume;
    async_stream::stream! {
        let mut live = Box::pin(live);
        // The last position sent, from which a catch-up replays.
        let mut sent = after;
        // Positions the last replay carried: their live announcements may still be on the way.
        let mut replayed: HashSet<i64> = HashSet::new();
        if !confirmations.all_confirmed().await {
            return;
        }
        let mut catch_up = after;
        loop {
            if let Some(from) = catch_up.take() {
                let reading = replay(from);
                tokio::pin!(reading);
                let mut heard = Vec::new();
                let outcome = loop {
                    tokio::select! {
                        outcome = &mut reading => break Some(outcome),
                        Some(event) = live.next() => {
                            heard.push(event);
                            if heard.len() > buffer {
                                break None;
                            }
                        }
                    }
                };
                let events = match outcome {
                    Some(Ok(Replay::Events(events))) => events,
                    Some(Ok(Replay::Unreachable)) | None => {
                        metrics::counter!("pulse_live_resyncs_total").increment(1);
                        yield Err(resync());
                        return;
                    }
                    Some(Err(err)) => {
                        yield Err(err);
                        return;
                    }
                };
                metrics::counter!("pulse_live_replayed_total").increment(events.len() as u64);
                replayed = events.iter().map(position).collect();
                for event in events {
                    sent = sent.max(Some(position(&event)));
                    yield Ok(event);
                }
                for event in heard {
                    if replayed.insert(position(&event)) {
                        sent = sent.max(Some(position(&event)));
                        yield Ok(event);
                    }
                }
            }
            // Chosen here, acted on below: `yield` works outside of other macros only.
            let step = tokio::select! {
                event = live.next() => Step::Event(event),
                () = confirmations.reconfirmed() => Step::Reconfirmed,
            };
            match step {
                Step::Event(None) => return,
                Step::Event(Some(event)) => {
                    if !replayed.contains(&position(&event)) {
                        sent = sent.max(Some(position(&event)));
                        yield Ok(event);
                    }
                }
                // Before anything was sent there is no position to catch up from: the client
                // holds nothing it could miss a successor of.
                Step::Reconfirmed => catch_up = sent,
            }
        }
    }
}
