use sea_orm::entity::prelude::*;

/// An option of a poll; see the migration that creates it.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "poll_options")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub poll_id: i64,
    pub label: String,
    /// What one vote adds on the DISPLAY boards.
    pub bonus: i32,
    /// Added once to the ALL_TIME DISPLAY board.
    pub initial_votes: i64,
    pub created_at: DateTime,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
