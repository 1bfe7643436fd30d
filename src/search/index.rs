//! The embedded index: one Tantivy index in this process's search directory, its schema, the
//! [`DocumentStore`] the indexer writes through, and the searches run on it.
//!
//! A commit carries the indexer's position ([`Applied`]) as its payload, so the documents and how
//! far they go are one atomic step: after a crash, the index reopens at its last commit with the
//! position of exactly that commit.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tantivy::collector::{Collector, SegmentCollector};
use tantivy::columnar::Column;
use tantivy::directory::MmapDirectory;
use tantivy::query::{BooleanQuery, BoostQuery, PhraseQuery, Query, TermQuery};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions, Value,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::{
    DocAddress, DocId, Index, IndexReader, IndexWriter, ReloadPolicy, Score, Searcher,
    SegmentOrdinal, SegmentReader, TantivyDocument, Term,
};

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
}

#[derive(Clone, Copy)]
struct Fields {
    id: Field,
    author: Field,
    title: Field,
    body: Field,
    views: Field,
    likes: Field,
    created: Field,
    updated: Field,
}

const ID: &str = "id";
const AUTHOR: &str = "author_id";
const VIEWS: &str = "view_count";
const LIKES: &str = "like_count";
const CREATED: &str = "created_at";

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
        views: builder.add_i64_field(VIEWS, STORED | FAST),
        likes: builder.add_i64_field(LIKES, STORED | FAST),
        created: builder.add_i64_field(CREATED, STORED | FAST),
        updated: builder.add_i64_field("updated_at", STORED),
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

/// Searchers kept for the cursors issued from them: a walk's later pages read the same documents
/// as its first (no repeats or skips while counts change between pages) for as long as the
/// snapshot is kept, in this process. A cursor whose snapshot is gone (idle too long, pushed out
/// by newer ones, or read by another process's replica) continues from its (key, id) on the
/// current documents: a document whose key moved across the cursor since may then repeat or be
/// missed.
struct Snapshots {
    kept: HashMap<u64, (Searcher, Instant)>,
    by_generation: HashMap<u64, u64>,
}

impl Snapshots {
    fn token_for(&mut self, searcher: &Searcher) -> u64 {
        let generation = searcher.generation().generation_id();
        if let Some(token) = self.by_generation.get(&generation)
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
        self.by_generation.retain(|_, token| live.contains(token));
        let token = rand::random::<u64>() | 1;
        self.kept.insert(token, (searcher.clone(), Instant::now()));
        self.by_generation.insert(generation, token);
        token
    }

