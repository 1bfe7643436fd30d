use sea_orm::entity::prelude::*;

/// A rate-limit rule of a poll; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "poll_rules")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub poll_id: i64,
    pub scope: String,
    pub window: String,
    pub limit: i64,
    pub channel: Option<String>,
    pub device: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
