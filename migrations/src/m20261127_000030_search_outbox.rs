use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The search index's outbox and its one row of state.
///
/// `search_outbox` gets one row per article whose document changed (published, edited, its views
/// flushed, its likes archived), inserted in the transaction that makes the change, so the index
/// (a projection of SQL, one replica per process) learns of every change that committed and of no
/// change that did not. Rows carry only the article id: a replica reads the article's current
/// values when it applies them. `created_at` ages rows for the lag metric and for pruning.
///
/// `search_state` is one row (`id` 1): `epoch`, raised by `pulse rebuild search` so that every
/// replica rebuilds, and `pruned_through`, the highest outbox id pruning has removed, so that a
/// replica that had not applied it knows it fell behind and rebuilds.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(SearchOutbox::Table)
                    .if_not_exists()
                    .col(big_pk_auto(SearchOutbox::Id))
                    .col(big_integer(SearchOutbox::ArticleId))
                    .col(date_time(SearchOutbox::CreatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(SearchState::Table)
                    .if_not_exists()
                    .col(integer(SearchState::Id).primary_key())
                    .col(big_integer(SearchState::Epoch).default(0))
                    .col(big_integer(SearchState::PrunedThrough).default(0))
                    .to_owned(),
            )
            .await?;
        let first = Query::insert()
            .into_table(SearchState::Table)
            .columns([
                SearchState::Id,
                SearchState::Epoch,
                SearchState::PrunedThrough,
            ])
            .values_panic([1.into(), 0.into(), 0.into()])
            .to_owned();
        manager.exec_stmt(first).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(SearchState::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(SearchOutbox::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum SearchOutbox {
    Table,
    Id,
    ArticleId,
    CreatedAt,
}

#[derive(DeriveIden)]
enum SearchState {
    Table,
    Id,
    Epoch,
    PrunedThrough,
}
