//! The registration point: every domain service, built in one place from the backends and the
//! configuration; the jobs the binary runs; the schema's root parts and the types a global id can
//! name. A new domain adds its service in [`Services::build`] (its worker, if it has one, in
//! [`Services::start`]), its jobs to [`JOBS`], its root parts to [`Query`], [`Mutation`] and
//! [`Subscription`], and its node types to the `node_types!` list; nothing else in the wiring
//! changes. The one-shot commands build the services and start nothing ([`Services::for_command`]).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use async_graphql::{MergedObject, MergedSubscription};
use pulse_edge::websocket::{LiveField, LiveKind};
use pulse_kit::Registry;
use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accounts::graphql::{AccountsMutation, AccountsQuery, User, load_user};
use crate::accounts::{AccountService, TokenSigner};
use crate::articles::graphql::{
    Article, ArticlesMutation, ArticlesQuery, ArticlesSubscription, load_article,
};
use crate::articles::stats::StatsWorkers;
use crate::articles::{ArticleService, ArticleStatsService};
use crate::config::Config;
use crate::documents::DocumentStore;
use crate::feed::follow_sync::FollowHook;
use crate::feed::graphql::{FeedQuery, FeedSubscription};
use crate::feed::publications::Relay;
use crate::feed::{FeedService, FeedSettings, FeedStore};
use crate::follows::FollowService;
use crate::follows::graphql::FollowsMutation;
use crate::graphql::node::node_types;
use crate::jobs::{Handler, JobRuntime, JobSettings, JobSpec};
use crate::likes::featured::FeaturedCommentService;
use crate::likes::graphql::{Comment, LikesMutation, load_comment};
use crate::likes::{CommentService, LikeArchiver, LikeService};
use crate::realtime::Hub;
use crate::redis::Redis;
use crate::search::SearchService;
use crate::search::graphql::SearchQueryRoot;
use crate::search::indexer::IndexerSettings;
use crate::views::crawler::CrawlerDetector;
use crate::views::graphql::{ViewsMutation, ViewsQuery};
use crate::views::{ViewFlusher, ViewService};
use crate::votes::graphql::{
    Poll, PollOption, VotesMutation, VotesQuery, VotesSubscription, load_poll, load_poll_option,
};
use crate::votes::live::LiveWorkers;
use crate::votes::{LiveBoardService, PollAdminService, PollConfigs, VoteArchiver, VoteService};

// The schema's roots: each domain's parts, merged (a doc comment here would show in the schema).
#[derive(MergedObject, Default)]
pub struct Query(
    NodeQuery,
    AccountsQuery,
    ArticlesQuery,
    ViewsQuery,
    VotesQuery,
    FeedQuery,
    SearchQueryRoot,
);

#[derive(MergedObject, Default)]
pub struct Mutation(
    AccountsMutation,
    ArticlesMutation,
    ViewsMutation,
    LikesMutation,
    VotesMutation,
    FollowsMutation,
);

#[derive(MergedSubscription, Default)]
pub struct Subscription(ArticlesSubscription, VotesSubscription, FeedSubscription);

/// Longest a starting process waits for its first view flush before it serves.
const STARTUP_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What each field of [`Subscription`] sends, for the websocket driver: a client that falls
/// behind loses the older of two unsent snapshots, never an event.
pub const LIVE_FIELDS: &[LiveField] = &[
    LiveField {
        name: "articlePublished",
        kind: LiveKind::Event,
    },
    LiveField {
        name: "articleStatsChanged",
        kind: LiveKind::Snapshot,
    },
    LiveField {
        name: "leaderboardChanged",
        kind: LiveKind::Snapshot,
    },
    LiveField {
        name: "feedItemAdded",
        kind: LiveKind::Event,
    },
];

/// The event fields a websocket's driver runs itself between events (see
/// [`pulse_edge::detached`]), whose resolvers hand over their source: one per follower, each idle
/// for long stretches, where async-graphql's stream would hold 9 KiB apiece.
pub const DETACHED: &[&str] = &["feedItemAdded"];

/// The event streams an SSE client resumes with `Last-Event-ID`: each event's `id` is what the
/// field's `after` takes (a feed item's cursor, an article's id).
pub const RESUMABLE: &[pulse_edge::stream::Resumable] = &[
    pulse_edge::stream::Resumable {
        field: "feedItemAdded",
        cursor: "cursor",
        argument: "after",
    },
    pulse_edge::stream::Resumable {
        field: "articlePublished",
        cursor: "id",
        argument: "after",
    },
];

node_types! {
    User(crate::accounts::USER) => load_user,
    Article(crate::articles::ARTICLE) => load_article,
    Comment(crate::likes::COMMENT) => load_comment,
    Poll(crate::votes::POLL) => load_poll,
    PollOption(crate::votes::POLL_OPTION) => load_poll_option,
}

