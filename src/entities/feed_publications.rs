use sea_orm::entity::prelude::*;

/// The publish outbox: one row per published article, written in the article's transaction and
/// relayed to the feed's dispatch stream afterwards.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "feed_publications")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub article_id: i64,
    pub author_id: i64,
    pub created_at: DateTime,
    /// When the dispatch event was last appended to the stream.
    pub relayed_at: Option<DateTime>,
    /// When the dispatcher had queued every fan-out chunk: the row's work is durable in Redis.
    pub dispatched_at: Option<DateTime>,
    /// When its article was announced to `articlePublished` subscribers; without it, the relay
    /// loop announces it.
    pub announced_at: Option<DateTime>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
