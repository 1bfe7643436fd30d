//! Period buckets of the boards, in a poll's own IANA zone: local hours, local days (23 or 25
//! hours long across a DST change), ISO weeks (Monday to Monday, the ISO week-year in the name)
//! and calendar months, plus the one ALL_TIME bucket.
//!
//! A bucket is named by its local start (`20261125T14+0100` for an hour, `20261125` for a day,
//! `2026W48`, `202611`, `all`), and knows its start and end instants, so the next and previous
//! buckets are the ones holding its end and the instant before its start: no period has a fixed
//! length, and nothing needs a reset job.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Timelike, Utc};
use chrono_tz::Tz;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Period {
    Hour,
    Day,
    Week,
    Month,
    AllTime,
}

impl Period {
    pub const ALL: [Period; 5] = [
        Period::Hour,
        Period::Day,
        Period::Week,
        Period::Month,
        Period::AllTime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Hour => "HOUR",
            Self::Day => "DAY",
            Self::Week => "WEEK",
            Self::Month => "MONTH",
            Self::AllTime => "ALL_TIME",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|period| period.name() == name)
    }

    /// `HOUR,DAY,…` as stored in SQL and in vote events.
    pub fn join(periods: &[Period]) -> String {
        periods
            .iter()
            .map(|period| period.name())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn split(text: &str) -> Option<Vec<Period>> {
        text.split(',').map(Period::parse).collect()
    }
}

/// One period's bucket: its name in keys, and the instants it spans (`None` for ALL_TIME).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub id: String,
    pub span: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

impl Bucket {
    pub fn start(&self) -> Option<DateTime<Utc>> {
        self.span.map(|(start, _)| start)
    }

    pub fn end(&self) -> Option<DateTime<Utc>> {
        self.span.map(|(_, end)| end)
    }
}

/// The bucket of `period` holding `at`, in `zone`.
pub fn bucket(period: Period, at: DateTime<Utc>, zone: Tz) -> Bucket {
    let local = at.with_timezone(&zone);
    let (id, start, end) = match period {
        Period::AllTime => {
            return Bucket {
                id: "all".into(),
                span: None,
            };
        }
        Period::Hour => {
            let into_hour = Duration::minutes(i64::from(local.minute()))
                + Duration::seconds(i64::from(local.second()))
                + Duration::nanoseconds(i64::from(local.nanosecond()));
            let start = at - into_hour;
            let local_start = start.with_timezone(&zone);
            // The offset tells apart the two local 01:00 hours of a night when clocks go back.
            let id = local_start.format("%Y%m%dT%H%z").to_string();
            (id, start, start + Duration::hours(1))
        }
        Period::Day => {
            let day = local.date_naive();
            let id = day.format("%Y%m%d").to_string();
            (
                id,
                start_of_day(day, zone),
                start_of_day(next_day(day), zone),
            )
        }
        Period::Week => {
            let week = local.iso_week();
            let monday = local.date_naive()
                - Duration::days(i64::from(local.weekday().num_days_from_monday()));
            let id = format!("{}W{:02}", week.year(), week.week());
            (
                id,
                start_of_day(monday, zone),
                start_of_day(monday + Duration::days(7), zone),
            )
        }
        Period::Month => {
            let first = local
                .date_naive()
                .with_day(1)
                .expect("every month has a day 1");
            let next = if first.month() == 12 {
                NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
            } else {
                NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
            }
            .expect("the first of the next month exists");
            let id = first.format("%Y%m").to_string();
            (id, start_of_day(first, zone), start_of_day(next, zone))
        }
    };
    Bucket {
        id,
        span: Some((start, end)),
    }
}

/// The bucket after `current` (where a vote's carry-over goes); none after ALL_TIME.
pub fn next(period: Period, current: &Bucket, zone: Tz) -> Option<Bucket> {
    current.end().map(|end| bucket(period, end, zone))
}

