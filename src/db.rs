//! The SQL connection: the system of record. One pool per process, migrated at start-up. What a
//! failed statement means (transient or not) is the runtime's (`pulse_runtime::sql`), re-exported
//! here.

use std::ops::Deref as _;
use std::time::Duration;

use anyhow::Context as _;
use migrations::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::SqliteJournalMode;
use sea_orm::sqlx::{ConnectOptions as _, Connection as _, Executor as _};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbBackend, DbErr, RuntimeErr};

use crate::config::redacted_url;

pub use pulse_runtime::sql::{Transient, now, retry_once, transient};

/// How long the readiness probe waits for SQLite's write lock: inside the probe's own timeout, so a
/// locked file reads as "not ready" rather than as a probe that hung.
const SQLITE_PROBE_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a request waits for one of the pool's connections before it answers UNAVAILABLE.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// `sqlite_busy_timeout`: how long a SQLite write waits for another writer before it fails.
pub async fn connect(
    url: &str,
    sqlite_busy_timeout: Duration,
) -> anyhow::Result<DatabaseConnection> {
    if let Some(path) = sqlite_file(url)
        && let Some(dir) = std::path::Path::new(path).parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the directory of {path}"))?;
    }
    // SQLite's writers queue on the file's lock holding a pool connection each, so a request waiting
    // for a connection is waiting for that lock: it may wait as long as a write may.
    let acquire_timeout = if url.starts_with("sqlite:") {
        ACQUIRE_TIMEOUT.max(sqlite_busy_timeout)
    } else {
        ACQUIRE_TIMEOUT
    };
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(16)
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(acquire_timeout)
        .sqlx_logging(false)
        // WAL lets readers proceed while a writer commits; the busy timeout makes concurrent writers
        // queue instead of failing with "database is locked", but only for as long as a client
        // should wait before hearing UNAVAILABLE.
        .map_sqlx_sqlite_opts(move |opts| {
            opts.journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(sqlite_busy_timeout)
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

/// Whether the database can take a write now. SQLite's readers never wait for its writer, so a
/// `SELECT 1` answers even while another process holds the file locked; there the probe takes the
/// write lock itself, on a connection of its own with a short busy timeout, and gives it back.
pub async fn probe_writable(db: &DatabaseConnection) -> Result<(), DbErr> {
    if db.get_database_backend() != DbBackend::Sqlite {
        return db.ping().await;
    }
    let options = db
        .get_sqlite_connection_pool()
        .connect_options()
        .deref()
        .clone()
        .busy_timeout(SQLITE_PROBE_BUSY_TIMEOUT);
    let probe = async {
        let mut conn = options.connect().await?;
        conn.execute("BEGIN IMMEDIATE").await?;
        conn.execute("ROLLBACK").await?;
        conn.close().await
    };
    probe
        .await
        .map_err(|err| DbErr::Conn(RuntimeErr::SqlxError(err.into())))
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
    use super::*;

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
