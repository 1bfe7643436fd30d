//! The votes archive job: moves accepted ballots from the shards' streams into the SQL vote log.
//!
//! Each batch is one transaction inserting the events SQL does not have yet (by event id, minted
//! by the vote script), so a batch delivered twice (a crash between commit and acknowledgement,
//! or `pulse jobs retry-dead`) logs each vote once. The runtime acknowledges after the commit.

use std::collections::HashSet;

use anyhow::{anyhow, bail};
use pulse_runtime::jobs::{Entry, Job, JobSpec};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect,
    TransactionTrait,
};

use crate::entities::vote_log;
use crate::keys::VOTE_SHARDS;

pub const SPEC: JobSpec = JobSpec {
    name: "votes-archive",
    shards: VOTE_SHARDS,
    tag: "vp",
};

/// Rows per multi-row statement.
const CHUNK: usize = 200;

pub struct VoteArchiver {
    db: DatabaseConnection,
}

impl VoteArchiver {
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }
}

/// A vote's fields, as `lua/vote_cast.lua` appends them.
#[derive(Debug, serde::Deserialize)]
pub struct VoteEntry {
    event: String,
    poll: i64,
    option: i64,
    voter: i64,
    seq: i64,
    /// Milliseconds since the epoch.
    at: i64,
    bonus: i32,
    carry: f64,
    periods: String,
    tz: String,
    channel: Option<String>,
    device: Option<String>,
}

fn parse(entry: &Entry<VoteEntry>) -> anyhow::Result<vote_log::ActiveModel> {
    let fields = &entry.payload;
    if fields.event.is_empty() || fields.event.len() > 40 {
        bail!("vote event {} has a malformed event id", entry.id);
    }
    let at = chrono::DateTime::from_timestamp_millis(fields.at)
        .ok_or_else(|| anyhow!("vote event {} has a malformed time", entry.id))?;
    Ok(vote_log::ActiveModel {
        event_id: Set(fields.event.clone()),
        poll_id: Set(fields.poll),
        option_id: Set(fields.option),
        voter_id: Set(fields.voter),
        seq: Set(fields.seq),
        at_ms: Set(fields.at),
        bonus: Set(fields.bonus),
        carry_over: Set(fields.carry),
        periods: Set(fields.periods.clone()),
        timezone: Set(fields.tz.clone()),
        channel: Set(fields.channel.clone()),
        device: Set(fields.device.clone()),
        created_at: Set(at.naive_utc()),
        ..Default::default()
    })
}

#[async_trait::async_trait]
impl Job for VoteArchiver {
    type Payload = VoteEntry;

    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry<VoteEntry>]) -> anyhow::Result<()> {
        let rows = batch
            .iter()
            .map(parse)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let txn = self.db.begin().await?;
        let mut archived = HashSet::new();
        for chunk in rows.chunks(CHUNK) {
            let ids = chunk.iter().map(|row| row.event_id.clone().unwrap());
            let found: Vec<String> = vote_log::Entity::find()
                .select_only()
                .column(vote_log::Column::EventId)
                .filter(vote_log::Column::EventId.is_in(ids))
                .into_tuple()
                .all(&txn)
                .await?;
            archived.extend(found);
        }
        let fresh: Vec<vote_log::ActiveModel> = rows
            .into_iter()
            .filter(|row| archived.insert(row.event_id.clone().unwrap()))
            .collect();
        for chunk in fresh.chunks(CHUNK) {
            vote_log::Entity::insert_many(chunk.to_vec())
                .exec_without_returning(&txn)
                .await?;
        }
        txn.commit().await?;
        metrics::counter!("pulse_votes_archived_total").increment(fresh.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[(&str, &str)]) -> Entry {
        Entry {
            shard: 7,
            id: "1-0".into(),
            payload: fields
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            deliveries: 1,
        }
    }

    /// The fields in the order and form `lua/vote_cast.lua` has always written them, so entries
    /// already in the streams when the payload became typed still decode.
    #[test]
    fn a_vote_as_the_script_writes_it_decodes_and_a_malformed_one_is_refused() {
        let good = [
            ("event", "9f2c:0"),
            ("poll", "23"),
            ("option", "4"),
            ("voter", "77"),
            ("seq", "1763900000000123"),
            ("at", "1763900000000"),
            ("bonus", "2"),
            ("carry", "0.5"),
            ("periods", "DAY,ALL"),
            ("tz", "Asia/Shanghai"),
            ("channel", "web"),
            ("device", ""),
        ];
        let row = parse(&entry(&good).decode().unwrap()).unwrap();
        assert_eq!(row.event_id.clone().unwrap(), "9f2c:0");
        assert_eq!(row.poll_id.clone().unwrap(), 23);
        assert_eq!(row.bonus.clone().unwrap(), 2);
        assert_eq!(row.carry_over.clone().unwrap(), 0.5);
        assert_eq!(row.channel.clone().unwrap().as_deref(), Some("web"));
        assert_eq!(row.device.clone().unwrap(), None);
        for (name, bad) in [("poll", "x"), ("bonus", "3000000000"), ("event", "")] {
            let fields: Vec<_> = good
                .iter()
                .map(|&(field, value)| (field, if field == name { bad } else { value }))
                .collect();
            let decoded = entry(&fields).decode::<VoteEntry>();
            assert!(
                decoded.and_then(|entry| parse(&entry)).is_err(),
                "{name} = {bad}"
            );
        }
    }
}
