//! `pulse-bench search`: the embedded search index at scale, in this process (no HTTP: what is
//! measured is the index and its indexer, with the server's own code).
//!
//! 1. Load `--articles` articles into a fresh SQL database: titles of 6 words and bodies of 60,
//!    half Chinese and half English, drawn from a vocabulary of `--vocabulary` made-up words
//!    (Chinese words of two characters, English ones of two or three syllables) with
//!    Zipf-distributed frequencies (`--zipf`), all generated from `--seed`, so a run is
//!    repeatable and needs no downloaded data. `--narrow` draws uniformly from the 40 words of the
//!    first runs instead, where every query matches about 80% of the articles: the worst case.
//! 2. Build a replica from SQL (the indexer's rebuild): time, and the index's size on disk.
//! 3. Queries at a fixed rate, every common shape (a Chinese word, an English word, two words, a
//!    phrase, Chinese and English; in the Zipf corpus words of rank 3, 41 and 601, a frequent
//!    pair, a phrase of the two most frequent English words) under every sort (relevance, views,
//!    newest) in turn: latency
//!    from each query's scheduled start, so a slow one delays the count, not the schedule; p50/p99
//!    per shape and per sort.
//! 4. View flush batches stream in (`--batch-articles` articles each, every `--batch-every`, each
//!    an SQL transaction with its outbox rows) while the indexer follows and the queries go on:
//!    documents the indexer wrote per second (and per second of its own busy time, its ceiling),
//!    freshness (a batch's commit to its replica commit), query latency under that load, and that
//!    the replica equals SQL afterwards.
//! 5. The replica reopened as after a restart: the time to open it and to load its counts from
//!    SQL at its first step, and that it still equals SQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use hdrhistogram::Histogram;
use pulse::entities::{articles, users};
use pulse::search::index::{DocumentStore as _, EmbeddedIndex, Search, Sort};
use pulse::search::indexer::{Indexer, IndexerSettings, document};
use pulse::search::query::SearchQuery;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use sea_orm::sea_query::{Expr, ExprTrait as _};
use sea_orm::{
    ActiveValue::Set, ColumnTrait as _, DatabaseConnection, EntityTrait as _, QueryFilter as _,
    QueryOrder as _, TransactionTrait as _,
};
use tokio_util::sync::CancellationToken;

use crate::database::BenchDatabase;
use crate::report::{print_table, thousands};

#[derive(Debug, Clone, Args)]
pub struct SearchArgs {
    /// Articles loaded into SQL and indexed.
    #[arg(long, default_value_t = 1_000_000)]
    pub articles: u64,
    /// Queries per second, in both query phases.
    #[arg(long, default_value_t = 50.0)]
    pub query_rate: f64,
    /// How long each query phase (idle, then under the view stream) lasts.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Articles per view flush batch in the stream.
    #[arg(long, default_value_t = 500)]
    pub batch_articles: usize,
    /// How often a view flush batch commits in the stream.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub batch_every: Duration,
    /// How often the indexer polls the outbox (the server's PULSE_SEARCH_POLL).
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub poll: Duration,
    /// A PostgreSQL or MariaDB URL naming an existing database, beside which the run creates its
    /// own; unset: a SQLite file.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Words in the corpus's vocabulary, half Chinese and half English.
    #[arg(long, default_value_t = 20_000)]
    pub vocabulary: usize,
    /// The exponent of the words' Zipf distribution: the word of rank r is drawn in proportion
    /// to 1 / r^zipf.
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// Seeds the vocabulary and the articles.
    #[arg(long, default_value_t = 24)]
    pub seed: u64,
    /// The first runs' corpus: 40 words drawn uniformly, every query matching most articles.
    #[arg(long)]
    pub narrow: bool,
}

