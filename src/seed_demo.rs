//! `pulse seed-demo`: realistic data, so every page of the demo app and every GraphiQL example has
//! something to show on first start.
//!
//! Everything goes through the services, as requests would: articles are published with their feed
//! outbox record, views, likes and votes run their Lua scripts and queue their stream events, and
//! follows queue their feed jobs. What the scripts queue is archived to SQL, and fanned out to
//! feeds, by the background jobs of the next `pulse serve`. Votes are cast at times spread over
//! the last four days, so boards have previous periods to compare with.

use std::sync::Arc;

use anyhow::Context as _;
use chrono::{Duration, Utc};
use pulse_kit::actor::Actor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accounts::TokenSigner;
use crate::accounts::service::{Handle, find_by_handle, insert_user};
use crate::app::Backends;
use crate::config::Config;
use crate::likes::Subject;
use crate::realtime::Hub;
use crate::services::{Inputs, Services, Workers};
use crate::votes::admin::{NewOption, NewPoll};
use crate::votes::board::TiePolicy;
use crate::votes::periods::Period;
use crate::votes::rules::{LimitScope, LimitWindow, Rule};
use crate::votes::service::{Ballot, Origin};

/// Demo accounts all share this password; they exist to click around in the demo and GraphiQL.
pub const DEMO_PASSWORD: &str = "pulse-demo-password";

/// The admin, who owns the poll.
const ADMIN: &str = "alice";
/// The author everyone follows.
const CELEBRITY: &str = "maya";
const WRITERS: [&str; 3] = ["bob", "carol", "dana"];
const READERS: usize = 24;

const ARTICLES: [(&str, &str, &str); 12] = [
    (
        "maya",
        "What a million readers taught me about headlines",
        "Short beats clever. Numbers beat adjectives. And nothing beats a headline that keeps the promise the article makes.",
    ),
    (
        "maya",
        "The newsletter is dead, long live the feed",
        "Readers follow people, not publications. A follow feed that loads in a blink is worth more than any inbox.",
    ),
    (
        "maya",
        "Live numbers change how people write",
        "When writers can watch views and likes move as they happen, they edit differently: faster, and for the reader.",
    ),
    (
        "alice",
        "Running Pulse on a laptop",
        "One binary, a SQLite file and a local Redis: that is the whole stack for development. PostgreSQL and Redis Cluster come later.",
    ),
    (
        "alice",
        "How we count a view exactly once",
        "A dedup key per viewer and article, a pending delta in Redis and a flusher that subtracts exactly what it committed.",
    ),
    (
        "bob",
        "Leaderboards that do not lie",
        "Real votes and display votes are two boards. Show the display board, audit the real one, and never mix them up.",
    ),
    (
        "bob",
        "Rate limits people understand",
        "Tell the voter which rule stopped them and when they may try again. A bare 429 makes people angry; a time makes them wait.",
    ),
    (
        "carol",
        "Push or pull? Both.",
        "Push new posts into the inboxes of active readers, pull the celebrities at read time, and rebuild the timeline of whoever returns.",
    ),
    (
        "carol",
        "Cursor pagination in one picture",
        "An opaque cursor holds the position, not the page number, so nothing repeats or goes missing while new posts arrive.",
    ),
    (
        "dana",
        "Accessibility is a feature",
        "Labels on every input, focus you can see, contrast you can read and a layout that works on a phone. None of it is optional.",
    ),
    (
        "dana",
        "Designing for the reconnect",
        "Sockets drop. Say so on screen, retry with backoff, and pick up where you left off once the server is back.",
    ),
    (
        "dana",
        "Small bundles, fast pages",
        "Precompressed assets with long cache lifetimes, and HTML that is revalidated on every load: the browser does the rest.",
    ),
];

const COMMENTS: [&str; 10] = [
    "This matches what we saw in production.",
    "Could you share the numbers behind this?",
    "Bookmarked. The second paragraph is gold.",
    "I disagree a little: it depends on the audience.",
    "Clear and short, thank you.",
    "We tried the same and it halved our support tickets.",
    "What happens when Redis restarts?",
    "The diagram would help here.",
    "Sharing this with my team.",
    "More of this, please!",
];

