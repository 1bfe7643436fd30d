//! Wiring: configuration in, a running server out; and an orderly shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine as _;
use pulse_kit::Registry;
use sea_orm::DatabaseConnection;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accounts::TokenSigner;
use crate::config::{Config, Secret};
use crate::graphql::PulseSchema;
use crate::graphql::schema::{self, QueryLimits};
use crate::graphql::validated::ValidationTally;
use crate::http::TrustedProxies;
use crate::http::groups::Groups;
use crate::http::server::Connections;
use crate::ownership::{self, DatabaseIdentity};
use crate::realtime::Hub;
use crate::redis::Redis;
use crate::redis::embedded::{self, RedisLocation};
use crate::services::{Inputs, Services, Workers};

/// The one application state: what the HTTP handlers and the GraphQL schema share, and what tests
/// and commands may reach into once the app is built.
#[derive(Clone)]
pub struct AppState {
    pub db: DatabaseConnection,
    pub redis: Redis,
    pub services: Arc<Services>,
    /// The same services by type, as resolvers and loaders reach them.
    pub registry: Arc<Registry>,
    pub schema: PulseSchema,
    /// Requests that reused their document's validation (see [`crate::graphql::validated`]).
    pub validations: Arc<ValidationTally>,
    pub tokens: Arc<TokenSigner>,
    pub hub: Hub,
    pub connections: Connections,
    pub proxies: TrustedProxies,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive once the headers are in.
    pub body_timeout: Duration,
    /// How each websocket is bounded: init timeout, pings, operations, private fields.
    pub websocket: crate::http::websocket::Settings,
    pub sockets_per_ip: crate::http::sockets_per_ip::SocketsPerIp,
    /// Cancelled when the server stops, so that websockets close with "going away".
    pub shutdown: CancellationToken,
}

pub struct App {
    listener: TcpListener,
    router: axum::Router,
    state: AppState,
    redis_location: RedisLocation,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    shutdown_grace: Duration,
    header_timeout: Duration,
}

/// SQL and Redis, connected and ready, shared by the server and the one-shot commands.
pub struct Backends {
    pub db: DatabaseConnection,
    pub redis: Redis,
    pub redis_location: RedisLocation,
}

impl Backends {
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("cannot create the data dir {}", config.data_dir.display()))?;
        let database_url = config.database_url();
        let db = crate::db::connect(&database_url, config.sqlite_busy_timeout).await?;
        crate::db::migrate(&db).await?;
        let identity = DatabaseIdentity::load_or_create(&db, &database_url).await?;
        let redis_location = embedded::locate(
            config.redis_url.as_deref(),
            config.redis_probe,
            &config.redis_server,
            &config.data_dir,
        )
        .await?;
        let prefix = match &config.redis_prefix {
            Some(prefix) => prefix.clone(),
            None => identity.default_prefix(&redis_location),
        };
        let connected = async {
            let redis =
                Redis::connect(redis_location.url(), &prefix, &crate::services::scripts()).await?;
            ownership::claim(&db, &redis, &identity, redis_location.url()).await?;
            anyhow::Ok(redis)
        }
        .await;
        let redis = match connected {
            Ok(redis) => redis,
            Err(err) => {
                Self::leave(redis_location).await;
                return Err(err);
            }
        };
        redis.warn_if_evicting().await;
        Ok(Self {
            db,
            redis,
            redis_location,
        })
    }

    async fn leave(redis_location: RedisLocation) {
        if let RedisLocation::Private(private) = redis_location {
            private.stop().await;
        }
    }

    /// Leaves the private redis-server, if one is in use, stopping it when this process is its last user.
    pub async fn close(self) {
        Self::leave(self.redis_location).await;
    }
}