const ZH: &[&str] = &[
    "高并发",
    "文章",
    "浏览量",
    "计数",
    "缓存",
    "数据库",
    "排行榜",
    "点赞",
    "关注",
    "时间线",
    "系统",
    "设计",
    "性能",
    "优化",
    "分布式",
    "队列",
    "一致性",
    "索引",
    "搜索",
    "用户",
];
const EN: &[&str] = &[
    "counting",
    "views",
    "redis",
    "flusher",
    "leaderboard",
    "likes",
    "feed",
    "timeline",
    "cache",
    "database",
    "search",
    "index",
    "stream",
    "batch",
    "latency",
    "throughput",
    "replica",
    "cluster",
    "shard",
    "commit",
];
/// The narrow corpus's query shapes, each with the queries that stand for it.
const NARROW_SHAPES: &[(&str, &[&str])] = &[
    ("a Chinese word", &["浏览量", "计数"]),
    ("an English word (stemmed)", &["count", "replicas"]),
    ("two words", &["redis cache", "分布式 一致性"]),
    ("a phrase", &["\"counting views\""]),
    ("Chinese and English", &["排行榜 leaderboard"]),
];
const SORTS: [(&str, Sort); 3] = [
    ("RELEVANCE", Sort::Relevance),
    ("VIEWS", Sort::Views),
    ("NEWEST", Sort::Newest),
];

/// Characters the made-up Chinese words are paired from: common ones, so jieba's dictionary and
/// model see text like the seeds', though the pairs mean nothing.
const HANZI: &str = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动\
    同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实\
    加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各\
    重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已\
    通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组\
    见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七\
    海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身";

const ONSETS: &[&str] = &[
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br",
    "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "th", "tr",
];
const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ea", "ee", "oa", "ou"];
const CODAS: &[&str] = &["", "", "", "n", "r", "l", "m", "ck", "nd", "st", "x"];

/// The corpus's words, each list most frequent first, and how often each rank is drawn.
struct Vocabulary {
    zh: Vec<String>,
    en: Vec<String>,
    /// Cumulative weights of the ranks of either list, ending at 1.
    cumulative: Vec<f64>,
}

impl Vocabulary {
    fn narrow() -> Self {
        let uniform = (1..=ZH.len())
            .map(|rank| rank as f64 / ZH.len() as f64)
            .collect();
        Self {
            zh: ZH.iter().map(|word| (*word).to_owned()).collect(),
            en: EN.iter().map(|word| (*word).to_owned()).collect(),
            cumulative: uniform,
        }
    }

    /// `size` distinct made-up words from `rng`, half Chinese and half English, ranked in the
    /// order they were made.
    fn zipf(size: usize, exponent: f64, rng: &mut StdRng) -> Self {
        let per_language = (size / 2).max(1);
        let hanzi: Vec<char> = HANZI.chars().filter(|c| !c.is_whitespace()).collect();
        let possible = hanzi.len() * hanzi.len();
        let mut seen = std::collections::HashSet::new();
        let mut zh = Vec::with_capacity(per_language);
        while zh.len() < per_language.min(possible) {
            let word: String = [
                hanzi[rng.random_range(0..hanzi.len())],
                hanzi[rng.random_range(0..hanzi.len())],
            ]
            .into_iter()
            .collect();
            if seen.insert(word.clone()) {
                zh.push(word);
            }
        }
        let mut en = Vec::with_capacity(per_language);
        while en.len() < per_language {
            let syllables = rng.random_range(2..=3);
            let word: String = (0..syllables)
                .map(|_| {
                    [
                        ONSETS[rng.random_range(0..ONSETS.len())],
                        VOWELS[rng.random_range(0..VOWELS.len())],
                        CODAS[rng.random_range(0..CODAS.len())],
                    ]
                    .concat()
                })
                .collect();
            if seen.insert(word.clone()) {
                en.push(word);
            }
        }
        let ranks = zh.len().min(en.len());
        zh.truncate(ranks);
        en.truncate(ranks);
        let weights: Vec<f64> = (1..=ranks)
            .map(|rank| 1.0 / (rank as f64).powf(exponent))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut running = 0.0;
        let cumulative = weights
            .iter()
            .map(|weight| {
                running += weight / total;
                running
            })
            .collect();
        Self { zh, en, cumulative }
    }

