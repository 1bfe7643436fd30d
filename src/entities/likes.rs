use sea_orm::entity::prelude::*;

/// The current relation of a user to a liked subject: the truth behind idempotent likes. A row
/// stays when its like is withdrawn (`liked` false), so the archiver can apply events as state
/// transitions.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "likes")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: i64,
    /// 1: an article, 2: a comment.
    #[sea_orm(primary_key, auto_increment = false)]
    pub subject_kind: i16,
    #[sea_orm(primary_key, auto_increment = false)]
    pub subject_id: i64,
    pub liked: bool,
    /// The sequence of the event that set this state; an event with a lower one is older and
    /// changes nothing.
    pub seq: i64,
    pub updated_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
