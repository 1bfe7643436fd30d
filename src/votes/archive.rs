//! The votes archive job: moves accepted ballots from the shards' streams into the SQL vote log.
//!
//! Each batch is one transaction inserting the events SQL does not have yet (by event id, minted
//! by the vote script), so a batch delivered twice (a crash between commit and acknowledgement,
//! or `pulse jobs retry-dead`) logs each vote once. The runtime acknowledges after the commit.

use std::collections::HashSet;

use anyhow::{Context as _, anyhow, bail};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect,
    TransactionTrait,
};

use crate::entities::vote_log;
use crate::jobs::{Entry, Job, JobSpec};
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

fn parse(entry: &Entry) -> anyhow::Result<vote_log::ActiveModel> {
    let field = |name: &str| {
        entry
            .field(name)
            .ok_or_else(|| anyhow!("vote event {} has no {name}", entry.id))
    };
    let number = |name: &str| -> anyhow::Result<i64> {
        field(name)?
            .parse()
            .with_context(|| format!("vote event {} has a malformed {name}", entry.id))
    };
    let optional = |name: &str| -> anyhow::Result<Option<String>> {
        Ok(Some(field(name)?.to_owned()).filter(|value| !value.is_empty()))
    };
    let event = field("event")?;
    if event.is_empty() || event.len() > 40 {
        bail!("vote event {} has a malformed event id", entry.id);
    }
    let at_ms = number("at")?;
    let at = chrono::DateTime::from_timestamp_millis(at_ms)
        .ok_or_else(|| anyhow!("vote event {} has a malformed time", entry.id))?;
    Ok(vote_log::ActiveModel {
        event_id: Set(event.to_owned()),
        poll_id: Set(number("poll")?),
        option_id: Set(number("option")?),
        voter_id: Set(number("voter")?),
        seq: Set(number("seq")?),
        at_ms: Set(at_ms),
        bonus: Set(i32::try_from(number("bonus")?)?),
        carry_over: Set(field("carry")?
            .parse()
            .with_context(|| format!("vote event {} has a malformed carry", entry.id))?),
        periods: Set(field("periods")?.to_owned()),
        timezone: Set(field("tz")?.to_owned()),
        channel: Set(optional("channel")?),
        device: Set(optional("device")?),
        created_at: Set(at.naive_utc()),
        ..Default::default()
    })
}

#[async_trait::async_trait]
impl Job for VoteArchiver {
    fn spec(&self) -> JobSpec {
        SPEC
    }

    async fn handle(&self, batch: &[Entry]) -> anyhow::Result<()> {
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