impl App {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let tokens = Arc::new(TokenSigner::new(&token_secret(&config)?, config.token_ttl)?);
        let Backends {
            db,
            redis,
            redis_location,
        } = Backends::connect(&config).await?;
        let (shutdown, tasks) = (CancellationToken::new(), TaskTracker::new());
        let hub = Hub::start(redis.target.pubsub(), shutdown.clone(), &tasks);
        let inputs = Inputs {
            db: &db,
            redis: &redis,
            hub: &hub,
            tokens: &tokens,
            config: &config,
        };
        let workers = Workers {
            tasks: &tasks,
            shutdown: &shutdown,
        };
        let services = Arc::new(Services::start(inputs, workers).await?);
        let limits = QueryLimits {
            max_depth: config.max_query_depth,
            max_complexity: config.max_query_complexity,
            introspection: config.introspection,
        };
        let validations = Arc::new(ValidationTally::default());
        let registry = Arc::new(services.registry());
        let schema = schema::build(limits, registry.clone(), validations.clone());
        let groups = Groups::new(schema.clone(), schema::anonymous_request_data);
        let state = AppState {
            db,
            redis,
            schema,
            validations,
            services,
            registry,
            tokens,
            hub,
            connections: Connections::new(config.max_connections),
            proxies: TrustedProxies::new(config.trusted_proxies.clone()),
            metrics: crate::telemetry::metrics_handle(),
            max_body_bytes: config.max_body_bytes,
            body_timeout: config.http_body_timeout,
            websocket: crate::http::websocket::Settings {
                init_timeout: config.ws_init_timeout,
                ping_interval: config.ws_ping_interval,
                pong_timeout: config.ws_pong_timeout,
                max_subscriptions: config.ws_max_subscriptions as usize,
                viewer_fields: schema::reads_viewer,
                live_fields: crate::services::LIVE_FIELDS,
                send_budget: config.ws_send_budget,
                resumable: crate::services::RESUMABLE,
                groups: Some(groups),
                detached: crate::services::DETACHED,
            },
            sockets_per_ip: crate::http::sockets_per_ip::SocketsPerIp::new(
                config.max_sockets_per_ip,
            ),
            shutdown: shutdown.clone(),
        };
        let router = crate::http::router(state.clone(), crate::http::cors(&config.cors_origins)?);
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        Ok(Self {
            listener,
            router,
            state,
            redis_location,
            shutdown,
            tasks,
            shutdown_grace: config.shutdown_grace,
            header_timeout: config.http_header_timeout,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until SIGTERM or Ctrl-C.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `stop` completes, then shuts down in order: stop accepting, let in-flight
    /// requests finish and close websockets with "going away" (up to the grace period), let
    /// background tasks finish their current batch, and stop a private Redis last, since those
    /// tasks may still be writing to it.
    pub async fn run_until(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        tracing::info!(address = %self.local_addr(), "pulse is serving");
        let connections = self.state.connections.clone();
        crate::http::server::serve(
            self.listener,
            self.router,
            connections.clone(),
            self.header_timeout,
            self.shutdown.clone(),
            stop,
        )
        .await;
        tracing::info!("shutting down: draining in-flight requests");
        self.shutdown.cancel();
        if tokio::time::timeout(self.shutdown_grace, connections.closed())
            .await
            .is_err()
        {
            tracing::warn!("in-flight requests did not finish within the grace period");
        }
        self.tasks.close();
        self.tasks.wait().await;
        if let RedisLocation::Private(private) = self.redis_location {
            private.stop().await;
        }
        tracing::info!("pulse stopped");
        Ok(())
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// The token secret: configured, or in dev mode one generated once and kept in the data dir so that
/// tokens survive restarts.
fn token_secret(config: &Config) -> anyhow::Result<Secret> {
    if let Some(secret) = &config.token_secret {
        return Ok(secret.clone());
    }
    if !config.dev {
        bail!(
            "PULSE_TOKEN_SECRET is not set. Set it to a random string of at least {} bytes \
             (e.g. `openssl rand -base64 48`), or pass --dev (PULSE_DEV=true) to generate one for development.",
            crate::accounts::tokens::MIN_SECRET_BYTES
        );
    }
    std::fs::create_dir_all(&config.data_dir)?;
    let path = config.data_dir.join("dev-token-secret");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        return Ok(Secret::new(existing.trim().to_owned()));
    }
    let secret = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 48]>());
    write_private(&path, &secret)?;
    tracing::warn!(
        path = %path.display(),
        "dev mode: generated a token secret; set PULSE_TOKEN_SECRET in production"
    );
    Ok(Secret::new(secret))
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}
