//! One-shot commands: `migrate`, `seed-demo`, `admin`.

use sea_orm::{ActiveModelTrait, ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter};

use crate::app::Backends;
use crate::config::{AdminAction, Command, Config, RebuildTarget};
use crate::entities::{articles, users};

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
        Command::Rebuild {
            target: RebuildTarget::Views,
        } => rebuild_views(&config, &backends).await,
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
        let existing = users::Entity::find()
            .filter(users::Column::Handle.eq(*handle))
            .one(db)
            .await?;
        let user = match existing {
            Some(user) => user,
            None => {
                users::ActiveModel {
                    handle: Set((*handle).to_owned()),
                    password_hash: Set(
                        crate::accounts::password::hash(DEMO_PASSWORD.to_owned()).await?
                    ),
                    is_admin: Set(index == 0),
                    created_at: Set(crate::db::now()),
                    ..Default::default()
                }
                .insert(db)
                .await?
            }
        };
        let has_articles = articles::Entity::find()
            .filter(articles::Column::AuthorId.eq(user.id))
            .one(db)
            .await?
            .is_some();
        if has_articles {
            continue;
        }
        for number in 1..=3 {
            let now = crate::db::now();
            articles::ActiveModel {
                author_id: Set(user.id),
                title: Set(format!("{handle}'s note #{number}")),
                body: Set(format!(
                    "Demo article {number} by {handle}. Open it, like it, share it."
                )),
                view_count: Set(0),
                like_count: Set(0),
                created_at: Set(now),
                updated_at: Set(now),
                ..Default::default()
            }
            .insert(db)
            .await?;
        }
    }
    println!(
        "demo users {} (password `{DEMO_PASSWORD}`; alice is an admin) with three articles each",
        DEMO_HANDLES.join(", ")
    );
    Ok(())
}

async fn rebuild_views(config: &Config, backends: &Backends) -> anyhow::Result<()> {
    let views = crate::views::ViewService::new(
        backends.db.clone(),
        backends.redis.clone(),
        std::sync::Arc::new(crate::views::crawler::CrawlerDetector::new(&[])?),
        config.view_window,
        config.timezone,
    );
    let articles = views.rebuild().await?;
    println!("rebuilt view counts and the all-time view ranking of {articles} articles");
    Ok(())
}

async fn admin(backends: &Backends, action: AdminAction) -> anyhow::Result<()> {
    let (handle, is_admin) = match &action {
        AdminAction::Grant { handle } => (handle, true),
        AdminAction::Revoke { handle } => (handle, false),
    };
    let handle = crate::accounts::service::Handle::parse(handle)?;
    let user = users::Entity::find()
        .filter(users::Column::Handle.eq(handle.as_str()))
        .one(&backends.db)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no user has the handle {}", handle.as_str()))?;
    let mut active: users::ActiveModel = user.into();
    active.is_admin = Set(is_admin);
    active.update(&backends.db).await?;
    println!(
        "{} is {} an admin",
        handle.as_str(),
        if is_admin { "now" } else { "no longer" }
    );
    Ok(())
}
