//! Live leaderboards (`leaderboardChanged`): the top of one board of one poll, pushed as votes
//! move it.
//!
//! The vote script announces every accepted ballot on the poll's channel, whichever process cast
//! it. Per process, one coalescing watcher per watched (poll, period, board) reads the board at
//! most once per tick, however many subscribers and votes (see [`pulse_runtime::realtime::coalesce`]),
//! and again when the period's bucket ends. Each subscriber gets the snapshot at once, then only
//! the snapshots whose visible top (its `first` entries) changed; every snapshot carries the
//! poll's vote sequence as its version.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::{FutureExt as _, Stream, StreamExt as _};
use pulse_runtime::error::AppResult;
use pulse_runtime::realtime::{Coalescer, CoalescerConfig, Hub, Sharding, Snapshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::board::Ranked;
use super::periods::{self, Bucket, Period};
use super::service::{Board, BoardKey, VoteService};
use crate::keys::VoteKeys;

/// A watched board: the current bucket of one period of a poll.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LiveBoard {
    pub poll: i64,
    pub period: Period,
    pub board: Board,
}

/// What a watcher reads: the current bucket and every option ranked.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveRanking {
    pub bucket: Bucket,
    pub ranked: Vec<Ranked>,
}

/// One subscriber's snapshot: the visible top, with the version it was read at.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveTop {
    pub bucket: Bucket,
    pub top: Vec<Ranked>,
    pub total: usize,
    pub version: i64,
}

#[derive(Clone)]
pub struct LiveBoardService {
    live: Coalescer<LiveBoard, LiveRanking>,
}

/// Where the watchers run.
pub struct LiveWorkers<'a> {
    pub hub: &'a Hub,
    pub tasks: &'a TaskTracker,
    pub shutdown: &'a CancellationToken,
    pub tick: Duration,
}

impl LiveBoardService {
    pub fn new(votes: VoteService, workers: LiveWorkers<'_>) -> Self {
        let keys = votes.redis_keys();
        let config = CoalescerConfig {
            kind: "leaderboard",
            tick: workers.tick,
            // Announced by the vote script in the poll's slot.
            sharding: Sharding::Sharded,
            hub: workers.hub,
            tasks: workers.tasks,
            shutdown: workers.shutdown,
        };
        let live = Coalescer::new(
            config,
            move |board: &LiveBoard| vec![keys.poll(board.poll).votes_channel()],
            move |board: LiveBoard| {
                let votes = votes.clone();
                async move { read(&votes, board).await }.boxed()
            },
        );
        Self { live }
    }

    /// The board's top `first` now, then each time it changes.
    pub fn watch(&self, board: LiveBoard, first: usize) -> impl Stream<Item = LiveTop> + use<> {
        let mut shown: Option<(String, Vec<Ranked>)> = None;
        self.live
            .subscribe(board)
            .filter_map(move |snapshot: Arc<Snapshot<LiveRanking>>| {
                let top: Vec<Ranked> = snapshot.value.ranked.iter().take(first).copied().collect();
                let visible = (snapshot.value.bucket.id.clone(), top.clone());
                let changed = shown.as_ref() != Some(&visible);
                shown = Some(visible);
                std::future::ready(changed.then(|| LiveTop {
                    bucket: snapshot.value.bucket.clone(),
                    top,
                    total: snapshot.value.ranked.len(),
                    version: snapshot.version,
                }))
            })
    }

    /// Board reads the watchers of this process have made.
    pub fn reads(&self) -> u64 {
        self.live.reads()
    }
}

async fn read(votes: &VoteService, board: LiveBoard) -> AppResult<Snapshot<LiveRanking>> {
    let config = votes.configs().require(board.poll).await?;
    let now = Utc::now();
    let bucket = periods::bucket(board.period, now, config.zone);
    let key = BoardKey {
        poll: board.poll,
        board: board.board,
        bucket: bucket.id.clone(),
    };
    let scores = votes
        .scores(std::slice::from_ref(&key))
        .await?
        .remove(&key)
        .unwrap_or_default();
    let ranked = super::service::ranked(&config, bucket, &scores);
    let refresh_at = ranked.bucket.end().and_then(|end| {
        let wait = (end - now).to_std().ok()?;
        Some(tokio::time::Instant::now() + wait)
    });
    Ok(Snapshot {
        version: ranked.version,
        value: LiveRanking {
            bucket: ranked.bucket,
            ranked: ranked.ranked,
        },
        refresh_at,
    })
}