    fn word(&self, rng: &mut StdRng) -> &str {
        let draw: f64 = rng.random();
        let rank = self
            .cumulative
            .partition_point(|&cumulative| cumulative < draw)
            .min(self.cumulative.len() - 1);
        if rng.random::<bool>() {
            &self.zh[rank]
        } else {
            &self.en[rank]
        }
    }

    fn text(&self, words: usize, rng: &mut StdRng) -> String {
        (0..words)
            .map(|_| self.word(rng))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The query shapes of this corpus, each with the queries that stand for it.
    fn shapes(&self, narrow: bool) -> Vec<(String, Vec<String>)> {
        if narrow {
            return NARROW_SHAPES
                .iter()
                .map(|(name, queries)| {
                    (
                        (*name).to_owned(),
                        queries.iter().map(|query| (*query).to_owned()).collect(),
                    )
                })
                .collect();
        }
        let at = |words: &[String], rank: usize| words[rank.min(words.len() - 1)].clone();
        let (zh, en) = (&self.zh, &self.en);
        vec![
            (
                "a Chinese word (rank 3, 41, 601)".to_owned(),
                vec![at(zh, 2), at(zh, 40), at(zh, 600)],
            ),
            (
                "an English word (rank 3, 41, 601)".to_owned(),
                vec![at(en, 2), at(en, 40), at(en, 600)],
            ),
            (
                "two words (rank 6 and 31)".to_owned(),
                vec![
                    format!("{} {}", at(en, 5), at(en, 30)),
                    format!("{} {}", at(zh, 5), at(zh, 30)),
                ],
            ),
            (
                "a phrase (rank 1 and 2)".to_owned(),
                vec![format!("\"{} {}\"", at(en, 0), at(en, 1))],
            ),
            (
                "Chinese and English (rank 11)".to_owned(),
                vec![format!("{} {}", at(zh, 10), at(en, 10))],
            ),
        ]
    }
}

async fn load_articles(
    db: &DatabaseConnection,
    count: u64,
    vocabulary: &Vocabulary,
    rng: &mut StdRng,
) -> anyhow::Result<()> {
    let now = pulse::db::now();
    users::Entity::insert(users::ActiveModel {
        handle: Set("bench-author".into()),
        password_hash: Set("x".into()),
        is_admin: Set(false),
        created_at: Set(now),
        ..Default::default()
    })
    .exec_without_returning(db)
    .await?;
    let author = users::Entity::find()
        .one(db)
        .await?
        .context("no author")?
        .id;
    let mut loaded = 0;
    while loaded < count {
        let txn = db.begin().await?;
        for _ in 0..20 {
            let rows: Vec<articles::ActiveModel> = (0..std::cmp::min(500, count - loaded))
                .map(|i| articles::ActiveModel {
                    author_id: Set(author),
                    title: Set(vocabulary.text(6, rng)),
                    body: Set(vocabulary.text(60, rng)),
                    view_count: Set(rng.random_range(0..10_000)),
                    like_count: Set(rng.random_range(0..1_000)),
                    created_at: Set(now - chrono::TimeDelta::seconds((count - loaded - i) as i64)),
                    updated_at: Set(now),
                    ..Default::default()
                })
                .collect();
            loaded += rows.len() as u64;
            if rows.is_empty() {
                break;
            }
            articles::Entity::insert_many(rows)
                .exec_without_returning(&txn)
                .await?;
        }
        txn.commit().await?;
    }
    Ok(())
}

fn dir_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .filter(|meta| meta.is_file())
        .map(|meta| meta.len())
        .sum()
}

/// One query phase's latencies in µs, from each query's scheduled start.
struct Latencies {
    all: Histogram<u64>,
    by_shape: Vec<Histogram<u64>>,
    by_sort: Vec<Histogram<u64>>,
    /// Hits per query, on average (of the 21 asked for).
    hits: u64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures are valid")
}

