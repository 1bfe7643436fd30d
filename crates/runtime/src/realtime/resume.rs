//! Resumable event streams: a live source of events joined to a history that replays what a client
//! missed since a position it holds, with no gap and no duplicate where the two meet.
//!
//! Every event has a position, an integer, and the live source delivers events in the order of
//! their positions: the order in which they were recorded in the history, which is not always the
//! order of ids (ids are minted when a row is inserted but commit, and are announced, in another
//! order; fan-out from different authors runs concurrently). So a position is a sequence number
//! given by the history at the moment it records an event (the feed's journal, the journal of
//! published articles), in the same atomic step that announces it. The guarantee, for a client
//! holding position `p`: it receives every event recorded after `p`, each once, in the order
//! recorded, and a position of an event it receives stands for everything up to it.
//!
//! The live source is subscribed first and its subscription confirmed by Redis before the history
//! is read, so an event is in the history read, or heard live, or both. A replay says which
//! position it brings the stream to (the history's newest when it was read); events heard live at
//! or before it are dropped as replayed, and so is any live event at or before the last position
//! sent. Positions are consecutive (1, 2, 3…; a source that filters, say by author, passes the
//! events it filters out on as positions without content, and its caller drops them after the
//! join): a live event past the next position means events were lost on the way (a listener that
//! lags behind its channel skips messages), and the stream catches up from the history. Each time
//! the live source is confirmed again (its pub/sub connection was lost and re-established, and
//! whatever was published meanwhile is gone), the stream catches up the same way from the last
//! position it sent. Where the history cannot reach back to the position (it was trimmed past it,
//! or recreated under a new epoch, or more events follow than one replay may carry), the stream
//! sends one resync error and ends, so a client learns that it must re-read instead of living with
//! a silent gap; a live source that finds its history recreated under it ends the stream the same
//! way, with an error item. A history that cannot be read for a while (`UNAVAILABLE`: the master
//! of its slot died and its replica is not promoted yet, or Redis restarts) is read again with
//! backoff, the live source still heard meanwhile: a pub/sub connection re-established in a
//! failover confirms the channels before the history's master is back, and the stream would
//! otherwise end exactly when it should catch up.

use std::future::Future;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt as _};
use tokio::sync::watch;

use crate::error::{AppError, AppResult};

/// The first wait before a history, or a replay's chunk, that was unavailable is read again.
const FIRST_REREAD_DELAY: Duration = Duration::from_millis(100);

/// The longest wait between two reads of a history that was unavailable.
const MAX_REREAD_DELAY: Duration = Duration::from_secs(2);

/// How many events of a replay are loaded at once (see [`Replay::loaded`]).
pub const REPLAY_CHUNK: usize = 32;

/// What a history holds after a position.
pub enum Replay<T> {
    /// Every event after the position, oldest first, as the stream takes them, and the position
    /// the history had reached when read (at least that of every event replayed): live events up
    /// to it were replayed. An error item ends the stream after it.
    Events {
        events: BoxStream<'static, AppResult<T>>,
        through: i64,
    },
    /// The history no longer reaches back to the position, or more events follow it than one
    /// replay carries.
    Unreachable,
}

impl<T: Send + 'static> Replay<T> {
    /// A replay of what the history listed after the position (`entries`: positions and ids, a
    /// few bytes each), whose events `load` makes [`REPLAY_CHUNK`] entries at a time, each chunk
    /// only once the stream has taken the one before. An event is a whole row, up to hundreds of
    /// kilobytes: loaded at once, a resume from far back would hold a thousand of them while its
    /// client reads the first few, and the rows of a client that falls behind its send budget
    /// and is cut off would have been read for nothing. Loaded in chunks, a replay holds one
    /// chunk, and reads no further than its client takes. A chunk whose store is unavailable for
    /// a while is loaded again with backoff, as the history's list is read again: the stream
    /// waits rather than ending in the middle of its replay. Any other error ends it.
    pub fn loaded<E, L, F>(entries: Vec<E>, through: i64, load: L) -> Self
    where
        E: Clone + Send + 'static,
        L: FnMut(Vec<E>) -> F + Send + 'static,
        F: Future<Output = AppResult<Vec<T>>> + Send + 'static,
    {
        let chunks =
            futures_util::stream::unfold(Some((entries.into_iter(), load)), |state| async move {
                let (mut entries, mut load) = state?;
                let chunk: Vec<E> = entries.by_ref().take(REPLAY_CHUNK).collect();
                if chunk.is_empty() {
                    return None;
                }
                match load_when_available(&mut load, chunk).await {
                    Ok(events) => Some((Ok(events), Some((entries, load)))),
                    Err(err) => Some((Err(err), None)),
                }
            });
        let events = chunks
            .flat_map(|loaded| match loaded {
                Ok(events) => futures_util::stream::iter(events).map(Ok).left_stream(),
                Err(err) => futures_util::stream::once(std::future::ready(Err(err))).right_stream(),
            })
            .boxed();
        Replay::Events { events, through }
    }
}

