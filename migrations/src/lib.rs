//! Schema migrations for Pulse. A migration is never edited after it lands: a change is a new file.

pub use sea_orm_migration::prelude::*;

mod m20261121_000001_create_users;
mod m20261121_000002_create_articles;
mod m20261121_000003_create_view_flush_batches;
mod m20261122_000004_view_flush_sequences;
mod m20261122_000005_widen_text_columns;
mod m20261123_000006_comments_and_likes;
mod m20261125_000007_polls_and_votes;
mod m20261125_000010_follows_and_feed;
mod m20261125_000013_trusted_documents;
mod m20261127_000020_database_identity;
mod m20261127_000030_search_outbox;
mod m20261129_000040_publication_announcements;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261121_000001_create_users::Migration),
            Box::new(m20261121_000002_create_articles::Migration),
            Box::new(m20261121_000003_create_view_flush_batches::Migration),
            Box::new(m20261122_000004_view_flush_sequences::Migration),
            Box::new(m20261122_000005_widen_text_columns::Migration),
            Box::new(m20261123_000006_comments_and_likes::Migration),
            Box::new(m20261125_000007_polls_and_votes::Migration),
            Box::new(m20261125_000010_follows_and_feed::Migration),
            Box::new(m20261125_000013_trusted_documents::Migration),
            Box::new(m20261127_000020_database_identity::Migration),
            Box::new(m20261127_000030_search_outbox::Migration),
            Box::new(m20261129_000040_publication_announcements::Migration),
        ]
    }
}
