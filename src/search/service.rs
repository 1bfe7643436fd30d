use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::index::{After, ArticleDoc, EmbeddedIndex, Hit, Search, Sort};
use super::indexer::{Indexer, IndexerSettings};
use super::outbox;
use super::query::SearchQuery;
use crate::error::{AppError, AppResult};
use crate::pagination::{Page, PageRequest, Position, SortKey, Walk};

/// How long a search by counts waits for a reopened replica to load them from SQL (one scan of
/// three columns of `articles`).
const COUNTS_WAIT: Duration = Duration::from_secs(10);

/// A search cursor's key: the snapshot its walk reads (see `index::Snapshots`) and the sort key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchKey {
    pub snapshot: u64,
    pub key: i64,
}

impl SortKey for SearchKey {
    fn write(&self) -> String {
        format!("{:x}.{}", self.snapshot, self.key)
    }

    fn read(raw: &str) -> Option<Self> {
        let (snapshot, key) = raw.split_once('.')?;
        Some(Self {
            snapshot: u64::from_str_radix(snapshot, 16).ok()?,
            key: key.parse().ok()?,
        })
    }
}

/// The walk of each sort: a cursor of one sort is refused by another.
pub fn walk(sort: Sort) -> Walk {
    match sort {
        Sort::Relevance => Walk("search:relevance"),
        Sort::Views => Walk("search:views"),
        Sort::Likes => Walk("search:likes"),
        Sort::Newest => Walk("search:newest"),
    }
}

/// A search as the resolver hands it over, validated.
pub struct SearchRequest {
    pub query: SearchQuery,
    pub sort: Sort,
    pub author: Option<i64>,
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    pub page: PageRequest<SearchKey>,
}

#[derive(Clone)]
pub struct SearchService {
    db: DatabaseConnection,
    dir: PathBuf,
    settings: IndexerSettings,
    replica: Arc<OnceLock<EmbeddedIndex>>,
}

impl SearchService {
    pub fn new(db: DatabaseConnection, dir: PathBuf, settings: IndexerSettings) -> Self {
        Self {
            db,
            dir,
            settings,
            replica: Arc::new(OnceLock::new()),
        }
    }

    /// Opens this process's replica (see [`EmbeddedIndex::open_replica`]) and starts its indexer.
    /// A replica that cannot be opened leaves this process without search, loudly, rather than
    /// without the rest.
    pub fn start(&self, tasks: &TaskTracker, shutdown: &CancellationToken) {
        match EmbeddedIndex::open_replica(&self.dir) {
            Ok((index, dir)) => {
                tracing::info!(dir = %dir.display(), "search replica opened");
                let index = self.replica.get_or_init(|| index).clone();
                let indexer = Indexer::new(self.db.clone(), Arc::new(index), self.settings);
                tasks.spawn(indexer.run(shutdown.clone()));
            }
            Err(err) => {
                tracing::error!(error = format!("{err:#}"), "this process serves no search");
            }
        }
    }

    fn replica(&self) -> AppResult<&EmbeddedIndex> {
        self.replica
            .get()
            .ok_or_else(|| AppError::Internal("this process has no search replica".into()))
    }

    /// This process's indexer, for tests and the load tool to step by hand.
    pub fn indexer(&self) -> AppResult<Indexer> {
        let index = self.replica()?.clone();
        Ok(Indexer::new(
            self.db.clone(),
            Arc::new(index),
            self.settings,
        ))
    }

    /// Every document of this process's replica, by id.
    pub async fn documents(&self) -> AppResult<Vec<ArticleDoc>> {
        let index = self.replica()?.clone();
        tokio::task::spawn_blocking(move || index.all_documents())
            .await
            .map_err(|err| AppError::Internal(err.to_string()))?
            .map_err(|err| AppError::Internal(format!("{err:#}")))
    }

    /// Asks every replica to rebuild from SQL (`pulse rebuild search`): each sees the new epoch
    /// at its next step. Returns the epoch.
    pub async fn request_rebuild(&self) -> AppResult<i64> {
        Ok(outbox::raise_epoch(&self.db).await?)
    }

    #[tracing::instrument(skip_all, fields(sort = ?request.sort))]
    pub async fn search(&self, request: SearchRequest) -> AppResult<Page<Hit>> {
        let index = self.replica()?.clone();
        if matches!(request.sort, Sort::Views | Sort::Likes)
            && !index.is_empty()
            && !index.counts_ready(COUNTS_WAIT).await
        {
            return Err(AppError::Internal(
                "this process's search replica is still loading its counts from SQL".into(),
            ));
        }
        let page = request.page;
        let limit = page.fetch_limit() as usize;
        let hits = tokio::task::spawn_blocking(move || {
            index.search(&Search {
                query: &request.query,
                sort: request.sort,
                author: request.author,
                since: request.since.map(|at| at.timestamp_millis()),
                until: request.until.map(|at| at.timestamp_millis()),
                limit,
                after: page.after.map(|after| After {
                    snapshot: after.key.snapshot,
                    key: after.key.key,
                    id: after.id,
                }),
            })
        })
        .await
        .map_err(|err| AppError::Internal(err.to_string()))?
        .map_err(|err| AppError::Internal(format!("search failed: {err:#}")))?;
        let snapshot = hits.snapshot;
        Ok(Page::from_overfetch(hits.hits, &page, |hit| Position {
            key: SearchKey {
                snapshot,
                key: hit.key,
            },
            id: hit.article_id,
        }))
    }
}
