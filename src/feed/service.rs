use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures_util::{FutureExt as _, Stream, StreamExt as _};
use pulse_kit::actor::Actor;
use singleflight_async::SingleFlight;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::FeedStore;
use crate::accounts::TokenSigner;
use crate::entities::articles;
use crate::error::{AppError, AppResult, SharedResult};
use crate::keys::FeedKeys;
use crate::pagination::{Cursor, Page, PageRequest, Position, SortKey, Walk};
use crate::realtime::{Confirmations, Hub, Replay, Resume, Sharding, resumable};
use crate::scripts::SCRIPTS;

/// The viewer's timeline, newest first. Positions are ([`FeedKey`], article id).
pub const FEED: Walk = Walk("feed");

/// The sort key of a feed cursor: a MAC that ties the cursor to its viewer (over the id and the
/// mark), and where the item stands in the viewer's journal. Pages page by the id alone; a resumed
/// `feedItemAdded` starts from the mark. Cursors issued before the journal existed, and those of a
/// page read from SQL while the inbox was being rebuilt, have no mark: they page, and a
/// subscription resumed from them is told to resync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeedKey {
    tag: i64,
    mark: Option<Mark>,
}

/// Where a client stands in its viewer's journal (see `lua/feed_read.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    /// The journal's epoch: a journal created again has another, and nothing of it replays.
    epoch: i64,
    /// The client has every article delivered up to this position.
    position: i64,
    /// The cursor comes from a page (or from the replay of one): the client also has the feed's
    /// items at or below the cursor's id as they were when `position` was newest, and none above
    /// it, so a resume replays those above the id as well.
    page: bool,
}

impl SortKey for FeedKey {
    fn write(&self) -> String {
        match self.mark {
            None => self.tag.to_string(),
            Some(mark) => format!(
                "{}.{}.{}.{}",
                self.tag,
                mark.epoch,
                mark.position,
                if mark.page { "p" } else { "j" }
            ),
        }
    }

    fn read(raw: &str) -> Option<Self> {
        let mut parts = raw.split('.');
        let tag = parts.next()?.parse().ok()?;
        let mark = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (None, ..) => None,
            (Some(epoch), Some(position), Some(kind), None) => Some(Mark {
                epoch: epoch.parse().ok()?,
                position: position.parse().ok()?,
                page: match kind {
                    "p" => true,
                    "j" => false,
                    _ => return None,
                },
            }),
            _ => return None,
        };
        Some(Self { tag, mark })
    }
}

/// How long a rebuild may hold its lock; a reader finding it held serves from SQL meanwhile.
const REBUILD_LOCK: Duration = Duration::from_secs(10);

/// Rebuilds of one read sent back by follow changes before the read gives up and uses SQL.
const REBUILD_ATTEMPTS: usize = 3;

/// How long an online marker lives; the process renews its subscribers' markers three times as often.
const ONLINE_TTL: Duration = Duration::from_secs(30);

/// Announcements a `feedItemAdded` may fall behind on its viewer's own channel before it skips
/// them and catches up from the journal. The channel carries that viewer's items alone, and each
/// slot of its buffer is allocated when the subscription starts: 256, the hub's default, cost
/// 10 KiB per idle subscriber.
const VIEWER_BUFFER: usize = 16;

/// Ids a replay asks of the timeline at a time: most resumes miss a few items, not the limit.
const REPLAY_IDS_PER_READ: usize = 100;

/// The resync of a `feedItemAdded` resumed from a cursor not issued to the viewer.
const FOREIGN_CURSOR: &str = "this cursor was not issued for your feed, so nothing can be replayed \
     from it: query `feed` again and subscribe with its newest cursor";

/// The resync of a `feedItemAdded` resumed from a cursor without a journal position.
const UNMARKED_CURSOR: &str = "this cursor holds no position in your feed's journal (it was issued \
     before positions were kept, or while your feed was being rebuilt), so nothing can be replayed \
     from it: query `feed` again and subscribe with its newest cursor";

/// The resync of a `feedItemAdded` whose journal was created again since its cursor, or under it.
const JOURNAL_RENEWED: &str = "your feed was rebuilt since this cursor (it had expired, or the \
     cache lost it), so what was added meanwhile cannot be replayed: query `feed` again and \
     subscribe with its newest cursor";