/// `load(chunk)`, again after a growing delay for as long as its store is unavailable.
async fn load_when_available<E, T, L, F>(load: &mut L, chunk: Vec<E>) -> AppResult<Vec<T>>
where
    E: Clone,
    L: FnMut(Vec<E>) -> F,
    F: Future<Output = AppResult<Vec<T>>>,
{
    let mut delay = FIRST_REREAD_DELAY;
    loop {
        match load(chunk.clone()).await {
            Err(err) if err.code() == "UNAVAILABLE" => {
                tracing::warn!(error = %err, "cannot load a replay's events; loading them again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_REREAD_DELAY);
            }
            loaded => return loaded,
        }
    }
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
    Event(Option<AppResult<T>>),
    Reconfirmed,
}

/// Where a live event stands against the last position sent.
enum Next {
    /// At or before it: replayed, or heard twice.
    Replayed,
    /// Right after it (or nothing was sent yet, so nothing can be missing before it).
    Successor,
    /// Past the next position: events in between were lost on the way (a listener that lagged
    /// skips messages), so the stream catches up from the history.
    Gap,
}

fn next(sent: Option<i64>, position: i64) -> Next {
    match sent {
        None => Next::Successor,
        Some(sent) if position <= sent => Next::Replayed,
        Some(sent) if position == sent + 1 => Next::Successor,
        Some(_) => Next::Gap,
    }
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

/// `live` (already subscribed, its channels' `confirmations` given; an error item ends the
/// stream) resumed after `resume.after`: the replay of what was missed, then live events past it,
/// each once, in the order of their positions. Ends after an error (the history could not be
/// read for a reason other than Redis being unavailable, a resync, or the live source's error).
pub fn resumable<T, L, R, F>(
    live: L,
    mut confirmations: Confirmations,
    resume: Resume<T, R>,
) -> impl Stream<Item = AppResult<T>> + Send + use<T, L, R, F>
where
    T: Send + 'static,
    L: Stream<Item = AppResult<T>> + Send + 'static,
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
        // The last position sent (or replayed through), from which a catch-up replays.
        let mut sent = after;
        if !confirmations.all_confirmed().await {
            return;
        }
        let mut catch_up = after;
        loop {
            if let Some(from) = catch_up.take() {
                let mut read_after = |delay: Duration| {
                    let reading = replay(from);
                    async move {
                        tokio::time::sleep(delay).await;
                        reading.await
                    }
                };
                // On the heap, and only while it is read: a history's read (SQL and Redis calls)
                // is many times the size of the rest of the stream, and an idle subscriber would
                // otherwise hold room for it for as long as it lives.
                let mut reading = Box::pin(read_after(Duration::ZERO));
                let mut delay = FIRST_REREAD_DELAY;
                let mut heard = Vec::new();
                let outcome = loop {
                    tokio::select! {
                        outcome = &mut reading => match outcome {
                            Err(err) if err.code() == "UNAVAILABLE" => {
                                tracing::warn!(error = %err, "cannot read a stream's history; reading it again");
                                reading.set(read_after(delay));
                                delay = (delay * 2).min(MAX_REREAD_DELAY);
                            }
                            outcome => break Some(outcome),
                        },
                        Some(event) = live.next() => {
                            heard.push(event);
                            if heard.len() > buffer {
                                break None;
                            }
                        }
                    }
                };
                let (mut events, through) = match outcome {
                    Some(Ok(Replay::Events { events, through })) => (events, through),
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
                while let Some(event) = events.next().await {
                    match event {
                        Ok(event) => {
                            metrics::counter!("pulse_live_replayed_total").increment(1);
                            yield Ok(event);
                        }
                        Err(err) => {
                            yield Err(err);
                            return;
                        }
                    }
                }
                sent = sent.max(Some(through));
                for event in heard {
                    let event = match event {
                        Ok(event) => event,
                        Err(err) => {
                            yield Err(err);
                            return;
                        }
                    };
                    match next(sent, position(&event)) {
                        Next::Replayed => {}
                        Next::Successor => {
                            sent = Some(position(&event));
                            yield Ok(event);
                        }
                        Next::Gap => {
                            catch_up = sent;
                            break;
                        }
                    }
                }
                if catch_up.is_some() {
                    continue;
                }
            }
            // Chosen here, acted on below: `yield` works outside of other macros only.
            let step = tokio::select! {
                event = live.next() => Step::Event(event),
                () = confirmations.reconfirmed() => Step::Reconfirmed,
            };
            match step {
                Step::Event(None) => return,
                Step::Event(Some(Err(err))) => {
                    yield Err(err);
                    return;
                }
                Step::Event(Some(Ok(event))) => match next(sent, position(&event)) {
                    Next::Replayed => {}
                    Next::Successor => {
                        sent = Some(position(&event));
                        yield Ok(event);
                    }
                    // The history has the ones skipped, and this one after them.
                    Next::Gap => catch_up = sent,
                },
                // Before anything was sent there is no position to catch up from: the client
                // holds nothing it could miss a successor of.
                Step::Reconfirmed => catch_up = sent,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::time::Duration;

    use futures_util::StreamExt as _;
    use tokio::sync::{mpsc, watch};

    use super::*;

    /// Events are their positions. The history holds 1..=`recorded`, and none past it once
    /// `recorded` is negative (trimmed).
    struct Source {
        recorded: Arc<AtomicI64>,
        /// How many reads of the history fail next, as Redis unavailable.
        unavailable: Arc<AtomicI64>,
        live: mpsc::UnboundedSender<AppResult<i64>>,
        confirmed: watch::Sender<u64>,
    }

    fn resumed(after: i64) -> (Source, impl Stream<Item = AppResult<i64>>) {
        let recorded = Arc::new(AtomicI64::new(0));
        let unavailable = Arc::new(AtomicI64::new(0));
        let (live, heard) = mpsc::unbounded_channel();
        let heard = futures_util::stream::unfold(heard, |mut heard| async move {
            heard.recv().await.map(|event| (event, heard))
        });
        let (confirmed, confirmations) = watch::channel(1);
        let (history, failing) = (recorded.clone(), unavailable.clone());
        let resume = Resume {
            after: Some(after),
            position: |event: &i64| *event,
            replay: move |from: i64| {
                let head = history.load(Ordering::SeqCst);
                let fails = failing.fetch_sub(1, Ordering::SeqCst) > 0;
                async move {
                    if fails {
                        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                        return Err(AppError::Redis(refused.into()));
                    }
                    Ok(if head < 0 {
                        Replay::Unreachable
                    } else {
                        Replay::loaded((from + 1..=head).collect(), head, |chunk| async {
                            Ok(chunk)
                        })
                    })
                }
            },
            buffer: 100,
            resync: || AppError::ResyncRequired("resync"),
        };
        let stream = resumable(heard, Confirmations::new(vec![confirmations]), resume);
        let source = Source {
            recorded,
            unavailable,
            live,
            confirmed,
        };
        (source, stream)
    }

    /// A stream resumed after 0 from `replay`, whose live source says nothing; the first value
    /// (its senders) keeps that source open.
    fn quietly_resumed<R, F>(replay: R) -> (impl Sized, impl Stream<Item = AppResult<i64>>)
    where
        R: FnMut(i64) -> F + Send + 'static,
        F: Future<Output = AppResult<Replay<i64>>> + Send,
    {
        let (live, heard) = mpsc::unbounded_channel::<AppResult<i64>>();
        let heard = futures_util::stream::unfold(heard, |mut heard| async move {
            heard.recv().await.map(|event| (event, heard))
        });
        let (confirmed, confirmations) = watch::channel(1);
        let resume = Resume {
            after: Some(0),
            position: |event: &i64| *event,
            replay,
            buffer: 100,
            resync: || AppError::ResyncRequired("resync"),
        };
        let stream = resumable(heard, Confirmations::new(vec![confirmations]), resume);
        ((live, confirmed), stream)
    }

    async fn next(stream: &mut (impl Stream<Item = AppResult<i64>> + Unpin)) -> AppResult<i64> {
        tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("an event within 5 s")
            .expect("the stream goes on")
    }

    #[tokio::test]
    async fn live_events_replayed_or_out_of_order_are_dropped_and_a_gap_or_a_reconnect_catches_up_from_the_history()
     {
        let (source, stream) = resumed(2);
        let mut stream = Box::pin(stream);
        source.recorded.store(4, Ordering::SeqCst);
        assert_eq!(next(&mut stream).await.unwrap(), 3);
        assert_eq!(next(&mut stream).await.unwrap(), 4);

        // Heard again after the replay carried it, then the next one.
        source.live.send(Ok(4)).unwrap();
        source.recorded.store(5, Ordering::SeqCst);
        source.live.send(Ok(5)).unwrap();
        assert_eq!(next(&mut stream).await.unwrap(), 5);

        // 6 was lost on the way: 7 is past the next position, and the history has both.
        source.recorded.store(7, Ordering::SeqCst);
        source.live.send(Ok(7)).unwrap();
        assert_eq!(next(&mut stream).await.unwrap(), 6);
        assert_eq!(next(&mut stream).await.unwrap(), 7);
        source.live.send(Ok(6)).unwrap();
        source.recorded.store(8, Ordering::SeqCst);
        source.live.send(Ok(8)).unwrap();
        assert_eq!(next(&mut stream).await.unwrap(), 8);

        // Published while the pub/sub connection was down: never heard, caught up on its return.
        source.recorded.store(9, Ordering::SeqCst);
        source.confirmed.send(2).unwrap();
        assert_eq!(next(&mut stream).await.unwrap(), 9);

        // The history no longer reaches back: one resync, then the end.
        source.recorded.store(-1, Ordering::SeqCst);
        source.live.send(Ok(11)).unwrap();
        assert!(matches!(
            next(&mut stream).await,
            Err(AppError::ResyncRequired("resync"))
        ));
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_history_unavailable_for_a_while_is_read_again_and_the_stream_goes_on() {
        let (source, stream) = resumed(0);
        let mut stream = Box::pin(stream);
        source.recorded.store(1, Ordering::SeqCst);
        assert_eq!(next(&mut stream).await.unwrap(), 1);

        // A failover: the channel is confirmed again while the history's master is still gone.
        source.unavailable.store(3, Ordering::SeqCst);
        source.recorded.store(2, Ordering::SeqCst);
        source.confirmed.send(2).unwrap();
        // Heard live while the history cannot be read: sent after the catch-up, once.
        source.recorded.store(3, Ordering::SeqCst);
        source.live.send(Ok(3)).unwrap();
        assert_eq!(next(&mut stream).await.unwrap(), 2);
        assert_eq!(next(&mut stream).await.unwrap(), 3);
        assert!(source.unavailable.load(Ordering::SeqCst) < 0, "read again");
        source.recorded.store(4, Ordering::SeqCst);
        source.live.send(Ok(4)).unwrap();
        assert_eq!(next(&mut stream).await.unwrap(), 4);
    }

    #[tokio::test]
    async fn an_error_from_the_live_source_ends_the_stream_after_it() {
        let (source, stream) = resumed(0);
        let mut stream = Box::pin(stream);
        source.recorded.store(1, Ordering::SeqCst);
        assert_eq!(next(&mut stream).await.unwrap(), 1);
        source
            .live
            .send(Err(AppError::ResyncRequired("renewed")))
            .unwrap();
        assert!(matches!(
            next(&mut stream).await,
            Err(AppError::ResyncRequired("renewed"))
        ));
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_stream_holds_no_room_for_its_history_reads_between_them() {
        const SCRATCH: usize = 16 * 1024;
        // A read that keeps a large buffer across an await, as a read through SQL and Redis keeps
        // its clients' futures.
        let (_open, stream) = quietly_resumed(|from: i64| async move {
            let scratch = [1u8; SCRATCH];
            tokio::task::yield_now().await;
            let through = from + i64::from(std::hint::black_box(scratch)[0]) - 1;
            Ok(Replay::loaded(
                Vec::new(),
                through,
                |chunk: Vec<i64>| async { Ok(chunk) },
            ))
        });
        let mut stream = Box::pin(stream);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), stream.next())
                .await
                .is_err(),
            "idle after the replay"
        );
        let held = std::mem::size_of_val(&*stream);
        assert!(held < SCRATCH / 8, "{held} bytes held by an idle stream");
    }

    #[tokio::test]
    async fn a_replay_loads_its_events_a_chunk_at_a_time_as_they_are_taken() {
        let chunks_loaded = Arc::new(AtomicI64::new(0));
        let loads = chunks_loaded.clone();
        let entries: Vec<i64> = (1..=10 * REPLAY_CHUNK as i64).collect();
        let Replay::Events {
            mut events,
            through,
        } = Replay::loaded(entries, 10 * REPLAY_CHUNK as i64, move |chunk: Vec<i64>| {
            loads.fetch_add(1, Ordering::SeqCst);
            async move { Ok(chunk) }
        })
        else {
            panic!("a replay of events");
        };
        assert_eq!(through, 10 * REPLAY_CHUNK as i64);
        assert_eq!(
            chunks_loaded.load(Ordering::SeqCst),
            0,
            "nothing before it is taken"
        );
        for expected in 1..=REPLAY_CHUNK as i64 + 1 {
            assert_eq!(events.next().await.unwrap().unwrap(), expected);
        }
        assert_eq!(
            chunks_loaded.load(Ordering::SeqCst),
            2,
            "one chunk per chunk taken"
        );
        let rest: Vec<i64> = events.map(Result::unwrap).collect().await;
        assert_eq!(rest.len(), 10 * REPLAY_CHUNK - REPLAY_CHUNK - 1);
        assert_eq!(rest.last(), Some(&(10 * REPLAY_CHUNK as i64)));
        assert_eq!(chunks_loaded.load(Ordering::SeqCst), 10);
    }

    #[tokio::test]
    async fn a_chunk_whose_store_is_unavailable_is_loaded_again_until_it_is_back() {
        let attempts = Arc::new(AtomicI64::new(0));
        let tried = attempts.clone();
        // The second chunk's store is down for its first two loads.
        let down_for = Arc::new(AtomicI64::new(2));
        let head = 2 * REPLAY_CHUNK as i64;
        let Replay::Events { events, .. } =
            Replay::loaded((1..=head).collect(), head, move |chunk: Vec<i64>| {
                tried.fetch_add(1, Ordering::SeqCst);
                let down = chunk[0] > 1 && down_for.fetch_sub(1, Ordering::SeqCst) > 0;
                async move {
                    if down {
                        return Err(AppError::Unavailable("the store is down"));
                    }
                    Ok(chunk)
                }
            })
        else {
            panic!("a replay of events");
        };
        let started = tokio::time::Instant::now();
        let replayed: Vec<i64> = events.map(Result::unwrap).collect().await;
        assert_eq!(replayed, (1..=head).collect::<Vec<_>>());
        assert_eq!(attempts.load(Ordering::SeqCst), 2 + 2);
        assert!(
            started.elapsed() >= FIRST_REREAD_DELAY * 3,
            "loaded again at once: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_chunk_that_cannot_be_loaded_ends_the_replay_with_its_error() {
        let (_open, stream) = quietly_resumed(|from: i64| async move {
            let head = from + 2 * REPLAY_CHUNK as i64;
            Ok(Replay::loaded(
                (from + 1..=head).collect(),
                head,
                |chunk: Vec<i64>| async move {
                    if chunk[0] > 1 {
                        return Err(AppError::ResyncRequired("lost"));
                    }
                    Ok(chunk)
                },
            ))
        });
        let mut stream = Box::pin(stream);
        for expected in 1..=REPLAY_CHUNK as i64 {
            assert_eq!(next(&mut stream).await.unwrap(), expected);
        }
        assert!(matches!(
            next(&mut stream).await,
            Err(AppError::ResyncRequired("lost"))
        ));
        assert!(stream.next().await.is_none());
    }
}
