use sea_orm_migration::{prelude::*, schema::*};

use crate::m20261121_000001_create_users::Users;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The follow graph and the feed's publish outbox.
///
/// `follows` holds one row per (follower, followee); its `id` grows with every follow, so "newest
/// first" lists of followers and followees are descending walks of `(followee_id, id)` and
/// `(follower_id, id)`. `follow_counts` keeps each user's follower and following counts, changed in
/// the same transaction as the row they count, so a count never disagrees with the graph and the
/// celebrity check at publish time is one primary-key read.
///
/// `feed_publications` is the publish outbox: the row is inserted in the transaction that inserts
/// the article, and relayed to the fan-out stream afterwards, so an article published while Redis
/// is unreachable still reaches feeds once it is back. `relayed_at` is set when the dispatch event
/// was appended, `dispatched_at` when the dispatcher had queued every fan-out chunk: a row relayed
/// long ago and never dispatched (its stream entry lost with a Redis rollback) is relayed again.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Follows::Table)
                    .if_not_exists()
                    .col(big_pk_auto(Follows::Id))
                    .col(big_integer(Follows::FollowerId))
                    .col(big_integer(Follows::FolloweeId))
                    .col(date_time(Follows::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_follows_follower")
                            .from(Follows::Table, Follows::FollowerId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_follows_followee")
                            .from(Follows::Table, Follows::FolloweeId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // One row per pair (what makes `follow` idempotent), and the `following` walk.
        manager
            .create_index(
                Index::create()
                    .name("idx_follows_pair")
                    .table(Follows::Table)
                    .col(Follows::FollowerId)
                    .col(Follows::FolloweeId)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_follows_follower_id")
                    .table(Follows::Table)
                    .col(Follows::FollowerId)
                    .col(Follows::Id)
                    .to_owned(),
            )
            .await?;
        // The `followers` walk, and the fan-out's chunks of followers by follower id.
        manager
            .create_index(
                Index::create()
                    .name("idx_follows_followee_id")
                    .table(Follows::Table)
                    .col(Follows::FolloweeId)
                    .col(Follows::Id)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_follows_followee_follower")
                    .table(Follows::Table)
                    .col(Follows::FolloweeId)
                    .col(Follows::FollowerId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(FollowCounts::Table)
                    .if_not_exists()
                    .col(big_integer(FollowCounts::UserId).primary_key())
                    .col(big_integer(FollowCounts::Followers).default(0))
                    .col(big_integer(FollowCounts::Following).default(0))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_follow_counts_user")
                            .from(FollowCounts::Table, FollowCounts::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(FeedPublications::Table)
                    .if_not_exists()
                    .col(big_pk_auto(FeedPublications::Id))
                    .col(big_integer(FeedPublications::ArticleId))
                    .col(big_integer(FeedPublications::AuthorId))
                    .col(date_time(FeedPublications::CreatedAt))
                    .col(date_time_null(FeedPublications::RelayedAt))
                    .col(date_time_null(FeedPublications::DispatchedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_feed_publications_article")
                            .from(FeedPublications::Table, FeedPublications::ArticleId)
                            .to(Articles::Table, Articles::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_feed_publications_dispatched")
                    .table(FeedPublications::Table)
                    .col(FeedPublications::DispatchedAt)
                    .col(FeedPublications::Id)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(FeedPublications::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(FollowCounts::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Follows::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Articles {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Follows {
    Table,
    Id,
    FollowerId,
    FolloweeId,
    CreatedAt,
}

#[derive(DeriveIden)]
enum FollowCounts {
    Table,
    UserId,
    Followers,
    Following,
}

#[derive(DeriveIden)]
enum FeedPublications {
    Table,
    Id,
    ArticleId,
    AuthorId,
    CreatedAt,
    RelayedAt,
    DispatchedAt,
}
