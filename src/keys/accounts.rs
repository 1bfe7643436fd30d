//! Accounts: the sign-in rate limit.

use std::net::IpAddr;

use super::Keys;

pub trait AccountKeys {
    /// Fixed-window counter of sign-in/sign-up attempts from one client address.
    fn auth_attempts(&self, client: IpAddr) -> String;
}

impl AccountKeys for Keys {
    fn auth_attempts(&self, client: IpAddr) -> String {
        format!("{}ratelimit:auth:{{ip:{client}}}", self.prefix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_clients_get_a_well_formed_hash_tag() {
        let key = Keys::new("p:").auth_attempts("::1".parse().unwrap());
        assert_eq!(key, "p:ratelimit:auth:{ip:::1}");
    }
}
