//! What admins send to create and change polls and their options.

use async_graphql::InputObject;
use chrono::{DateTime, Utc};

use super::types::{PeriodGql, RateLimitRuleInput, TiePolicyGql};
use crate::admin::{NewOption, NewPoll, PollChanges};
use crate::rules::Rule;

#[derive(InputObject)]
pub struct PollOptionInput {
    label: String,
    /// What one vote adds on the DISPLAY boards (1 to 1,000,000).
    #[graphql(default = 1)]
    bonus: i32,
    /// Added once to the ALL_TIME DISPLAY board.
    #[graphql(default)]
    initial_votes: i64,
}

impl From<PollOptionInput> for NewOption {
    fn from(input: PollOptionInput) -> Self {
        Self {
            label: input.label,
            bonus: input.bonus,
            initial_votes: input.initial_votes,
        }
    }
}

#[derive(InputObject)]
pub struct CreatePollInput {
    title: String,
    /// An IANA zone, e.g. `Europe/Paris`: bounds the hours, days, ISO weeks and months.
    #[graphql(default_with = "String::from(\"UTC\")")]
    timezone: String,
    #[graphql(default_with = "vec![PeriodGql::AllTime]")]
    periods: Vec<PeriodGql>,
    /// Fraction (0 to 1) of each vote also credited to the next period's boards.
    #[graphql(default)]
    carry_over: f64,
    #[graphql(default_with = "TiePolicyGql::Competition")]
    tie_policy: TiePolicyGql,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    #[graphql(default)]
    rules: Vec<RateLimitRuleInput>,
    #[graphql(default)]
    options: Vec<PollOptionInput>,
}

/// Fields left out are left as they are; `rules` replaces every rule.
#[derive(InputObject)]
pub struct UpdatePollInput {
    title: Option<String>,
    timezone: Option<String>,
    periods: Option<Vec<PeriodGql>>,
    carry_over: Option<f64>,
    tie_policy: Option<TiePolicyGql>,
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    rules: Option<Vec<RateLimitRuleInput>>,
}

impl From<CreatePollInput> for NewPoll {
    fn from(input: CreatePollInput) -> Self {
        Self {
            title: input.title,
            timezone: input.timezone,
            periods: input.periods.into_iter().map(Into::into).collect(),
            carry_over: input.carry_over,
            tie_policy: input.tie_policy.into(),
            starts_at: input.starts_at,
            ends_at: input.ends_at,
            rules: input.rules.into_iter().map(Rule::from).collect(),
            options: input.options.into_iter().map(NewOption::from).collect(),
        }
    }
}

impl From<UpdatePollInput> for PollChanges {
    fn from(input: UpdatePollInput) -> Self {
        Self {
            title: input.title,
            timezone: input.timezone,
            periods: input
                .periods
                .map(|periods| periods.into_iter().map(Into::into).collect()),
            carry_over: input.carry_over,
            tie_policy: input.tie_policy.map(Into::into),
            starts_at: input.starts_at,
            ends_at: input.ends_at,
            rules: input
                .rules
                .map(|rules| rules.into_iter().map(Rule::from).collect()),
        }
    }
}
