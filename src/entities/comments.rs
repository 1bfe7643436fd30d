use sea_orm::entity::prelude::*;

/// A comment on an article; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "comments")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub article_id: i64,
    pub author_id: i64,
    #[sea_orm(column_type = "Text")]
    pub body: String,
    /// Likes as archived; Redis holds the live count.
    pub like_count: i64,
    /// How many archiver batches have changed `like_count`: orders cached counts.
    pub like_version: i64,
    pub created_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
