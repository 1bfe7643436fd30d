//! The only place Redis keys are built.
//!
//! Every key starts with the configured prefix, so deployments and tests share one Redis safely.
//! Keys that one script touches together share a hash tag (`{a:9}`, `{u:7}`, `{p:42}`), which keeps
//! every script single-slot on Redis Cluster.

use std::net::IpAddr;

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

    /// Fixed-window counter of sign-in/sign-up attempts from one client address.
    pub fn auth_attempts(&self, client: IpAddr) -> String {
        format!("{}ratelimit:auth:{{ip:{client}}}", self.prefix)
    }

    /// Pub/sub channel announcing newly published articles.
    pub fn articles_published_channel(&self) -> String {
        format!("{}events:articles:published", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_the_prefix() {
        let keys = Keys::new("t1:");
        assert!(
            keys.auth_attempts("10.0.0.1".parse().unwrap())
                .starts_with("t1:")
        );
        assert!(keys.articles_published_channel().starts_with("t1:"));
    }

    #[test]
    fn ipv6_clients_get_a_well_formed_hash_tag() {
        let key = Keys::new("p:").auth_attempts("::1".parse().unwrap());
        assert_eq!(key, "p:ratelimit:auth:{ip:::1}");
    }
}
