use std::collections::HashMap;

use async_graphql::ErrorExtensions;
use async_graphql::dataloader::Loader;
use pulse_kit::context::{FromServices, Registry};

use super::ArticleService;
use crate::entities::articles;

/// Articles by id, batched: `node(id:)` lookups in one request share a query.
pub struct ArticleLoader(pub ArticleService);

impl FromServices for ArticleLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<ArticleService>().clone())
    }
}

impl Loader<i64> for ArticleLoader {
    type Value = articles::Model;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[i64]) -> Result<HashMap<i64, Self::Value>, Self::Error> {
        let articles = self.0.by_ids(keys).await.map_err(|err| err.extend())?;
        Ok(articles
            .into_iter()
            .map(|article| (article.id, article))
            .collect())
    }
}
