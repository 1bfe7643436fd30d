use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Users::Table)
                    .if_not_exists()
                    .col(big_pk_auto(Users::Id))
                    // Handles are stored lower-cased, so the unique index is case-insensitive on every backend.
                    .col(string_len_uniq(Users::Handle, 32))
                    .col(string_len(Users::PasswordHash, 255))
                    .col(boolean(Users::IsAdmin).default(false))
                    .col(date_time(Users::CreatedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Users::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
pub(crate) enum Users {
    Table,
    Id,
    Handle,
    PasswordHash,
    IsAdmin,
    CreatedAt,
}
