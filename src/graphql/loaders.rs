//! Per-request DataLoaders. Each is made on first use, so a request that needs none (most mutations)
//! pays for none; within a request, every load of one kind is batched, and what was loaded is kept
//! for the rest of the request.
//!
//! A loader gathers the keys asked for within a millisecond of the first one. On a loaded machine a
//! page's resolvers can take longer than that to run, and the batch splits; so resolvers that
//! return a list prefetch what the selected fields need with one `load_many` per kind (the lists of
//! articles and comments do), and the per-item fields then find it loaded.
//!
//! A domain registers a loader by implementing [`FromServices`] next to it (in its `loader.rs`);
//! nothing here changes when a domain arrives.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_graphql::dataloader::{DataLoader, HashMapCache};

use crate::services::Services;

/// A loader made from the services, once per request that uses it.
pub trait FromServices: Send + Sync + 'static {
    fn from_services(services: &Services) -> Self;
}

pub struct Loaders {
    services: Arc<Services>,
    made: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Loaders {
    pub fn new(services: Arc<Services>) -> Self {
        Self {
            services,
            made: Mutex::new(HashMap::new()),
        }
    }

    /// This request's loader of kind `L`, made on first use.
    pub fn get<L: FromServices>(&self) -> Arc<DataLoader<L, HashMapCache>> {
        let mut made = self
            .made
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let loader = made.entry(TypeId::of::<L>()).or_insert_with(|| {
            Arc::new(DataLoader::with_cache(
                L::from_services(&self.services),
                tokio::spawn,
                HashMapCache::default(),
            ))
        });
        Arc::clone(loader)
            .downcast::<DataLoader<L, HashMapCache>>()
            .expect("loaders are stored under their own type id")
    }
}
