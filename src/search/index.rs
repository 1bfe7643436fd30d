//! The embedded index: one Tantivy index in this process's search directory, its schema, the
//! [`DocumentStore`] the indexer writes through, and the searches run on it.
//!
//! A commit carries the indexer's position ([`Applied`]) as its payload, so the documents and how
//! far they go are one atomic step: after a crash, the index reopens at its last commit with the
//! position of exactly that commit.
//!
//! Views and likes are not in the documents but in a [`CountTable`] beside them, published with
//! each commit, so a count change rewrites no document (see `counts.rs`). The table is not
//! persisted: a reopened index loads it from SQL ([`DocumentStore::load_counts`]) before it
//! applies anything, which gives counts at least as new as the committed position, and the rows
//! after that position then write the same absolute values again.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tantivy::collector::{Collector, SegmentCollector};
use tantivy::columnar::Column;
use tantivy::directory::{Directory as _, INDEX_WRITER_LOCK, MmapDirectory};
use tantivy::query::{BooleanQuery, BoostQuery, PhraseQuery, Query, TermQuery};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions, Value,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::{
    DocAddress, DocId, Index, IndexReader, IndexSettings, IndexWriter, ReloadPolicy, Score,
    Searcher, SegmentOrdinal, SegmentReader, TantivyDocument, Term,
};

use super::counts::{CountTable, Counts};
use super::query::SearchQuery;
use super::tokenizer::{DOCUMENT_ANALYZER, document_analyzer, snippet_analyzer};

/// The writer's memory before it writes a segment out: large enough that a rebuild makes few
/// segments, small enough for a 2-core, small-memory host.
const WRITER_MEMORY: usize = 64 * 1024 * 1024;
/// Snapshots kept for cursors, and how long an unused one is kept: see [`Snapshots`].
const SNAPSHOTS_KEPT: usize = 16;
const SNAPSHOT_IDLE: Duration = Duration::from_secs(120);
/// Longest snippet, in characters.
const SNIPPET_CHARS: usize = 160;

/// An article as the index holds it: absolute values read from SQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArticleDoc {
    pub id: i64,
    pub author_id: i64,
    pub title: String,
    pub body: String,
    pub view_count: i64,
    pub like_count: i64,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    pub updated_at: i64,
}

/// One document change.
#[derive(Clone, Debug)]
pub enum Change {
    Upsert(ArticleDoc),
    Delete(i64),
}

/// An outbox id the indexer has not seen although a higher one is applied: the row of a
/// transaction that has not committed yet (ids are taken at insert, commits land in any order),
/// or of one that rolled back. Watched until `seen_at` (ms) is older than the gap window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    pub id: i64,
    pub seen_at: i64,
}

/// How far a store has applied the outbox, committed with the documents.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The `search_state.epoch` the store was built in.
    pub epoch: i64,
    /// Every outbox id up to here is applied, but the gaps.
    pub through: i64,
    pub gaps: Vec<Gap>,
}

/// Where the indexer writes. Changes are staged and become visible, with the position, at
/// `commit`; a process that dies before it leaves the store at its previous commit. The embedded
/// Tantivy index is the one implementation; ARCHITECTURE.md ("Search") describes an external
/// engine's.
#[async_trait::async_trait]
pub trait DocumentStore: Send + Sync {
    /// The position of the last commit; `None` for a store never committed (built from SQL).
    async fn applied(&self) -> anyhow::Result<Option<Applied>>;
    /// Stages the removal of every document (a rebuild), dropping what was staged since the
    /// last commit.
    async fn clear(&self) -> anyhow::Result<()>;
    async fn stage(&self, changes: Vec<Change>) -> anyhow::Result<()>;
    /// Makes what was staged visible together with `applied`.
    async fn commit(&self, applied: &Applied) -> anyhow::Result<()>;
    /// Drops what was staged since the last commit.
    async fn abandon(&self) -> anyhow::Result<()>;
    /// Whether the store needs every article's counts from SQL before it applies outbox rows:
    /// one that keeps them outside its committed state, opened on an index it did not build.
    async fn wants_counts(&self) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Every article's counts as SQL holds them now, read after the store was opened (so at
    /// least as new as its committed position); visible at once.
    async fn load_counts(&self, _counts: Vec<(i64, Counts)>) -> anyhow::Result<()> {
        Ok(())
    }
}