/// Queries at `rate` for `duration`: query n has shape n mod the shapes, and the sort after it,
/// so every shape meets every sort.
async fn query_phase(
    index: &EmbeddedIndex,
    shapes: &[(String, Vec<String>)],
    rate: f64,
    duration: Duration,
) -> Latencies {
    let interval = Duration::from_secs_f64(1.0 / rate);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let mut n = 0usize;
    while started.elapsed() < duration {
        let scheduled = started + interval * n as u32;
        tokio::time::sleep_until(scheduled.into()).await;
        let index = index.clone();
        let shape = n % shapes.len();
        let sort = (n / shapes.len()) % SORTS.len();
        let queries = &shapes[shape].1;
        let text = &queries[(n / (shapes.len() * SORTS.len())) % queries.len()];
        let query = SearchQuery::parse(text).expect("the bench's queries parse");
        tasks.push(tokio::task::spawn_blocking(move || {
            let hits = index
                .search(&Search {
                    query: &query,
                    sort: SORTS[sort].1,
                    author: None,
                    since: None,
                    until: None,
                    limit: 21,
                    after: None,
                })
                .map(|hits| hits.hits.len() as u64)
                .unwrap_or(0);
            (shape, sort, scheduled.elapsed(), hits)
        }));
        n += 1;
    }
    let mut latencies = Latencies {
        all: histogram(),
        by_shape: shapes.iter().map(|_| histogram()).collect(),
        by_sort: SORTS.iter().map(|_| histogram()).collect(),
        hits: 0,
    };
    for task in tasks {
        let (shape, sort, latency, found) = task.await.unwrap();
        let micros = latency.as_micros() as u64;
        latencies.all.record(micros).ok();
        latencies.by_shape[shape].record(micros).ok();
        latencies.by_sort[sort].record(micros).ok();
        latencies.hits += found;
    }
    latencies.hits /= std::cmp::max(latencies.all.len(), 1);
    latencies
}

fn p50_p99(histogram: &Histogram<u64>) -> String {
    format!(
        "{} / {}",
        ms(histogram.value_at_quantile(0.5)),
        ms(histogram.value_at_quantile(0.99))
    )
}

/// What the indexer did while following the view stream, until it had applied all of it.
#[derive(Default)]
struct Followed {
    documents: usize,
    /// From the stream's start until the last of it was applied.
    elapsed: Duration,
    /// Time spent in steps that applied rows: the documents over it are the indexer's ceiling.
    busy: Duration,
}

/// The indexer following the outbox as `Indexer::run` does (a step every `poll`, at once while
/// rows wait), counting the documents each step wrote and the time the steps that wrote took,
/// until a step finds nothing left once `streamed` is cancelled.
async fn follow(
    indexer: Indexer,
    poll: Duration,
    streamed: CancellationToken,
) -> anyhow::Result<Followed> {
    let mut followed = Followed::default();
    let following = Instant::now();
    loop {
        let started = Instant::now();
        let stepped = indexer.step().await?;
        if stepped.rows == 0 && streamed.is_cancelled() {
            followed.elapsed = following.elapsed();
            return Ok(followed);
        }
        if stepped.rows > 0 {
            followed.busy += started.elapsed();
            followed.documents += stepped.documents;
        }
        if !stepped.more {
            tokio::time::sleep(poll).await;
        }
    }
}

fn ms(micros: u64) -> String {
    format!("{:.2} ms", micros as f64 / 1000.0)
}

