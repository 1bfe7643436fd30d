use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// `feed_publications.announced_at`: when the article was announced to `articlePublished`
/// subscribers (journaled and published on the articles' channel). The publish announces it
/// itself and records that with the relay's own update; a row left without it (Redis could not
/// take the announcement, or the process died first) is announced by the relay loop once Redis
/// answers, so an announcement is late rather than lost. Rows older than the column were announced
/// or lost before it existed: they count as announced, so that none is announced again years late.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(FeedPublications::Table)
                    .add_column(date_time_null(FeedPublications::AnnouncedAt))
                    .to_owned(),
            )
            .await?;
        let settled = Query::update()
            .table(FeedPublications::Table)
            .value(
                FeedPublications::AnnouncedAt,
                Expr::col(FeedPublications::CreatedAt),
            )
            .to_owned();
        manager.exec_stmt(settled).await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_feed_publications_announced")
                    .table(FeedPublications::Table)
                    .col(FeedPublications::AnnouncedAt)
                    .col(FeedPublications::Id)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("idx_feed_publications_announced")
                    .table(FeedPublications::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(FeedPublications::Table)
                    .drop_column(FeedPublications::AnnouncedAt)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum FeedPublications {
    Table,
    Id,
    CreatedAt,
    AnnouncedAt,
}
