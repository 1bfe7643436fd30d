use sea_orm::entity::prelude::*;

/// The sequence of a view shard's last committed batch; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "view_flush_shards")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub shard: i32,
    pub last_seq: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
