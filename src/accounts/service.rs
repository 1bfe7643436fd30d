use std::sync::Arc;
use std::time::Duration;

use pulse_kit::actor::Actor;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter,
};

use super::{password, tokens::TokenSigner};
use crate::db::retry_once;
use crate::entities::users;
use crate::error::{AppError, AppResult, Unique, UniqueViolationExt as _};
use crate::keys::AccountKeys;
use crate::redis::Redis;
use crate::scripts::SCRIPTS;
use crate::text::{Controls, TextRule, Trim};

const AUTH_WINDOW: Duration = Duration::from_secs(60);

const HANDLE: TextRule = TextRule {
    field: "handle",
    noun: "a handle",
    chars: 3..=32,
    unit: "letters, digits or underscores",
    trim: Trim::Stored,
    controls: Controls::Refused,
};

/// Passwords are hashed before they are stored, so any character, NUL included, reaches SQL only as
/// part of an ASCII hash; refusing some would only lock out whoever already chose them.
const PASSWORD: TextRule = TextRule {
    field: "password",
    noun: "a password",
    chars: 8..=128,
    unit: "characters",
    trim: Trim::Never,
    controls: Controls::Allowed,
};

/// A handle as stored: lower-cased ASCII letters, digits and underscores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle(String);

impl Handle {
    pub fn parse(raw: &str) -> AppResult<Self> {
        let handle = HANDLE.parse(raw)?.to_ascii_lowercase();
        let well_formed = handle
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !well_formed {
            return Err(HANDLE.invalid());
        }
        Ok(Self(handle))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn check_password(password: &str) -> AppResult<()> {
    PASSWORD.parse(password).map(|_| ())
}

pub struct Session {
    pub token: String,
    pub user: users::Model,
}

#[derive(Clone)]
pub struct AccountService {
    db: DatabaseConnection,
    redis: Redis,
    tokens: Arc<TokenSigner>,
    auth_attempts_per_minute: u32,
}

#[async_trait::async_trait]
impl pulse_kit::Admins for AccountService {
    async fn require_admin(&self, user_id: i64) -> AppResult<()> {
        AccountService::require_admin(self, user_id).await
    }
}

impl AccountService {
    pub fn new(
        db: DatabaseConnection,
        redis: Redis,
        tokens: Arc<TokenSigner>,
        auth_attempts_per_minute: u32,
    ) -> Self {
        Self {
            db,
            redis,
            tokens,
            auth_attempts_per_minute,
        }
    }

    #[tracing::instrument(skip_all)]
    pub async fn sign_up(&self, actor: &Actor, handle: &str, password: &str) -> AppResult<Session> {
        let handle = Handle::parse(handle)?;
        check_password(password)?;
        self.throttle(actor).await?;
        let user = insert_user(&self.db, &handle, password, false).await?;
        tracing::info!(user.id = user.id, "user signed up");
        Ok(Session {
            token: self.tokens.issue(user.id)?,
            user,
        })
    }

    #[tracing::instrument(skip_all)]
    pub async fn sign_in(&self, actor: &Actor, handle: &str, password: &str) -> AppResult<Session> {
        let rejected = AppError::Unauthenticated("wrong handle or password");
        // Malformed credentials get the same answer as wrong ones: nothing to learn from the difference.
        let (Ok(handle), Ok(())) = (Handle::parse(handle), check_password(password)) else {
            return Err(rejected);
        };
        self.throttle(actor).await?;
        let user = self.by_handle(&handle).await?;
        let hash = user.as_ref().map(|user| user.password_hash.clone());
        match user {
            Some(user) if password::verify(password.to_owned(), hash).await? => Ok(Session {
                token: self.tokens.issue(user.id)?,
                user,
            }),
            _ => Err(rejected),
        }
    }

    /// Counts an authentication attempt from the actor's address against the per-minute allowance.
    /// By address even when signed in: the limit is on password guessing from one place.
    async fn throttle(&self, actor: &Actor) -> AppResult<()> {
        if self.auth_attempts_per_minute == 0 {
            return Ok(());
        }
        let mut conn = self.redis.conn.clone();
        let (allowed, reset_ms): (i64, i64) = SCRIPTS
            .rate_limit
            .key(self.redis.keys.auth_attempts(actor.client_ip))
            .arg(self.auth_attempts_per_minute)
            .arg(AUTH_WINDOW.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        if allowed == 1 {
            Ok(())
        } else {
            Err(AppError::RateLimited {
                retry_after_seconds: (reset_ms.max(0) as u64).div_ceil(1000).max(1),
            })
        }
    }

    pub async fn by_handle(&self, handle: &Handle) -> AppResult<Option<users::Model>> {
        find_by_handle(&self.db, handle).await
    }

    pub async fn by_id(&self, id: i64) -> AppResult<Option<users::Model>> {
        Ok(retry_once(|| users::Entity::find_by_id(id).one(&self.db)).await?)
    }

    pub async fn by_ids(&self, ids: &[i64]) -> AppResult<Vec<users::Model>> {
        let query = users::Entity::find().filter(users::Column::Id.is_in(ids.iter().copied()));
        Ok(retry_once(|| query.clone().all(&self.db)).await?)
    }

    /// Fails with `FORBIDDEN` unless `user_id` currently holds the admin role.
    pub async fn require_admin(&self, user_id: i64) -> AppResult<()> {
        match self.by_id(user_id).await? {
            Some(user) if user.is_admin => Ok(()),
            Some(_) => Err(AppError::Forbidden("admins only")),
            None => Err(AppError::Unauthenticated(
                "the signed-in user no longer exists",
            )),
        }
    }

    /// Grants or revokes the admin role; `NOT_FOUND` when no such user exists.
    pub async fn set_admin(&self, handle: &str, is_admin: bool) -> AppResult<users::Model> {
        set_admin(&self.db, handle, is_admin).await
    }

    /// Grants the admin role to the handles of `PULSE_ADMINS`. A handle that cannot be granted (no
    /// such user yet, SQL down) is logged and skipped: the server still starts, and the grant can be
    /// made later with `pulse admin grant`.
    pub async fn grant_configured_admins(&self, handles: &[String]) {
        for handle in handles.iter().filter(|handle| !handle.trim().is_empty()) {
            match self.set_admin(handle, true).await {
                Ok(_) => tracing::info!(handle, "admin role granted from PULSE_ADMINS"),
                Err(err) => {
                    tracing::warn!(handle, error = %err, "cannot grant admin role from PULSE_ADMINS")
                }
            }
        }
    }
}

/// Creates a user with `password` hashed; a taken handle is `BAD_USER_INPUT`. Shared by sign-up and
/// the demo seed.
pub async fn insert_user(
    db: &DatabaseConnection,
    handle: &Handle,
    password: &str,
    is_admin: bool,
) -> AppResult<users::Model> {
    let password_hash = password::hash(password.to_owned()).await?;
    let user = users::ActiveModel {
        handle: Set(handle.as_str().to_owned()),
        password_hash: Set(password_hash),
        is_admin: Set(is_admin),
        created_at: Set(crate::db::now()),
        ..Default::default()
    };
    match user.insert(db).await.or_duplicate()? {
        Unique::Inserted(user) => Ok(user),
        Unique::Duplicate => Err(AppError::bad_input("handle", "that handle is taken")),
    }
}

pub async fn find_by_handle(
    db: &DatabaseConnection,
    handle: &Handle,
) -> AppResult<Option<users::Model>> {
    let query = users::Entity::find().filter(users::Column::Handle.eq(handle.as_str()));
    Ok(retry_once(|| query.clone().one(db)).await?)
}

/// Grants or revokes the admin role; `NOT_FOUND` when no such user exists. Shared by the API's
/// service, `PULSE_ADMINS` and `pulse admin`.
pub async fn set_admin(
    db: &DatabaseConnection,
    handle: &str,
    is_admin: bool,
) -> AppResult<users::Model> {
    let handle = Handle::parse(handle)?;
    let Some(user) = find_by_handle(db, &handle).await? else {
        return Err(AppError::NoSuchHandle(handle.as_str().to_owned()));
    };
    let mut active: users::ActiveModel = user.into();
    active.is_admin = Set(is_admin);
    Ok(active.update(db).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_case_insensitive() {
        assert_eq!(Handle::parse("  Alice_1 ").unwrap().as_str(), "alice_1");
    }

    #[test]
    fn malformed_handles_are_bad_input() {
        for raw in [
            "ab",
            "has space",
            "émile",
            "x".repeat(33).as_str(),
            "semi;colon",
            "nul\0byte",
        ] {
            assert_eq!(
                Handle::parse(raw).unwrap_err().code(),
                "BAD_USER_INPUT",
                "{raw}"
            );
        }
    }
}
