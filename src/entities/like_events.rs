use sea_orm::entity::prelude::*;

/// One like or unlike as archived, insert only; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "like_events")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Minted when the like script accepted the event; unique, so a replay is recognised.
    pub event_id: String,
    pub user_id: i64,
    pub subject_kind: i16,
    pub subject_id: i64,
    /// True for a like, false for an unlike.
    pub liked: bool,
    /// The subject's count in SQL after this event.
    pub like_count: i64,
    /// The event's local date (`PULSE_TIMEZONE`), e.g. 20261123: the archive's partition key.
    pub date_key: i32,
    pub created_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