/// The bucket before `current`; none before ALL_TIME.
pub fn previous(period: Period, current: &Bucket, zone: Tz) -> Option<Bucket> {
    current
        .start()
        .map(|start| bucket(period, start - Duration::milliseconds(1), zone))
}

/// Where a bucket stands for a reader, which tells an all-zero board that is true (nobody could
/// vote then) from one that is not known any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeriodState {
    /// The bucket holding now; ALL_TIME's one bucket always.
    Current,
    /// Ended within the retention: the board as the period ended.
    Past,
    /// Not begun: only the carry-over credited to it so far.
    Future,
    /// Ends before the poll opened to votes (its creation or its start): every score is 0.
    BeforePoll,
    /// Ended longer ago than the retention: its board is no longer kept.
    Expired,
}

/// The state of `bucket` at `now`, for a poll open to votes from `opened`, whose past boards are
/// kept for `retention` after their period ends (the same instant their keys expire).
pub fn state(
    bucket: &Bucket,
    now: DateTime<Utc>,
    opened: DateTime<Utc>,
    retention: std::time::Duration,
) -> PeriodState {
    let Some((start, end)) = bucket.span else {
        return PeriodState::Current;
    };
    let retention = Duration::from_std(retention).unwrap_or(Duration::MAX);
    if end <= opened {
        PeriodState::BeforePoll
    } else if now < start {
        PeriodState::Future
    } else if now < end {
        PeriodState::Current
    } else if end
        .checked_add_signed(retention)
        .is_some_and(|kept| now >= kept)
    {
        PeriodState::Expired
    } else {
        PeriodState::Past
    }
}

fn next_day(day: NaiveDate) -> NaiveDate {
    day.succ_opt()
        .expect("dates this far out are refused earlier")
}

