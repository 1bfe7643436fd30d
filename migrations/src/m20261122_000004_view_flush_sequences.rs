use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Flush sequences, which let the view flusher tell a Redis that came back older than SQL (a
/// restart from an old snapshot or AOF, a promoted replica) from one that is up to date.
/// `view_flush_shards` holds, per shard, the sequence of the last batch committed; it only grows,
/// so a batch whose sequence SQL has passed was issued by a Redis that rolled back.
/// `articles.view_flush_seq` is the sequence of the last batch that flushed the article: an
/// article flushed after the sequence a rolled-back Redis knows has its stale pending views in SQL.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(ViewFlushShards::Table)
                    .if_not_exists()
                    .col(integer(ViewFlushShards::Shard).primary_key())
                    .col(big_integer(ViewFlushShards::LastSeq))
                    .to_owned(),
            )
            .await?;
        // One row per view shard (`VIEW_SHARDS` in src/redis/keys.rs; the flusher adds any missing
        // row), so that the flusher's first pass after a start needs no writes before its takes.
        let mut rows = Query::insert()
            .into_table(ViewFlushShards::Table)
            .columns([ViewFlushShards::Shard, ViewFlushShards::LastSeq])
            .to_owned();
        for shard in 0..16 {
            rows.values_panic([shard.into(), 0.into()]);
        }
        manager.exec_stmt(rows).await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Articles::Table)
                    .add_column(big_integer(Articles::ViewFlushSeq).default(0))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Articles::Table)
                    .drop_column(Articles::ViewFlushSeq)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(ViewFlushShards::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum ViewFlushShards {
    Table,
    Shard,
    LastSeq,
}

#[derive(DeriveIden)]
enum Articles {
    Table,
    ViewFlushSeq,
}
