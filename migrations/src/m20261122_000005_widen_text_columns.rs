//! MySQL/MariaDB only: bodies fit their documented maximum in any characters, and any character fits.
//!
//! A body may be 50,000 characters; in 4-byte characters that is 200,000 bytes, beyond `TEXT`'s
//! 65,535, so the column becomes `MEDIUMTEXT` (16 MiB). The other string columns are `VARCHAR(n)`,
//! which counts characters, so they hold their limits already. Tables created on a server whose
//! default character set is not utf8mb4 cannot store 4-byte characters (emoji) at all; they, and
//! the database's default for tables still to come, are converted. SQLite and PostgreSQL store any
//! text of these lengths already: nothing to do there.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLES: [&str; 3] = ["users", "articles", "view_flush_batches"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        let db = manager.get_connection();
        if !database_is_utf8mb4(db).await? {
            db.execute_unprepared("ALTER DATABASE CHARACTER SET utf8mb4")
                .await?;
        }
        for table in TABLES {
            if !table_is_utf8mb4(db, table).await? {
                db.execute_unprepared(&format!(
                    "ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4"
                ))
                .await?;
            }
        }
        db.execute_unprepared("ALTER TABLE articles MODIFY body MEDIUMTEXT NOT NULL")
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        // Fails, rather than cut bodies short, while a body longer than TEXT holds is stored.
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE articles MODIFY body TEXT NOT NULL")
            .await?;
        Ok(())
    }
}

async fn database_is_utf8mb4(db: &SchemaManagerConnection<'_>) -> Result<bool, DbErr> {
    let sql = "SELECT DEFAULT_CHARACTER_SET_NAME AS charset FROM information_schema.SCHEMATA \
               WHERE SCHEMA_NAME = DATABASE()";
    only_utf8mb4(db, Statement::from_string(DbBackend::MySql, sql)).await
}

/// Whether the table's default and every one of its text columns are utf8mb4.
async fn table_is_utf8mb4(db: &SchemaManagerConnection<'_>, table: &str) -> Result<bool, DbErr> {
    let sql = "SELECT c.CHARACTER_SET_NAME AS charset \
               FROM information_schema.TABLES t \
               JOIN information_schema.COLLATION_CHARACTER_SET_APPLICABILITY c \
                 ON c.COLLATION_NAME = t.TABLE_COLLATION \
               WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = ? \
               UNION ALL \
               SELECT CHARACTER_SET_NAME FROM information_schema.COLUMNS \
               WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
                 AND CHARACTER_SET_NAME IS NOT NULL";
    let statement =
        Statement::from_sql_and_values(DbBackend::MySql, sql, [table.into(), table.into()]);
    only_utf8mb4(db, statement).await
}

async fn only_utf8mb4(
    db: &SchemaManagerConnection<'_>,
    statement: Statement,
) -> Result<bool, DbErr> {
    for row in db.query_all_raw(statement).await? {
        if row.try_get::<String>("", "charset")? != "utf8mb4" {
            return Ok(false);
        }
    }
    Ok(true)
}
