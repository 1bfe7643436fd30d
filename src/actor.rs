//! Who is acting on a request: built once per request (or websocket connection) by the HTTP layer
//! and handed to services, which decide from it what the caller may do and whom to count.

use std::net::IpAddr;

use crate::error::{AppError, AppResult};

/// The caller: a signed-in user or anonymous, where the request came from, and its User-Agent.
#[derive(Clone, Debug)]
pub struct Actor {
    /// The signed-in user, from a verified token.
    pub user: Option<i64>,
    /// The client's address: the peer, or the X-Forwarded-For hop a trusted proxy vouches for.
    pub client_ip: IpAddr,
    pub user_agent: Option<String>,
}

/// Whom an action is counted for: a signed-in user, else the client's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    User(i64),
    Address(IpAddr),
}

impl Actor {
    /// The signed-in user, or `UNAUTHENTICATED`.
    pub fn require_user(&self) -> AppResult<i64> {
        self.user.ok_or(AppError::Unauthenticated("sign in first"))
    }

    pub fn identity(&self) -> Identity {
        match self.user {
            Some(user) => Identity::User(user),
            None => Identity::Address(self.client_ip),
        }
    }
}
