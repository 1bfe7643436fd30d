use std::collections::HashMap;

use async_graphql::ErrorExtensions;
use async_graphql::dataloader::Loader;
use pulse_kit::context::{FromServices, Registry};

use super::service::{LiveViews, ViewService};

/// Live view counts by article: a page of articles costs one pipelined Redis round trip.
pub struct ViewCountLoader(pub ViewService);

impl FromServices for ViewCountLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<ViewService>().clone())
    }
}

impl Loader<i64> for ViewCountLoader {
    type Value = LiveViews;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[i64]) -> Result<HashMap<i64, Self::Value>, Self::Error> {
        self.0.live(keys).await.map_err(|err| err.extend())
    }
}
