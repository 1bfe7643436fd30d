//! One-shot commands: `migrate`, `seed-demo`, `rebuild`, `admin`, `jobs`, `documents`.

use crate::app::Backends;
use crate::config::{
    AdminAction, Command, Config, DocumentsAction, FeedAction, JobsAction, RebuildTarget,
};
use crate::services::Services;

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
        Command::SeedDemo => crate::seed_demo::run(&backends, &config).await,
        command => {
            let services = Services::for_command(&backends.db, &backends.redis, &config);
            match services {
                Ok(services) => through_services(&backends, &services, command).await,
                Err(err) => Err(err),
            }
        }
    };
    backends.close().await;
    outcome
}

/// The commands that act through the services, built and not started.
async fn through_services(
    backends: &Backends,
    services: &Services,
    command: Command,
) -> anyhow::Result<()> {
    match command {
        Command::Admin { action } => admin(services, action).await,
        Command::Jobs { action } => jobs(backends, action).await,
        Command::Documents { action } => documents(services, action).await,
        Command::Rebuild {
            target: RebuildTarget::Views,
        } => rebuild_views(services).await,
        Command::Rebuild {
            target: RebuildTarget::Likes,
        } => rebuild_likes(services).await,
        Command::Rebuild {
            target: RebuildTarget::Votes,
        } => rebuild_votes(services).await,
        Command::Rebuild {
            target: RebuildTarget::Feed,
        } => rebuild_feed(services).await,
        Command::Rebuild {
            target: RebuildTarget::Search,
        } => rebuild_search(services).await,
        Command::Feed {
            action: FeedAction::Vacuum,
        } => vacuum_feed(services).await,
        Command::Migrate | Command::SeedDemo | Command::Serve | Command::PrintSchema => {
            unreachable!("handled by main and run")
        }
    }
}

async fn rebuild_views(services: &Services) -> anyhow::Result<()> {
    let articles = services.views.rebuild_all().await?;
    println!("rebuilt view counts and the all-time view ranking of {articles} articles");
    Ok(())
}

async fn rebuild_likes(services: &Services) -> anyhow::Result<()> {
    let rebuilt = services.likes.rebuild_all().await?;
    println!(
        "rebuilt the like counts of {} articles and comments and the all-time like ranking; dropped {} cached relations",
        rebuilt.subjects, rebuilt.relations_dropped
    );
    Ok(())
}

async fn rebuild_votes(services: &Services) -> anyhow::Result<()> {
    let rebuilt = services.votes.rebuild_all().await?;
    println!(
        "rebuilt the boards and participant counts of {} polls from {} logged votes",
        rebuilt.polls, rebuilt.votes
    );
    Ok(())
}

async fn rebuild_feed(services: &Services) -> anyhow::Result<()> {
    let rebuilt = services.feed.rebuild_all().await?;
    println!(
        "reloaded {} feed outboxes from SQL and the audiences of {} readers; inboxes rebuild on \
         their next read",
        rebuilt.outboxes, rebuilt.readers
    );
    Ok(())
}

async fn rebuild_search(services: &Services) -> anyhow::Result<()> {
    let epoch = services.search.request_rebuild().await?;
    println!(
        "search epoch is now {epoch}: every process's search replica rebuilds from SQL at its next \
         poll (a stopped one when it starts); pulse_search_rebuilds_total counts them"
    );
    Ok(())
}

async fn vacuum_feed(services: &Services) -> anyhow::Result<()> {
    let removed = services.feed.vacuum().await?;
    println!(
        "removed {} feed keys of deleted users and {} left by crashed rebuilds or expired inboxes",
        removed.of_deleted_users, removed.leftovers
    );
    Ok(())
}

