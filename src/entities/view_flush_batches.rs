use sea_orm::entity::prelude::*;

/// A view-count batch already applied to SQL; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "view_flush_batches")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub batch_id: String,
    pub articles: i32,
    pub views: i64,
    pub applied_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
