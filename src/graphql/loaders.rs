//! Per-request DataLoaders. Each is made on first use, so a request that needs none (most mutations)
//! pays for none; within a request, every load of one kind is batched.
//!
//! A domain registers a loader by implementing [`FromServices`] next to it (in its `loader.rs`);
//! nothing here changes when a domain arrives.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_graphql::dataloader::DataLoader;

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
    pub fn get<L: FromServices>(&self) -> Arc<DataLoader<L>> {
        let mut made = self
            .made
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let loader = made.entry(TypeId::of::<L>()).or_insert_with(|| {
            Arc::new(DataLoader::new(
                L::from_services(&self.services),
                tokio::spawn,
            ))
        });
        Arc::clone(loader)
            .downcast::<DataLoader<L>>()
            .expect("loaders are stored under their own type id")
    }
}
