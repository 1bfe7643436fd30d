//! What a failed SQL statement means: a transient failure (a lost connection, a deadlock, a lock
//! or pool wait that ran out) answers `UNAVAILABLE`, and idempotent work retries once on one.

use sea_orm::sqlx;
use sea_orm::{DbErr, RuntimeErr};

/// Why a statement failed when the same statement may well succeed later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transient {
    /// The connection broke, was refused or was terminated: another connection may work at once.
    Disconnected,
    /// A deadlock or serialization failure: the transaction lost a race and may win the next one.
    Conflict,
    /// A wait for a lock or a pooled connection ran out. The wait took its whole bound already, so
    /// trying again at once would double what the client waits.
    TimedOut,
}

impl Transient {
    fn worth_retrying_at_once(self) -> bool {
        !matches!(self, Self::TimedOut)
    }
}

/// Classifies `err`; `None` for failures that another try would repeat (bad SQL, constraint
/// violations, decoding errors).
pub fn transient(err: &DbErr) -> Option<Transient> {
    match err {
        DbErr::ConnectionAcquire(_) => Some(Transient::TimedOut),
        // Opening a connection failed, whatever the reason: the database cannot be reached.
        DbErr::Conn(_) => Some(Transient::Disconnected),
        DbErr::Exec(RuntimeErr::SqlxError(err)) | DbErr::Query(RuntimeErr::SqlxError(err)) => {
            transient_sqlx(err)
        }
        _ => None,
    }
}

fn transient_sqlx(err: &sqlx::Error) -> Option<Transient> {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed => {
            Some(Transient::Disconnected)
        }
        sqlx::Error::PoolTimedOut => Some(Transient::TimedOut),
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                postgres_transient(pg.code())
            } else if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                mysql_transient(my.number(), my.code())
            } else if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // SQLite's `code()` is its extended result code, in decimal.
                sqlite_transient(db.code()?.parse().ok()?)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// By SQLSTATE: class 08 (connection exception), the server shutting down or terminating the
/// backend (57P01–57P03), too many connections (53300), serialization failure and deadlock.
fn postgres_transient(sqlstate: &str) -> Option<Transient> {
    match sqlstate {
        "40001" | "40P01" => Some(Transient::Conflict),
        "57P01" | "57P02" | "57P03" | "53300" => Some(Transient::Disconnected),
        _ if sqlstate.starts_with("08") => Some(Transient::Disconnected),
        _ => None,
    }
}

/// By error number: 1213 deadlock, 1205 lock wait timeout, 1040 too many connections, 1053 server
/// shutdown, 1927 connection killed (MariaDB), 2006/2013 server gone; or SQLSTATE class 08.
fn mysql_transient(number: u16, sqlstate: Option<&str>) -> Option<Transient> {
    match number {
        1213 => Some(Transient::Conflict),
        1205 => Some(Transient::TimedOut),
        1040 | 1053 | 1927 | 2006 | 2013 => Some(Transient::Disconnected),
        _ if sqlstate.is_some_and(|state| state.starts_with("08")) => Some(Transient::Disconnected),
        _ => None,
    }
}

/// By primary result code (the low byte of the extended one): SQLITE_BUSY (5) comes after the busy
/// timeout ran out; SQLITE_LOCKED (6) is a conflict inside one process.
fn sqlite_transient(extended: i32) -> Option<Transient> {
    match extended & 0xff {
        5 => Some(Transient::TimedOut),
        6 => Some(Transient::Conflict),
        _ => None,
    }
}

/// Runs `operation`, and once more if it failed transiently in a way another try may fix at once.
/// Only for idempotent work: a write may have committed before its connection broke, so running it
/// twice must leave the same result as running it once.
pub async fn retry_once<T, F, Fut>(mut operation: F) -> Result<T, DbErr>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    match operation().await {
        Err(err) if transient(&err).is_some_and(Transient::worth_retrying_at_once) => {
            tracing::warn!(error = %err, "transient SQL failure; trying once more");
            operation().await
        }
        done => done,
    }
}

/// The current time as stored in SQL: UTC, whole seconds (the precision every backend keeps, so a
/// value read back equals the value written).
pub fn now() -> chrono::NaiveDateTime {
    let now = chrono::Utc::now().naive_utc();
    chrono::DurationRound::duration_trunc(now, chrono::TimeDelta::seconds(1)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminated_backends_and_lost_races_are_transient_on_postgres() {
        assert_eq!(postgres_transient("57P01"), Some(Transient::Disconnected));
        assert_eq!(postgres_transient("08006"), Some(Transient::Disconnected));
        assert_eq!(postgres_transient("40P01"), Some(Transient::Conflict));
        assert_eq!(postgres_transient("23505"), None);
        assert_eq!(postgres_transient("22021"), None);
    }

    #[test]
    fn killed_connections_and_deadlocks_are_transient_on_mysql() {
        assert_eq!(
            mysql_transient(1927, Some("70100")),
            Some(Transient::Disconnected)
        );
        assert_eq!(
            mysql_transient(1213, Some("40001")),
            Some(Transient::Conflict)
        );
        assert_eq!(
            mysql_transient(1047, Some("08S01")),
            Some(Transient::Disconnected)
        );
        assert_eq!(mysql_transient(1062, Some("23000")), None);
    }

    #[test]
    fn sqlite_busy_is_a_wait_that_ran_out() {
        assert_eq!(sqlite_transient(5), Some(Transient::TimedOut));
        assert_eq!(sqlite_transient(517), Some(Transient::TimedOut));
        assert_eq!(sqlite_transient(262), Some(Transient::Conflict));
        assert_eq!(sqlite_transient(2067), None);
    }

    #[test]
    fn waits_that_ran_out_are_not_retried_at_once() {
        let timed_out = DbErr::ConnectionAcquire(sea_orm::ConnAcquireErr::Timeout);
        assert_eq!(transient(&timed_out), Some(Transient::TimedOut));
        assert!(!Transient::TimedOut.worth_retrying_at_once());
        assert!(Transient::Disconnected.worth_retrying_at_once());
    }
}
