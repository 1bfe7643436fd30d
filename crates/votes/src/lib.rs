//! Polls, votes and live leaderboards (seed 001).
//!
//! Truth: SQL. `polls`, `poll_options` and `poll_rules` are the configuration (each process keeps
//! a copy in memory, dropped everywhere when an admin changes it); `vote_log` holds every accepted
//! ballot with the configuration it was cast under, in the order the vote script applied them.
//!
//! Rebuildable from SQL (`pulse rebuild votes`): every board (REAL and DISPLAY, per period bucket
//! of the poll's zone, the next buckets' carry-over included), the participant HyperLogLogs, the
//! poll's vote sequence and closed flag. Replaying the log in sequence order adds the same doubles
//! in the same order as the script did, so a rebuilt board equals the live one exactly.
//!
//! Not rebuilt: the rate-limit counters (they only ever hold a window's worth of ballots).
//!
//! May be lost: ballots accepted but not yet archived when Redis loses its data (as the README
//! says for AOF and snapshots); a ballot is in the stream, atomically with its board changes,
//! before `castVotes` answers. Past period buckets are kept for `PULSE_VOTE_BUCKET_RETENTION`
//! after their period ends, then expire (the log still has them).

pub mod admin;
pub mod archive;
pub mod board;
pub mod config;
pub mod entities;
pub mod graphql;
pub mod keys;
pub mod live;
pub mod loader;
pub mod periods;
pub mod rebuild;
pub mod rules;
pub mod scripts;
pub mod service;

pub use admin::PollAdminService;
pub use archive::VoteArchiver;
pub use config::PollConfigs;
pub use live::LiveBoardService;
pub use service::VoteService;

use pulse_kit::ids::NodeType;

/// A poll's global id names this type.
pub const POLL: NodeType = NodeType::named("Poll");
/// A poll option's global id names this type.
pub const POLL_OPTION: NodeType = NodeType::named("PollOption");
