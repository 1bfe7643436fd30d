//! Accounts: users, passwords, session tokens and the admin role.
//!
//! SQL holds users (truth). Tokens are stateless signed JWTs carrying only the user id, so checking one
//! costs no I/O; the admin role is read from SQL when an admin-only operation asks for it, so granting
//! or revoking takes effect at once.

pub mod graphql;
pub mod loader;
pub mod password;
pub mod service;
pub mod tokens;

pub use service::AccountService;
pub use tokens::TokenSigner;

/// A user's global id names this type.
pub const USER: pulse_kit::ids::NodeType = pulse_kit::ids::NodeType::named("User");