/// Every domain's Lua scripts, which `Redis::connect` loads at start-up.
pub fn scripts() -> Vec<&'static redis::Script> {
    let mut scripts = crate::scripts::SCRIPTS.all().to_vec();
    scripts.extend(crate::votes::scripts::all());
    scripts
}

/// A job the binary runs: its identity (what `pulse jobs` and the job metrics know of it) and how
/// its handler is made when the process runs jobs.
#[derive(Clone, Copy)]
pub struct Job {
    pub spec: JobSpec,
    handler: fn(&JobInputs<'_>) -> Arc<dyn Handler>,
}

/// What job handlers are made from: the jobs' own Redis connection (see [`Services::start`]) and
/// the running services.
struct JobInputs<'a> {
    db: &'a DatabaseConnection,
    redis: &'a Redis,
    services: &'a Services,
    config: &'a Config,
}

impl JobInputs<'_> {
    fn feed_store(&self) -> FeedStore {
        self.services.feed.store().with_redis(self.redis.clone())
    }
}

/// Every job the binary runs, in the order the runtime starts them: `pulse jobs status` and
/// `pulse jobs retry-dead` read this list, every job metric starts with a series for each, and the
/// runtime runs exactly these handlers.
pub const JOBS: &[Job] = &[
    Job {
        spec: crate::likes::archive::SPEC,
        handler: |jobs| {
            Arc::new(LikeArchiver::new(
                jobs.db.clone(),
                jobs.redis.clone(),
                jobs.services.featured.clone(),
                jobs.config.like_relation_ttl,
                jobs.config.timezone,
            ))
        },
    },
    Job {
        spec: crate::votes::archive::SPEC,
        handler: |jobs| Arc::new(VoteArchiver::new(jobs.db.clone())),
    },
    Job {
        spec: crate::feed::dispatch::SPEC,
        handler: |jobs| Arc::new(crate::feed::dispatch::Dispatcher(jobs.feed_store())),
    },
    Job {
        spec: crate::feed::fanout::SPEC,
        handler: |jobs| Arc::new(crate::feed::fanout::Fanout(jobs.feed_store())),
    },
    Job {
        spec: crate::feed::follow_sync::SPEC,
        handler: |jobs| Arc::new(crate::feed::follow_sync::FollowSync(jobs.feed_store())),
    },
];

/// A job of [`JOBS`] by name.
pub fn job(name: &str) -> Option<JobSpec> {
    JOBS.iter()
        .map(|job| job.spec)
        .find(|spec| spec.name == name)
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
    /// Every service, for resolvers and loaders to reach by type ([`pulse_kit::service`]).
    pub fn registry(&self) -> Registry {
        Registry::default()
            .with(self.accounts.clone())
            .with(self.articles.clone())
            .with(self.views.clone())
            .with(self.likes.clone())
            .with(self.comments.clone())
            .with(self.featured.clone())
            .with(self.stats.clone())
            .with(self.votes.clone())
            .with(self.polls.clone())
            .with(self.live_boards.clone())
            .with(self.follows.clone())
            .with(self.feed.clone())
            .with(self.documents.clone())
            .with(self.search.clone())
    }

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
            config.replay_limit,
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
        let polls = PollAdminService::new(
            db.clone(),
            redis.clone(),
            Arc::new(accounts.clone()),
            poll_configs,
        );
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
        let flusher = ViewFlusher::new(db.clone(), redis.clone(), config.view_flush_lease);
        // The first flush runs before the process serves: it is the one that repairs a Redis that
        // came back older than SQL, and counts read before it could show views twice. A long
        // backlog (or an unreachable Redis) is left to the periodic flush rather than hold the
        // start; a flush cut short is re-driven like one whose process died.
        match tokio::time::timeout(STARTUP_FLUSH_WAIT, flusher.flush_all()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "start-up view flush failed; the periodic flush retries")
            }
            Err(_) => tracing::warn!(
                seconds = STARTUP_FLUSH_WAIT.as_secs(),
                "start-up view flush still running; the periodic flush takes it over"
            ),
        }
        let shutdown = workers.shutdown.clone();
        workers
            .tasks
            .spawn(flusher.run(config.view_flush_interval, shutdown));
        if config.run_jobs {
            let redis = &redis
                .own_connection()
                .await
                .context("cannot open the background jobs' Redis connection")?;
            let inputs = JobInputs {
                db,
                redis,
                services: &services,
                config,
            };
            let jobs = JOBS.iter().map(|job| (job.handler)(&inputs)).collect();
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

#[cfg(test)]
mod tests {
    /// A domain's `NodeType` carries the name its ids are written with, which must be its GraphQL
    /// type's, or `node(id:)` and the type's own `id` field would disagree.
    #[test]
    fn every_node_type_is_named_as_the_graphql_type_it_resolves_to() {
        let types = super::node_types();
        assert_eq!(types.len(), 5);
        for (node_type, graphql_name) in types {
            assert_eq!(node_type.name(), graphql_name);
        }
    }
}
