//! Time buckets of the DAY and WEEK view rankings: local days and ISO weeks in the configured zone.

use std::time::Duration;

use chrono::{DateTime, Datelike, Utc};
use chrono_tz::Tz;

/// A day's ranking is kept this long after its last view, long enough to compare with yesterday.
pub const DAY_BUCKET_TTL: Duration = Duration::from_secs(3 * 24 * 3600);
/// A week's ranking is kept this long after its last view, long enough to compare with last week.
pub const WEEK_BUCKET_TTL: Duration = Duration::from_secs(15 * 24 * 3600);

/// The local day of `at`, e.g. `20261121`.
pub fn day(at: DateTime<Utc>, zone: Tz) -> String {
    at.with_timezone(&zone).format("%Y%m%d").to_string()
}

/// The ISO week of `at`, e.g. `2026W47`; the year is the ISO week-year, not the calendar year.
pub fn week(at: DateTime<Utc>, zone: Tz) -> String {
    let week = at.with_timezone(&zone).iso_week();
    format!("{}W{:02}", week.year(), week.week())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn days_follow_the_configured_zone() {
        let late_evening_utc = utc("2026-11-21T23:30:00Z");
        assert_eq!(day(late_evening_utc, chrono_tz::UTC), "20261121");
        assert_eq!(day(late_evening_utc, chrono_tz::Asia::Shanghai), "20261122");
        assert_eq!(
            day(utc("2026-11-21T03:00:00Z"), chrono_tz::America::Los_Angeles),
            "20261120"
        );
    }

    #[test]
    fn weeks_are_iso_weeks() {
        assert_eq!(week(utc("2026-11-21T12:00:00Z"), chrono_tz::UTC), "2026W47");
        // 1 January 2027 is a Friday: it belongs to the last ISO week of 2026.
        assert_eq!(week(utc("2027-01-01T12:00:00Z"), chrono_tz::UTC), "2026W53");
        // Sunday night in UTC is already Monday, a new week, in Tokyo.
        assert_eq!(week(utc("2026-11-22T20:00:00Z"), chrono_tz::UTC), "2026W47");
        assert_eq!(
            week(utc("2026-11-22T20:00:00Z"), chrono_tz::Asia::Tokyo),
            "2026W48"
        );
    }
}