#[derive(Clone, Copy)]
struct Fields {
    id: Field,
    author: Field,
    title: Field,
    body: Field,
    created: Field,
    updated: Field,
    content: Field,
}

const ID: &str = "id";
const AUTHOR: &str = "author_id";
const CREATED: &str = "created_at";
const CONTENT: &str = "content";

fn schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    let text = TextOptions::default().set_stored().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(DOCUMENT_ANALYZER)
            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
    );
    let fields = Fields {
        id: builder.add_i64_field(ID, INDEXED | STORED | FAST),
        author: builder.add_i64_field(AUTHOR, STORED | FAST),
        title: builder.add_text_field("title", text.clone()),
        body: builder.add_text_field("body", text),
        created: builder.add_i64_field(CREATED, STORED | FAST),
        updated: builder.add_i64_field("updated_at", STORED),
        // A digest of everything above: an upsert whose digest the index already holds changes
        // counts only, and leaves the document alone.
        content: builder.add_i64_field(CONTENT, FAST),
    };
    (builder.build(), fields)
}

/// The order of a search, and so of its cursor's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    Relevance,
    Views,
    Likes,
    Newest,
}

/// What one search asks for, parsed and bounded.
pub struct Search<'a> {
    pub query: &'a SearchQuery,
    pub sort: Sort,
    pub author: Option<i64>,
    /// Creation time bounds in ms, inclusive.
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub limit: usize,
    pub after: Option<After>,
}

/// Where a walk stands: the snapshot it reads and its last (key, id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct After {
    pub snapshot: u64,
    pub key: i64,
    pub id: i64,
}

/// One hit, best first.
#[derive(Clone, Debug)]
pub struct Hit {
    pub article_id: i64,
    pub key: i64,
    pub title: String,
    pub snippet: String,
}

/// A page of hits and the snapshot it was read from.
pub struct Hits {
    pub snapshot: u64,
    pub hits: Vec<Hit>,
}

/// What searches read: the documents of one commit and the counts published with it.
struct View {
    searcher: Searcher,
    counts: Arc<CountTable>,
    /// Raised at every publish: a commit of counts alone leaves the searcher's generation as it
    /// was, but not what a search ranks by.
    version: u64,
}

/// Views kept for the cursors issued from them: a walk's later pages read the same documents and
/// counts as its first (no repeats or skips while counts change between pages) for as long as the
/// view is kept, in this process. A cursor whose view is gone (idle too long, pushed out by newer
/// ones, or read by another process's replica) continues from its (key, id) on the current
/// view: a document whose key moved across the cursor since may then repeat or be missed.
struct Snapshots {
    kept: HashMap<u64, (Arc<View>, Instant)>,
    by_version: HashMap<u64, u64>,
}

impl Snapshots {
    fn token_for(&mut self, view: &Arc<View>) -> u64 {
        if let Some(token) = self.by_version.get(&view.version)
            && let Some((_, used)) = self.kept.get_mut(token)
        {
            *used = Instant::now();
            return *token;
        }
        self.kept
            .retain(|_, (_, used)| used.elapsed() < SNAPSHOT_IDLE);
        while self.kept.len() >= SNAPSHOTS_KEPT {
            let oldest = self
                .kept
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(token, _)| *token);
            if let Some(token) = oldest {
                self.kept.remove(&token);
            }
        }
        let live: std::collections::HashSet<u64> = self.kept.keys().copied().collect();
        self.by_version.retain(|_, token| live.contains(token));
        let token = rand::random::<u64>() | 1;
        self.kept.insert(token, (view.clone(), Instant::now()));
        self.by_version.insert(view.version, token);
        token
    }

    fn get(&mut self, token: u64) -> Option<Arc<View>> {
        let (view, used) = self.kept.get_mut(&token)?;
        if used.elapsed() >= SNAPSHOT_IDLE {
            return None;
        }
        *used = Instant::now();
        Some(view.clone())
    }
}