/// The poll's options: label, bonus per vote on the DISPLAY boards, initial votes.
const OPTIONS: [(&str, i32, i64); 5] = [
    ("Rust in production", 1, 0),
    ("Designing for the reconnect", 1, 0),
    ("Leaderboards that do not lie", 2, 0),
    ("Accessibility is a feature", 1, 40),
    ("The follow feed at scale", 3, 0),
];

pub async fn run(backends: &Backends, config: &Config) -> anyhow::Result<()> {
    let db = &backends.db;
    for handle in [ADMIN, CELEBRITY].into_iter().chain(WRITERS) {
        if find_by_handle(db, &Handle::parse(handle)?).await?.is_some() {
            println!(
                "the demo data is there already (user `{handle}` exists): nothing added; \
                 seed a fresh database to start over"
            );
            return Ok(());
        }
    }

    let (shutdown, tasks) = (CancellationToken::new(), TaskTracker::new());
    let hub = Hub::start(backends.redis.target.pubsub(), shutdown.clone(), &tasks);
    let tokens = Arc::new(TokenSigner::throwaway(config.token_ttl)?);
    // The next `pulse serve` runs the jobs this queues; a seed that stops in a few seconds should
    // not take them halfway.
    let config = Config {
        run_jobs: false,
        ..config.clone()
    };
    let services = Services::start(
        Inputs {
            db,
            redis: &backends.redis,
            hub: &hub,
            tokens: &tokens,
            config: &config,
        },
        Workers {
            tasks: &tasks,
            shutdown: &shutdown,
        },
    )
    .await?;
    let seeded = seed(backends, &services).await;
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    let summary = seeded?;
    println!(
        "demo data: {} users (password `{DEMO_PASSWORD}`; `{ADMIN}` is an admin, `{CELEBRITY}` is \
         followed by everyone), {} articles, {} comments, {} likes, {} views, {} follows, a poll \
         with {} votes over the last 4 days",
        summary.users,
        summary.articles,
        summary.comments,
        summary.likes,
        summary.views,
        summary.follows,
        summary.votes
    );
    Ok(())
}

#[derive(Default)]
struct Summary {
    users: usize,
    articles: usize,
    comments: usize,
    likes: usize,
    views: usize,
    follows: usize,
    votes: usize,
}

fn actor(user: i64) -> Actor {
    Actor {
        user: Some(user),
        client_ip: std::net::Ipv4Addr::LOCALHOST.into(),
        user_agent: None,
    }
}

