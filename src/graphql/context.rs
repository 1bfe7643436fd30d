//! What a resolver knows about the request it serves.

use std::net::IpAddr;

/// The caller: a signed-in user or anonymous, and where the request came from.
#[derive(Clone, Debug)]
pub struct RequestContext {
    pub viewer: Option<i64>,
    /// The client's address: the peer, or the X-Forwarded-For hop a trusted proxy vouches for.
    pub client_ip: IpAddr,
    pub user_agent: Option<String>,
}

impl RequestContext {
    pub fn require_viewer(&self) -> crate::error::AppResult<i64> {
        self.viewer
            .ok_or(crate::error::AppError::Unauthenticated("sign in first"))
    }
}
