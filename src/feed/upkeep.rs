//! Upkeep of the feed's Redis keys: `pulse feed vacuum` and `pulse rebuild feed`. Inboxes of
//! inactive users need none: they expire on their own.

use std::collections::{BTreeMap, HashSet};

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use super::FeedStore;
use crate::db::retry_once;
use crate::entities::users;
use crate::error::AppResult;
use crate::keys::FeedKeys;
use crate::keys::{FeedUserKeys, Keys};

/// Every feed key, grouped by user: key name (`inbox`, `outbox`, …) → full key.
async fn feed_keys(store: &FeedStore) -> AppResult<BTreeMap<i64, BTreeMap<String, String>>> {
    let mut scan = store.redis.scan(store.redis.keys.feed_pattern());
    let mut found: BTreeMap<i64, BTreeMap<String, String>> = BTreeMap::new();
    while let Some(keys) = scan.next_batch().await? {
        for key in keys {
            let prefix = store.redis.keys.prefix();
            if let Some((user, name)) = FeedUserKeys::parse(prefix, &key) {
                found.entry(user).or_default().insert(name, key);
            } else if let Some((author, shard)) = Keys::parse_feed_audience(prefix, &key) {
                found
                    .entry(author)
                    .or_default()
                    .insert(format!("audience:{shard}"), key);
            }
        }
    }
    Ok(found)
}

/// What a vacuum removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Vacuumed {
    /// Keys of users who no longer exist.
    pub of_deleted_users: usize,
    /// Building keys a crashed rebuild left without its lock.
    pub leftovers: usize,
}

/// Removes the feed keys nothing will use again: those of deleted users, a rebuild's building
/// key whose lock has expired (the rebuild died).
/// Audiences need no vacuum: a delivery drops the followers whose inbox has expired.
pub(super) async fn vacuum(store: &FeedStore) -> AppResult<Vacuumed> {
    let keys = feed_keys(store).await?;
    let ids: Vec<i64> = keys.keys().copied().collect();
    let mut existing = HashSet::new();
    for chunk in ids.chunks(500) {
        let query = users::Entity::find()
            .select_only()
            .column(users::Column::Id)
            .filter(users::Column::Id.is_in(chunk.iter().copied()));
        let found: Vec<i64> = retry_once(|| query.clone().into_tuple().all(&store.db)).await?;
        existing.extend(found);
    }
    let mut report = Vacuumed::default();
    let mut doomed = Vec::new();
    for (user, names) in &keys {
        if !existing.contains(user) {
            report.of_deleted_users += names.len();
            doomed.extend(names.values().cloned());
            continue;
        }
        if let Some(building) = names.get("inbox-building")
            && !names.contains_key("rebuild-lock")
        {
            report.leftovers += 1;
            doomed.push(building.clone());
        }
    }
    let mut conn = store.redis.conn.clone();
    for chunk in doomed.chunks(500) {
        // One key per command: on a Redis Cluster the keys are in different slots.
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.del(key).ignore();
        }
        let () = pipe.query_async(&mut conn).await?;
    }
    metrics::counter!("pulse_feed_vacuumed_keys_total")
        .increment((report.of_deleted_users + report.leftovers) as u64);
    Ok(report)
}

/// What `pulse rebuild feed` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Outboxes reloaded from SQL.
    pub outboxes: usize,
    /// Users with an inbox put back in the audiences of everyone they follow, and their inbox
    /// made whole.
    pub readers: usize,
}

/// Reloads every cached outbox from SQL, and for every user whose inbox exists: puts them back
/// in the audiences of their followees (joins lost with a Redis rollback would otherwise keep
/// fan-out from them until their inbox expires), and merges their followees' newest articles into
/// the inbox, as a rebuild would pull them, so a hole (a follow's backfill or a fan-out lost with
/// a rollback) is filled or falls below the inbox's floor. Missing inboxes are rebuilt by their
/// next read and need nothing.
pub(super) async fn rebuild(store: &FeedStore) -> AppResult<Rebuilt> {
    let keys = feed_keys(store).await?;
    let mut report = Rebuilt::default();
    let mut conn = store.redis.conn.clone();
    for (&user, names) in &keys {
        if names.contains_key("outbox") || names.contains_key("outbox-loaded") {
            let outbox = store.redis.keys.feed_user(user);
            // Dropped first, so the load below starts from SQL alone; a publish meanwhile re-adds
            // its article to the outbox before or after the load, and is kept either way.
            let () = redis::pipe()
                .del(outbox.outbox_loaded())
                .ignore()
                .del(outbox.outbox())
                .ignore()
                .query_async(&mut conn)
                .await?;
            store.outbox_page(user, i64::MAX, 0).await?;
            report.outboxes += 1;
        }
    }
    // Once every outbox is whole: the inboxes are merged from them.
    for (&user, names) in &keys {
        if names.contains_key("inbox") {
            let followees = store.followees(user).await?;
            let fanned_out = store.join_and_split(user, &followees).await?;
            let timeline = store.timeline(&fanned_out).await?;
            store.merge(user, &timeline).await?;
            report.readers += 1;
        }
    }
    Ok(report)
}
