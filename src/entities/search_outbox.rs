use sea_orm::entity::prelude::*;

/// An article whose search document changed; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "search_outbox")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub article_id: i64,
    pub created_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
