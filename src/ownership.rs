//! One Redis prefix belongs to one database.
//!
//! Everything Pulse keeps in Redis is a cache or a queue of one SQL database: pending view counts
//! flushed into it, like events archived into it, boards rebuilt from its vote log. Two databases
//! on one prefix mix all of it (one server shows the other's counts, a view counted by one is
//! flushed into the other, a rebuild from one erases the other's). So every process that connects
//! (the server and every command, through [`crate::app::Backends::connect`]) checks, before it reads
//! or writes anything else under the prefix, that the prefix belongs to its database, and refuses
//! to start otherwise.
//!
//! - The database's identity is the one row of `database_identity`, inserted by whichever process
//!   starts on the database first (concurrent first starts insert one row between them and read
//!   the same id).
//! - The prefix's owner key (`<prefix>owner`) records the owning database's id, and its URL
//!   (redacted) for the error message. It is set with `SET NX` only, so two databases starting at
//!   once on a fresh prefix cannot both win: the loser reads the winner's id and refuses.
//! - A prefix without an owner key is claimed when it is this database's by every sign there is:
//!   the database has never claimed a prefix (its first start since owner keys exist: the keys
//!   there, if any, were written before them), or the prefix is the one it claimed last (Redis
//!   restarted empty or came back older than the claim, which the project already survives), or the
//!   prefix holds no key at all. Only that last case scans, stopping at the first key found; the
//!   scan costs a round trip per thousand keys of the whole Redis, and runs only when a database
//!   that owned another prefix meets a prefix without an owner.

use anyhow::{Context as _, bail};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, DatabaseConnection, EntityTrait};
use serde::{Deserialize, Serialize};

use crate::config::redacted_url;
use crate::entities::database_identity;
use crate::redis::Redis;
use crate::redis::embedded::RedisLocation;

/// The prefix of a deployment that names none.
pub const DEFAULT_PREFIX: &str = "pulse:";

/// Hex digits of the database id a derived prefix carries: 48 bits, so two data dirs on one
/// Redis differ by far more than chance, and a clash would still be caught by the owner key.
const DERIVED_ID_DIGITS: usize = 12;

/// Who this process's database is.
#[derive(Clone, Debug)]
pub struct DatabaseIdentity {
    /// Random, 32 hex digits, made once per database.
    pub id: String,
    /// The prefix this database last claimed, if it ever did.
    pub claimed_prefix: Option<String>,
    /// The database's URL with its password redacted, to name it in messages.
    pub url: String,
}