/// The error of a `feedItemAdded` whose inbox is being rebuilt by another process.
const REBUILDING: &str = "your feed is being rebuilt: query `feed` again and subscribe with its \
     newest cursor";

/// The resync of a `feedItemAdded` whose client missed more than one replay carries, or whose
/// journal no longer reaches back to its cursor.
const TOO_FAR_BEHIND: &str = "more items were added to your feed since this cursor than a resumed \
     subscription replays (PULSE_REPLAY_LIMIT), or your feed was rebuilt since: query `feed` \
     again and subscribe with its newest cursor";

/// One page of a timeline.
pub struct FeedPage {
    pub page: Page<articles::Model>,
    /// The viewer's inbox was being rebuilt by another reader: this page came from SQL.
    pub regenerating: bool,
}

/// Candidate ids for a page, before hydration and the follow filter.
struct Candidates {
    ids: Vec<i64>,
    /// The journal as the inbox read found it; none when the page came from SQL.
    journal: Option<Journal>,
    /// Nothing older than the last candidate exists.
    exhausted: bool,
    regenerating: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rebuild {
    /// The inbox exists now.
    Ready,
    /// Another process holds the rebuild lock.
    Elsewhere,
}

/// One pointer wide: a live subscriber's stream holds a clone for as long as it lives.
#[derive(Clone)]
pub struct FeedService(Arc<Shared>);

struct Shared {
    store: FeedStore,
    tokens: Arc<TokenSigner>,
    hub: Hub,
    rebuilds: Arc<SingleFlight<i64, SharedResult<Rebuild>>>,
    live_articles: LiveArticles,
    presences: Presences,
}

/// A live item's article and the subscriber it goes to, and where its row (or none: deleted, or
/// an author the subscriber no longer follows) is answered.
type LiveRead = (
    (i64, i64),
    oneshot::Sender<SharedResult<Option<articles::Model>>>,
);

/// Most live reads answered by one pair of queries.
const LIVE_BATCH: usize = 500;

/// The articles of live items, checked against each subscriber's follows, for all of a process's
/// subscribers at once: an item fanned out to a thousand followers online here is read in a few
/// batches of two queries, not once per follower. While one batch is read, the reads asked for
/// meanwhile queue and go together in the next, so a lone item waits for nothing.
#[derive(Clone)]
struct LiveArticles {
    store: FeedStore,
    /// Started by the first read, from inside the runtime; it ends when the last clone of the
    /// service is dropped and the channel closes.
    reads: Arc<OnceLock<mpsc::UnboundedSender<LiveRead>>>,
}

impl LiveArticles {
    fn new(store: FeedStore) -> Self {
        Self {
            store,
            reads: Arc::default(),
        }
    }

    async fn read(&self, viewer: i64, article: i64) -> AppResult<Option<articles::Model>> {
        let reads = self.reads.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(Self::serve(self.store.clone(), receiver));
            sender
        });
        let (answer, answered) = oneshot::channel();
        reads
            .send(((viewer, article), answer))
            .map_err(|_| AppError::Internal("the live article reader has stopped".into()))?;
        answered
            .await
            .map_err(|_| AppError::Internal("the live article reader has stopped".into()))?
            .map_err(AppError::Shared)
    }

    async fn serve(store: FeedStore, mut reads: mpsc::UnboundedReceiver<LiveRead>) {
        let mut batch = Vec::with_capacity(LIVE_BATCH);
        while reads.recv_many(&mut batch, LIVE_BATCH).await > 0 {
            let pairs: Vec<(i64, i64)> = batch.iter().map(|(pair, _)| *pair).collect();
            match store.followed_articles_of(&pairs).await {
                Ok(found) => {
                    for (pair, answer) in batch.drain(..) {
                        let _ = answer.send(Ok(found.get(&pair).cloned()));
                    }
                }
                Err(err) => {
                    let err = err.shared();
                    for (_, answer) in batch.drain(..) {
                        let _ = answer.send(Err(err.clone()));
                    }
                }
            }
        }
    }
}

impl FeedService {
    pub fn new(store: FeedStore, tokens: Arc<TokenSigner>, hub: Hub) -> Self {
        Self(Arc::new(Shared {
            live_articles: LiveArticles::new(store.clone()),
            presences: Presences::default(),
            store,
            tokens,
            hub,
            rebuilds: Arc::default(),
        }))
    }

