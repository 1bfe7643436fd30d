//! The votes' Lua script, compiled into the binary from `crates/votes/lua/` and loaded with the
//! others at start-up (the app lists every domain's in its registration point).

use std::sync::LazyLock;

use redis::Script;

/// One voter's ballots in one poll, all or nothing each: see `lua/vote_cast.lua`.
pub static VOTE_CAST: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/vote_cast.lua")));

/// Every script of the domain, for `Redis::connect` to load.
pub fn all() -> [&'static Script; 1] {
    [&VOTE_CAST]
}
