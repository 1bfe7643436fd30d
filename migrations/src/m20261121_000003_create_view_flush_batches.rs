use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// One row per view-count batch applied to `articles.view_count`. It is written in the same
/// transaction as the counts, so replaying a batch (after a crash, or by a second flusher) finds its
/// row and changes nothing.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(ViewFlushBatches::Table)
                    .if_not_exists()
                    .col(string_len(ViewFlushBatches::BatchId, 64).primary_key())
                    .col(integer(ViewFlushBatches::Articles))
                    .col(big_integer(ViewFlushBatches::Views))
                    .col(date_time(ViewFlushBatches::AppliedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_view_flush_batches_applied_at")
                    .table(ViewFlushBatches::Table)
                    .col(ViewFlushBatches::AppliedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(ViewFlushBatches::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum ViewFlushBatches {
    Table,
    BatchId,
    Articles,
    Views,
    AppliedAt,
}
