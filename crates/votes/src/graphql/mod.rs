//! The votes domain's GraphQL: polls and their options, leaderboards and standings, ballots,
//! admin changes, and live leaderboards. Resolvers read the context, call the votes services and
//! map the result; the enums mirror the domain's own types through async-graphql's `remote`.

mod admin;
mod leaderboard;
mod mutations;
mod poll;
mod queries;
mod subscriptions;
mod types;

pub use mutations::VotesMutation;
pub use poll::{Poll, PollConnection, PollOption};
pub use queries::{VotesQuery, load_poll, load_poll_option};
pub use subscriptions::VotesSubscription;