    fn get(&mut self, token: u64) -> Option<Searcher> {
        let (searcher, used) = self.kept.get_mut(&token)?;
        if used.elapsed() >= SNAPSHOT_IDLE {
            return None;
        }
        *used = Instant::now();
        Some(searcher.clone())
    }
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
    writer: Arc<Mutex<IndexWriter<TantivyDocument>>>,
    snapshots: Arc<Mutex<Snapshots>>,
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
    /// keeps its own replica in its own directory.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the search dir {}", dir.display()))?;
        let (schema, fields) = schema();
        let directory = MmapDirectory::open(dir)
            .with_context(|| format!("cannot open the search dir {}", dir.display()))?;
        let index = Index::open_or_create(directory, schema.clone()).with_context(|| {
            format!(
                "the search dir {} holds an index of another schema; remove it to rebuild",
                dir.display()
            )
        })?;
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
        Ok(Self {
            index,
            fields,
            reader,
            writer: Arc::new(Mutex::new(writer)),
            snapshots: Arc::new(Mutex::new(Snapshots {
                kept: HashMap::new(),
                by_generation: HashMap::new(),
            })),
        })
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, IndexWriter<TantivyDocument>> {
        self.writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn snapshots(&self) -> std::sync::MutexGuard<'_, Snapshots> {
        self.snapshots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn document(&self, article: &ArticleDoc) -> TantivyDocument {
        let f = self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_i64(f.id, article.id);
        doc.add_i64(f.author, article.author_id);
        doc.add_text(f.title, &article.title);
        doc.add_text(f.body, &article.body);
        doc.add_i64(f.views, article.view_count);
        doc.add_i64(f.likes, article.like_count);
        doc.add_i64(f.created, article.created_at);
        doc.add_i64(f.updated, article.updated_at);
        doc
    }

    /// Every document, by id: what tests compare with SQL.
    pub fn all_documents(&self) -> anyhow::Result<Vec<ArticleDoc>> {
        let searcher = self.reader.searcher();
        let mut docs = Vec::new();
        for (ordinal, segment) in searcher.segment_readers().iter().enumerate() {
            for doc in segment.doc_ids_alive() {
                let stored: TantivyDocument =
                    searcher.doc(DocAddress::new(ordinal as SegmentOrdinal, doc))?;
                docs.push(self.read_document(&stored)?);
            }
        }
        docs.sort_by_key(|doc| doc.id);
        Ok(docs)
    }

    fn read_document(&self, doc: &TantivyDocument) -> anyhow::Result<ArticleDoc> {
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
        Ok(ArticleDoc {
            id: int(f.id)?,
            author_id: int(f.author)?,
            title: text(f.title)?,
            body: text(f.body)?,
            view_count: int(f.views)?,
            like_count: int(f.likes)?,
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
        let searcher = snapshot.unwrap_or_else(|| self.reader.searcher());
        let token = self.snapshots().token_for(&searcher);
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
        };
        let top = searcher.search(query.as_ref(), &collector)?;
        let titles = snippets(&searcher, query.as_ref(), self.fields.title)?;
        let bodies = snippets(&searcher, query.as_ref(), self.fields.body)?;
        let mut hits = Vec::with_capacity(top.len());
        for ranked in top {
            let doc: TantivyDocument = searcher.doc(ranked.address)?;
            let article = self.read_document(&doc)?;
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
            let mut writer = this.writer();
            // tantivy's delete_all_documents winds the opstamp counter back to the commit the
            // writer was opened at, not its last one, while deletes of the last commit can
            // still wait in an indexing thread's queue. Their higher opstamps stop that thread
            // from applying the rebuild's own deletes when it writes its segment; at the commit
            // they are applied as if newer than every document of it, so a rebuilt document went
            // with the delete staged just before it (issue 24: a rebuild after `pulse rebuild
            // search` without article 1). A rollback first leaves a writer as freshly opened: an
            // empty delete queue and the counter at the last commit, where winding back is a
            // no-op.
            writer.rollback()?;
            writer.delete_all_documents()?;
            Ok(())
        })
        .await?
    }

    async fn stage(&self, changes: Vec<Change>) -> anyhow::Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let writer = this.writer();
            for change in changes {
                let id = match &change {
                    Change::Upsert(article) => article.id,
                    Change::Delete(id) => *id,
                };
                writer.delete_term(Term::from_field_i64(this.fields.id, id));
                if let Change::Upsert(article) = change {
                    writer.add_document(this.document(&article))?;
                }
            }
            Ok(())
        })
        .await?
    }

    async fn commit(&self, applied: &Applied) -> anyhow::Result<()> {
        let payload = serde_json::to_string(applied)?;
        let this = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut writer = this.writer();
            let mut prepared = writer.prepare_commit()?;
            prepared.set_payload(&payload);
            prepared.commit()?;
            drop(writer);
            this.reader.reload()?;
            Ok(())
        })
        .await?
    }

    async fn abandon(&self) -> anyhow::Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.writer().rollback().map(drop)).await??;
        Ok(())
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
}

struct PageSegment {
    ordinal: SegmentOrdinal,
    sort: Sort,
    author: Option<i64>,
    since: Option<i64>,
    until: Option<i64>,
    after: Option<(i64, i64)>,
    limit: usize,
    ids: Column<i64>,
    authors: Column<i64>,
    created: Column<i64>,
    sort_column: Option<Column<i64>>,
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
        let sort_column = match self.sort {
            Sort::Relevance => None,
            Sort::Views => Some(fast.i64(VIEWS)?),
            Sort::Likes => Some(fast.i64(LIKES)?),
            Sort::Newest => Some(fast.i64(CREATED)?),
        };
        Ok(PageSegment {
            ordinal,
            sort: self.sort,
            author: self.author,
            since: self.since,
            until: self.until,
            after: self.after,
            limit: self.limit,
            ids: fast.i64(ID)?,
            authors: fast.i64(AUTHOR)?,
            created: fast.i64(CREATED)?,
            sort_column,
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
        let key = match (&self.sort_column, self.sort) {
            (Some(column), _) => column.first(doc).unwrap_or(0),
            (None, _) => i64::from(score.max(0.0).to_bits()),
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
