//! Feed upkeep: `pulse feed vacuum`, `pulse rebuild feed`, and what a deleted article leaves.

use sea_orm::EntityTrait;

use crate::feed::{
    bulk_follow, feed_page, in_audience, in_inbox, publish, redis_conn, token, users,
};
use crate::helpers::{TestApp, eventually, pulse_command};
use pulse::keys::FeedKeys;

async fn exists(app: &TestApp, key: &str) -> bool {
    let mut conn = redis_conn(app).await;
    redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

async fn set(app: &TestApp, keys: &[String]) {
    let mut conn = redis_conn(app).await;
    let mut pipe = redis::pipe();
    for key in keys {
        if key.contains(":inbox") || key.contains(":outbox:") {
            pipe.zadd(key, 0, 0).ignore();
        } else {
            pipe.set(key, 1).ignore();
        }
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
}

#[tokio::test]
async fn vacuum_removes_the_keys_of_deleted_users_and_dead_rebuilds_and_nothing_in_use() {
    let app = TestApp::spawn().await;
    let people = users(&app, "vac", 3).await;
    let keys = &app.state.redis.keys;
    let (healthy, dead_rebuild, rebuilding) = (
        keys.feed_user(people[0]),
        keys.feed_user(people[1]),
        keys.feed_user(people[2]),
    );
    let gone = keys.feed_user(people[2] + 1000);
    let kept = [
        healthy.inbox(),
        healthy.outbox(),
        healthy.outbox_loaded(),
        rebuilding.inbox_building(),
        rebuilding.rebuild_lock(),
        keys.feed_audience(people[0], 7),
    ];
    let removed = [
        dead_rebuild.inbox_building(),
        gone.inbox(),
        gone.outbox(),
        keys.feed_audience(gone.user(), 7),
    ];
    set(&app, &kept).await;
    set(&app, &removed).await;

    let output = pulse_command()
        .args(["feed", "vacuum"])
        .env("DATABASE_URL", app.config.database_url())
        .env("REDIS_URL", app.config.redis_url.as_deref().unwrap())
        .env(
            "PULSE_REDIS_PREFIX",
            app.config.redis_prefix.as_deref().unwrap(),
        )
        .env("PULSE_DATA_DIR", &app.config.data_dir)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("removed 3 feed keys of deleted users and 1 left"),
        "{stdout}"
    );
    for key in &kept {
        assert!(exists(&app, key).await, "{key} was removed");
    }
    for key in &removed {
        assert!(!exists(&app, key).await, "{key} was kept");
    }
}

#[tokio::test]
async fn rebuild_feed_reloads_a_damaged_outbox_from_sql_and_restores_lost_audiences() {
    let app = TestApp::spawn_with(|config| config.feed_celebrity_followers = 1).await;
    let people = users(&app, "obx", 2).await;
    let (star, fan) = (people[0], people[1]);
    bulk_follow(&app, &[fan], star).await;
    let mut posts = Vec::new();
    for i in 0..3 {
        posts.push(publish(&app, &token(&app, star), &format!("p{i}")).await);
    }
    posts.reverse();
    assert_eq!(
        feed_page(&app, &token(&app, fan), 10, None).await.ids,
        posts
    );
    let outbox = app.state.redis.keys.feed_user(star).outbox();
    let mut conn = redis_conn(&app).await;
    let () = redis::cmd("ZREM")
        .arg(&outbox)
        .arg(posts[1])
        .query_async(&mut conn)
        .await
        .unwrap();
    // Whether a page shows the damage depends on whether it was served from the outbox or from
    // SQL, so the damage and the repair are checked on the outbox itself.
    let outbox_ids = async |conn: &mut pulse::redis::Link| -> Vec<i64> {
        let mut ids: Vec<i64> = redis::cmd("ZRANGE")
            .arg(&outbox)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await
            .unwrap();
        ids.retain(|id| posts.contains(id));
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids
    };
    assert_eq!(outbox_ids(&mut conn).await, [posts[0], posts[2]]);

    // A rollback also lost the fan's place in the star's audience.
    let () = redis::cmd("DEL")
        .arg(
            app.state
                .redis
                .keys
                .feed_audience(star, pulse::keys::feed_shard(fan)),
        )
        .query_async(&mut conn)
        .await
        .unwrap();

    let rebuilt = app.state.services.feed.rebuild_all().await.unwrap();
    assert_eq!(rebuilt.outboxes, 1);
    assert_eq!(rebuilt.readers, 1);
    assert!(
        in_audience(&app, star, fan).await,
        "the reader is not back in the audience"
    );
    assert_eq!(
        outbox_ids(&mut conn).await,
        posts,
        "the outbox is whole again"
    );
    assert_eq!(
        feed_page(&app, &token(&app, fan), 10, None).await.ids,
        posts
    );
}

#[tokio::test]
async fn a_deleted_article_leaves_every_feed_at_once() {
    let app = TestApp::spawn().await;
    let people = users(&app, "del", 2).await;
    let (author, reader) = (people[0], people[1]);
    bulk_follow(&app, &[reader], author).await;
    feed_page(&app, &token(&app, reader), 5, None).await;
    let kept = publish(&app, &token(&app, author), "kept").await;
    let deleted = publish(&app, &token(&app, author), "deleted").await;
    eventually("both reach the inbox", async || {
        in_inbox(&app, reader, deleted).await && in_inbox(&app, reader, kept).await
    })
    .await;
    pulse::entities::articles::Entity::delete_by_id(deleted)
        .exec(&app.state.db)
        .await
        .unwrap();
    let page = feed_page(&app, &token(&app, reader), 5, None).await;
    assert_eq!(page.ids, vec![kept]);
    assert!(!page.has_next_page);
}
