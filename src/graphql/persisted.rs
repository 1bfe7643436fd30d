//! The documents domain as the store behind the edge's persisted documents
//! ([`pulse_edge::persisted`]): APQ in Redis, trusted documents in SQL. A failure reaches the
//! client as its code (`UNAVAILABLE`, `INTERNAL`), its detail logged once.

use std::sync::Arc;

use async_graphql::ErrorExtensions as _;
use pulse_edge::persisted::{DocumentStore, PersistedMode};

use crate::documents;

#[async_trait::async_trait]
impl DocumentStore for documents::DocumentStore {
    fn mode(&self) -> PersistedMode {
        documents::DocumentStore::mode(self)
    }

    async fn registered(&self, sha256: &str) -> async_graphql::Result<Option<String>> {
        self.persisted(sha256).await.map_err(|err| err.extend())
    }

    async fn register(&self, sha256: &str, document: &str) -> async_graphql::Result<()> {
        self.persist(sha256, document)
            .await
            .map_err(|err| err.extend())
    }

    async fn trusted(&self, sha256: &str) -> async_graphql::Result<Option<Arc<str>>> {
        documents::DocumentStore::trusted(self, sha256)
            .await
            .map_err(|err| err.extend())
    }
}
