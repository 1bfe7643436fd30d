//! Websockets open per client address. Every socket holds a connection slot for as long as it
//! lives (`PULSE_MAX_CONNECTIONS`), so without a cap of its own one address could hold every slot
//! with idle sockets and shut everyone else out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Sockets open by address.
type Held = Arc<Mutex<HashMap<IpAddr, u32>>>;

/// How many websockets each client address holds, under a cap.
#[derive(Clone)]
pub struct SocketsPerIp {
    /// `0`: no cap, nothing counted.
    cap: u32,
    open: Held,
}

/// One socket's place under its address's cap, given back when dropped.
pub struct SocketPlace(Option<(IpAddr, Held)>);

impl SocketsPerIp {
    pub fn new(cap: u32) -> Self {
        Self {
            cap,
            open: Arc::default(),
        }
    }

    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// A place for one more socket from `client`, or `None` when it holds the cap already. An
    /// IPv6 client counts by its /64, the block one host is usually given whole.
    pub fn take(&self, client: IpAddr) -> Option<SocketPlace> {
        if self.cap == 0 {
            return Some(SocketPlace(None));
        }
        let client = counted_address(client);
        let mut open = lock(&self.open);
        let held = open.entry(client).or_default();
        if *held >= self.cap {
            return None;
        }
        *held += 1;
        Some(SocketPlace(Some((client, self.open.clone()))))
    }

    /// Sockets `client` holds now.
    pub fn held(&self, client: IpAddr) -> u32 {
        let open = lock(&self.open);
        open.get(&counted_address(client)).copied().unwrap_or(0)
    }
}

fn counted_address(client: IpAddr) -> IpAddr {
    match client.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        v4 => v4,
    }
}

fn lock(open: &Mutex<HashMap<IpAddr, u32>>) -> std::sync::MutexGuard<'_, HashMap<IpAddr, u32>> {
    open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for SocketPlace {
    fn drop(&mut self) {
        let Some((client, open)) = self.0.take() else {
            return;
        };
        let mut open = lock(&open);
        if let Some(held) = open.get_mut(&client) {
            *held -= 1;
            if *held == 0 {
                open.remove(&client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_the_cap_and_a_closed_socket_frees_its_place() {
        let sockets = SocketsPerIp::new(2);
        let client: IpAddr = "192.0.2.7".parse().unwrap();
        let first = sockets.take(client).expect("a first place");
        let _second = sockets.take(client).expect("a second place");
        assert!(sockets.take(client).is_none());
        assert!(sockets.take("192.0.2.8".parse().unwrap()).is_some());
        drop(first);
        assert_eq!(sockets.held(client), 1);
        assert!(sockets.take(client).is_some());
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64_and_a_mapped_ipv4_as_itself() {
        let sockets = SocketsPerIp::new(1);
        let _held = sockets.take("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert!(
            sockets
                .take("2001:db8:1:2:ffff::9".parse().unwrap())
                .is_none()
        );
        assert!(sockets.take("2001:db8:1:3::1".parse().unwrap()).is_some());
        let _v4 = sockets.take("192.0.2.7".parse().unwrap()).unwrap();
        assert!(sockets.take("::ffff:192.0.2.7".parse().unwrap()).is_none());
    }

    #[test]
    fn a_cap_of_zero_counts_nothing() {
        let sockets = SocketsPerIp::new(0);
        let client: IpAddr = "192.0.2.7".parse().unwrap();
        let places: Vec<_> = (0..1000).map(|_| sockets.take(client).unwrap()).collect();
        assert_eq!(places.len(), 1000);
        assert_eq!(sockets.held(client), 0);
    }
}
