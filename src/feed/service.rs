use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::{Stream, StreamExt as _};
use singleflight_async::SingleFlight;

use super::FeedStore;
use crate::accounts::TokenSigner;
use crate::actor::Actor;
use crate::entities::articles;
use crate::error::{AppError, AppResult, SharedResult};
use crate::keys::FeedKeys;
use crate::pagination::{Cursor, Page, PageRequest, Position, Walk};
use crate::realtime::{Confirmations, Hub, Replay, Resume, resumable};
use crate::scripts::SCRIPTS;

/// The viewer's timeline, newest first. Positions are (MAC of viewer and id, article id).
pub const FEED: Walk = Walk("feed");

/// How long a rebuild may hold its lock; a reader finding it held serves from SQL meanwhile.
const REBUILD_LOCK: Duration = Duration::from_secs(10);

/// Rebuilds of one read sent back by follow changes before the read gives up and uses SQL.
const REBUILD_ATTEMPTS: usize = 3;

/// How long an online marker lives; the subscription holding it renews it three times as often.
const ONLINE_TTL: Duration = Duration::from_secs(30);

/// Ids a replay asks of the timeline at a time: most resumes miss a few items, not the limit.
const REPLAY_CHUNK: usize = 100;

/// The resync of a `feedItemAdded` resumed from a cursor not issued to the viewer.
const FOREIGN_CURSOR: &str = "this cursor was not issued for your feed, so nothing can be replayed \
     from it: query `feed` again and subscribe with its newest cursor";

/// The resync of a `feedItemAdded` whose client missed more than one replay carries.
const TOO_FAR_BEHIND: &str = "more items were added to your feed since this cursor than a resumed \
     subscription replays (PULSE_REPLAY_LIMIT): query `feed` again and subscribe with its newest \
     cursor";

/// One page of a timeline.
pub struct FeedPage {
    pub page: Page<articles::Model>,
    /// The viewer's inbox was being rebuilt by another reader: this page came from SQL.
    pub regenerating: bool,
}

/// Candidate ids for a page, before hydration and the follow filter.
struct Candidates {
    ids: Vec<i64>,
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

#[derive(Clone)]
pub struct FeedService {
    store: FeedStore,
    tokens: Arc<TokenSigner>,
    hub: Hub,
    rebuilds: Arc<SingleFlight<i64, SharedResult<Rebuild>>>,
}

impl FeedService {
    pub fn new(store: FeedStore, tokens: Arc<TokenSigner>, hub: Hub) -> Self {
        Self {
            store,
            tokens,
            hub,
            rebuilds: Arc::default(),
        }
    }

    /// Reloads the outboxes and audiences from SQL: `pulse rebuild feed`.
    pub async fn rebuild_all(&self) -> AppResult<super::upkeep::Rebuilt> {
        super::upkeep::rebuild(&self.store).await
    }

    /// Removes the feed keys nothing will use again: `pulse feed vacuum`.
    pub async fn vacuum(&self) -> AppResult<super::upkeep::Vacuumed> {
        super::upkeep::vacuum(&self.store).await
    }

    pub fn store(&self) -> &FeedStore {
        &self.store
    }

    fn position(&self, viewer: i64, article: i64) -> Position<i64> {
        let message = format!("feed:{viewer}:{article}");
        Position {
            key: self.tokens.tag(message.as_bytes()),
            id: article,
        }
    }

