//! The key builder's shared part: the prefix every key starts with, and the keys of the job
//! runtime. The domains' key families (`src/keys/`) build on it, one file per family.
//!
//! Every key starts with the configured prefix, so deployments and tests share one Redis safely.
//! Keys that one script touches together share a hash tag (`{<tag>:N}` for shard N of a job's
//! streams, where the tag is the domain's own), which keeps every script single-slot on Redis
//! Cluster.

#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A prefix with a brace would put its own hash tag first in every key, sending every key to one
    /// Redis Cluster slot; refuse it at start-up instead.
    pub fn check_prefix(prefix: &str) -> Result<(), String> {
        if prefix.contains(['{', '}']) {
            Err(format!(
                "PULSE_REDIS_PREFIX {prefix:?} must not contain braces: they would override the keys' hash tags"
            ))
        } else {
            Ok(())
        }
    }

    /// The prefix with `SCAN MATCH`'s special characters escaped, to start a pattern with.
    pub fn prefix_pattern(&self) -> String {
        escape_glob(&self.prefix)
    }

    /// String: which database owns the prefix (see `src/ownership.rs`). One key, so one slot on a
    /// cluster; no hash tag, since no script touches it.
    pub fn owner(&self) -> String {
        format!("{}owner", self.prefix)
    }

    /// A `SCAN MATCH` pattern for every key under the prefix.
    pub fn everything_pattern(&self) -> String {
        format!("{}*", self.prefix_pattern())
    }

    /// The keys of shard `shard` of job `job`, whose shards carry the hash tag `{<tag>:<shard>}`.
    /// See [`JobShardKeys`].
    pub fn job_shard<'a>(&'a self, job: &'a str, tag: &'a str, shard: u32) -> JobShardKeys<'a> {
        JobShardKeys {
            keys: self,
            job,
            tag,
            shard,
        }
    }
}

fn escape_glob(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

/// One shard of a job: its stream and its dead letters carry the domain's own shard hash tag (a
/// job of the views domain would use `{v:N}`), so a domain script can append an event to the
/// stream of the shard it writes in, single-slot, and moving dead letters back is single-slot too.
pub struct JobShardKeys<'a> {
    keys: &'a Keys,
    job: &'a str,
    tag: &'a str,
    shard: u32,
}

impl JobShardKeys<'_> {
    fn key(&self, name: &str) -> String {
        format!(
            "{}job:{}:{name}:{{{}:{}}}",
            self.keys.prefix, self.job, self.tag, self.shard
        )
    }

    /// Stream of the job's entries on this shard, read by the consumer group named after the job.
    pub fn stream(&self) -> String {
        self.key("stream")
    }

    /// Stream of the entries that failed every delivery, each with its error and original id.
    pub fn dead(&self) -> String {
        self.key("dead")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_cannot_carry_its_own_hash_tag() {
        assert!(Keys::check_prefix("pulse:").is_ok());
        assert!(Keys::check_prefix("{tenant}:").is_err());
    }

    #[test]
    fn patterns_escape_the_prefix() {
        let keys = Keys::new("t*[1]:");
        assert_eq!(keys.everything_pattern(), "t\\*\\[1\\]:*");
        assert!(keys.owner().starts_with("t*[1]:"));
    }

    #[test]
    fn a_job_shards_stream_and_dead_letters_share_the_domains_hash_tag() {
        let keys = Keys::new("p:");
        let shard = keys.job_shard("likes", "l", 3);
        for key in [shard.stream(), shard.dead()] {
            assert!(key.starts_with("p:"), "{key} lacks the prefix");
            assert_eq!(
                key.matches('{').count(),
                1,
                "{key} has more than one hash tag"
            );
            assert!(key.ends_with("{l:3}"), "{key} is not in shard 3 of likes");
        }
        assert_ne!(shard.stream(), keys.job_shard("likes", "l", 4).stream());
        assert_ne!(shard.stream(), keys.job_shard("votes", "l", 3).stream());
    }
}
