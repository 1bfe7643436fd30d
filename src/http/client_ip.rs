//! The client's address. X-Forwarded-For is believed only when the direct peer is a configured
//! trusted proxy, and then only up to the first hop that is not itself trusted: anything to the
//! left of that hop was written by the client and proves nothing.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

#[derive(Clone, Debug, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(networks: Vec<IpNet>) -> Self {
        Self(networks)
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }

    pub fn client_ip(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.ip().to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        let mut client = peer;
        for hop in hops.iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) => {
                    client = ip.to_canonical();
                    if !self.trusts(client) {
                        break;
                    }
                }
                // A malformed hop ends what can be believed; the last good address stands.
                Err(_) => break,
            }
        }
        client
    }

    /// The end user's User-Agent: the one a trusted proxy forwards in [`FORWARDED_USER_AGENT`] (a
    /// server that renders pages calls the API with its own HTTP library, which would count as a
    /// crawler), else the request's own.
    pub fn user_agent<'a>(&self, peer: SocketAddr, headers: &'a HeaderMap) -> Option<&'a str> {
        let header = |name| headers.get(name).and_then(|value| value.to_str().ok());
        let forwarded = if self.trusts(peer.ip()) {
            header(FORWARDED_USER_AGENT)
        } else {
            None
        };
        forwarded.or_else(|| header(axum::http::header::USER_AGENT.as_str()))
    }
}

/// The header a trusted proxy or rendering server puts the browser's User-Agent in.
pub const FORWARDED_USER_AGENT: &str = "x-forwarded-user-agent";

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", xff.parse().unwrap());
        headers
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()])
    }

    #[test]
    fn an_untrusted_peer_cannot_claim_another_address() {
        let peer: SocketAddr = "203.0.113.9:5000".parse().unwrap();
        assert_eq!(proxies().client_ip(peer, &headers("1.2.3.4")), peer.ip());
    }

    #[test]
    fn a_trusted_proxy_names_the_client() {
        let peer: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let ip = proxies().client_ip(peer, &headers("198.51.100.7"));
        assert_eq!(ip, "198.51.100.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn spoofed_hops_left_of_the_real_client_are_ignored() {
        let peer: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let ip = proxies().client_ip(peer, &headers("6.6.6.6, 198.51.100.7, 10.9.9.9"));
        assert_eq!(ip, "198.51.100.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn only_a_trusted_proxy_forwards_a_user_agent() {
        let mut headers = HeaderMap::new();
        headers.insert("user-agent", "python-requests/2.31".parse().unwrap());
        headers.insert(
            FORWARDED_USER_AGENT,
            "Mozilla/5.0 Firefox/120".parse().unwrap(),
        );
        let proxy: SocketAddr = "10.0.0.2:4000".parse().unwrap();
        let stranger: SocketAddr = "203.0.113.9:4000".parse().unwrap();
        let proxies = proxies();
        assert_eq!(
            proxies.user_agent(proxy, &headers),
            Some("Mozilla/5.0 Firefox/120")
        );
        assert_eq!(
            proxies.user_agent(stranger, &headers),
            Some("python-requests/2.31")
        );
        headers.remove(FORWARDED_USER_AGENT);
        assert_eq!(
            proxies.user_agent(proxy, &headers),
            Some("python-requests/2.31")
        );
    }

    #[test]
    fn garbage_in_the_header_falls_back_to_the_last_believable_hop() {
        let peer: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        assert_eq!(proxies().client_ip(peer, &headers("not-an-ip")), peer.ip());
    }
}
