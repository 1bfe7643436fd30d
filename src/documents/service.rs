use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use pulse_edge::persisted::{PersistedMode, sha256_hex};
use redis::AsyncCommands;
use sea_orm::{ActiveModelTrait, DatabaseConnection, EntityTrait, QueryOrder, Set};

use crate::entities::trusted_documents;
use crate::error::{AppResult, Unique, UniqueViolationExt};
use crate::keys::DocumentKeys;
use crate::redis::Redis;

/// A registered trusted document.
#[derive(Debug, Clone)]
pub struct RegisteredDocument {
    pub sha256: String,
    pub name: Option<String>,
    pub created_at: chrono::NaiveDateTime,
}

/// How often, at most, a hash not found among the trusted documents makes a process read them
/// again from SQL: a document registered meanwhile is found within this, and unknown hashes sent
/// by anyone cost SQL at most one read per interval.
const TRUSTED_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct DocumentStore {
    db: DatabaseConnection,
    redis: Redis,
    mode: PersistedMode,
    apq_ttl: Duration,
    trusted: Arc<RwLock<TrustedCache>>,
    reload: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

#[derive(Default)]
struct TrustedCache {
    documents: HashMap<String, Arc<str>>,
}

impl DocumentStore {
    pub fn new(
        db: DatabaseConnection,
        redis: Redis,
        mode: PersistedMode,
        apq_ttl: Duration,
    ) -> Self {
        Self {
            db,
            redis,
            mode,
            apq_ttl,
            trusted: Arc::default(),
            reload: Arc::default(),
        }
    }

    pub fn mode(&self) -> PersistedMode {
        self.mode
    }

    /// The document an automatic persisted query registered under `sha256`; reading it keeps it
    /// another TTL.
    pub async fn persisted(&self, sha256: &str) -> AppResult<Option<String>> {
        let key = self.redis.keys.persisted_query(sha256);
        let mut conn = self.redis.conn.clone();
        let expiry = redis::Expiry::EX(self.apq_ttl.as_secs().max(1));
        Ok(conn.get_ex(key, expiry).await?)
    }

    /// Registers `document` under its hash for the TTL. The caller has checked the hash.
    pub async fn persist(&self, sha256: &str, document: &str) -> AppResult<()> {
        let key = self.redis.keys.persisted_query(sha256);
        let mut conn = self.redis.conn.clone();
        let ttl = self.apq_ttl.as_secs().max(1);
        let _: () = conn.set_ex(key, document, ttl).await?;
        Ok(())
    }

    /// The trusted document registered under `sha256`.
    pub async fn trusted(&self, sha256: &str) -> AppResult<Option<Arc<str>>> {
        if let Some(found) = self.cached_trusted(sha256) {
            return Ok(Some(found));
        }
        let mut last_reload = self.reload.lock().await;
        // Another request may have reloaded while this one waited.
        if let Some(found) = self.cached_trusted(sha256) {
            return Ok(Some(found));
        }
        if last_reload.is_some_and(|at| at.elapsed() < TRUSTED_RELOAD_INTERVAL) {
            return Ok(None);
        }
        let rows = trusted_documents::Entity::find().all(&self.db).await?;
        let documents: HashMap<String, Arc<str>> = rows
            .into_iter()
            .map(|row| (row.sha256, Arc::from(row.document)))
            .collect();
        let found = documents.get(sha256).cloned();
        self.trusted
            .write()
            .expect("trusted cache poisoned")
            .documents = documents;
        *last_reload = Some(Instant::now());
        Ok(found)
    }

    /// Registers a trusted document; `false` when it was registered already.
    pub async fn add_trusted(
        &self,
        name: Option<&str>,
        document: &str,
    ) -> AppResult<(String, bool)> {
        let sha256 = sha256_hex(document);
        let row = trusted_documents::ActiveModel {
            sha256: Set(sha256.clone()),
            name: Set(name.map(|name| name.chars().take(200).collect())),
            document: Set(document.to_owned()),
            created_at: Set(chrono::Utc::now().naive_utc()),
        };
        let added = matches!(
            row.insert(&self.db).await.or_duplicate()?,
            Unique::Inserted(_)
        );
        Ok((sha256, added))
    }

    pub async fn list_trusted(&self) -> AppResult<Vec<RegisteredDocument>> {
        let rows = trusted_documents::Entity::find()
            .order_by_asc(trusted_documents::Column::CreatedAt)
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| RegisteredDocument {
                sha256: row.sha256,
                name: row.name,
                created_at: row.created_at,
            })
            .collect())
    }

    /// Removes a trusted document; `false` when none had the hash. A process that loaded it keeps
    /// running it until its next reload (on a miss) or restart: removal tidies, it does not revoke.
    pub async fn remove_trusted(&self, sha256: &str) -> AppResult<bool> {
        let result = trusted_documents::Entity::delete_by_id(sha256.to_owned())
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected > 0)
    }

    fn cached_trusted(&self, sha256: &str) -> Option<Arc<str>> {
        let cache = self.trusted.read().expect("trusted cache poisoned");
        cache.documents.get(sha256).cloned()
    }
}
