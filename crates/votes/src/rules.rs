//! Rate-limit rules: which apply to a ballot, and the counters they are checked against.
//!
//! A rule limits ballots per VOTER, per client IP or per OPTION within a window (a second, a
//! minute, a local hour, day, ISO week or month of the poll's zone, or the whole poll). A rule
//! may name a `channel`, applying only to that channel's ballots, and a `device`, applying only to
//! that device type's ballots and counting them apart. Among the rules that match a ballot, the
//! most specific of each (scope, window) applies: a partner channel's rule replaces the general
//! one for that channel's traffic, which is how it grants extra votes, since both count into one
//! counter (a voter with 2 general votes this minute has 5 more under a partner's limit of 7).
//! A device's rule counts apart: a voter capped on `web` can still vote on `mobile`.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use pulse_runtime::error::{AppError, AppResult};

use super::periods::{self, Period};

/// Most rules one poll may carry.
pub const MAX_RULES: usize = 20;
/// Longest channel or device name.
pub const MAX_TAG_CHARS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitScope {
    Voter,
    Ip,
    Option,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitWindow {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Poll,
}

impl LimitScope {
    pub fn name(self) -> &'static str {
        match self {
            Self::Voter => "VOTER",
            Self::Ip => "IP",
            Self::Option => "OPTION",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Voter, Self::Ip, Self::Option]
            .into_iter()
            .find(|scope| scope.name() == name)
    }
}

