//! Persisted documents at the door: a request that names its document by the SHA-256 in
//! `extensions.persistedQuery` gets the text, in APQ mode from what any client registered (Apollo's
//! automatic persisted queries), in trusted mode only from the documents registered ahead of time.
//!
//! The protocol lives here, the storage with the server: it implements [`DocumentStore`] (a shared
//! cache for APQ, a table for trusted documents), and [`PersistedDocuments`] does the rest: the
//! extension's checks, the hash check of a document sent with its hash, registration once the
//! document has run, and the errors clients act on, each with its `extensions.code`.

use std::sync::{Arc, Mutex};

use async_graphql::{ErrorExtensions as _, Request, Response, ServerError, ServerResult};
use sha2::{Digest, Sha256};

/// Which documents a server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PersistedMode {
    /// Any document; clients may also send a hash alone for one registered earlier by anyone
    /// (Apollo's automatic persisted queries).
    Apq,
    /// Only documents registered ahead of time, sent by hash or in full.
    Trusted,
    /// Any document, always in full; hashes are refused.
    Off,
}

/// Where persisted documents are kept. Errors are the store's own failures (a backend down), and
/// reach the client with whatever code the store gave them.
#[async_trait::async_trait]
pub trait DocumentStore: Send + Sync {
    /// Which documents the server runs.
    fn mode(&self) -> PersistedMode;

    /// The document an automatic persisted query registered under `sha256`, if it is still kept.
    async fn registered(&self, sha256: &str) -> async_graphql::Result<Option<String>>;

    /// Registers `document` under `sha256`, which is its hash (checked here before the call).
    async fn register(&self, sha256: &str, document: &str) -> async_graphql::Result<()>;

    /// The trusted document registered under `sha256`.
    async fn trusted(&self, sha256: &str) -> async_graphql::Result<Option<Arc<str>>>;
}

/// The hex SHA-256 of a document, as persisted-query clients compute it.
pub fn sha256_hex(document: &str) -> String {
    format!("{:x}", Sha256::digest(document.as_bytes()))
}

/// Whether `hash` looks like a hex SHA-256: anything else is refused before it reaches a store.
pub fn is_sha256_hex(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Why a request's persisted document was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    BadUserInput(String),
    /// The message Apollo clients look for before they send the full document.
    #[error("PersistedQueryNotFound")]
    NotFound,
    #[error("PersistedQueryNotSupported")]
    NotSupported,
    #[error("this server runs only registered documents, and none has the SHA-256 {0}")]
    NotTrusted(String),
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadUserInput(_) => "BAD_USER_INPUT",
            Self::NotFound => "PERSISTED_QUERY_NOT_FOUND",
            Self::NotSupported => "PERSISTED_QUERY_NOT_SUPPORTED",
            Self::NotTrusted(_) => "DOCUMENT_NOT_TRUSTED",
        }
    }
}

impl From<Refusal> for ServerError {
    fn from(refusal: Refusal) -> Self {
        whole_request(
            async_graphql::Error::new(refusal.to_string()).extend_with(|_, ext| {
                ext.set("code", refusal.code());
            }),
        )
    }
}

/// An error of the request as a whole: no position in the document is to blame.
fn whole_request(error: async_graphql::Error) -> ServerError {
    let mut server_error = ServerError::new(error.message, None);
    server_error.extensions = error.extensions;
    server_error
}

/// One request's pass through the persisted documents: [`prepare`](Self::prepare) before the
/// document is parsed, [`after`](Self::after) once it has run.
pub struct PersistedDocuments {
    store: Arc<dyn DocumentStore>,
    /// A hash and document sent together in APQ mode, registered once the document has run: a
    /// document that does not even validate is not worth keeping for anyone.
    to_register: Mutex<Option<(String, String)>>,
}

/// The `sha256Hash` of the request's `extensions.persistedQuery`, if it has one.
fn requested_hash(request: &Request) -> Result<Option<String>, Refusal> {
    let Some(persisted) = request.extensions.get("persistedQuery") else {
        return Ok(None);
    };
    let persisted = persisted.clone().into_json().unwrap_or_default();
    if persisted.get("version").and_then(|v| v.as_i64()) != Some(1) {
        return Err(Refusal::BadUserInput(
            "extensions.persistedQuery.version must be 1".to_owned(),
        ));
    }
    match persisted.get("sha256Hash").and_then(|hash| hash.as_str()) {
        Some(hash) if is_sha256_hex(hash) => Ok(Some(hash.to_ascii_lowercase())),
        _ => Err(Refusal::BadUserInput(
            "extensions.persistedQuery.sha256Hash must be 64 hex digits".to_owned(),
        )),
    }
}

