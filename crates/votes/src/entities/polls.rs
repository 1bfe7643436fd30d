use sea_orm::entity::prelude::*;

/// A poll's configuration; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "polls")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub title: String,
    /// IANA zone whose hours, days, ISO weeks and months bound the period buckets.
    pub timezone: String,
    /// Comma-separated periods, e.g. `HOUR,DAY,ALL_TIME`.
    pub periods: String,
    pub carry_over: f64,
    pub tie_policy: String,
    pub starts_at: Option<DateTime>,
    pub ends_at: Option<DateTime>,
    pub closed_at: Option<DateTime>,
    pub created_at: DateTime,
    pub updated_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
