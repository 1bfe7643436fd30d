use sea_orm::entity::prelude::*;

/// A user's follower and following counts, changed in the transaction that changes `follows`.
/// A user nobody ever followed and who never followed anyone has no row (both counts 0).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "follow_counts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: i64,
    pub followers: i64,
    pub following: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
