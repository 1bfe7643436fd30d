use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The documents a server in trusted-documents mode runs, registered ahead of time by `pulse
/// documents add`, keyed by the hex SHA-256 of their text (what clients send as the persisted
/// query hash). MySQL's `TEXT` stops at 64 KiB, below the request body limit, so the document is a
/// `MEDIUMTEXT` there.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let document = match manager.get_database_backend() {
            sea_orm::DatabaseBackend::MySql => ColumnDef::new(TrustedDocuments::Document)
                .custom(Alias::new("MEDIUMTEXT"))
                .not_null()
                .to_owned(),
            _ => text(TrustedDocuments::Document),
        };
        manager
            .create_table(
                Table::create()
                    .table(TrustedDocuments::Table)
                    .if_not_exists()
                    .col(string_len(TrustedDocuments::Sha256, 64).primary_key())
                    .col(string_len_null(TrustedDocuments::Name, 200))
                    .col(document)
                    .col(date_time(TrustedDocuments::CreatedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(TrustedDocuments::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum TrustedDocuments {
    Table,
    Sha256,
    Name,
    Document,
    CreatedAt,
}
