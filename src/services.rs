//! The service registry: every domain service, built in one place from the backends and the
//! configuration, with the domain workers started next to the services they serve.
//!
//! A new domain adds its service in [`Services::build`] and, if it has one, starts its worker in
//! [`Services::start`]; nothing else in the wiring changes. The one-shot commands build the
//! services and start nothing ([`Services::for_command`]).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accounts::{AccountService, TokenSigner};
use crate::articles::stats::StatsWorkers;
use crate::articles::{ArticleService, ArticleStatsService};
use crate::config::Config;
use crate::documents::DocumentStore;
use crate::feed::follow_sync::FollowHook;
use crate::feed::publications::Relay;
use crate::feed::{FeedService, FeedSettings, FeedStore};
use crate::follows::FollowService;
use crate::jobs::{Handler, JobRuntime, JobSettings, JobSpec};
use crate::likes::featured::FeaturedCommentService;
use crate::likes::{CommentService, LikeArchiver, LikeService};
use crate::realtime::Hub;
use crate::redis::Redis;
use crate::search::SearchService;
use crate::search::indexer::IndexerSettings;
use crate::views::crawler::CrawlerDetector;
use crate::views::{ViewFlusher, ViewService};
use crate::votes::live::LiveWorkers;
use crate::votes::{LiveBoardService, PollAdminService, PollConfigs, VoteArchiver, VoteService};

/// Every job the binary runs, in the order [`Services::start`] starts them (it refuses to start
/// otherwise): `pulse jobs status` and `pulse jobs retry-dead` read this list, and every job
/// metric starts with a series for each.
pub const JOBS: &[JobSpec] = &[
    crate::likes::archive::SPEC,
    crate::votes::archive::SPEC,
    crate::feed::dispatch::SPEC,
    crate::feed::fanout::SPEC,
    crate::feed::follow_sync::SPEC,
];

/// A job of [`JOBS`] by name.
pub fn job(name: &str) -> Option<JobSpec> {
    JOBS.iter().copied().find(|spec| spec.name == name)
}

/// What the services are built from: the backends, and the token signer every session check needs.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub db: &'a DatabaseConnection,
    pub redis: &'a Redis,
    pub hub: &'a Hub,
    pub tokens: &'a Arc<TokenSigner>,
    pub config: &'a Config,
}

/// Where background workers run, and what tells them to stop.
#[derive(Clone, Copy)]
pub struct Workers<'a> {
    pub tasks: &'a TaskTracker,
    pub shutdown: &'a CancellationToken,
}

/// The service layer, shared by every request. Each member is a `<Thing>Service`, the one word for
/// what resolvers and commands call; the stores, caches and jobs behind them keep their own names.
#[derive(Clone)]
pub struct Services {
    pub accounts: AccountService,
    pub articles: ArticleService,
    pub views: ViewService,
    pub likes: LikeService,
    pub comments: CommentService,
    pub featured: FeaturedCommentService,
    pub stats: ArticleStatsService,
    pub votes: VoteService,
    pub polls: PollAdminService,
    pub live_boards: LiveBoardService,
    pub follows: FollowService,
    pub feed: FeedService,
    pub documents: DocumentStore,
    pub search: SearchService,
}

impl Services {
    /// Builds every service and starts nothing: the live watchers only hold `workers` to spawn
    /// into once someone subscribes.
    pub fn build(inputs: Inputs<'_>, workers: Workers<'_>) -> anyhow::Result<Self> {
        let Inputs {
            db,
            redis,
            hub,
            tokens,
            config,
        } = inputs;
        let accounts = AccountService::new(
            db.clone(),
            redis.clone(),
            tokens.clone(),
            config.auth_attempts_per_minute,
        );
        let comments = CommentService::new(db.clone(), redis.clone(), accounts.clone());
        let feed_store =
            FeedStore::new(db.clone(), redis.clone(), FeedSettings::from_config(config));
        let articles = ArticleService::new(
            db.clone(),
            redis.clone(),
            hub.clone(),
            Relay::new(feed_store.clone()),
        );
        let follows =
            FollowService::new(db.clone()).with_listener(Arc::new(FollowHook(feed_store.clone())));
        let feed = FeedService::new(feed_store.clone(), tokens.clone(), hub.clone());
        let views = ViewService::new(
            db.clone(),
            redis.clone(),
            Arc::new(crawler_detector(config.crawler_patterns_file.as_deref())?),
            config.view_window,
            config.timezone,
        );
        let likes = LikeService::new(
            db.clone(),
            redis.clone(),
            config.like_relation_ttl,
            config.timezone,
        );
        let stats = ArticleStatsService::new(
            articles.clone(),
            views.clone(),
            likes.clone(),
            redis.keys.clone(),
            StatsWorkers {
                hub,
                tasks: workers.tasks,
                shutdown: workers.shutdown,
                tick: config.stats_tick,
            },
        );
        let poll_configs = PollConfigs::new(db.clone(), redis.clone());
        let votes = VoteService::new(
            redis.clone(),
            poll_configs.clone(),
            config.vote_bucket_retention,
        );
        let polls =
            PollAdminService::new(db.clone(), redis.clone(), accounts.clone(), poll_configs);
        let live_boards = LiveBoardService::new(
            votes.clone(),
            LiveWorkers {
                hub,
                tasks: workers.tasks,
                shutdown: workers.shutdown,
                tick: config.leaderboard_tick,
            },
        );
        Ok(Self {
            votes,
            polls,
            live_boards,
            accounts,
            articles,
            views,
            likes,
            stats,
            featured: FeaturedCommentService::new(
                redis.clone(),
                comments.clone(),
                config.featured_refresh,
            ),
            comments,
            follows,
            feed,
            documents: DocumentStore::new(
                db.clone(),
                redis.clone(),
                config.persisted_queries,
                config.apq_ttl,
            ),
            search: SearchService::new(
                db.clone(),
                config.search_dir(),
                IndexerSettings {
                    poll: config.search_poll,
                    batch: config.search_batch,
                    gap_window: config.search_gap_window,
                    retention: config.search_outbox_retention,
                },
            ),
        })
    }

