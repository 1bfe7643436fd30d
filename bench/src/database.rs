//! The SQL database a scenario's servers share: a SQLite file of the run's own, or a fresh
//! database on a PostgreSQL or MariaDB server, dropped afterwards.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use sea_orm::{ConnectionTrait as _, Database, DatabaseConnection};

use crate::server::sqlite_url;

pub struct BenchDatabase {
    pub url: String,
    /// A SQLite file's directory, removed at the end.
    dir: Option<PathBuf>,
    /// A server database: the URL to reconnect with to drop it, and its name.
    server: Option<(String, String)>,
}

impl BenchDatabase {
    /// A fresh database: a SQLite file when `server_url` is unset, else a new database beside the
    /// one `server_url` names (`postgres://…/test`, `mysql://…/test`).
    pub async fn create(server_url: Option<&str>) -> anyhow::Result<Self> {
        let name = format!("pulse_bench_{}", crate::random_hex(12));
        let Some(server_url) = server_url else {
            let dir = std::env::temp_dir().join(&name);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            return Ok(Self {
                url: sqlite_url(&dir.join("pulse.sqlite")),
                dir: Some(dir),
                server: None,
            });
        };
        if !(server_url.starts_with("postgres://") || server_url.starts_with("mysql://")) {
            bail!(
                "--database-url must be a postgres:// or mysql:// URL naming an existing database"
            );
        }
        let (base, _) = server_url
            .rsplit_once('/')
            .context("--database-url names no database")?;
        let admin = Database::connect(server_url)
            .await
            .context("cannot connect to --database-url")?;
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("cannot create the database {name}"))?;
        admin.close().await.ok();
        Ok(Self {
            url: format!("{base}/{name}"),
            dir: None,
            server: Some((server_url.to_owned(), name)),
        })
    }

    pub async fn connect(&self) -> anyhow::Result<DatabaseConnection> {
        Database::connect(&self.url)
            .await
            .context("cannot connect to the run's database")
    }

    /// The backend's name, for the report.
    pub fn backend(&self) -> &'static str {
        match self.url.split_once("://").map(|(scheme, _)| scheme) {
            Some("postgres") => "PostgreSQL",
            Some("mysql") => "MariaDB/MySQL",
            _ => "SQLite",
        }
    }

    /// Removes the database; call once every server using it has stopped.
    pub async fn remove(self) -> anyhow::Result<()> {
        if let Some(dir) = self.dir {
            std::fs::remove_dir_all(&dir).ok();
        }
        if let Some((server_url, name)) = self.server {
            let admin = Database::connect(&server_url).await?;
            admin
                .execute_unprepared(&format!("DROP DATABASE {name}"))
                .await
                .with_context(|| format!("cannot drop the database {name}"))?;
            admin.close().await.ok();
        }
        Ok(())
    }
}
