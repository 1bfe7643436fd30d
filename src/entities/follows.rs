use sea_orm::entity::prelude::*;

/// `follower_id` follows `followee_id`. `id` grows with every follow: the order of the
/// followers/following lists, newest first.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "follows")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub follower_id: i64,
    pub followee_id: i64,
    pub created_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