    /// Reloads the outboxes and audiences from SQL: `pulse rebuild feed`.
    pub async fn rebuild_all(&self) -> AppResult<super::upkeep::Rebuilt> {
        super::upkeep::rebuild(&self.0.store).await
    }

    /// Removes the feed keys nothing will use again: `pulse feed vacuum`.
    pub async fn vacuum(&self) -> AppResult<super::upkeep::Vacuumed> {
        super::upkeep::vacuum(&self.0.store).await
    }

    pub fn store(&self) -> &FeedStore {
        &self.0.store
    }

    fn position(&self, viewer: i64, article: i64, mark: Option<Mark>) -> Position<FeedKey> {
        let message = match mark {
            None => format!("feed:{viewer}:{article}"),
            Some(mark) => format!(
                "feed:{viewer}:{article}:{}:{}:{}",
                mark.epoch, mark.position, mark.page
            ),
        };
        Position {
            key: FeedKey {
                tag: self.0.tokens.tag(message.as_bytes()),
                mark,
            },
            id: article,
        }
    }

    /// A page request for `viewer`'s feed: `BAD_USER_INPUT` for a cursor not issued to them.
    pub fn parse_page(
        &self,
        actor: &Actor,
        first: Option<i32>,
        after: Option<&str>,
    ) -> AppResult<(i64, PageRequest<FeedKey>)> {
        let viewer = actor.require_user()?;
        let request = PageRequest::<FeedKey>::parse(FEED, first, after)?;
        if let Some(after) = request.after
            && after != self.position(viewer, after.id, after.key.mark)
        {
            return Err(AppError::bad_input(
                "after",
                "this cursor was not issued for your feed",
            ));
        }
        Ok((viewer, request))
    }

    /// A page of the viewer's timeline: from the inbox (rebuilt first when missing), merged with
    /// the celebrities' outboxes, continued from SQL past the cached window; only articles of
    /// authors the viewer follows now. Its cursors carry the journal's position as the first
    /// inbox read found it, which says what the page holds to a subscription resumed from them.
    #[tracing::instrument(skip_all, fields(viewer))]
    pub async fn page(&self, viewer: i64, request: &PageRequest<FeedKey>) -> AppResult<FeedPage> {
        let want = request.fetch_limit() as usize;
        let mut below = request.after.map_or(i64::MAX, |after| after.id);
        let mut rows: Vec<articles::Model> = Vec::with_capacity(want);
        let mut regenerating = false;
        let mut journal = None;
        loop {
            let missing = want - rows.len();
            // A few more than missing: some may be filtered out.
            let asked = (missing + missing / 4 + 2) as u64;
            let candidates = self.candidates(viewer, below, asked).await?;
            regenerating |= candidates.regenerating;
            // As the first read found it: the page holds what was delivered up to then.
            journal.get_or_insert(candidates.journal);
            let Some(&last) = candidates.ids.last() else {
                break;
            };
            rows.extend(self.hydrate(viewer, &candidates.ids).await?);
            below = last;
            if rows.len() >= want || candidates.exhausted {
                break;
            }
        }
        rows.truncate(want);
        let mark = journal.flatten().map(|journal| Mark {
            epoch: journal.epoch,
            position: journal.head,
            page: true,
        });
        let page = Page::from_overfetch(rows, request, |row| self.position(viewer, row.id, mark));
        Ok(FeedPage { page, regenerating })
    }

