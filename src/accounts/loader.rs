use std::collections::HashMap;

use async_graphql::ErrorExtensions;
use async_graphql::dataloader::Loader;
use pulse_kit::context::{FromServices, Registry};

use super::AccountService;
use crate::entities::users;

/// Users by id, batched: a page of articles costs one query for all their authors.
pub struct UserLoader(pub AccountService);

impl FromServices for UserLoader {
    fn from_services(services: &Registry) -> Self {
        Self(services.get::<AccountService>().clone())
    }
}

impl Loader<i64> for UserLoader {
    type Value = users::Model;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[i64]) -> Result<HashMap<i64, Self::Value>, Self::Error> {
        let users = self.0.by_ids(keys).await.map_err(|err| err.extend())?;
        Ok(users.into_iter().map(|user| (user.id, user)).collect())
    }
}
