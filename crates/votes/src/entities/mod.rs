//! The votes' tables: the polls' configuration and the log of accepted ballots.

pub mod poll_options;
pub mod poll_rules;
pub mod polls;
pub mod vote_log;