async fn seed(backends: &Backends, services: &Services) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let readers: Vec<String> = (1..=READERS).map(|n| format!("reader{n:02}")).collect();
    let handles: Vec<&str> = [ADMIN, CELEBRITY]
        .into_iter()
        .chain(WRITERS)
        .chain(readers.iter().map(String::as_str))
        .collect();
    // Password hashing is the slow part: hash on every core at once.
    let users = futures_util::future::try_join_all(handles.iter().map(|handle| async move {
        let user = insert_user(
            &backends.db,
            &Handle::parse(handle)?,
            DEMO_PASSWORD,
            *handle == ADMIN,
        )
        .await?;
        anyhow::Ok((*handle, user.id))
    }))
    .await?;
    summary.users = users.len();
    let id_of = |handle: &str| {
        users
            .iter()
            .find(|(name, _)| *name == handle)
            .map(|(_, id)| *id)
            .expect("every demo handle was created")
    };
    let reader_ids: Vec<i64> = readers.iter().map(|handle| id_of(handle)).collect();

    let mut articles = Vec::new();
    for (author, title, body) in ARTICLES {
        let article = services
            .articles
            .publish(&actor(id_of(author)), title, body)
            .await
            .with_context(|| format!("publishing {title:?}"))?;
        articles.push(article.id);
    }
    summary.articles = articles.len();

    let follows = reader_ids
        .iter()
        .enumerate()
        .flat_map(|(index, &reader)| {
            [
                (reader, id_of(CELEBRITY)),
                (reader, id_of(WRITERS[index % WRITERS.len()])),
            ]
        })
        .chain([CELEBRITY, WRITERS[0], WRITERS[1]].map(|followee| (id_of(ADMIN), id_of(followee))));
    for (follower, followee) in follows {
        services.follows.follow(&actor(follower), followee).await?;
        summary.follows += 1;
    }

    // Older articles have had more readers: views and likes fall off with recency.
    for (rank, &article) in articles.iter().enumerate() {
        let audience = READERS - (rank * READERS / (articles.len() + 4));
        for (index, &reader) in reader_ids.iter().take(audience).enumerate() {
            services.views.record(article, &actor(reader)).await?;
            summary.views += 1;
            if index % 3 != rank % 3 {
                services
                    .likes
                    .set(&actor(reader), Subject::Article(article), true)
                    .await?;
                summary.likes += 1;
            }
        }
        let mut comments = Vec::new();
        for offset in 0..(2 + rank % 3) {
            let reader = reader_ids[(rank * 5 + offset * 7) % READERS];
            let text = COMMENTS[(rank + offset * 3) % COMMENTS.len()];
            comments.push(services.comments.add(&actor(reader), article, text).await?);
            summary.comments += 1;
        }
        // A few likes on the comments, so articles have featured comments.
        for (position, comment) in comments.iter().enumerate() {
            for &reader in reader_ids.iter().skip(position).take(3 - position.min(2)) {
                services
                    .likes
                    .set(&actor(reader), Subject::Comment(comment.id), true)
                    .await?;
                summary.likes += 1;
            }
        }
    }

    summary.votes = seed_poll(services, id_of(ADMIN), &reader_ids).await?;
    Ok(summary)
}

/// A poll with rules, bonuses and initial votes, and ballots cast over the last four days, with a
/// favourite that changes from day to day so ranks move between periods.
async fn seed_poll(services: &Services, admin: i64, readers: &[i64]) -> anyhow::Result<usize> {
    let poll = services
        .polls
        .create(
            &actor(admin),
            NewPoll {
                title: "Talk of the week".to_owned(),
                timezone: "UTC".to_owned(),
                periods: Period::ALL.to_vec(),
                carry_over: 0.1,
                tie_policy: TiePolicy::Competition,
                starts_at: None,
                ends_at: None,
                rules: vec![
                    Rule {
                        scope: LimitScope::Voter,
                        window: LimitWindow::Minute,
                        limit: 5,
                        channel: None,
                        device: None,
                    },
                    Rule {
                        scope: LimitScope::Voter,
                        window: LimitWindow::Day,
                        limit: 50,
                        channel: None,
                        device: None,
                    },
                ],
                options: OPTIONS
                    .iter()
                    .map(|&(label, bonus, initial_votes)| NewOption {
                        label: label.to_owned(),
                        bonus,
                        initial_votes,
                    })
                    .collect(),
            },
        )
        .await?;
    let options: Vec<i64> = poll.options.iter().map(|option| option.id).collect();
    let origin = Origin {
        channel: None,
        device: Some("web".to_owned()),
    };
    let now = Utc::now();
    let mut votes = 0;
    for days_ago in (0..4_i64).rev() {
        let favourite = (days_ago as usize * 2) % options.len();
        for (index, &reader) in readers.iter().enumerate() {
            // Half the readers back the day's favourite; the rest spread over the others.
            let option = if index % 2 == 0 {
                options[favourite]
            } else {
                options[(favourite + 1 + index % (options.len() - 1)) % options.len()]
            };
            let hours_ago = days_ago * 24 + (index as i64 % 6);
            let at = now - Duration::hours(hours_ago) - Duration::minutes(index as i64);
            let outcomes = services
                .votes
                .cast(
                    &actor(reader),
                    &[Ballot {
                        poll: poll.id,
                        option,
                    }],
                    &origin,
                    at,
                )
                .await?;
            votes += outcomes.iter().filter(|o| o.rejection.is_none()).count();
        }
    }
    Ok(votes)
}