    /// The services of a one-shot command: built, not started. No realtime connection opens, and
    /// the signer is a throwaway, since a command signs no session.
    pub fn for_command(
        db: &DatabaseConnection,
        redis: &Redis,
        config: &Config,
    ) -> anyhow::Result<Self> {
        let tokens = Arc::new(TokenSigner::throwaway(config.token_ttl)?);
        let inputs = Inputs {
            db,
            redis,
            hub: &Hub::unconnected(),
            tokens: &tokens,
            config,
        };
        let workers = Workers {
            tasks: &TaskTracker::new(),
            shutdown: &CancellationToken::new(),
        };
        Self::build(inputs, workers)
    }

    /// Builds every service, applies the configured admin grants and starts the domain workers.
    pub async fn start(inputs: Inputs<'_>, workers: Workers<'_>) -> anyhow::Result<Self> {
        let (db, redis, hub, config) = (inputs.db, inputs.redis, inputs.hub, inputs.config);
        let services = Self::build(inputs, workers)?;
        services
            .votes
            .configs()
            .start_invalidation(hub, workers.tasks, workers.shutdown);
        services
            .accounts
            .grant_configured_admins(&config.admins)
            .await;
        services.search.start(workers.tasks, workers.shutdown);
        let shutdown = workers.shutdown.clone();
        workers.tasks.spawn(
            ViewFlusher::new(db.clone(), redis.clone(), config.view_flush_lease)
                .run(config.view_flush_interval, shutdown),
        );
        if config.run_jobs {
            let redis = &redis
                .own_connection()
                .await
                .context("cannot open the background jobs' Redis connection")?;
            let feed_store = services.feed.store().with_redis(redis.clone());
            let jobs: Vec<Arc<dyn Handler>> = vec![
                Arc::new(LikeArchiver::new(
                    db.clone(),
                    redis.clone(),
                    services.featured.clone(),
                    config.like_relation_ttl,
                    config.timezone,
                )),
                Arc::new(VoteArchiver::new(db.clone())),
                Arc::new(crate::feed::dispatch::Dispatcher(feed_store.clone())),
                Arc::new(crate::feed::fanout::Fanout(feed_store.clone())),
                Arc::new(crate::feed::follow_sync::FollowSync(feed_store)),
            ];
            anyhow::ensure!(
                jobs.iter()
                    .map(|job| job.job_spec())
                    .eq(JOBS.iter().copied()),
                "the jobs started are not the jobs of services::JOBS"
            );
            let relay = Relay::new(services.feed.store().clone());
            workers
                .tasks
                .spawn(relay.run(config.feed_relay_interval, workers.shutdown.clone()));
            JobRuntime::new(redis.clone(), job_settings(config)).start(
                jobs,
                workers.tasks,
                workers.shutdown,
            );
        }
        Ok(services)
    }
}

/// The job runtime's settings from the configuration; the rest keep their defaults.
pub fn job_settings(config: &Config) -> JobSettings {
    JobSettings {
        batch: config.job_batch as usize,
        lease: config.job_lease,
        poll: config.job_poll,
        shards_at_once: config.job_concurrency as usize,
        ..JobSettings::default()
    }
}

/// The shipped crawler list plus the patterns of `PULSE_CRAWLER_PATTERNS_FILE`, if set.
fn crawler_detector(patterns_file: Option<&Path>) -> anyhow::Result<CrawlerDetector> {
    let extra = match patterns_file {
        None => Vec::new(),
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the crawler patterns file {}", path.display()))?
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(str::to_owned)
            .collect(),
    };
    CrawlerDetector::new(&extra)
}