/// What was staged since the last commit, beside the writer's own queue.
#[derive(Default)]
struct Staged {
    /// Every document was removed (a rebuild).
    cleared: bool,
    /// Content digests of the documents written (`None`: removed).
    content: HashMap<i64, Option<i64>>,
    counts: HashMap<i64, Option<Counts>>,
}

/// The writer and what it knows of the committed documents, under one lock.
struct Writing {
    writer: IndexWriter<TantivyDocument>,
    /// The content digest of every committed document, by article id.
    indexed: HashMap<i64, i64>,
    staged: Staged,
}

impl Writing {
    /// The digest of the document `id` as the staged changes leave it.
    fn content(&self, id: i64) -> Option<i64> {
        match self.staged.content.get(&id) {
            Some(content) => *content,
            None if self.staged.cleared => None,
            None => self.indexed.get(&id).copied(),
        }
    }
}

/// A digest of what an article's document holds besides its counts.
fn content_digest(article: &ArticleDoc) -> i64 {
    let mut hasher = Sha256::new();
    for number in [article.author_id, article.created_at, article.updated_at] {
        hasher.update(number.to_le_bytes());
    }
    hasher.update((article.title.len() as u64).to_le_bytes());
    hasher.update(article.title.as_bytes());
    hasher.update(article.body.as_bytes());
    let digest = hasher.finalize();
    i64::from_le_bytes(
        digest[..8]
            .try_into()
            .expect("a SHA-256 digest has 8 bytes"),
    )
}

fn held_by_another_process(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<tantivy::TantivyError>(),
            Some(tantivy::TantivyError::LockFailure(..))
        )
    })
}

/// The embedded index of this process.
#[derive(Clone)]
pub struct EmbeddedIndex {
    index: Index,
    fields: Fields,
    reader: IndexReader,
    writing: Arc<Mutex<Writing>>,
    current: Arc<RwLock<Arc<View>>>,
    /// Whether the counts are complete: built by this process or loaded from SQL since it opened
    /// the index.
    counts_ready: Arc<tokio::sync::watch::Sender<bool>>,
    snapshots: Arc<Mutex<Snapshots>>,
    /// Documents written (added or replaced) since this process opened the index.
    written: Arc<AtomicU64>,
}

/// Replicas one search dir may hold: processes that share a data dir (several API processes on
/// one host with the same defaults) each take the first replica no other process holds, rather
/// than the second of them serving no search.
pub const MAX_REPLICAS_PER_DIR: usize = 8;

impl EmbeddedIndex {
    /// Opens the first replica under `dir` (`replica-0`, `replica-1`, …) that no other process
    /// holds, creating it when missing; a process restarting takes its old one back (the lowest
    /// free) and resumes from its last commit. Returns the replica's directory too.
    pub fn open_replica(dir: &Path) -> anyhow::Result<(Self, PathBuf)> {
        for n in 0..MAX_REPLICAS_PER_DIR {
            let replica = dir.join(format!("replica-{n}"));
            match Self::open(&replica) {
                Ok(index) => return Ok((index, replica)),
                Err(err) if held_by_another_process(&err) => continue,
                Err(err) => return Err(err),
            }
        }
        anyhow::bail!(
            "every one of the {MAX_REPLICAS_PER_DIR} search replicas in {} is held by another \
             process; give this one a PULSE_SEARCH_DIR of its own",
            dir.display()
        )
    }

