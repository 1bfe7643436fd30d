use sea_orm_migration::{prelude::*, schema::*};

use crate::m20261121_000001_create_users::Users;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Articles::Table)
                    .if_not_exists()
                    .col(big_pk_auto(Articles::Id))
                    .col(big_integer(Articles::AuthorId))
                    .col(string_len(Articles::Title, 200))
                    .col(text(Articles::Body))
                    // Counters are owned by the view flusher and the like archiver, which only ever
                    // add to them; article edits never write these columns.
                    .col(big_integer(Articles::ViewCount).default(0))
                    .col(big_integer(Articles::LikeCount).default(0))
                    .col(date_time(Articles::CreatedAt))
                    .col(date_time(Articles::UpdatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_articles_author")
                            .from(Articles::Table, Articles::AuthorId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // Serves `User.articles` and `articles(authorId:)`: newest first is a descending walk of this index.
        manager
            .create_index(
                Index::create()
                    .name("idx_articles_author_id")
                    .table(Articles::Table)
                    .col(Articles::AuthorId)
                    .col(Articles::Id)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Articles::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Articles {
    Table,
    Id,
    AuthorId,
    Title,
    Body,
    ViewCount,
    LikeCount,
    CreatedAt,
    UpdatedAt,
}