/// The first instant of local `day`: midnight, or the first time after it that exists (a few
/// zones move their clocks at midnight).
fn start_of_day(day: NaiveDate, zone: Tz) -> DateTime<Utc> {
    let midnight = day.and_hms_opt(0, 0, 0).expect("midnight is a valid time");
    (0..=24 * 4)
        .find_map(|quarter| {
            zone.from_local_datetime(&(midnight + Duration::minutes(15 * quarter)))
                .earliest()
        })
        .expect("a local day has some instant")
        .with_timezone(&Utc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    const PARIS: Tz = chrono_tz::Europe::Paris;
    const NEW_YORK: Tz = chrono_tz::America::New_York;

    #[test]
    fn one_second_before_local_midnight_and_midnight_are_different_days() {
        // 23:59:59 and 00:00:00 in Shanghai (UTC+8).
        let shanghai = chrono_tz::Asia::Shanghai;
        let before = bucket(Period::Day, utc("2026-11-25T15:59:59Z"), shanghai);
        let after = bucket(Period::Day, utc("2026-11-25T16:00:00Z"), shanghai);
        assert_eq!(before.id, "20261125");
        assert_eq!(after.id, "20261126");
        assert_eq!(next(Period::Day, &before, shanghai).unwrap(), after);
        assert_eq!(previous(Period::Day, &after, shanghai).unwrap(), before);
    }

    #[test]
    fn iso_week_one_can_start_in_the_previous_december() {
        // Monday 29 December 2025 opens ISO week 1 of 2026.
        let week = bucket(Period::Week, utc("2025-12-29T10:00:00Z"), chrono_tz::UTC);
        assert_eq!(week.id, "2026W01");
        assert_eq!(week.start(), Some(utc("2025-12-29T00:00:00Z")));
        let before = previous(Period::Week, &week, chrono_tz::UTC).unwrap();
        assert_eq!(before.id, "2025W52");
        // 1 January 2027 is a Friday of 2026's last week, W53.
        let last = bucket(Period::Week, utc("2027-01-01T12:00:00Z"), chrono_tz::UTC);
        assert_eq!(last.id, "2026W53");
        assert_eq!(
            next(Period::Week, &last, chrono_tz::UTC).unwrap().id,
            "2027W01"
        );
    }

    #[test]
    fn a_spring_forward_day_lasts_23_hours_and_a_fall_back_day_25() {
        let spring = bucket(Period::Day, utc("2026-03-29T12:00:00Z"), PARIS);
        let (start, end) = spring.span.unwrap();
        assert_eq!(end - start, Duration::hours(23));
        let autumn = bucket(Period::Day, utc("2026-10-25T12:00:00Z"), PARIS);
        let (start, end) = autumn.span.unwrap();
        assert_eq!(end - start, Duration::hours(25));
        assert_eq!(start, utc("2026-10-24T22:00:00Z"));
    }

    #[test]
    fn the_repeated_hour_of_a_fall_back_night_is_two_buckets() {
        // 01:30 EDT then 01:30 EST, one hour apart.
        let first = bucket(Period::Hour, utc("2026-11-01T05:30:00Z"), NEW_YORK);
        let second = bucket(Period::Hour, utc("2026-11-01T06:30:00Z"), NEW_YORK);
        assert_eq!(first.id, "20261101T01-0400");
        assert_eq!(second.id, "20261101T01-0500");
        assert_eq!(next(Period::Hour, &first, NEW_YORK).unwrap(), second);
    }

    #[test]
    fn hours_follow_half_hour_zones() {
        let india = chrono_tz::Asia::Kolkata;
        let hour = bucket(Period::Hour, utc("2026-11-25T10:10:00Z"), india);
        assert_eq!(hour.id, "20261125T15+0530");
        assert_eq!(hour.start(), Some(utc("2026-11-25T09:30:00Z")));
    }

    #[test]
    fn months_roll_over_the_year() {
        let december = bucket(Period::Month, utc("2026-12-31T23:00:00Z"), chrono_tz::UTC);
        assert_eq!(december.id, "202612");
        assert_eq!(
            next(Period::Month, &december, chrono_tz::UTC).unwrap().id,
            "202701"
        );
    }

    #[test]
    fn all_time_has_no_neighbours() {
        let all = bucket(Period::AllTime, Utc::now(), PARIS);
        assert_eq!(all.id, "all");
        assert!(next(Period::AllTime, &all, PARIS).is_none());
        assert!(previous(Period::AllTime, &all, PARIS).is_none());
    }

    #[test]
    fn a_bucket_is_before_the_poll_past_expired_current_or_future() {
        let day = |at: &str| bucket(Period::Day, utc(at), chrono_tz::UTC);
        let now = utc("2026-11-25T12:00:00Z");
        let opened = utc("2026-11-10T08:00:00Z");
        let kept = std::time::Duration::from_secs(7 * 24 * 3600);
        let state_of = |at: &str| state(&day(at), now, opened, kept);
        assert_eq!(state_of("2026-11-09T23:00:00Z"), PeriodState::BeforePoll);
        // The day the poll opened ended after it did: votes could be in it, and it is kept 7 days.
        assert_eq!(state_of("2026-11-10T01:00:00Z"), PeriodState::Expired);
        assert_eq!(state_of("2026-11-17T12:00:00Z"), PeriodState::Expired);
        assert_eq!(state_of("2026-11-18T00:00:00Z"), PeriodState::Past);
        assert_eq!(state_of("2026-11-24T23:59:59Z"), PeriodState::Past);
        assert_eq!(state_of("2026-11-25T00:00:00Z"), PeriodState::Current);
        assert_eq!(state_of("2026-11-26T00:00:00Z"), PeriodState::Future);
        let all = bucket(Period::AllTime, now, chrono_tz::UTC);
        assert_eq!(state(&all, now, opened, kept), PeriodState::Current);
    }

    #[test]
    fn periods_round_trip_through_their_stored_form() {
        let periods = vec![Period::Hour, Period::Week, Period::AllTime];
        assert_eq!(Period::split(&Period::join(&periods)).unwrap(), periods);
        assert!(Period::split("DAY,FORTNIGHT").is_none());
    }
}
