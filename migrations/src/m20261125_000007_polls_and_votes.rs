use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Polls, their options and rate-limit rules, and the vote log.
///
/// `polls`, `poll_options` and `poll_rules` are the configuration each process keeps in memory.
/// `vote_log` is the insert-only record of every accepted ballot, keyed by the event id the vote
/// script minted (a replayed stream entry is recognised) and ordered within a poll by `seq`, the
/// order in which the script applied the votes: replaying it in that order rebuilds every board
/// exactly, floats included. Each row carries the poll's configuration as the vote saw it (bonus,
/// carry-over, periods, zone), so a later change of the poll does not rewrite history.
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Polls::Table)
                    .if_not_exists()
                    .col(big_pk_auto(Polls::Id))
                    .col(string_len(Polls::Title, 200))
                    .col(string_len(Polls::Timezone, 64))
                    .col(string_len(Polls::Periods, 64))
                    .col(double(Polls::CarryOver))
                    .col(string_len(Polls::TiePolicy, 16))
                    .col(date_time_null(Polls::StartsAt))
                    .col(date_time_null(Polls::EndsAt))
                    .col(date_time_null(Polls::ClosedAt))
                    .col(date_time(Polls::CreatedAt))
                    .col(date_time(Polls::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(PollOptions::Table)
                    .if_not_exists()
                    .col(big_pk_auto(PollOptions::Id))
                    .col(big_integer(PollOptions::PollId))
                    .col(string_len(PollOptions::Label, 200))
                    .col(integer(PollOptions::Bonus))
                    .col(big_integer(PollOptions::InitialVotes))
                    .col(date_time(PollOptions::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_poll_options_poll")
                            .from(PollOptions::Table, PollOptions::PollId)
                            .to(Polls::Table, Polls::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_poll_options_poll")
                    .table(PollOptions::Table)
                    .col(PollOptions::PollId)
                    .col(PollOptions::Id)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(PollRules::Table)
                    .if_not_exists()
                    .col(big_pk_auto(PollRules::Id))
                    .col(big_integer(PollRules::PollId))
                    .col(string_len(PollRules::Scope, 16))
                    .col(string_len(PollRules::Window, 16))
                    .col(big_integer(PollRules::Limit))
                    .col(string_len_null(PollRules::Channel, 64))
                    .col(string_len_null(PollRules::Device, 64))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_poll_rules_poll")
                            .from(PollRules::Table, PollRules::PollId)
                            .to(Polls::Table, Polls::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_poll_rules_poll")
                    .table(PollRules::Table)
                    .col(PollRules::PollId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(VoteLog::Table)
                    .if_not_exists()
                    .col(big_pk_auto(VoteLog::Id))
                    .col(string_len(VoteLog::EventId, 40).unique_key())
                    .col(big_integer(VoteLog::PollId))
                    .col(big_integer(VoteLog::OptionId))
                    .col(big_integer(VoteLog::VoterId))
                    .col(big_integer(VoteLog::Seq))
                    .col(big_integer(VoteLog::AtMs))
                    .col(integer(VoteLog::Bonus))
                    .col(double(VoteLog::CarryOver))
                    .col(string_len(VoteLog::Periods, 64))
                    .col(string_len(VoteLog::Timezone, 64))
                    .col(string_len_null(VoteLog::Channel, 64))
                    .col(string_len_null(VoteLog::Device, 64))
                    .col(date_time(VoteLog::CreatedAt))
                    .to_owned(),
            )
            .await?;
        // A rebuild replays one poll's votes in the order the script applied them.
        manager
            .create_index(
                Index::create()
                    .name("idx_vote_log_poll_seq")
                    .table(VoteLog::Table)
                    .col(VoteLog::PollId)
                    .col(VoteLog::Seq)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            VoteLog::Table.into_iden(),
            PollRules::Table.into_iden(),
            PollOptions::Table.into_iden(),
            Polls::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Polls {
    Table,
    Id,
    Title,
    Timezone,
    Periods,
    CarryOver,
    TiePolicy,
    StartsAt,
    EndsAt,
    ClosedAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum PollOptions {
    Table,
    Id,
    PollId,
    Label,
    Bonus,
    InitialVotes,
    CreatedAt,
}

#[derive(DeriveIden)]
enum PollRules {
    Table,
    Id,
    PollId,
    Scope,
    Window,
    Limit,
    Channel,
    Device,
}

#[derive(DeriveIden)]
enum VoteLog {
    Table,
    Id,
    EventId,
    PollId,
    OptionId,
    VoterId,
    Seq,
    AtMs,
    Bonus,
    CarryOver,
    Periods,
    Timezone,
    Channel,
    Device,
    CreatedAt,
}
