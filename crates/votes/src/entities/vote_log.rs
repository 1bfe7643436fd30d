use sea_orm::entity::prelude::*;

/// One accepted ballot, insert only; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "vote_log")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Minted by the vote script; unique, so a replayed stream entry is recognised.
    pub event_id: String,
    pub poll_id: i64,
    pub option_id: i64,
    pub voter_id: i64,
    /// The poll's vote sequence: the order the script applied its votes in.
    pub seq: i64,
    pub at_ms: i64,
    pub bonus: i32,
    pub carry_over: f64,
    pub periods: String,
    pub timezone: String,
    pub channel: Option<String>,
    pub device: Option<String>,
    pub created_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