    /// Opens (or creates) the index in `dir`. Fails when another process holds it: each process
    /// keeps its own replica in its own directory. An index of another schema (an older
    /// release's) is replaced by an empty one, which the indexer then rebuilds from SQL.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the search dir {}", dir.display()))?;
        let (schema, fields) = schema();
        let directory = MmapDirectory::open(dir)
            .with_context(|| format!("cannot open the search dir {}", dir.display()))?;
        let index = match Index::open_or_create(directory.clone(), schema.clone()) {
            Err(tantivy::TantivyError::SchemaError(_)) => {
                let _held = directory
                    .acquire_lock(&INDEX_WRITER_LOCK)
                    .with_context(|| {
                        format!(
                            "cannot lock the search dir {} to replace its index of another schema",
                            dir.display()
                        )
                    })?;
                tracing::warn!(
                    dir = %dir.display(),
                    "the search replica holds an index of another schema; starting it anew"
                );
                Index::create(directory, schema, IndexSettings::default())?
            }
            opened => opened
                .with_context(|| format!("cannot open the search index in {}", dir.display()))?,
        };
        index
            .tokenizers()
            .register(DOCUMENT_ANALYZER, document_analyzer());
        let writer = index.writer(WRITER_MEMORY).with_context(|| {
            format!(
                "cannot lock the search dir {}: is another process using it? Each process needs \
                 its own PULSE_SEARCH_DIR",
                dir.display()
            )
        })?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let searcher = reader.searcher();
        let indexed = committed_contents(&searcher)?;
        Ok(Self {
            index,
            fields,
            reader,
            writing: Arc::new(Mutex::new(Writing {
                writer,
                indexed,
                staged: Staged::default(),
            })),
            current: Arc::new(RwLock::new(Arc::new(View {
                searcher,
                counts: Arc::default(),
                version: 0,
            }))),
            counts_ready: Arc::new(tokio::sync::watch::Sender::new(false)),
            snapshots: Arc::new(Mutex::new(Snapshots {
                kept: HashMap::new(),
                by_version: HashMap::new(),
            })),
            written: Arc::default(),
        })
    }

    fn writing(&self) -> std::sync::MutexGuard<'_, Writing> {
        self.writing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn snapshots(&self) -> std::sync::MutexGuard<'_, Snapshots> {
        self.snapshots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn current(&self) -> Arc<View> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Makes the last commit's documents visible with `counts`. Called with the writer's lock
    /// held, so views are published in the order of the commits.
    fn publish(&self, counts: CountTable) -> anyhow::Result<()> {
        self.reader.reload()?;
        let searcher = self.reader.searcher();
        let mut current = self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *current = Arc::new(View {
            searcher,
            counts: Arc::new(counts),
            version: current.version + 1,
        });
        Ok(())
    }

    /// Waits up to `timeout` for the counts to be complete (see [`DocumentStore::load_counts`]);
    /// whether they are.
    pub async fn counts_ready(&self, timeout: Duration) -> bool {
        let mut ready = self.counts_ready.subscribe();
        tokio::time::timeout(timeout, ready.wait_for(|ready| *ready))
            .await
            .is_ok_and(|ready| ready.is_ok())
    }

    /// Whether the index holds no document (a replica not built yet).
    pub fn is_empty(&self) -> bool {
        self.current().searcher.num_docs() == 0
    }

    /// Documents written (added or replaced, not counts alone) since this process opened the
    /// index.
    pub fn documents_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    fn document(&self, article: &ArticleDoc) -> TantivyDocument {
        let f = self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_i64(f.id, article.id);
        doc.add_i64(f.author, article.author_id);
        doc.add_text(f.title, &article.title);
        doc.add_text(f.body, &article.body);
        doc.add_i64(f.created, article.created_at);
        doc.add_i64(f.updated, article.updated_at);
        doc.add_i64(f.content, content_digest(article));
        doc
    }

    /// Every document with its counts, by id: what tests compare with SQL.
    pub fn all_documents(&self) -> anyhow::Result<Vec<ArticleDoc>> {
        let view = self.current();
        let mut docs = Vec::new();
        for (ordinal, segment) in view.searcher.segment_readers().iter().enumerate() {
            for doc in segment.doc_ids_alive() {
                let stored: TantivyDocument = view
                    .searcher
                    .doc(DocAddress::new(ordinal as SegmentOrdinal, doc))?;
                docs.push(self.read_document(&stored, &view.counts)?);
            }
        }
        docs.sort_by_key(|doc| doc.id);
        Ok(docs)
    }

    fn read_document(
        &self,
        doc: &TantivyDocument,
        counts: &CountTable,
    ) -> anyhow::Result<ArticleDoc> {
        let f = self.fields;
        let int = |field: Field| {
            doc.get_first(field)
                .and_then(|value| value.as_i64())
                .context("a stored document lacks a number")
        };
        let text = |field: Field| {
            doc.get_first(field)
                .and_then(|value| value.as_str())
                .map(str::to_owned)
                .context("a stored document lacks a text")
        };
        let id = int(f.id)?;
        let Counts { views, likes } = counts.get(id);
        Ok(ArticleDoc {
            id,
            author_id: int(f.author)?,
            title: text(f.title)?,
            body: text(f.body)?,
            view_count: views,
            like_count: likes,
            created_at: int(f.created)?,
            updated_at: int(f.updated)?,
        })
    }

    /// The tantivy query for `query`: every clause in the title or the body (the title weighs
    /// double).
    fn tantivy_query(&self, query: &SearchQuery) -> Box<dyn Query> {
        let in_field = |field: Field, clause: &[(usize, String)]| -> Box<dyn Query> {
            match clause {
                [(_, word)] => Box::new(TermQuery::new(
                    Term::from_field_text(field, word),
                    IndexRecordOption::WithFreqs,
                )),
                words => Box::new(PhraseQuery::new_with_offset(
                    words
                        .iter()
                        .map(|(position, word)| (*position, Term::from_field_text(field, word)))
                        .collect(),
                )),
            }
        };
        let clauses = query
            .clauses()
            .iter()
            .map(|clause| {
                Box::new(BooleanQuery::union(vec![
                    Box::new(BoostQuery::new(in_field(self.fields.title, clause), 2.0)),
                    in_field(self.fields.body, clause),
                ])) as Box<dyn Query>
            })
            .collect();
        Box::new(BooleanQuery::intersection(clauses))
    }

    /// One page of a search. Blocking: call it off the async threads.
    pub fn search(&self, search: &Search<'_>) -> anyhow::Result<Hits> {
        let snapshot = search
            .after
            .and_then(|after| self.snapshots().get(after.snapshot));
        let view = snapshot.unwrap_or_else(|| self.current());
        let token = self.snapshots().token_for(&view);
        let searcher = &view.searcher;
        if search.query.clauses().is_empty() || search.limit == 0 {
            return Ok(Hits {
                snapshot: token,
                hits: Vec::new(),
            });
        }
        let query = self.tantivy_query(search.query);
        let collector = PageCollector {
            sort: search.sort,
            author: search.author,
            since: search.since,
            until: search.until,
            after: search.after.map(|after| (after.key, after.id)),
            limit: search.limit,
            counts: view.counts.clone(),
        };
        let top = searcher.search(query.as_ref(), &collector)?;
        let titles = snippets(searcher, query.as_ref(), self.fields.title)?;
        let bodies = snippets(searcher, query.as_ref(), self.fields.body)?;
        let mut hits = Vec::with_capacity(top.len());
        for ranked in top {
            let doc: TantivyDocument = searcher.doc(ranked.address)?;
            let article = self.read_document(&doc, &view.counts)?;
            let title = titles.snippet(&article.title);
            let body = bodies.snippet(&article.body);
            hits.push(Hit {
                article_id: ranked.id,
                key: ranked.key,
                title: if title.is_empty() {
                    escape(&article.title)
                } else {
                    title.to_html()
                },
                snippet: body.to_html(),
            });
        }
        Ok(Hits {
            snapshot: token,
            hits,
        })
    }
}

