//! The script registry: the runtime's own Lua scripts, and loading every script the process runs
//! (the runtime's and the domains', which `Redis::connect` is given) into Redis at start-up.
//!
//! `redis::Script` sends EVALSHA and falls back to loading the body on NOSCRIPT, so a Redis that
//! restarted (or a replica promoted) mid-run costs one extra round trip, never an error. On a
//! cluster, `SCRIPT LOAD` goes to every master and EVALSHA to the master of the script's keys.

use redis::Script;

/// The job runtime's scripts; the domains keep theirs (`lua/` of the app).
pub struct Scripts {
    /// Dead letters back onto a job's stream: see `lua/job_retry_dead.lua`.
    pub job_retry_dead: Script,
    /// Idle, empty consumers of a job's group dropped: see `lua/job_forget_consumers.lua`.
    pub job_forget_consumers: Script,
}

impl Scripts {
    pub fn load() -> Self {
        Self {
            job_retry_dead: Script::new(include_str!("../../lua/job_retry_dead.lua")),
            job_forget_consumers: Script::new(include_str!("../../lua/job_forget_consumers.lua")),
        }
    }

    /// Loads the runtime's scripts and `others` into Redis's script cache up front, so the first
    /// request after start-up does not pay the NOSCRIPT round trip.
    pub async fn preload(
        &self,
        others: &[&Script],
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<()> {
        let own = [&self.job_retry_dead, &self.job_forget_consumers];
        for script in own.iter().chain(others) {
            script.prepare_invoke().load_async(conn).await?;
        }
        Ok(())
    }
}
