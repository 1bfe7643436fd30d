//! Who is acting on a request: built once per request (or websocket connection) by the HTTP layer
//! and handed to services, which decide from it what the caller may do and whom to count.

use std::net::IpAddr;

use pulse_runtime::error::{AppError, AppResult};

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

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(user: Option<i64>) -> Actor {
        Actor {
            user,
            client_ip: "192.0.2.7".parse().unwrap(),
            user_agent: None,
        }
    }

    #[test]
    fn a_signed_in_actor_is_counted_as_the_user_wherever_it_connects_from() {
        assert_eq!(actor(Some(9)).identity(), Identity::User(9));
        assert_eq!(actor(Some(9)).require_user().unwrap(), 9);
    }

    #[test]
    fn an_anonymous_actor_is_counted_by_address_and_cannot_act_as_a_user() {
        let anonymous = actor(None);
        assert_eq!(
            anonymous.identity(),
            Identity::Address("192.0.2.7".parse().unwrap())
        );
        assert_eq!(
            anonymous.require_user().unwrap_err().code(),
            "UNAUTHENTICATED"
        );
    }
}