    /// The articles of `ids` that exist and whose author `viewer` follows, in the order of `ids`.
    async fn hydrate(&self, viewer: i64, ids: &[i64]) -> AppResult<Vec<articles::Model>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let found = self.0.store.followed_articles(viewer, ids).await?;
        let mut by_id: HashMap<i64, articles::Model> =
            found.into_iter().map(|row| (row.id, row)).collect();
        Ok(ids.iter().filter_map(|id| by_id.remove(id)).collect())
    }

    /// Up to `limit` ids below `below`, newest first. Each source (the inbox, each celebrity's
    /// outbox) is exact down to a floor: the last id it gave when it gave `limit`; else, for the
    /// inbox, its own floor (raised by backfills that could not take everything, and by trims),
    /// and for an outbox the lowest it holds, or 0 when it holds the whole history. Above the
    /// highest floor the merge is exact; below it, SQL continues.
    async fn candidates(&self, viewer: i64, below: i64, limit: u64) -> AppResult<Candidates> {
        let (inbox, regenerating) = match read_inbox(&self.0.store, viewer, below, limit).await? {
            Some(inbox) => (Some(inbox), false),
            None => match self.rebuild(viewer).await? {
                Rebuild::Ready => (
                    read_inbox(&self.0.store, viewer, below, limit).await?,
                    false,
                ),
                Rebuild::Elsewhere => (None, true),
            },
        };
        let Some(inbox) = inbox else {
            let ids = self.0.store.sql_feed(viewer, below, limit).await?;
            return Ok(Candidates {
                exhausted: (ids.len() as u64) < limit,
                ids,
                journal: None,
                regenerating,
            });
        };
        let floor_of = |ids: &[i64], floor: i64| -> i64 {
            if ids.len() as u64 == limit {
                *ids.last().expect("limit > 0")
            } else {
                floor.min(below)
            }
        };
        let mut floor = floor_of(&inbox.ids, inbox.floor);
        let journal = Some(inbox.journal);
        let mut merged: Vec<i64> = inbox.ids;
        let celebrities = self.0.store.followed_celebrities(viewer).await?;
        for celebrity in celebrities {
            let (ids, coverage) = self.0.store.outbox_page(celebrity, below, limit).await?;
            let outbox_floor = if coverage.complete {
                0
            } else if coverage.lowest > 0 {
                coverage.lowest
            } else {
                below
            };
            floor = floor.max(floor_of(&ids, outbox_floor));
            merged.extend(ids);
        }
        merged.sort_unstable_by(|a, b| b.cmp(a));
        merged.dedup();
        merged.retain(|&id| id >= floor);
        merged.truncate(limit as usize);
        let mut exhausted = floor == 0 && (merged.len() as u64) < limit;
        if (merged.len() as u64) < limit && floor > 0 {
            let more = limit - merged.len() as u64;
            let older = self.0.store.sql_feed(viewer, floor, more).await?;
            metrics::counter!("pulse_feed_sql_reads_total").increment(1);
            exhausted = (older.len() as u64) < more;
            merged.extend(older);
        }
        Ok(Candidates {
            ids: merged,
            journal,
            exhausted,
            regenerating,
        })
    }

    /// Rebuilds `viewer`'s missing inbox by pull; concurrent readers in this process share one
    /// rebuild, and other processes find the lock held.
    async fn rebuild(&self, viewer: i64) -> AppResult<Rebuild> {
        let work = || async { self.rebuild_now(viewer).await.map_err(AppError::shared) };
        self.0
            .rebuilds
            .work(viewer, work)
            .await
            .map_err(AppError::Shared)
    }

    /// Rebuilds under the lock; starts over when a follow or unfollow meanwhile sent the rebuild
    /// back (its pull may predate the change), a few times before leaving it to the next read.
    #[tracing::instrument(skip_all, fields(viewer))]
    async fn rebuild_now(&self, viewer: i64) -> AppResult<Rebuild> {
        for _ in 0..REBUILD_ATTEMPTS {
            match self.rebuild_once(viewer).await? {
                Some(rebuild) => return Ok(rebuild),
                None => metrics::counter!("pulse_feed_rebuilds_restarted_total").increment(1),
            }
        }
        Ok(Rebuild::Elsewhere)
    }

    /// One rebuild; `None` when it must start over.
    async fn rebuild_once(&self, viewer: i64) -> AppResult<Option<Rebuild>> {
        let store = &self.0.store;
        let keys = store.redis.keys.feed_user(viewer);
        let token = format!("{:016x}", rand::random::<u64>());
        let mut conn = store.redis.conn.clone();
        let began: i64 = SCRIPTS
            .feed_rebuild_begin
            .key(keys.inbox())
            .key(keys.inbox_building())
            .key(keys.rebuild_lock())
            .arg(&token)
            .arg(REBUILD_LOCK.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        match began {
            2 => return Ok(Some(Rebuild::Ready)),
            0 => return Ok(Some(Rebuild::Elsewhere)),
            _ => {}
        }
        // Read after the building key exists: a follow change committed before this read is in
        // it, and one committed after finds the building key and sends this rebuild back.
        let followees = store.followees(viewer).await?;
        // In the audiences before the pull, so what is published meanwhile is either pulled or
        // fanned out into the building key.
        let fanned_out = store.join_and_split(viewer, &followees).await?;
        let timeline = store.timeline(&fanned_out).await?;
        let mut install = SCRIPTS.feed_rebuild_install.prepare_invoke();
        install
            .key(keys.inbox())
            .key(keys.inbox_building())
            .key(keys.rebuild_lock())
            .arg(&token)
            .arg(store.settings.inbox_ttl.as_millis() as u64)
            .arg(store.settings.cap)
            .arg(timeline.floor);
        for id in &timeline.ids {
            install.arg(*id);
        }
        let installed: i64 = install.invoke_async(&mut conn).await?;
        store.counters.rebuilds.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("pulse_feed_rebuilds_total").increment(1);
        Ok(match installed {
            1 => Some(Rebuild::Ready),
            2 => None,
            _ => Some(Rebuild::Elsewhere),
        })
    }

    /// Where a resumed `feedItemAdded` starts: the article id and journal mark of `after`, a
    /// cursor of the viewer's feed (from `feed` or an earlier item). `BAD_USER_INPUT` when it is
    /// malformed; `RESYNC_REQUIRED` when it was not issued to the viewer (forged, or another
    /// viewer's) or holds no mark, since nothing can be replayed from it.
    fn resume_point(&self, viewer: i64, after: Option<&str>) -> AppResult<Option<(i64, Mark)>> {
        let Some(after) = after else {
            return Ok(None);
        };
        let position = Cursor::decode::<FeedKey>(FEED, after)?;
        if position != self.position(viewer, position.id, position.key.mark) {
            return Err(AppError::ResyncRequired(FOREIGN_CURSOR));
        }
        let mark = position
            .key
            .mark
            .ok_or(AppError::ResyncRequired(UNMARKED_CURSOR))?;
        Ok(Some((position.id, mark)))
    }

    /// The ids of `viewer`'s feed above `after`, oldest first, read as pages read them (the
    /// inbox, the celebrities' outboxes, SQL below the inbox's floor), so an inbox rebuilt or
    /// trimmed since still replays exactly; `None` past the replay limit. Their rows are loaded
    /// as the replay is taken.
    async fn since(&self, viewer: i64, after: i64) -> AppResult<Option<Vec<i64>>> {
        let limit = self.0.store.settings.replay_limit as usize;
        let mut below = i64::MAX;
        let mut ids: Vec<i64> = Vec::new();
        loop {
            let asked = (limit + 1 - ids.len()).min(REPLAY_IDS_PER_READ) as u64;
            let candidates = self.candidates(viewer, below, asked).await?;
            let before = ids.len();
            ids.extend(candidates.ids.iter().copied().take_while(|&id| id > after));
            let reached = ids.len() - before < candidates.ids.len() || candidates.exhausted;
            if ids.len() > limit {
                return Ok(None);
            }
            match candidates.ids.last() {
                Some(&last) if !reached => below = last,
                _ => break,
            }
        }
        ids.reverse();
        Ok(Some(ids))
    }

    /// The articles delivered into `viewer`'s journal of `epoch` after `position`, oldest first,
    /// with their positions, and the newest position; `None` when the journal is not of that
    /// epoch, no longer reaches back to `position`, or holds more than the replay limit after it.
    async fn journal_since(
        &self,
        viewer: i64,
        epoch: i64,
        position: i64,
    ) -> AppResult<Option<(i64, Vec<(i64, i64)>)>> {
        let keys = self.0.store.redis.keys.feed_user(viewer);
        let mut conn = self.0.store.redis.conn.clone();
        let reply: Vec<i64> = SCRIPTS
            .journal_read
            .key(keys.journal())
            .arg(epoch)
            .arg(position)
            .arg(self.0.store.settings.replay_limit)
            .invoke_async(&mut conn)
            .await?;
        Ok(match reply[..] {
            [1, head, ..] => Some((
                head,
                reply[2..]
                    .chunks_exact(2)
                    .map(|pair| (pair[0], pair[1]))
                    .collect(),
            )),
            _ => None,
        })
    }

    /// What a `feedItemAdded` of `viewer` missed since `position` of the journal of `epoch`:
    /// with `page_above` (a resume from a page's cursor), first the feed's items above that id
    /// that the journal does not list after `position` (the client's page did not hold them),
    /// oldest first; then every article the journal lists after `position`, in its order.
    async fn replay(
        &self,
        viewer: i64,
        epoch: i64,
        position: i64,
        page_above: Option<i64>,
    ) -> AppResult<Replay<FeedEvent>> {
        let above = match page_above {
            Some(id) => match self.since(viewer, id).await? {
                Some(ids) => ids,
                None => return Ok(Replay::Unreachable),
            },
            None => Vec::new(),
        };
        // Read after the page's part: what was delivered while that was read is listed here.
        let Some((through, entries)) = self.journal_since(viewer, epoch, position).await? else {
            return Ok(Replay::Unreachable);
        };
        let listed: HashSet<i64> = entries.iter().map(|&(id, _)| id).collect();
        let page_mark = Mark {
            epoch,
            position,
            page: true,
        };
        let mut marked: Vec<(Mark, i64)> = above
            .into_iter()
            .filter(|id| !listed.contains(id))
            .map(|id| (page_mark, id))
            .collect();
        marked.extend(entries.into_iter().map(|(id, position)| {
            let mark = Mark {
                epoch,
                position,
                page: false,
            };
            (mark, id)
        }));
        if marked.len() > self.0.store.settings.replay_limit as usize {
            return Ok(Replay::Unreachable);
        }
        let service = self.clone();
        Ok(Replay::loaded(
            marked,
            through,
            move |chunk: Vec<(Mark, i64)>| {
                let service = service.clone();
                async move {
                    let ids: Vec<i64> = chunk.iter().map(|&(_, id)| id).collect();
                    let mut rows: HashMap<i64, articles::Model> = service
                        .hydrate(viewer, &ids)
                        .await?
                        .into_iter()
                        .map(|row| (row.id, row))
                        .collect();
                    Ok(chunk
                        .into_iter()
                        .map(|(mark, id)| FeedEvent {
                            mark,
                            row: rows.remove(&id),
                        })
                        .collect())
                }
            },
        ))
    }

    /// Opens `viewer`'s journal beside their inbox (rebuilt first when missing: only an inbox
    /// that exists gets fan-out writes, and announcements come from those).
    async fn open_journal(&self, viewer: i64) -> AppResult<Journal> {
        if let Some(inbox) = read_inbox(&self.0.store, viewer, i64::MAX, 1).await? {
            return Ok(inbox.journal);
        }
        self.rebuild(viewer).await?;
        match read_inbox(&self.0.store, viewer, i64::MAX, 1).await? {
            Some(inbox) => Ok(inbox.journal),
            None => Err(AppError::ResyncRequired(REBUILDING)),
        }
    }

    /// The payload of an announcement on the viewer's channel: "epoch:position:id".
    fn announced(payload: &[u8]) -> Option<(i64, i64, i64)> {
        let text = std::str::from_utf8(payload).ok()?;
        let mut parts = text.split(':');
        let epoch = parts.next()?.parse().ok()?;
        let position = parts.next()?.parse().ok()?;
        let id = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some((epoch, position, id))
    }

    /// Articles that join the viewer's feed, with their cursors, in the order they were delivered
    /// to it (its journal's): with `after` (a cursor of the viewer's feed), first those delivered
    /// since that cursor was issued, then the new ones, each once. The celebrities' articles,
    /// heard on their channels, are delivered to the viewer's inbox here, which gives them their
    /// positions. Ends with `RESYNC_REQUIRED` when the items since `after` cannot be replayed.
    /// Keeps the viewer marked online (fan-out announces only to online users) and their inbox
    /// and journal alive for as long as the stream is held.
    pub async fn live(
        &self,
        actor: &Actor,
        after: Option<&str>,
    ) -> AppResult<impl Stream<Item = AppResult<(Cursor, articles::Model)>> + use<>> {
        let viewer = actor.require_user()?;
        let after = self.resume_point(viewer, after)?;
        let journal = self.open_journal(viewer).await?;
        let epoch = journal.epoch;
        let (start, mut page_above) = match after {
            None => (journal.head, None),
            Some((_, mark)) if mark.epoch != epoch => {
                return Err(AppError::ResyncRequired(JOURNAL_RENEWED));
            }
            Some((id, mark)) => (mark.position, mark.page.then_some(id)),
        };
        let keys = &self.0.store.redis.keys;
        let own = self.0.hub.subscribe_buffered(
            keys.feed_channel(viewer),
            Sharding::Sharded,
            VIEWER_BUFFER,
        );
        let celebrities: Vec<_> = self
            .0
            .store
            .followed_celebrities(viewer)
            .await?
            .into_iter()
            .map(|author| {
                let channel = keys.feed_author_channel(author);
                (author, self.0.hub.subscribe_as(channel, Sharding::Sharded))
            })
            .collect();
        let mut confirmations = vec![own.confirmations()];
        confirmations.extend(celebrities.iter().map(|(_, heard)| heard.confirmations()));
        let mut heard = vec![own.map(Heard::Own).boxed()];
        heard.extend(celebrities.into_iter().map(|(author, subscription)| {
            subscription
                .map(move |payload| Heard::Celebrity(author, payload))
                .boxed()
        }));
        let presence = self.0.presences.hold(&self.0.store, viewer).await?;
        let service = self.clone();
        // Each item's work is boxed, so that the stream holds its space only while an item is
        // read, not for as long as the subscriber is idle.
        let arrivals = futures_util::stream::select_all(heard).filter_map(move |heard| {
            let service = service.clone();
            let _held = &presence;
            let arrival = async move {
                match heard {
                    Heard::Own(payload) => {
                        let (of, position, article) = Self::announced(&payload)?;
                        if of != epoch {
                            return Some(Err(AppError::ResyncRequired(JOURNAL_RENEWED)));
                        }
                        let row = match service.0.live_articles.read(viewer, article).await {
                            Ok(row) => row,
                            Err(err) => return Some(Err(err)),
                        };
                        let mark = Mark {
                            epoch,
                            position,
                            page: false,
                        };
                        Some(Ok(FeedEvent { mark, row }))
                    }
                    Heard::Celebrity(author, payload) => {
                        let article: i64 = std::str::from_utf8(&payload).ok()?.parse().ok()?;
                        // Announced back on the viewer's channel, with its position, unless
                        // another of the viewer's subscriptions delivered it first.
                        let delivered = service
                            .0
                            .store
                            .deliver(author, &[article], &[viewer], true)
                            .await;
                        if let Err(err) = delivered {
                            tracing::warn!(error = %err, article, "cannot deliver a celebrity's article to a subscriber's inbox");
                        }
                        None
                    }
                }
            };
            arrival.boxed()
        });
        let history = self.clone();
        let resume = Resume {
            after: Some(start),
            position: |event: &FeedEvent| event.mark.position,
            replay: move |from| {
                let history = history.clone();
                let page_above = page_above.take();
                async move { history.replay(viewer, epoch, from, page_above).await }
            },
            buffer: self.0.store.settings.replay_limit as usize,
            resync: || AppError::ResyncRequired(TOO_FAR_BEHIND),
        };
        let service = self.clone();
        let events = resumable(arrivals, Confirmations::new(confirmations), resume);
        Ok(events.filter_map(move |event| {
            let item = match event {
                Ok(FeedEvent { mark, row }) => row.map(|row| {
                    let cursor =
                        Cursor::encode(FEED, &service.position(viewer, row.id, Some(mark)));
                    Ok((cursor, row))
                }),
                Err(err) => Some(Err(err)),
            };
            std::future::ready(item)
        }))
    }
}