/// The content digest of every document of `searcher`, by article id.
fn committed_contents(searcher: &Searcher) -> tantivy::Result<HashMap<i64, i64>> {
    let mut contents = HashMap::new();
    for segment in searcher.segment_readers() {
        let fast = segment.fast_fields();
        let (ids, digests) = (fast.i64(ID)?, fast.i64(CONTENT)?);
        for doc in segment.doc_ids_alive() {
            if let (Some(id), Some(digest)) = (ids.first(doc), digests.first(doc)) {
                contents.insert(id, digest);
            }
        }
    }
    Ok(contents)
}

/// A snippet generator for `field`, weighing the query's terms as `SnippetGenerator::create`
/// does, but cutting text with [`snippet_analyzer`].
fn snippets(
    searcher: &Searcher,
    query: &dyn Query,
    field: Field,
) -> tantivy::Result<SnippetGenerator> {
    let mut terms = std::collections::BTreeSet::new();
    query.query_terms(&mut |term, _| {
        if term.field() == field {
            terms.insert(term.clone());
        }
    });
    let mut weights = std::collections::BTreeMap::new();
    for term in terms {
        let Some(text) = term.value().as_str().map(str::to_owned) else {
            continue;
        };
        let frequency = searcher.doc_freq(&term)?;
        if frequency > 0 {
            weights.insert(text, 1.0 / (1.0 + frequency as Score));
        }
    }
    Ok(SnippetGenerator::new(
        weights,
        snippet_analyzer(),
        field,
        SNIPPET_CHARS,
    ))
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[async_trait::async_trait]
impl DocumentStore for EmbeddedIndex {
    async fn applied(&self) -> anyhow::Result<Option<Applied>> {
        let metas = self.index.load_metas()?;
        metas
            .payload
            .map(|payload| {
                serde_json::from_str(&payload).context("unreadable search commit payload")
            })
            .transpose()
    }

    async fn clear(&self) -> anyhow::Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut writing = this.writing();
            // tantivy's delete_all_documents winds the opstamp counter back to the commit the
            // writer was opened at, not its last one, while deletes of the last commit can
            // still wait in an indexing thread's queue. Their higher opstamps stop that thread
            // from applying the rebuild's own deletes when it writes its segment; at the commit
            // they are applied as if newer than every document of it, so a rebuilt document went
            // with the delete staged just before it (issue 24: a rebuild after `pulse rebuild
            // search` without article 1). A rollback first leaves a writer as freshly opened: an
            // empty delete queue and the counter at the last commit, where winding back is a
            // no-op.
            writing.writer.rollback()?;
            writing.writer.delete_all_documents()?;
            writing.staged = Staged {
                cleared: true,
                ..Staged::default()
            };
            Ok(())
        })
        .await?
    }

    /// An upsert whose content the index holds already (a count change) stages its counts
    /// only; the document is rewritten when its text, author or dates changed.
    async fn stage(&self, changes: Vec<Change>) -> anyhow::Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut writing = this.writing();
            let mut written = 0;
            for change in changes {
                match change {
                    Change::Upsert(article) => {
                        let counts = Counts {
                            views: article.view_count,
                            likes: article.like_count,
                        };
                        writing.staged.counts.insert(article.id, Some(counts));
                        let digest = content_digest(&article);
                        if writing.content(article.id) == Some(digest) {
                            continue;
                        }
                        let id = Term::from_field_i64(this.fields.id, article.id);
                        writing.writer.delete_term(id);
                        writing.writer.add_document(this.document(&article))?;
                        writing.staged.content.insert(article.id, Some(digest));
                        written += 1;
                    }
                    Change::Delete(id) => {
                        writing
                            .writer
                            .delete_term(Term::from_field_i64(this.fields.id, id));
                        writing.staged.content.insert(id, None);
                        writing.staged.counts.insert(id, None);
                    }
                }
            }
            this.written.fetch_add(written, Ordering::Relaxed);
            metrics::counter!("pulse_search_documents_rewritten_total").increment(written);
            Ok(())
        })
        .await?
    }

    async fn commit(&self, applied: &Applied) -> anyhow::Result<()> {
        let payload = serde_json::to_string(applied)?;
        let this = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut writing = this.writing();
            let mut prepared = writing.writer.prepare_commit()?;
            prepared.set_payload(&payload);
            prepared.commit()?;
            let staged = std::mem::take(&mut writing.staged);
            if staged.cleared {
                writing.indexed.clear();
            }
            for (id, content) in staged.content {
                match content {
                    Some(digest) => writing.indexed.insert(id, digest),
                    None => writing.indexed.remove(&id),
                };
            }
            let counts = if staged.cleared {
                CountTable::default().with(staged.counts)
            } else {
                this.current().counts.with(staged.counts)
            };
            this.publish(counts)?;
            if staged.cleared {
                this.counts_ready.send_replace(true);
            }
            Ok(())
        })
        .await?
    }

    async fn abandon(&self) -> anyhow::Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut writing = this.writing();
            writing.writer.rollback()?;
            writing.staged = Staged::default();
            Ok(())
        })
        .await??;
        Ok(())
    }

    async fn wants_counts(&self) -> anyhow::Result<bool> {
        Ok(!*self.counts_ready.borrow())
    }

    async fn load_counts(&self, counts: Vec<(i64, Counts)>) -> anyhow::Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let _writing = this.writing();
            let loaded = counts.into_iter().map(|(id, counts)| (id, Some(counts)));
            this.publish(CountTable::default().with(loaded))?;
            this.counts_ready.send_replace(true);
            Ok(())
        })
        .await?
    }
}

