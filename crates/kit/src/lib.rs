//! What a Pulse domain is written against. A domain crate (`crates/votes`, …) depends on this and
//! on `pulse-runtime`, never on the app or on a domain it does not name in its manifest; the app
//! builds the services, registers them ([`context::Registry`]) and merges the domains' schema parts.
//!
//! - [`actor`]: who is acting on a request, and whom it is counted for.
//! - [`ids`]: global ids (`base64url("Poll:7")`), each domain naming its own [`ids::NodeType`]s.
//! - [`context`]: a resolver's reach into the request: the services by type, the request's
//!   DataLoaders, the actor.
//! - [`connection`]: Relay connections over the runtime's keyset pages.
//! - [`Admins`]: the one question domains ask of accounts.

pub mod actor;
pub mod connection;
pub mod context;
pub mod ids;

pub use actor::{Actor, Identity};
pub use context::{FreshEachEvent, FreshLoaders, Loaders, Registry, actor, loaders, service};

use pulse_runtime::error::AppResult;

/// Whether a signed-in user may do what only admins may. Accounts answers it; a domain with
/// admin-only mutations holds one, so it need not depend on accounts.
#[async_trait::async_trait]
pub trait Admins: Send + Sync {
    /// `Ok` for an admin; `FORBIDDEN` for anyone else, `UNAUTHENTICATED` for a user who no longer
    /// exists.
    async fn require_admin(&self, user_id: i64) -> AppResult<()>;
}
