//! Votes: a poll's boards, participant counters, rate-limit counters and vote sequence.

use pulse_runtime::redis::Keys;

/// Polls spread over this many shards, each with the hash tag `{vp:N}`: every key of one poll
/// (and the shard's archive stream) is in one slot, so the one script that casts a poll's votes
/// is single-slot on Redis Cluster. Changing it strands existing keys.
pub const VOTE_SHARDS: u32 = 16;

pub fn vote_shard_of(poll: i64) -> u32 {
    poll.rem_euclid(i64::from(VOTE_SHARDS)) as u32
}

pub trait VoteKeys {
    /// The keys of poll `poll`. See [`PollKeys`].
    fn poll(&self, poll: i64) -> PollKeys<'_>;

    /// Pub/sub channel told the id of a poll whose configuration an admin changed.
    fn polls_changed_channel(&self) -> String;
}

impl VoteKeys for Keys {
    fn poll(&self, poll: i64) -> PollKeys<'_> {
        PollKeys { keys: self, poll }
    }

    fn polls_changed_channel(&self) -> String {
        format!("{}events:polls:changed", self.prefix())
    }
}

pub struct PollKeys<'a> {
    keys: &'a Keys,
    poll: i64,
}

impl PollKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!(
            "{}vote:{name}:{{vp:{}}}:{}",
            self.keys.prefix(),
            vote_shard_of(self.poll),
            self.poll
        )
    }

    pub fn shard(&self) -> u32 {
        vote_shard_of(self.poll)
    }

    /// Sorted set option → score of one board (`r` REAL, `d` DISPLAY) in one period bucket.
    pub fn board(&self, board: &str, bucket: &str) -> String {
        format!("{}:{board}:{bucket}", self.key("b"))
    }

    /// A `SCAN MATCH` pattern for every board of the poll.
    pub fn board_pattern(&self) -> String {
        format!(
            "{}vote:b:\\{{vp:{}\\}}:{}:*",
            self.keys.prefix_pattern(),
            vote_shard_of(self.poll),
            self.poll
        )
    }

    /// HyperLogLog of the poll's distinct voters.
    pub fn participants(&self) -> String {
        self.key("hll")
    }

    /// HyperLogLog of the distinct voters of one option.
    pub fn option_participants(&self, option: i64) -> String {
        format!("{}:{option}", self.key("hll"))
    }

    /// Counter of one rate-limit rule for one subject (voter, address, option) in one window.
    pub fn limit_counter(&self, counter: &str, subject: &str, window: &str) -> String {
        format!("{}:{counter}:{subject}:{window}", self.key("rl"))
    }

    /// Set while the poll is closed: the vote script refuses every ballot, whatever a process's
    /// cached configuration says.
    pub fn closed(&self) -> String {
        self.key("closed")
    }

    /// String: the poll's vote sequence, one per accepted ballot; orders the vote log and versions
    /// the live boards.
    pub fn seq(&self) -> String {
        self.key("seq")
    }

    /// Pub/sub channel told whenever one of the poll's boards moves; under the poll's hash tag,
    /// so the vote script publishes it on a cluster with `SPUBLISH` in its own slot.
    pub fn votes_channel(&self) -> String {
        self.key("events")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_polls_vote_touches_keys_of_one_slot() {
        let keys = Keys::new("p:");
        let poll = keys.poll(7 + i64::from(VOTE_SHARDS));
        let job = keys.job_shard("votes-archive", "vp", poll.shard());
        for key in [
            poll.board("r", "20261125"),
            poll.board("d", "all"),
            poll.participants(),
            poll.option_participants(3),
            poll.limit_counter("VOTER:MINUTE:*", "42", "m1"),
            poll.closed(),
            poll.seq(),
            job.stream(),
            poll.votes_channel(),
        ] {
            assert!(key.starts_with("p:"), "{key} lacks the prefix");
            assert_eq!(
                key.matches('{').count(),
                1,
                "{key} has more than one hash tag"
            );
            assert!(key.contains("{vp:7}"), "{key} is not in vote shard 7");
        }
        assert_ne!(poll.board("r", "all"), keys.poll(7).board("r", "all"));
    }

    #[test]
    fn the_board_pattern_matches_this_polls_boards_only() {
        let keys = Keys::new("p:");
        assert_eq!(keys.poll(23).board_pattern(), "p:vote:b:\\{vp:7\\}:23:*");
        assert_eq!(
            Keys::new("t*:").poll(23).board_pattern(),
            "t\\*:vote:b:\\{vp:7\\}:23:*"
        );
    }
}