impl LimitWindow {
    pub fn name(self) -> &'static str {
        match self {
            Self::Second => "SECOND",
            Self::Minute => "MINUTE",
            Self::Hour => "HOUR",
            Self::Day => "DAY",
            Self::Week => "WEEK",
            Self::Month => "MONTH",
            Self::Poll => "POLL",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Second,
            Self::Minute,
            Self::Hour,
            Self::Day,
            Self::Week,
            Self::Month,
            Self::Poll,
        ]
        .into_iter()
        .find(|window| window.name() == name)
    }

    /// The window holding `at`: its name in counter keys and when it ends (never, for POLL).
    pub fn current(self, at: DateTime<Utc>, zone: Tz) -> (String, Option<DateTime<Utc>>) {
        let fixed = |millis: i64, tag: &str| {
            let index = at.timestamp_millis().div_euclid(millis);
            let end = DateTime::from_timestamp_millis((index + 1) * millis);
            (format!("{tag}{index}"), end)
        };
        let local = |period: Period| {
            let bucket = periods::bucket(period, at, zone);
            let end = bucket.end();
            (bucket.id, end)
        };
        match self {
            Self::Second => fixed(1_000, "s"),
            Self::Minute => fixed(60_000, "m"),
            Self::Hour => local(Period::Hour),
            Self::Day => local(Period::Day),
            Self::Week => local(Period::Week),
            Self::Month => local(Period::Month),
            Self::Poll => ("poll".into(), None),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub scope: LimitScope,
    pub window: LimitWindow,
    pub limit: i64,
    pub channel: Option<String>,
    pub device: Option<String>,
}

impl Rule {
    fn matches(&self, channel: Option<&str>, device: Option<&str>) -> bool {
        self.channel
            .as_deref()
            .is_none_or(|own| Some(own) == channel)
            && self.device.as_deref().is_none_or(|own| Some(own) == device)
    }

    fn specificity(&self) -> u8 {
        u8::from(self.channel.is_some()) * 2 + u8::from(self.device.is_some())
    }

    /// What the rule's counter is shared by: its scope and window, and its device (rules that
    /// differ only by channel share one counter).
    pub fn counter_name(&self) -> String {
        format!(
            "{}:{}:{}",
            self.scope.name(),
            self.window.name(),
            self.device.as_deref().unwrap_or("*")
        )
    }
}

/// Checks a poll's rules as a whole: limits positive, names short, at most one rule per
/// (scope, window, channel, device), at most [`MAX_RULES`].
pub fn validate(rules: &[Rule]) -> AppResult<()> {
    if rules.len() > MAX_RULES {
        return Err(AppError::bad_input(
            "rules",
            format!("a poll has at most {MAX_RULES} rules"),
        ));
    }
    for (index, rule) in rules.iter().enumerate() {
        if rule.limit < 1 {
            return Err(AppError::bad_input(
                "rules",
                "a rule's limit must be at least 1",
            ));
        }
        for tag in [&rule.channel, &rule.device].into_iter().flatten() {
            if tag.is_empty()
                || tag.chars().count() > MAX_TAG_CHARS
                || tag.contains(['{', '}', ':'])
            {
                return Err(AppError::bad_input(
                    "rules",
                    format!(
                        "channel and device names have 1 to {MAX_TAG_CHARS} characters, without braces or colons"
                    ),
                ));
            }
        }
        let twin = rules[..index].iter().any(|other| {
            other.scope == rule.scope
                && other.window == rule.window
                && other.channel == rule.channel
                && other.device == rule.device
        });
        if twin {
            return Err(AppError::bad_input(
                "rules",
                format!(
                    "two rules limit {} per {} for the same channel and device",
                    rule.scope.name(),
                    rule.window.name()
                ),
            ));
        }
    }
    Ok(())
}

/// The rules that apply to a ballot from `channel` on `device`, by their index in `rules`: the
/// most specific matching rule of each (scope, window).
pub fn applicable<'a>(
    rules: &'a [Rule],
    channel: Option<&str>,
    device: Option<&str>,
) -> Vec<(usize, &'a Rule)> {
    let matching: Vec<(usize, &Rule)> = rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| rule.matches(channel, device))
        .collect();
    matching
        .iter()
        .copied()
        .filter(|(_, rule)| {
            !matching.iter().any(|(_, other)| {
                other.scope == rule.scope
                    && other.window == rule.window
                    && other.specificity() > rule.specificity()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(scope: LimitScope, window: LimitWindow, limit: i64) -> Rule {
        Rule {
            scope,
            window,
            limit,
            channel: None,
            device: None,
        }
    }

    #[test]
    fn a_partner_channels_rule_replaces_the_general_one_for_its_traffic_only() {
        let general = rule(LimitScope::Voter, LimitWindow::Minute, 2);
        let partner = Rule {
            channel: Some("partner".into()),
            ..rule(LimitScope::Voter, LimitWindow::Minute, 7)
        };
        let per_option = rule(LimitScope::Option, LimitWindow::Hour, 100);
        let rules = vec![general.clone(), partner.clone(), per_option];
        let indexes = |channel| -> Vec<usize> {
            applicable(&rules, channel, None)
                .iter()
                .map(|(index, _)| *index)
                .collect()
        };
        assert_eq!(indexes(Some("partner")), vec![1, 2]);
        assert_eq!(indexes(Some("web-ads")), vec![0, 2]);
        assert_eq!(indexes(None), vec![0, 2]);
        assert_eq!(general.counter_name(), partner.counter_name());
    }

    #[test]
    fn a_devices_rule_counts_apart() {
        let web = Rule {
            device: Some("web".into()),
            ..rule(LimitScope::Voter, LimitWindow::Day, 5)
        };
        let mobile = Rule {
            device: Some("mobile".into()),
            ..web.clone()
        };
        assert_ne!(web.counter_name(), mobile.counter_name());
        let rules = vec![web, mobile];
        assert_eq!(applicable(&rules, None, Some("mobile")).len(), 1);
        assert_eq!(applicable(&rules, None, Some("mobile"))[0].0, 1);
        assert!(applicable(&rules, None, None).is_empty());
    }

    #[test]
    fn twin_rules_and_non_positive_limits_are_refused() {
        let twin = vec![
            rule(LimitScope::Ip, LimitWindow::Hour, 3),
            rule(LimitScope::Ip, LimitWindow::Hour, 4),
        ];
        assert_eq!(validate(&twin).unwrap_err().code(), "BAD_USER_INPUT");
        let zero = vec![rule(LimitScope::Ip, LimitWindow::Hour, 0)];
        assert_eq!(validate(&zero).unwrap_err().code(), "BAD_USER_INPUT");
    }

    #[test]
    fn fixed_windows_end_on_their_boundary() {
        let at: DateTime<Utc> = "2026-11-25T10:00:59.500Z".parse().unwrap();
        let (id, end) = LimitWindow::Minute.current(at, chrono_tz::UTC);
        assert!(id.starts_with('m'));
        assert_eq!(end, Some("2026-11-25T10:01:00Z".parse().unwrap()));
        assert_eq!(LimitWindow::Poll.current(at, chrono_tz::UTC).1, None);
    }
}
