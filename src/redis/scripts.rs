//! Lua scripts, compiled into the binary from `lua/` and invoked by name.
//!
//! `redis::Script` sends EVALSHA and falls back to loading the body on NOSCRIPT, so a Redis that
//! restarted (or a replica promoted) mid-run costs one extra round trip, never an error.

use redis::Script;

pub struct Scripts {
    /// Fixed-window counter: see `lua/rate_limit.lua`.
    pub rate_limit: Script,
}

impl Scripts {
    pub fn load() -> Self {
        Self {
            rate_limit: Script::new(include_str!("../../lua/rate_limit.lua")),
        }
    }

    fn all(&self) -> [&Script; 1] {
        [&self.rate_limit]
    }

    /// Loads every script into Redis's script cache up front, so the first request after start-up
    /// does not pay the NOSCRIPT round trip.
    pub async fn preload(
        &self,
        conn: &mut redis::aio::ConnectionManager,
    ) -> redis::RedisResult<()> {
        for script in self.all() {
            script.prepare_invoke().load_async(conn).await?;
        }
        Ok(())
    }
}