impl DatabaseIdentity {
    /// The database's identity, made now if this is the first process on it.
    pub async fn load_or_create(db: &DatabaseConnection, url: &str) -> anyhow::Result<Self> {
        let fresh = database_identity::ActiveModel {
            id: Set(1),
            database_id: Set(format!("{:032x}", rand::random::<u128>())),
            redis_prefix: Set(None),
            created_at: Set(crate::db::now()),
        };
        database_identity::Entity::insert(fresh)
            .on_conflict(
                // `do_nothing_on`, not `do_nothing`: MySQL has no `ON CONFLICT DO NOTHING`, and
                // this spelling becomes `ON DUPLICATE KEY UPDATE id = id` there.
                OnConflict::column(database_identity::Column::Id)
                    .do_nothing_on([database_identity::Column::Id])
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await
            .context("cannot record the database's identity")?;
        let row = database_identity::Entity::find_by_id(1)
            .one(db)
            .await
            .context("cannot read the database's identity")?
            .context("the database's identity row is missing")?;
        Ok(Self {
            id: row.database_id,
            claimed_prefix: row.redis_prefix,
            url: redacted_url(url),
        })
    }

    /// The prefix to use when none is configured: the default one, except on the local Redis
    /// found by the probe, which every data dir on the machine finds alike. There each database
    /// gets a prefix of its own, derived from its id, so two data dirs never share one.
    pub fn default_prefix(&self, location: &RedisLocation) -> String {
        match location {
            RedisLocation::LocalDefault(_) => {
                format!("{DEFAULT_PREFIX}{}:", &self.id[..DERIVED_ID_DIGITS])
            }
            RedisLocation::Configured(_) | RedisLocation::Private(_) => DEFAULT_PREFIX.to_owned(),
        }
    }
}

/// What the owner key holds.
#[derive(Serialize, Deserialize)]
struct Owner {
    database_id: String,
    database: String,
}

/// Makes sure `redis`'s prefix belongs to `identity`'s database, claiming it if it is free; an
/// error that names both databases and the prefix when it belongs to another. `redis_url` names
/// the Redis in messages.
pub async fn claim(
    db: &DatabaseConnection,
    redis: &Redis,
    identity: &DatabaseIdentity,
    redis_url: &str,
) -> anyhow::Result<()> {
    let prefix = redis.keys.prefix();
    let where_ = format!("Redis prefix {prefix:?} at {}", redacted_url(redis_url));
    let owner = match read_owner(redis).await? {
        Some(owner) => owner,
        None => {
            if !may_claim_unowned(redis, identity).await? {
                bail!(
                    "{where_} holds keys but records no owner, and this database ({}, id {}) last \
                     used the prefix {:?}: the keys may be another database's. Point \
                     PULSE_REDIS_PREFIX back at {:?}, or give this database a prefix of its own; if \
                     the keys are this database's after all, delete them (`redis-cli --scan \
                     --pattern '{prefix}*' | xargs redis-cli unlink`, then `pulse rebuild` each \
                     domain) and start again.",
                    identity.url,
                    identity.id,
                    identity.claimed_prefix.as_deref().unwrap_or_default(),
                    identity.claimed_prefix.as_deref().unwrap_or_default(),
                );
            }
            set_owner_if_none(redis, identity).await?
        }
    };
    if owner.database_id != identity.id {
        bail!(
            "{where_} belongs to another database: {} (id {}) claimed it, and this process uses {} \
             (id {}). Two databases on one prefix mix their counts, queues and caches, so nothing \
             was read or written under it. Give this database a prefix of its own \
             (PULSE_REDIS_PREFIX), or point DATABASE_URL at the database that owns the prefix; if \
             that database is gone for good, delete the prefix's keys (`redis-cli --scan --pattern \
             '{prefix}*' | xargs redis-cli unlink`) and start again.",
            owner.database,
            owner.database_id,
            identity.url,
            identity.id,
        );
    }
    if identity.claimed_prefix.as_deref() != Some(prefix) {
        remember_prefix(db, prefix).await?;
    }
    tracing::info!(prefix, database.id = %identity.id, "the Redis prefix belongs to this database");
    Ok(())
}

async fn read_owner(redis: &Redis) -> anyhow::Result<Option<Owner>> {
    let mut conn = redis.conn.clone();
    let raw: Option<String> = redis::cmd("GET")
        .arg(redis.keys.owner())
        .query_async(&mut conn)
        .await
        .context("cannot read the Redis prefix's owner")?;
    raw.map(|raw| {
        serde_json::from_str(&raw).with_context(|| {
            format!(
                "the Redis key {} is not an owner record: {raw:?}",
                redis.keys.owner()
            )
        })
    })
    .transpose()
}

/// Whether an ownerless prefix may be taken (see the module's docs).
async fn may_claim_unowned(redis: &Redis, identity: &DatabaseIdentity) -> anyhow::Result<bool> {
    match identity.claimed_prefix.as_deref() {
        None => Ok(true),
        Some(claimed) if claimed == redis.keys.prefix() => Ok(true),
        Some(_) => holds_no_key(redis).await,
    }
}

async fn holds_no_key(redis: &Redis) -> anyhow::Result<bool> {
    let mut scan = redis.scan(redis.keys.everything_pattern());
    while let Some(keys) = scan
        .next_batch()
        .await
        .context("cannot scan the Redis prefix")?
    {
        if !keys.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Sets the owner key to this database unless it is set, and returns whoever owns it then.
async fn set_owner_if_none(redis: &Redis, identity: &DatabaseIdentity) -> anyhow::Result<Owner> {
    let mine = Owner {
        database_id: identity.id.clone(),
        database: identity.url.clone(),
    };
    let mut conn = redis.conn.clone();
    let set: Option<String> = redis::cmd("SET")
        .arg(redis.keys.owner())
        .arg(serde_json::to_string(&mine)?)
        .arg("NX")
        .query_async(&mut conn)
        .await
        .context("cannot claim the Redis prefix")?;
    if set.is_some() {
        tracing::info!(
            prefix = redis.keys.prefix(),
            "claimed the Redis prefix for this database"
        );
        return Ok(mine);
    }
    // Another process set it between our read and our write: its claim stands.
    read_owner(redis)
        .await?
        .context("the Redis prefix's owner key vanished while it was claimed")
}

async fn remember_prefix(db: &DatabaseConnection, prefix: &str) -> anyhow::Result<()> {
    database_identity::Entity::update(database_identity::ActiveModel {
        id: sea_orm::ActiveValue::Unchanged(1),
        redis_prefix: Set(Some(prefix.to_owned())),
        ..Default::default()
    })
    .exec(db)
    .await
    .context("cannot record the claimed Redis prefix")?;
    Ok(())
}
