//! The SQL connection: the system of record. One pool per process, migrated at start-up.

use std::time::Duration;

use anyhow::Context as _;
use migrations::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::SqliteJournalMode;
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::config::redacted_url;

pub async fn connect(url: &str) -> anyhow::Result<DatabaseConnection> {
    if let Some(path) = sqlite_file(url)
        && let Some(dir) = std::path::Path::new(path).parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the directory of {path}"))?;
    }
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(16)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(5))
        .sqlx_logging(false)
        // WAL lets readers proceed while a writer commits; the busy timeout makes concurrent writers
        // queue instead of failing with "database is locked".
        .map_sqlx_sqlite_opts(|opts| {
            opts.journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true)
        });
    Database::connect(options)
        .await
        .with_context(|| format!("cannot connect to the database at {}", redacted_url(url)))
}

pub async fn migrate(db: &DatabaseConnection) -> anyhow::Result<()> {
    Migrator::up(db, None)
        .await
        .context("database migration failed")
}

/// The current time as stored in SQL: UTC, whole seconds (the precision every backend keeps, so a
/// value read back equals the value written).
pub fn now() -> chrono::NaiveDateTime {
    let now = chrono::Utc::now().naive_utc();
    chrono::DurationRound::duration_trunc(now, chrono::TimeDelta::seconds(1)).unwrap_or(now)
}

fn sqlite_file(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

#[cfg(test)]
mod tests {
    use super::sqlite_file;

    #[test]
    fn finds_the_file_of_a_sqlite_url() {
        assert_eq!(
            sqlite_file("sqlite://data/pulse.sqlite?mode=rwc"),
            Some("data/pulse.sqlite")
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://localhost/test"), None);
    }
}