/// A hit as the collector ranks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Ranked {
    key: i64,
    id: i64,
    address: DocAddress,
}

/// The best `limit` matches after a (key, id) position, filtered by author and creation time:
/// a keyset page over any sort, relevance included (its key is the score's bits, which order as
/// the scores do since scores are never negative).
struct PageCollector {
    sort: Sort,
    author: Option<i64>,
    since: Option<i64>,
    until: Option<i64>,
    after: Option<(i64, i64)>,
    limit: usize,
    counts: Arc<CountTable>,
}

/// Where a segment's sort key comes from.
enum SortKeys {
    Score,
    Column(Column<i64>),
    Views(Arc<CountTable>),
    Likes(Arc<CountTable>),
}

struct PageSegment {
    ordinal: SegmentOrdinal,
    author: Option<i64>,
    since: Option<i64>,
    until: Option<i64>,
    after: Option<(i64, i64)>,
    limit: usize,
    ids: Column<i64>,
    authors: Column<i64>,
    created: Column<i64>,
    keys: SortKeys,
    best: BinaryHeap<Reverse<Ranked>>,
}

impl Collector for PageCollector {
    type Fruit = Vec<Ranked>;
    type Child = PageSegment;

    fn for_segment(
        &self,
        ordinal: SegmentOrdinal,
        segment: &SegmentReader,
    ) -> tantivy::Result<PageSegment> {
        let fast = segment.fast_fields();
        let keys = match self.sort {
            Sort::Relevance => SortKeys::Score,
            Sort::Views => SortKeys::Views(self.counts.clone()),
            Sort::Likes => SortKeys::Likes(self.counts.clone()),
            Sort::Newest => SortKeys::Column(fast.i64(CREATED)?),
        };
        Ok(PageSegment {
            ordinal,
            author: self.author,
            since: self.since,
            until: self.until,
            after: self.after,
            limit: self.limit,
            ids: fast.i64(ID)?,
            authors: fast.i64(AUTHOR)?,
            created: fast.i64(CREATED)?,
            keys,
            best: BinaryHeap::new(),
        })
    }