impl PersistedDocuments {
    pub fn new(store: Arc<dyn DocumentStore>) -> Self {
        Self {
            store,
            to_register: Mutex::new(None),
        }
    }

    async fn apq(&self, request: &mut Request, hash: Option<String>) -> ServerResult<()> {
        let Some(hash) = hash else { return Ok(()) };
        if request.query.is_empty() {
            let document = self.store.registered(&hash).await.map_err(whole_request)?;
            request.query = document.ok_or(Refusal::NotFound)?;
            return Ok(());
        }
        let actual = sha256_hex(&request.query);
        if actual != hash {
            return Err(Refusal::BadUserInput(format!(
                "the document's SHA-256 is {actual}, not the sha256Hash sent"
            ))
            .into());
        }
        *self.to_register.lock().expect("lock poisoned") = Some((hash, request.query.clone()));
        Ok(())
    }

    async fn trusted(&self, request: &mut Request, hash: Option<String>) -> ServerResult<()> {
        let hash = match hash {
            Some(hash) if request.query.is_empty() || sha256_hex(&request.query) == hash => hash,
            Some(_) => {
                return Err(Refusal::BadUserInput(
                    "the document's SHA-256 is not the sha256Hash sent".to_owned(),
                )
                .into());
            }
            None => sha256_hex(&request.query),
        };
        match self.store.trusted(&hash).await.map_err(whole_request)? {
            Some(document) => {
                request.query = document.to_string();
                Ok(())
            }
            None => Err(Refusal::NotTrusted(hash).into()),
        }
    }

