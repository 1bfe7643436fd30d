use sea_orm::entity::prelude::*;

/// One row per like shard, locked first by every archiver transaction of the shard, so that two
/// consumers never apply the shard's events from stale reads; `batches` counts what was applied.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "like_archive_shards")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub shard: i32,
    pub batches: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