pub async fn run(args: SearchArgs) -> anyhow::Result<()> {
    let database = BenchDatabase::create(args.database_url.as_deref()).await?;
    let db = pulse::db::connect(&database.url, Duration::from_secs(30)).await?;
    pulse::db::migrate(&db).await?;
    let loading = Instant::now();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let vocabulary = if args.narrow {
        Vocabulary::narrow()
    } else {
        Vocabulary::zipf(args.vocabulary, args.zipf, &mut rng)
    };
    let shapes = vocabulary.shapes(args.narrow);
    load_articles(&db, args.articles, &vocabulary, &mut rng).await?;
    let loaded_in = loading.elapsed();

    let dir = std::env::temp_dir().join(format!("pulse-bench-search-{}", crate::random_hex(8)));
    let index = EmbeddedIndex::open(&dir)?;
    let settings = IndexerSettings {
        poll: args.poll,
        batch: 2_000,
        gap_window: Duration::from_secs(60),
        retention: Duration::from_secs(86_400),
    };
    let indexer = Indexer::new(db.clone(), Arc::new(index.clone()), settings);
    let building = Instant::now();
    indexer.step().await?;
    let built_in = building.elapsed();
    let size = dir_size(&dir);

    let idle = query_phase(&index, &shapes, args.query_rate, args.duration).await;

    // The view stream, with the indexer following it as the server's does until the stream has
    // stopped and every batch is applied.
    let stop = CancellationToken::new();
    let streamed = CancellationToken::new();
    let following = tokio::spawn(follow(indexer.clone(), args.poll, streamed.clone()));
    let commits: Arc<std::sync::Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let writer = {
        let (db, commits, stop) = (db.clone(), commits.clone(), stop.clone());
        let (articles, every, total) =
            (args.batch_articles, args.batch_every, args.articles as i64);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            let mut rows = 0u64;
            while !stop.is_cancelled() {
                ticker.tick().await;
                let ids: Vec<i64> = (0..articles)
                    .map(|_| rand::random_range(1..=total))
                    .collect();
                let txn = db.begin().await?;
                articles::Entity::update_many()
                    .col_expr(
                        articles::Column::ViewCount,
                        Expr::col(articles::Column::ViewCount).add(1),
                    )
                    .filter(articles::Column::Id.is_in(ids.iter().copied()))
                    .exec(&txn)
                    .await?;
                pulse::search::outbox::record(&txn, ids.iter().copied()).await?;
                let (last, _) = pulse::search::outbox::high_marks(&txn, pulse::db::now()).await?;
                txn.commit().await?;
                commits.lock().unwrap().push((last, Instant::now()));
                rows += ids.len() as u64;
            }
            anyhow::Ok(rows)
        })
    };
    let freshness = {
        let (index, commits, streamed) = (index.clone(), commits.clone(), streamed.clone());
        tokio::spawn(async move {
            let mut histogram = histogram();
            loop {
                let through = index.applied().await?.map_or(0, |applied| applied.through);
                let now = Instant::now();
                commits.lock().unwrap().retain(|(last, at)| {
                    let applied = *last <= through;
                    if applied {
                        histogram.record((now - *at).as_micros() as u64).ok();
                    }
                    !applied
                });
                if streamed.is_cancelled() && commits.lock().unwrap().is_empty() {
                    return anyhow::Ok(histogram);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let streaming = Instant::now();
    let loaded = query_phase(&index, &shapes, args.query_rate, args.duration).await;
    stop.cancel();
    let written = writer.await??;
    let stream_secs = streaming.elapsed().as_secs_f64();
    streamed.cancel();
    let followed = following.await??;
    let fresh = freshness.await??;
    let sql: Vec<_> = articles::Entity::find()
        .order_by_asc(articles::Column::Id)
        .all(&db)
        .await?
        .iter()
        .map(document)
        .collect();
    let equal = index.all_documents()? == sql;
    // A restart: the writer's lock goes with the last handle on the index; the reopened replica
    // reads its digests from the index and, at its first step, its counts from SQL.
    drop((indexer, index));
    let reopening = Instant::now();
    let index = EmbeddedIndex::open(&dir)?;
    let opened_in = reopening.elapsed();
    let indexer = Indexer::new(db.clone(), Arc::new(index.clone()), settings);
    let stepped = indexer.step().await?;
    let counts_in = reopening.elapsed() - opened_in;
    let equal = equal && !stepped.rebuilt && index.all_documents()? == sql;
    drop(indexer);

    let mut rows = vec![
        (
            "SQL load (not the index)".to_owned(),
            format!("{:.1} s", loaded_in.as_secs_f64()),
        ),
        (
            "replica built from SQL".to_owned(),
            format!("{:.1} s", built_in.as_secs_f64()),
        ),
        (
            "build rate".to_owned(),
            format!(
                "{} articles/s",
                thousands(args.articles as f64 / built_in.as_secs_f64())
            ),
        ),
        (
            "index size".to_owned(),
            format!("{:.1} MiB", size as f64 / crate::report::MIB),
        ),
        (
            "queries p50 / p99: idle | under stream".to_owned(),
            format!("{} | {}", p50_p99(&idle.all), p50_p99(&loaded.all)),
        ),
    ];
    for (shape, (name, queries)) in shapes.iter().enumerate() {
        rows.push((
            format!("  {name}: {}", queries.join(" | ")),
            format!(
                "{} | {}",
                p50_p99(&idle.by_shape[shape]),
                p50_p99(&loaded.by_shape[shape])
            ),
        ));
    }
    for (sort, (name, _)) in SORTS.iter().enumerate() {
        rows.push((
            format!("  sort {name}"),
            format!(
                "{} | {}",
                p50_p99(&idle.by_sort[sort]),
                p50_p99(&loaded.by_sort[sort])
            ),
        ));
    }
    rows.extend([
        (
            "queries max: idle | under stream".to_owned(),
            format!("{} | {}", ms(idle.all.max()), ms(loaded.all.max())),
        ),
        (
            "hits per query (of 21)".to_owned(),
            format!("{} | {}", idle.hits, loaded.hits),
        ),
        (
            "view stream".to_owned(),
            format!(
                "{} articles every {:?}: {} outbox rows/s",
                args.batch_articles,
                args.batch_every,
                thousands(written as f64 / stream_secs)
            ),
        ),
        (
            "indexing the stream".to_owned(),
            format!(
                "{} documents in {:.1} s: {} documents/s; {} per second of the indexer's busy \
                 time ({:.0}% busy)",
                thousands(followed.documents as f64),
                followed.elapsed.as_secs_f64(),
                thousands(followed.documents as f64 / followed.elapsed.as_secs_f64()),
                thousands(followed.documents as f64 / followed.busy.as_secs_f64().max(1e-9)),
                100.0 * followed.busy.as_secs_f64() / followed.elapsed.as_secs_f64()
            ),
        ),
        (
            "freshness p50 / p99 / max".to_owned(),
            format!(
                "{} / {} / {} (batch commit to replica commit, poll {:?})",
                ms(fresh.value_at_quantile(0.5)),
                ms(fresh.value_at_quantile(0.99)),
                ms(fresh.max()),
                args.poll
            ),
        ),
        (
            "replica reopened: open | counts loaded from SQL".to_owned(),
            format!(
                "{:.2} s | {:.2} s",
                opened_in.as_secs_f64(),
                counts_in.as_secs_f64()
            ),
        ),
        (
            "replica equals SQL after (and reopened)".to_owned(),
            equal.to_string(),
        ),
    ]);
    let rows: Vec<(&str, String)> = rows
        .iter()
        .map(|(name, value)| (name.as_str(), value.clone()))
        .collect();
    print_table(
        &format!(
            "pulse-bench search: {} articles on {}, embedded index, query rate {}/s, {}",
            thousands(args.articles as f64),
            database.backend(),
            args.query_rate,
            if args.narrow {
                "narrow corpus (40 words, uniform)".to_owned()
            } else {
                format!(
                    "{} words (Zipf {}, seed {})",
                    thousands((vocabulary.zh.len() + vocabulary.en.len()) as f64),
                    args.zipf,
                    args.seed
                )
            }
        ),
        &rows,
    );
    drop(index);
    std::fs::remove_dir_all(&dir).ok();
    db.close().await.ok();
    database.remove().await?;
    anyhow::ensure!(equal, "the replica differs from SQL");
    Ok(())
}
