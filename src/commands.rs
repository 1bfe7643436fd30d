//! One-shot commands: `migrate`, `seed-demo`, `rebuild`, `admin`, `jobs`.

use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use crate::accounts::service::{Handle, find_by_handle, insert_user, set_admin};
use crate::app::Backends;
use crate::articles::service::insert_article;
use crate::config::{AdminAction, Command, Config, FeedAction, JobsAction, RebuildTarget};
use crate::entities::articles;

pub async fn run(config: Config, command: Command) -> anyhow::Result<()> {
    let backends = Backends::connect(&config).await?;
    let outcome = match command {
        Command::Migrate => {
            println!(
                "migrations applied to {}",
                crate::config::redacted_url(&config.database_url())
            );
            Ok(())
        }
        Command::SeedDemo => seed_demo(&backends).await,
        Command::Admin { action } => admin(&backends, action).await,
        Command::Jobs { action } => jobs(&backends, action).await,
        Command::Rebuild {
            target: RebuildTarget::Views,
        } => rebuild_views(&backends).await,
        Command::Rebuild {
            target: RebuildTarget::Likes,
        } => rebuild_likes(&backends).await,
        Command::Rebuild {
            target: RebuildTarget::Feed,
        } => rebuild_feed(&backends, &config).await,
        Command::Feed {
            action: FeedAction::Vacuum,
        } => vacuum_feed(&backends, &config).await,
        Command::Serve | Command::PrintSchema => unreachable!("handled by main"),
    };
    backends.close().await;
    outcome
}

/// Demo accounts all share this password; they exist to click around in GraphiQL and the demo page.
pub const DEMO_PASSWORD: &str = "pulse-demo-password";
const DEMO_HANDLES: [&str; 3] = ["alice", "bob", "carol"];

async fn seed_demo(backends: &Backends) -> anyhow::Result<()> {
    let db = &backends.db;
    for (index, handle) in DEMO_HANDLES.iter().enumerate() {
        let handle = Handle::parse(handle)?;
        let user = match find_by_handle(db, &handle).await? {
            Some(user) => user,
            None => insert_user(db, &handle, DEMO_PASSWORD, index == 0).await?,
        };
        let has_articles = articles::Entity::find()
            .filter(articles::Column::AuthorId.eq(user.id))
            .one(db)
            .await?
            .is_some();
        if has_articles {
            continue;
        }
        let handle = handle.as_str();
        for number in 1..=3 {
            let title = format!("{handle}'s note #{number}");
            let body = format!("Demo article {number} by {handle}. Open it, like it, share it.");
            insert_article(db, user.id, &title, &body).await?;
        }
    }
    println!(
        "demo users {} (password `{DEMO_PASSWORD}`; alice is an admin) with three articles each",
        DEMO_HANDLES.join(", ")
    );
    Ok(())
}

async fn rebuild_views(backends: &Backends) -> anyhow::Result<()> {
    let articles = crate::views::rebuild::rebuild_all(&backends.db, &backends.redis).await?;
    println!("rebuilt view counts and the all-time view ranking of {articles} articles");
    Ok(())
}

async fn rebuild_likes(backends: &Backends) -> anyhow::Result<()> {
    let rebuilt = crate::likes::rebuild::rebuild_all(&backends.db, &backends.redis).await?;
    println!(
        "rebuilt the like counts of {} articles and comments and the all-time like ranking; dropped {} cached relations",
        rebuilt.subjects, rebuilt.relations_dropped
    );
    Ok(())
}

fn feed_store(backends: &Backends, config: &Config) -> crate::feed::FeedStore {
    crate::feed::FeedStore::new(
        backends.db.clone(),
        backends.redis.clone(),
        crate::feed::FeedSettings::from_config(config),
    )
}

async fn rebuild_feed(backends: &Backends, config: &Config) -> anyhow::Result<()> {
    let outboxes = crate::feed::upkeep::rebuild_outboxes(&feed_store(backends, config)).await?;
    println!("reloaded {outboxes} feed outboxes from SQL; inboxes rebuild on their next read");
    Ok(())
}

async fn vacuum_feed(backends: &Backends, config: &Config) -> anyhow::Result<()> {
    let removed = crate::feed::upkeep::vacuum(&feed_store(backends, config)).await?;
    println!(
        "removed {} feed keys of deleted users and {} left by crashed rebuilds or expired inboxes",
        removed.of_deleted_users, removed.leftovers
    );
    Ok(())
}

async fn admin(backends: &Backends, action: AdminAction) -> anyhow::Result<()> {
    let (handle, is_admin) = match &action {
        AdminAction::Grant { handle } => (handle, true),
        AdminAction::Revoke { handle } => (handle, false),
    };
    let user = set_admin(&backends.db, handle, is_admin).await?;
    println!(
        "{} is {} an admin",
        user.handle,
        if is_admin { "now" } else { "no longer" }
    );
    Ok(())
}

async fn jobs(backends: &Backends, action: JobsAction) -> anyhow::Result<()> {
    let redis = &backends.redis;
    match action {
        JobsAction::Status => {
            if crate::jobs::REGISTRY.is_empty() {
                println!("no jobs registered");
            }
            for spec in crate::jobs::REGISTRY {
                for stream in crate::jobs::status(redis, *spec).await? {
                    println!(
                        "{} {}: length {}, pending {}, lag {}, dead letters {}",
                        spec.name,
                        stream.stream,
                        stream.length,
                        stream.pending,
                        stream.lag,
                        stream.dead
                    );
                }
            }
        }
        JobsAction::RetryDead { job } => {
            let Some(spec) = crate::jobs::registered(&job) else {
                let known: Vec<&str> = crate::jobs::REGISTRY.iter().map(|spec| spec.name).collect();
                anyhow::bail!("no job named {job:?}; registered jobs: {known:?}");
            };
            let moved = crate::jobs::retry_dead(redis, spec).await?;
            println!("put {moved} dead letters of {job} back onto its streams");
        }
    }
    Ok(())
}
