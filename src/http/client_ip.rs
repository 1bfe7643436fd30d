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
}

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
    fn garbage_in_the_header_falls_back_to_the_last_believable_hop() {
        let peer: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        assert_eq!(proxies().client_ip(peer, &headers("not-an-ip")), peer.ip());
    }
}
