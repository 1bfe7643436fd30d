use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The database's identity, so that a Redis prefix can belong to one database: one row (`id` 1),
/// created by the first process that starts on the database, holding a random `database_id` that
/// the Redis prefix's owner key records, and `redis_prefix`, the prefix this database last claimed
/// (null until its first claim). A Redis that lost its owner key but kept the keys of the prefix
/// this database claimed is still this database's.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(DatabaseIdentity::Table)
                    .if_not_exists()
                    .col(integer(DatabaseIdentity::Id).primary_key())
                    .col(string_len(DatabaseIdentity::DatabaseId, 32))
                    .col(text_null(DatabaseIdentity::RedisPrefix))
                    .col(date_time(DatabaseIdentity::CreatedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(DatabaseIdentity::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum DatabaseIdentity {
    Table,
    Id,
    DatabaseId,
    RedisPrefix,
    CreatedAt,
}