struct Inbox {
    /// The inbox holds every article of the fanned-out followees from here up.
    floor: i64,
    /// The journal, read in the same step.
    journal: Journal,
    /// Those below the cursor, at or above the floor, newest first.
    ids: Vec<i64>,
}

/// A viewer's journal as one read found it.
#[derive(Clone, Copy, Debug)]
struct Journal {
    epoch: i64,
    /// The newest position: every article delivered before the read has one up to it.
    head: i64,
}

/// One item of a resumed `feedItemAdded`, with where it stands; `row` is none for an article the
/// viewer no longer sees (its author unfollowed, or it was deleted), whose position still counts.
struct FeedEvent {
    mark: Mark,
    row: Option<articles::Model>,
}

/// What a `feedItemAdded` hears.
enum Heard {
    /// "epoch:position:id" on the viewer's channel.
    Own(Arc<[u8]>),
    /// An article id on a followed celebrity's channel.
    Celebrity(i64, Arc<[u8]>),
}

/// The users holding a `feedItemAdded` subscription in this process, by how many, whose online
/// markers (and inboxes and journals) one task renews for all of them: a subscriber costs an entry
/// here, not a task and a timer of its own, and a user with several subscriptions is renewed once.
#[derive(Default)]
struct Presences {
    online: Online,
    /// The renewing task, started by the first subscriber from inside the runtime; dropping the
    /// service stops it.
    renewing: OnceLock<DropGuard>,
}

