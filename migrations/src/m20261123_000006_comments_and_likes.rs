use sea_orm_migration::{prelude::*, schema::*};

use crate::m20261121_000001_create_users::Users;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Comments, and likes of articles and comments.
///
/// `likes` holds the current relation of a user to a subject (an article or a comment, by
/// `subject_kind` 1 or 2): it is the truth that keeps liking idempotent forever, whatever Redis has
/// forgotten. Its `seq` is the sequence of the event that set it: events may reach SQL out of order
/// (a dead consumer's batch is taken over after newer ones were archived), and an older one never
/// overwrites a newer state. `like_events` is the insert-only archive of every like and unlike, each row with the
/// subject's count after it and the local date, keyed by the event id the like script minted, so a
/// replayed event is recognised. The subjects' `like_count` columns are kept in step by the same
/// archiver transaction, which also bumps `like_version`: the order in which SQL applied batches to a
/// subject, so that Redis never replaces a newer cached count with an older one.
/// `like_archive_shards` has a row per like shard, which each archiver transaction locks first.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Comments::Table)
                    .if_not_exists()
                    .col(big_pk_auto(Comments::Id))
                    .col(big_integer(Comments::ArticleId))
                    .col(big_integer(Comments::AuthorId))
                    .col(text(Comments::Body))
                    .col(big_integer(Comments::LikeCount).default(0))
                    .col(big_integer(Comments::LikeVersion).default(0))
                    .col(date_time(Comments::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_comments_article")
                            .from(Comments::Table, Comments::ArticleId)
                            .to(Articles::Table, Articles::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_comments_author")
                            .from(Comments::Table, Comments::AuthorId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // `Article.comments`, newest first, is a descending walk of this index; so is the featured
        // list's recompute, which reads one article's comments.
        manager
            .create_index(
                Index::create()
                    .name("idx_comments_article_id")
                    .table(Comments::Table)
                    .col(Comments::ArticleId)
                    .col(Comments::Id)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Likes::Table)
                    .if_not_exists()
                    .col(big_integer(Likes::UserId))
                    .col(small_integer(Likes::SubjectKind))
                    .col(big_integer(Likes::SubjectId))
                    .col(boolean(Likes::Liked))
                    .col(big_integer(Likes::Seq))
                    .col(date_time(Likes::UpdatedAt))
                    .primary_key(
                        Index::create()
                            .col(Likes::UserId)
                            .col(Likes::SubjectKind)
                            .col(Likes::SubjectId),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_likes_user")
                            .from(Likes::Table, Likes::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // Finds a subject's likes, to drop them with the subject and to recount it.
        manager
            .create_index(
                Index::create()
                    .name("idx_likes_subject")
                    .table(Likes::Table)
                    .col(Likes::SubjectKind)
                    .col(Likes::SubjectId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(LikeEvents::Table)
                    .if_not_exists()
                    .col(big_pk_auto(LikeEvents::Id))
                    .col(string_len(LikeEvents::EventId, 32).unique_key())
                    .col(big_integer(LikeEvents::UserId))
                    .col(small_integer(LikeEvents::SubjectKind))
                    .col(big_integer(LikeEvents::SubjectId))
                    .col(boolean(LikeEvents::Liked))
                    .col(big_integer(LikeEvents::LikeCount))
                    .col(integer(LikeEvents::DateKey))
                    .col(date_time(LikeEvents::CreatedAt))
                    .to_owned(),
            )
            .await?;
        // The last event of a subject carries its count: "count as of" queries read one row.
        manager
            .create_index(
                Index::create()
                    .name("idx_like_events_subject")
                    .table(LikeEvents::Table)
                    .col(LikeEvents::SubjectKind)
                    .col(LikeEvents::SubjectId)
                    .col(LikeEvents::Id)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_like_events_date_key")
                    .table(LikeEvents::Table)
                    .col(LikeEvents::DateKey)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(LikeArchiveShards::Table)
                    .if_not_exists()
                    .col(integer(LikeArchiveShards::Shard).primary_key())
                    .col(big_integer(LikeArchiveShards::Batches))
                    .to_owned(),
            )
            .await?;
        // One row per like shard (`LIKE_SHARDS` in src/redis/keys.rs): the archiver's transaction
        // locks its shard's row first, which serialises a shard's batches across consumers.
        let mut rows = Query::insert()
            .into_table(LikeArchiveShards::Table)
            .columns([LikeArchiveShards::Shard, LikeArchiveShards::Batches])
            .to_owned();
        for shard in 0..16 {
            rows.values_panic([shard.into(), 0.into()]);
        }
        manager.exec_stmt(rows).await?;
        // One column per statement: SQLite alters one thing at a time.
        for column in [Articles::CommentCount, Articles::LikeVersion] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Articles::Table)
                        .add_column(big_integer(column).default(0))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [Articles::LikeVersion, Articles::CommentCount] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Articles::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .drop_table(Table::drop().table(LikeArchiveShards::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(LikeEvents::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Likes::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Comments::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Articles {
    Table,
    Id,
    CommentCount,
    LikeVersion,
}

#[derive(DeriveIden)]
enum Comments {
    Table,
    Id,
    ArticleId,
    AuthorId,
    Body,
    LikeCount,
    LikeVersion,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Likes {
    Table,
    UserId,
    SubjectKind,
    SubjectId,
    Liked,
    Seq,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum LikeEvents {
    Table,
    Id,
    EventId,
    UserId,
    SubjectKind,
    SubjectId,
    Liked,
    LikeCount,
    DateKey,
    CreatedAt,
}

#[derive(DeriveIden)]
enum LikeArchiveShards {
    Table,
    Shard,
    Batches,
}
