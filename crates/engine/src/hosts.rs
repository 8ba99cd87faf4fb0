//! The addresses live servants heartbeat from, readable without the
//! engine's lock: the edge asks, for every large body, whether its sender's
//! address is a registered servant's (whose heartbeats a part of the body
//! budget is kept for), and must not queue behind the engine to know.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, PoisonError, RwLock},
};

/// Live servants per observed IP address (several servants may share one,
/// behind a NAT). Cheap to clone; every clone sees the same servants.
#[derive(Debug, Clone, Default)]
pub struct ServantHosts {
    live: Arc<RwLock<HashMap<IpAddr, usize>>>,
}

impl ServantHosts {
    /// Whether a live servant heartbeats from `ip`.
    pub fn includes(&self, ip: IpAddr) -> bool {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&ip.to_canonical())
    }

    pub(crate) fn add(&self, ip: IpAddr) {
        *self
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(ip.to_canonical())
            .or_default() += 1;
    }

    pub(crate) fn remove(&self, ip: IpAddr) {
        let mut live = self.live.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = live.get_mut(&ip.to_canonical()) {
            *count -= 1;
            if *count == 0 {
                live.remove(&ip.to_canonical());
            }
        }
    }

    /// The same hosts, forgotten: a restarted state has no servant yet, and
    /// the edge keeps its handle.
    pub(crate) fn emptied(&self) -> Self {
        self.live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.clone()
    }
}