/// The users online through this process, with how many subscriptions each.
type Online = Arc<Mutex<HashMap<i64, usize>>>;

/// Renewals in flight at once: a pass over 10,000 subscribers is a few hundred round trips deep,
/// well within a renewal period, without a burst of 10,000 commands at Redis.
const RENEWALS_IN_FLIGHT: usize = 32;

impl Presences {
    /// Marks `user` online before returning, so that every item fanned out from then on is
    /// announced (a resumed stream reads its history after this), and keeps the marker alive, and
    /// the inbox and journal with it, until the returned presence is dropped: a subscriber is an
    /// active reader even when it reads no page.
    async fn hold(&self, store: &FeedStore, user: i64) -> AppResult<Presence> {
        let key = store.redis.keys.feed_user(user).online();
        mark_online(store, &key).await?;
        *lock(&self.online).entry(user).or_default() += 1;
        self.renewing.get_or_init(|| {
            let stop = CancellationToken::new();
            let renewing = Self::renew(store.clone(), self.online.clone());
            let stopped = stop.clone();
            tokio::spawn(async move { stopped.run_until_cancelled(renewing).await });
            stop.drop_guard()
        });
        Ok(Presence(Box::new((self.online.clone(), user))))
    }

    async fn renew(store: FeedStore, online: Online) {
        loop {
            tokio::time::sleep(ONLINE_TTL / 3).await;
            let users: Vec<i64> = lock(&online).keys().copied().collect();
            futures_util::stream::iter(users)
                .for_each_concurrent(RENEWALS_IN_FLIGHT, |user| {
                    let store = &store;
                    async move {
                        let key = store.redis.keys.feed_user(user).online();
                        if let Err(err) = mark_online(store, &key).await {
                            tracing::warn!(error = %err, "cannot renew a feed subscriber's online marker");
                        }
                        if let Err(err) = read_inbox(store, user, i64::MAX, 1).await {
                            tracing::warn!(error = %err, "cannot renew a feed subscriber's inbox");
                        }
                    }
                })
                .await;
        }
    }
}