    /// The request with its document in full, from the hash it names where it names one, in the
    /// store's mode.
    pub async fn prepare(&self, mut request: Request) -> ServerResult<Request> {
        let hash = requested_hash(&request)?;
        match self.store.mode() {
            PersistedMode::Apq => self.apq(&mut request, hash).await?,
            PersistedMode::Trusted => self.trusted(&mut request, hash).await?,
            PersistedMode::Off if hash.is_some() => return Err(Refusal::NotSupported.into()),
            PersistedMode::Off => {}
        }
        if request.query.trim().is_empty() {
            return Err(Refusal::BadUserInput("the request has no `query`".to_owned()).into());
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
            if let Err(err) = self.store.register(&hash, &document).await {
                tracing::warn!(error = %err.message, "persisted query not registered");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const QUERY: &str = "{ __typename }";

    /// Documents in memory, as a server's store would keep them.
    struct Memory {
        mode: PersistedMode,
        registered: Mutex<HashMap<String, String>>,
        trusted: HashMap<String, Arc<str>>,
    }

    impl Memory {
        fn new(mode: PersistedMode) -> Arc<Self> {
            let trusted = HashMap::from([(sha256_hex(QUERY), Arc::from(QUERY))]);
            Arc::new(Self {
                mode,
                registered: Mutex::default(),
                trusted,
            })
        }
    }

    #[async_trait::async_trait]
    impl DocumentStore for Memory {
        fn mode(&self) -> PersistedMode {
            self.mode
        }

        async fn registered(&self, sha256: &str) -> async_graphql::Result<Option<String>> {
            Ok(self.registered.lock().unwrap().get(sha256).cloned())
        }

        async fn register(&self, sha256: &str, document: &str) -> async_graphql::Result<()> {
            let mut registered = self.registered.lock().unwrap();
            registered.insert(sha256.to_owned(), document.to_owned());
            Ok(())
        }

        async fn trusted(&self, sha256: &str) -> async_graphql::Result<Option<Arc<str>>> {
            Ok(self.trusted.get(sha256).cloned())
        }
    }

    fn request(query: &str, sha256: &str) -> Request {
        let mut request = Request::new(query);
        let extension = serde_json::json!({ "version": 1, "sha256Hash": sha256 });
        request.extensions.insert(
            "persistedQuery".to_owned(),
            async_graphql::Value::from_json(extension).unwrap(),
        );
        request
    }

    fn code(error: &ServerError) -> String {
        let code = error.extensions.as_ref().and_then(|ext| ext.get("code"));
        code.map(ToString::to_string).unwrap_or_default()
    }

    /// Runs one request through the stage, answering it with `response` when it was let through.
    async fn pass(
        store: &Arc<Memory>,
        request: Request,
        response: Response,
    ) -> ServerResult<String> {
        let stage = PersistedDocuments::new(store.clone());
        let prepared = stage.prepare(request).await?;
        stage.after(&response).await;
        Ok(prepared.query)
    }

    fn answered() -> Response {
        Response::new(async_graphql::Value::Null)
    }

    #[test]
    fn hashes_are_the_hex_sha256_clients_compute() {
        // printf '{ __typename }' | sha256sum
        assert_eq!(
            sha256_hex(QUERY),
            "7f56e67dd21ab3f30d1ff8b7bed08893f0a0db86449836189b361dd1e56ddb4b"
        );
        assert!(is_sha256_hex(&sha256_hex("x")));
        assert!(!is_sha256_hex("../../etc"));
        assert!(!is_sha256_hex(&"g".repeat(64)));
    }

    #[tokio::test]
    async fn an_apq_hash_is_unknown_until_its_document_ran_with_it() {
        let store = Memory::new(PersistedMode::Apq);
        let hash = sha256_hex("{ a }");
        let unknown = pass(&store, request("", &hash), answered()).await;
        let unknown = unknown.unwrap_err();
        assert_eq!(unknown.message, "PersistedQueryNotFound");
        assert_eq!(code(&unknown), "\"PERSISTED_QUERY_NOT_FOUND\"");

        // A document that failed as a whole (it did not validate) is not registered.
        let refused = Response::from_errors(vec![ServerError::new("invalid", None)]);
        pass(&store, request("{ a }", &hash), refused)
            .await
            .unwrap();
        assert!(pass(&store, request("", &hash), answered()).await.is_err());

        pass(&store, request("{ a }", &hash.to_uppercase()), answered())
            .await
            .unwrap();
        let found = pass(&store, request("", &hash), answered()).await.unwrap();
        assert_eq!(found, "{ a }");
    }

    #[tokio::test]
    async fn a_document_sent_under_another_documents_hash_is_refused_and_not_registered() {
        let store = Memory::new(PersistedMode::Apq);
        let other = sha256_hex("{ b }");
        let refused = pass(&store, request("{ a }", &other), answered()).await;
        let refused = refused.unwrap_err();
        assert_eq!(code(&refused), "\"BAD_USER_INPUT\"");
        assert!(
            refused.message.contains("not the sha256Hash sent"),
            "{}",
            refused.message
        );
        assert!(store.registered.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_malformed_extension_is_refused_with_what_it_should_be() {
        let store = Memory::new(PersistedMode::Apq);
        let bad_hash = pass(&store, request("", "../../etc"), answered()).await;
        assert!(bad_hash.unwrap_err().message.contains("64 hex digits"));
        let mut old = Request::new("");
        let extension = serde_json::json!({ "version": 2, "sha256Hash": sha256_hex(QUERY) });
        old.extensions.insert(
            "persistedQuery".to_owned(),
            async_graphql::Value::from_json(extension).unwrap(),
        );
        let old = pass(&store, old, answered()).await;
        assert!(old.unwrap_err().message.contains("version must be 1"));
    }

    #[tokio::test]
    async fn trusted_mode_runs_only_trusted_documents_by_hash_or_in_full() {
        let store = Memory::new(PersistedMode::Trusted);
        let by_hash = pass(&store, request("", &sha256_hex(QUERY)), answered()).await;
        assert_eq!(by_hash.unwrap(), QUERY);
        let in_full = pass(&store, Request::new(QUERY), answered()).await;
        assert_eq!(in_full.unwrap(), QUERY);

        let other = pass(&store, Request::new("{ a }"), answered()).await;
        let other = other.unwrap_err();
        assert_eq!(code(&other), "\"DOCUMENT_NOT_TRUSTED\"");
        assert!(
            other.message.contains(&sha256_hex("{ a }")),
            "{}",
            other.message
        );
        // Trusted mode never registers what a client sends.
        let sent = pass(&store, request("{ a }", &sha256_hex("{ a }")), answered()).await;
        assert!(sent.is_err());
        assert!(store.registered.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn with_persisted_documents_off_a_hash_is_refused_and_a_document_runs() {
        let store = Memory::new(PersistedMode::Off);
        let hashed = pass(&store, request(QUERY, &sha256_hex(QUERY)), answered()).await;
        let hashed = hashed.unwrap_err();
        assert_eq!(code(&hashed), "\"PERSISTED_QUERY_NOT_SUPPORTED\"");
        let plain = pass(&store, Request::new(QUERY), answered()).await;
        assert_eq!(plain.unwrap(), QUERY);
        let empty = pass(&store, Request::new("  "), answered()).await;
        assert!(empty.unwrap_err().message.contains("no `query`"));
    }
}
