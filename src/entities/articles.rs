use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "articles")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub author_id: i64,
    pub title: String,
    #[sea_orm(column_type = "Text")]
    pub body: String,
    pub view_count: i64,
    pub like_count: i64,
    /// Sequence of the last view batch that flushed this article; see the flush-sequence migration.
    /// Defaulted on decode: publish events from processes older than the column lack it.
    #[serde(default)]
    pub view_flush_seq: i64,
    /// Kept in step with `comments` by the transactions that add and delete them.
    #[serde(default)]
    pub comment_count: i64,
    /// How many like-archiver batches have changed `like_count`: orders cached counts.
    #[serde(default)]
    pub like_version: i64,
    pub created_at: DateTime,
    pub updated_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::users::Entity",
        from = "Column::AuthorId",
        to = "super::users::Column::Id",
        on_delete = "Cascade"
    )]
    Author,
}

impl Related<super::users::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Author.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