/// A subscription's share of its user's presence; the user stays online (until the marker
/// expires) while any share is held. One pointer wide: it lives in the subscription's stream,
/// whose every byte an idle subscriber keeps.
struct Presence(Box<(Online, i64)>);

impl Drop for Presence {
    fn drop(&mut self) {
        let (online, user) = &*self.0;
        let mut online = lock(online);
        if let Some(held) = online.get_mut(user) {
            *held -= 1;
            if *held == 0 {
                online.remove(user);
            }
        }
    }
}

async fn mark_online(store: &FeedStore, key: &str) -> redis::RedisResult<()> {
    let mut conn = store.redis.conn.clone();
    redis::cmd("SET")
        .arg(key)
        .arg(1)
        .arg("PX")
        .arg(ONLINE_TTL.as_millis() as u64)
        .query_async(&mut conn)
        .await
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The inbox of `viewer` below `below` (exclusive; `i64::MAX` for its top), at most `limit` ids,
/// renewing its and its journal's lives; `None` when it does not exist.
async fn read_inbox(
    store: &FeedStore,
    viewer: i64,
    below: i64,
    limit: u64,
) -> AppResult<Option<Inbox>> {
    let keys = store.redis.keys.feed_user(viewer);
    let max = if below == i64::MAX {
        "+inf".to_owned()
    } else {
        format!("({below}")
    };
    let mut conn = store.redis.conn.clone();
    let reply: Vec<i64> = SCRIPTS
        .feed_read
        .key(keys.inbox())
        .key(keys.journal())
        .arg(max)
        .arg(limit)
        .arg(store.settings.inbox_ttl.as_millis() as u64)
        .invoke_async(&mut conn)
        .await?;
    Ok(match reply[..] {
        [1, floor, epoch, head, ..] => Some(Inbox {
            floor,
            journal: Journal { epoch, head },
            ids: reply[4..].to_vec(),
        }),
        _ => None,
    })
}