    fn requires_scoring(&self) -> bool {
        self.sort == Sort::Relevance
    }

    fn merge_fruits(&self, fruits: Vec<Vec<Ranked>>) -> tantivy::Result<Vec<Ranked>> {
        let mut all: Vec<Ranked> = fruits.into_iter().flatten().collect();
        all.sort_by_key(|ranked| Reverse((ranked.key, ranked.id)));
        all.truncate(self.limit);
        Ok(all)
    }
}

impl SegmentCollector for PageSegment {
    type Fruit = Vec<Ranked>;

    fn collect(&mut self, doc: DocId, score: Score) {
        let Some(id) = self.ids.first(doc) else {
            return;
        };
        if let Some(author) = self.author
            && self.authors.first(doc) != Some(author)
        {
            return;
        }
        if self.since.is_some() || self.until.is_some() {
            let created = self.created.first(doc).unwrap_or(0);
            if self.since.is_some_and(|since| created < since)
                || self.until.is_some_and(|until| created > until)
            {
                return;
            }
        }
        let key = match &self.keys {
            SortKeys::Score => i64::from(score.max(0.0).to_bits()),
            SortKeys::Column(column) => column.first(doc).unwrap_or(0),
            SortKeys::Views(counts) => counts.get(id).views,
            SortKeys::Likes(counts) => counts.get(id).likes,
        };
        if let Some(after) = self.after
            && (key, id) >= after
        {
            return;
        }
        let ranked = Ranked {
            key,
            id,
            address: DocAddress::new(self.ordinal, doc),
        };
        if self.best.len() < self.limit {
            self.best.push(Reverse(ranked));
        } else if let Some(Reverse(worst)) = self.best.peek()
            && (key, id) > (worst.key, worst.id)
        {
            self.best.pop();
            self.best.push(Reverse(ranked));
        }
    }

    fn harvest(self) -> Vec<Ranked> {
        self.best
            .into_iter()
            .map(|Reverse(ranked)| ranked)
            .collect()
    }
}