    /// A page request for `viewer`'s feed: `BAD_USER_INPUT` for a cursor not issued to them.
    pub fn parse_page(
        &self,
        actor: &Actor,
        first: Option<i32>,
        after: Option<&str>,
    ) -> AppResult<(i64, PageRequest<i64>)> {
        let viewer = actor.require_user()?;
        let request = PageRequest::<i64>::parse(FEED, first, after)?;
        if let Some(after) = request.after
            && after != self.position(viewer, after.id)
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
    /// authors the viewer follows now.
    #[tracing::instrument(skip_all, fields(viewer))]
    pub async fn page(&self, viewer: i64, request: &PageRequest<i64>) -> AppResult<FeedPage> {
        let want = request.fetch_limit() as usize;
        let mut below = request.after.map_or(i64::MAX, |after| after.id);
        let mut rows: Vec<articles::Model> = Vec::with_capacity(want);
        let mut regenerating = false;
        loop {
            let missing = want - rows.len();
            // A few more than missing: some may be filtered out.
            let asked = (missing + missing / 4 + 2) as u64;
            let candidates = self.candidates(viewer, below, asked).await?;
            regenerating |= candidates.regenerating;
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
        let page = Page::from_overfetch(rows, request, |row| self.position(viewer, row.id));
        Ok(FeedPage { page, regenerating })
    }

    /// The articles of `ids` that exist and whose author `viewer` follows, in the order of `ids`.
    async fn hydrate(&self, viewer: i64, ids: &[i64]) -> AppResult<Vec<articles::Model>> {
        let found = self.store.followed_articles(viewer, ids).await?;
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
        let (inbox, regenerating) = match self.read_inbox(viewer, below, limit).await? {
            Some(inbox) => (Some(inbox), false),
            None => match self.rebuild(viewer).await? {
                Rebuild::Ready => (self.read_inbox(viewer, below, limit).await?, false),
                Rebuild::Elsewhere => (None, true),
            },
        };
        let Some(inbox) = inbox else {
            let ids = self.store.sql_feed(viewer, below, limit).await?;
            return Ok(Candidates {
                exhausted: (ids.len() as u64) < limit,
                ids,
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
        let mut merged: Vec<i64> = inbox.ids;
        let celebrities = self.store.followed_celebrities(viewer).await?;
        for celebrity in celebrities {
            let (ids, coverage) = self.store.outbox_page(celebrity, below, limit).await?;
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
            let older = self.store.sql_feed(viewer, floor, more).await?;
            metrics::counter!("pulse_feed_sql_reads_total").increment(1);
            exhausted = (older.len() as u64) < more;
            merged.extend(older);
        }
        Ok(Candidates {
            ids: merged,
            exhausted,
            regenerating,
        })
    }

    async fn read_inbox(&self, viewer: i64, below: i64, limit: u64) -> AppResult<Option<Inbox>> {
        let keys = self.store.redis.keys.feed_user(viewer);
        let max = if below == i64::MAX {
            "+inf".to_owned()
        } else {
            format!("({below}")
        };
        let mut conn = self.store.redis.conn.clone();
        let reply: Vec<i64> = SCRIPTS
            .feed_read
            .key(keys.inbox())
            .arg(max)
            .arg(limit)
            .arg(self.store.settings.inbox_ttl.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        Ok(match reply[..] {
            [1, floor, ..] => Some(Inbox {
                floor,
                ids: reply[2..].to_vec(),
            }),
            _ => None,
        })
    }

    /// Rebuilds `viewer`'s missing inbox by pull; concurrent readers in this process share one
    /// rebuild, and other processes find the lock held.
    async fn rebuild(&self, viewer: i64) -> AppResult<Rebuild> {
        let work = || async { self.rebuild_now(viewer).await.map_err(AppError::shared) };
        self.rebuilds
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
        let store = &self.store;
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

    /// Where a resumed `feedItemAdded` starts: the article id of `after`, a cursor of the viewer's
    /// feed (from `feed` or an earlier item). `BAD_USER_INPUT` when it is malformed;
    /// `RESYNC_REQUIRED` when it was not issued to the viewer (forged, or another viewer's), since
    /// nothing can be replayed from it.
    fn resume_point(&self, viewer: i64, after: Option<&str>) -> AppResult<Option<i64>> {
        let Some(after) = after else {
            return Ok(None);
        };
        let position = Cursor::decode::<i64>(FEED, after)?;
        if position != self.position(viewer, position.id) {
            return Err(AppError::ResyncRequired(FOREIGN_CURSOR));
        }
        Ok(Some(position.id))
    }

    /// The items of `viewer`'s feed above `after`, oldest first, read as pages read them (the
    /// inbox, the celebrities' outboxes, SQL below the inbox's floor), so an inbox rebuilt or
    /// trimmed since still replays exactly; `Unreachable` past the replay limit.
    async fn since(&self, viewer: i64, after: i64) -> AppResult<Replay<articles::Model>> {
        let limit = self.store.settings.replay_limit as usize;
        let mut below = i64::MAX;
        let mut rows: Vec<articles::Model> = Vec::new();
        loop {
            let asked = (limit + 1 - rows.len()).min(REPLAY_CHUNK) as u64;
            let candidates = self.candidates(viewer, below, asked).await?;
            let newer: Vec<i64> = candidates
                .ids
                .iter()
                .copied()
                .take_while(|&id| id > after)
                .collect();
            let reached = newer.len() < candidates.ids.len() || candidates.exhausted;
            rows.extend(self.hydrate(viewer, &newer).await?);
            if rows.len() > limit {
                return Ok(Replay::Unreachable);
            }
            match candidates.ids.last() {
                Some(&last) if !reached => below = last,
                _ => break,
            }
        }
        rows.reverse();
        Ok(Replay::Events(rows))
    }

    /// Articles that join the viewer's feed, with their cursors: with `after` (a cursor of the
    /// viewer's feed), first those above it, oldest first; then those fanned out to the viewer's
    /// inbox and those of the celebrities the viewer follows, as they come, each once. Ends with
    /// `RESYNC_REQUIRED` when the items since `after` cannot be replayed. Keeps the viewer marked
    /// online (fan-out announces only to online users) for as long as the stream is held.
    pub async fn live(
        &self,
        actor: &Actor,
        after: Option<&str>,
    ) -> AppResult<impl Stream<Item = AppResult<(Cursor, articles::Model)>> + use<>> {
        let viewer = actor.require_user()?;
        let after = self.resume_point(viewer, after)?;
        // Only an inbox that exists gets fan-out writes, and announcements come from those.
        if self.read_inbox(viewer, i64::MAX, 1).await?.is_none() {
            self.rebuild(viewer).await?;
        }
        let keys = &self.store.redis.keys;
        let celebrities = self.store.followed_celebrities(viewer).await?;
        let mut channels = vec![keys.feed_channel(viewer)];
        channels.extend(
            celebrities
                .iter()
                .map(|&author| keys.feed_author_channel(author)),
        );
        let subscriptions: Vec<_> = channels
            .into_iter()
            .map(|channel| self.hub.subscribe(channel))
            .collect();
        let confirmations = Confirmations::new(
            subscriptions
                .iter()
                .map(|subscription| subscription.confirmations())
                .collect(),
        );
        let messages = futures_util::stream::select_all(subscriptions);
        let presence = Presence::start(self.store.clone(), viewer).await?;
        let service = self.clone();
        let arrivals = messages.filter_map(move |payload| {
            let service = service.clone();
            let _held = &presence;
            async move {
                let article: i64 = std::str::from_utf8(&payload).ok()?.parse().ok()?;
                service.hydrate(viewer, &[article]).await.ok()?.pop()
            }
        });
        let history = self.clone();
        let resume = Resume {
            after,
            position: |row: &articles::Model| row.id,
            replay: move |from| {
                let history = history.clone();
                async move { history.since(viewer, from).await }
            },
            buffer: self.store.settings.replay_limit as usize,
            resync: || AppError::ResyncRequired(TOO_FAR_BEHIND),
        };
        let service = self.clone();
        Ok(resumable(arrivals, confirmations, resume).map(move |item| {
            item.map(|row| {
                let cursor = Cursor::encode(FEED, &service.position(viewer, row.id));
                (cursor, row)
            })
        }))
    }
}

struct Inbox {
    /// The inbox holds every article of the fanned-out followees from here up.
    floor: i64,
    /// Those below the cursor, at or above the floor, newest first.
    ids: Vec<i64>,
}

/// Keeps a user's online marker alive until dropped (with the subscription that holds it).
struct Presence {
    stop: tokio_util::sync::CancellationToken,
}

impl Presence {
    /// Marks `user` online before returning, so that every item fanned out from then on is
    /// announced (a resumed stream reads its history after this), and keeps the marker alive.
    async fn start(store: FeedStore, user: i64) -> AppResult<Self> {
        let key = store.redis.keys.feed_user(user).online();
        mark_online(&store, &key).await?;
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(ONLINE_TTL / 3) => {}
                    _ = stopped.cancelled() => break,
                }
                if let Err(err) = mark_online(&store, &key).await {
                    tracing::warn!(error = %err, "cannot renew a feed subscriber's online marker");
                }
            }
        });
        Ok(Self { stop })
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

impl Drop for Presence {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
