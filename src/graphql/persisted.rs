//! Persisted documents at the door: a request that names its document by hash gets the text, in
//! APQ mode from what any process registered, in trusted mode only from the registered documents.
//! See [`crate::documents`].

use std::sync::Mutex;

use async_graphql::{Request, Response, ServerError, ServerResult};

use super::extensions::whole_request;
use crate::documents::{DocumentStore, PersistedMode, is_sha256_hex, sha256_hex};
use crate::error::AppError;

/// The persisted-document stage of [`super::extensions::RequestPipeline`], made once per request.
pub struct PersistedDocuments {
    store: DocumentStore,
    /// A hash and document sent together in APQ mode, registered once the document has run: a
    /// document that does not even validate is not worth keeping for anyone.
    to_register: Mutex<Option<(String, String)>>,
}

fn bad_input(message: impl Into<String>) -> ServerError {
    whole_request(AppError::BadUserInput {
        message: message.into(),
        field: None,
    })
}

/// The `sha256Hash` of the request's `extensions.persistedQuery`, if it has one.
fn requested_hash(request: &Request) -> ServerResult<Option<String>> {
    let Some(persisted) = request.extensions.get("persistedQuery") else {
        return Ok(None);
    };
    let persisted = persisted.clone().into_json().unwrap_or_default();
    if persisted.get("version").and_then(|v| v.as_i64()) != Some(1) {
        return Err(bad_input(
            "extensions.persistedQuery.version must be 1".to_owned(),
        ));
    }
    match persisted.get("sha256Hash").and_then(|hash| hash.as_str()) {
        Some(hash) if is_sha256_hex(hash) => Ok(Some(hash.to_ascii_lowercase())),
        _ => Err(bad_input(
            "extensions.persistedQuery.sha256Hash must be 64 hex digits".to_owned(),
        )),
    }
}

impl PersistedDocuments {
    pub fn new(store: DocumentStore) -> Self {
        Self {
            store,
            to_register: Mutex::new(None),
        }
    }

    async fn apq(&self, request: &mut Request, hash: Option<String>) -> ServerResult<()> {
        let Some(hash) = hash else { return Ok(()) };
        if request.query.is_empty() {
            let document = self.store.persisted(&hash).await.map_err(whole_request)?;
            request.query =
                document.ok_or_else(|| whole_request(AppError::PersistedQueryNotFound))?;
            return Ok(());
        }
        let actual = sha256_hex(&request.query);
        if actual != hash {
            return Err(bad_input(format!(
                "the document's SHA-256 is {actual}, not the sha256Hash sent"
            )));
        }
        *self.to_register.lock().expect("lock poisoned") = Some((hash, request.query.clone()));
        Ok(())
    }

    async fn trusted(&self, request: &mut Request, hash: Option<String>) -> ServerResult<()> {
        let hash = match hash {
            Some(hash) if request.query.is_empty() || sha256_hex(&request.query) == hash => hash,
            Some(_) => {
                return Err(bad_input(
                    "the document's SHA-256 is not the sha256Hash sent".to_owned(),
                ));
            }
            None => sha256_hex(&request.query),
        };
        match self.store.trusted(&hash).await.map_err(whole_request)? {
            Some(document) => {
                request.query = document.to_string();
                Ok(())
            }
            None => Err(whole_request(AppError::DocumentNotTrusted(hash))),
        }
    }

    /// The request with its document in full, from the hash it names where it names one, in the
    /// mode the server runs in.
    pub async fn prepare(&self, mut request: Request) -> ServerResult<Request> {
        let hash = requested_hash(&request)?;
        match self.store.mode() {
            PersistedMode::Apq => self.apq(&mut request, hash).await?,
            PersistedMode::Trusted => self.trusted(&mut request, hash).await?,
            PersistedMode::Off if hash.is_some() => {
                return Err(whole_request(AppError::PersistedQueryNotSupported));
            }
            PersistedMode::Off => {}
        }
        if request.query.trim().is_empty() {
            return Err(bad_input("the request has no `query`".to_owned()));
        }
        Ok(request)
    }

    /// Registers the document sent with its hash, once it ran.
    pub async fn after(&self, response: &Response) {
        let registration = self.to_register.lock().expect("lock poisoned").take();
        let ran = response.errors.iter().all(|error| !error.path.is_empty());
        if let Some((hash, document)) = registration.filter(|_| ran) {
            // A client that registers gets its answer either way; a failure here only means the
            // next hash-only request asks for the full document again.
            if let Err(err) = self.store.persist(&hash, &document).await {
                tracing::warn!(error = %err, "persisted query not registered");
            }
        }
    }
}
