//! The GraphQL faces of the domain's enums and rate-limit rules.

use async_graphql::{Enum, InputObject, SimpleObject};

use crate::board::TiePolicy;
use crate::periods::{Period, PeriodState};
use crate::rules::{LimitScope, LimitWindow, Rule};
use crate::service::Board;

/// What a leaderboard's period is, next to now and the poll's life.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "PeriodState", remote = "PeriodState")]
pub enum PeriodStateGql {
    /// The period holding now (ALL_TIME always): the live board.
    Current,
    /// Ended within `PULSE_VOTE_BUCKET_RETENTION`: the board as the period ended.
    Past,
    /// Not begun: only the carry-over credited to it so far.
    Future,
    /// Ends before the poll opened to votes (its creation or `startsAt`): every score is 0.
    BeforePoll,
    /// Ended longer ago than `PULSE_VOTE_BUCKET_RETENTION`: its board is no longer kept, and the
    /// leaderboard has no entries.
    Expired,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "Period", remote = "Period")]
pub enum PeriodGql {
    Hour,
    Day,
    /// An ISO week (Monday to Monday) of the poll's zone.
    Week,
    Month,
    AllTime,
}

/// DISPLAY counts each vote as the option's bonus N; REAL counts 1.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "Board", remote = "Board")]
pub enum BoardGql {
    Display,
    Real,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "TiePolicy", remote = "TiePolicy")]
pub enum TiePolicyGql {
    /// 1, 2, 3: ties ordered by option id.
    Ordinal,
    /// 1, 1, 2.
    Dense,
    /// 1, 1, 3.
    Competition,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "LimitScope", remote = "LimitScope")]
pub enum LimitScopeGql {
    Voter,
    Ip,
    Option,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "LimitWindow", remote = "LimitWindow")]
pub enum LimitWindowGql {
    Second,
    Minute,
    /// A local hour of the poll's zone; DAY, WEEK and MONTH too.
    Hour,
    Day,
    Week,
    Month,
    /// The poll's whole life.
    Poll,
}

/// A rule with `channel` applies only to ballots from that channel; one with `device` counts per
/// device type.
#[derive(SimpleObject, Clone)]
pub struct RateLimitRule {
    scope: LimitScopeGql,
    window: LimitWindowGql,
    limit: i64,
    channel: Option<String>,
    device: Option<String>,
}

impl From<&Rule> for RateLimitRule {
    fn from(rule: &Rule) -> Self {
        Self {
            scope: rule.scope.into(),
            window: rule.window.into(),
            limit: rule.limit,
            channel: rule.channel.clone(),
            device: rule.device.clone(),
        }
    }
}

#[derive(InputObject)]
pub struct RateLimitRuleInput {
    scope: LimitScopeGql,
    window: LimitWindowGql,
    /// At least 1.
    limit: i64,
    /// Only ballots from this channel; among rules of one scope and window, a channel's rule
    /// replaces the general one for that channel's traffic.
    channel: Option<String>,
    /// Only ballots from this device type, counted apart from other devices.
    device: Option<String>,
}

impl From<RateLimitRuleInput> for Rule {
    fn from(input: RateLimitRuleInput) -> Self {
        Self {
            scope: input.scope.into(),
            window: input.window.into(),
            limit: input.limit,
            channel: input.channel,
            device: input.device,
        }
    }
}