async fn admin(services: &Services, action: AdminAction) -> anyhow::Result<()> {
    let (handle, is_admin) = match &action {
        AdminAction::Grant { handle } => (handle, true),
        AdminAction::Revoke { handle } => (handle, false),
    };
    let user = services.accounts.set_admin(handle, is_admin).await?;
    println!(
        "{} is {} an admin",
        user.handle,
        if is_admin { "now" } else { "no longer" }
    );
    Ok(())
}

/// The documents of one file: the file itself, or the operations of a manifest.
fn documents_of(
    path: &std::path::Path,
    manifest: bool,
) -> anyhow::Result<Vec<(Option<String>, String)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
    if !manifest {
        let name = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned());
        return Ok(vec![(name, text)]);
    }
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|err| anyhow::anyhow!("{} is not JSON: {err}", path.display()))?;
    // Apollo: {"format": "apollo-persisted-query-manifest", "operations": [{"name", "body"}]};
    // Relay and GraphQL Codegen: {"<hash>": "<document>"}.
    if let Some(operations) = json.get("operations").and_then(|ops| ops.as_array()) {
        return operations
            .iter()
            .map(|operation| {
                let body = operation.get("body").and_then(|body| body.as_str());
                let body = body.ok_or_else(|| anyhow::anyhow!("an operation has no `body`"))?;
                let name = operation.get("name").and_then(|name| name.as_str());
                Ok((name.map(str::to_owned), body.to_owned()))
            })
            .collect();
    }
    let map = json
        .as_object()
        .ok_or_else(|| anyhow::anyhow!("{}: not a manifest", path.display()))?;
    map.values()
        .map(|body| {
            let body = body
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("a manifest value is not a string"))?;
            Ok((None, body.to_owned()))
        })
        .collect()
}

async fn documents(services: &Services, action: DocumentsAction) -> anyhow::Result<()> {
    let store = &services.documents;
    match action {
        DocumentsAction::Add { files, manifest } => {
            anyhow::ensure!(!files.is_empty(), "name at least one file");
            let mut found = Vec::new();
            for path in &files {
                found.extend(documents_of(path, manifest)?);
            }
            // Every document is checked before any is registered: a typo is found now, whole.
            for (name, document) in &found {
                if let Err(err) = async_graphql::parser::parse_query(document) {
                    anyhow::bail!(
                        "{} does not parse: {err}",
                        name.as_deref().unwrap_or("a document")
                    );
                }
            }
            for (name, document) in &found {
                let (sha256, added) = store.add_trusted(name.as_deref(), document).await?;
                let state = if added { "added" } else { "already registered" };
                println!("{sha256} {} {state}", name.as_deref().unwrap_or("-"));
            }
        }
        DocumentsAction::List => {
            for document in store.list_trusted().await? {
                println!(
                    "{} {} {}",
                    document.sha256,
                    document.name.as_deref().unwrap_or("-"),
                    document.created_at.and_utc().to_rfc3339()
                );
            }
        }
        DocumentsAction::Remove { sha256 } => {
            let sha256 = sha256.to_ascii_lowercase();
            anyhow::ensure!(
                store.remove_trusted(&sha256).await?,
                "no registered document has the SHA-256 {sha256}"
            );
            println!("{sha256} removed");
        }
    }
    Ok(())
}

async fn jobs(backends: &Backends, action: JobsAction) -> anyhow::Result<()> {
    let redis = &backends.redis;
    match action {
        JobsAction::Status => {
            if crate::services::JOBS.is_empty() {
                println!("no jobs registered");
            }
            for spec in crate::services::JOBS.iter().map(|job| job.spec) {
                for stream in crate::jobs::status(redis, spec).await? {
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
            let Some(spec) = crate::services::job(&job) else {
                let known: Vec<&str> = crate::services::JOBS
                    .iter()
                    .map(|job| job.spec.name)
                    .collect();
                anyhow::bail!("no job named {job:?}; registered jobs: {known:?}");
            };
            let moved = crate::jobs::retry_dead(redis, spec).await?;
            println!("put {moved} dead letters of {job} back onto its streams");
        }
    }
    Ok(())
}
