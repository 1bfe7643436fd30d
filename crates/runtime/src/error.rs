//! The one error type of the request path, and how it shows to clients.
//!
//! Client mistakes carry their message to the client; failures of ours are logged once, here, with
//! their detail, and reach the client only as a code and a generic message.

use async_graphql::ErrorExtensions;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("no user has the handle `{0}`")]
    NoSuchHandle(String),
    #[error("{message}")]
    BadUserInput {
        message: String,
        /// The argument or input field at fault, when there is one.
        field: Option<&'static str>,
    },
    /// An event stream cannot resume from the client's position; the message says what to re-read.
    #[error("{0}")]
    ResyncRequired(&'static str),
    /// Not ready to answer yet, for a reason of this process's own that passes by itself (a
    /// replica still loading); the message says what, and the client retries.
    #[error("{0}; retry shortly")]
    Unavailable(&'static str),
    #[error("too many attempts; retry in {retry_after_seconds} s")]
    RateLimited { retry_after_seconds: u64 },
    #[error("database error: {0}")]
    Database(#[from] sea_orm::DbErr),
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("internal error: {0}")]
    Internal(String),
    /// One failure reported to every caller that waited on the same work (a single-flight load).
    #[error(transparent)]
    Shared(std::sync::Arc<AppError>),
}

pub type AppResult<T> = Result<T, AppError>;

/// The outcome of work several callers share (a single-flight load): each gets the same error.
pub type SharedResult<T> = Result<T, std::sync::Arc<AppError>>;

impl AppError {
    pub fn bad_input(field: &'static str, message: impl Into<String>) -> Self {
        Self::BadUserInput {
            message: message.into(),
            field: Some(field),
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated(_) => "UNAUTHENTICATED",
            Self::Forbidden(_) => "FORBIDDEN",
            Self::NotFound(_) | Self::NoSuchHandle(_) => "NOT_FOUND",
            Self::BadUserInput { .. } => "BAD_USER_INPUT",
            Self::RateLimited { .. } => "RATE_LIMITED",
            Self::ResyncRequired(_) => "RESYNC_REQUIRED",
            Self::Unavailable(_) => "UNAVAILABLE",
            Self::Database(err) if crate::sql::transient(err).is_some() => "UNAVAILABLE",
            Self::Redis(err) if crate::redis::link::is_unreachable(err) => "UNAVAILABLE",
            Self::Database(_) | Self::Redis(_) | Self::Internal(_) => "INTERNAL",
            Self::Shared(err) => err.code(),
        }
    }

    fn is_ours(&self) -> bool {
        match self {
            Self::Database(_) | Self::Redis(_) | Self::Internal(_) => true,
            Self::Shared(err) => err.is_ours(),
            _ => false,
        }
    }

    /// The same error for several callers.
    pub fn shared(self) -> std::sync::Arc<Self> {
        std::sync::Arc::new(self)
    }
}

impl ErrorExtensions for AppError {
    fn extend(&self) -> async_graphql::Error {
        if let Self::Shared(inner) = self {
            return AppError::extend(inner);
        }
        let code = self.code();
        let message = if self.is_ours() {
            tracing::error!(error = %self, code, "request failed");
            match code {
                "UNAVAILABLE" => "a backing service is unavailable; retry shortly".to_owned(),
                _ => "internal error".to_owned(),
            }
        } else {
            self.to_string()
        };
        async_graphql::Error::new(message).extend_with(|_, ext| {
            ext.set("code", code);
            match self {
                Self::BadUserInput {
                    field: Some(field), ..
                } => ext.set("field", *field),
                Self::RateLimited {
                    retry_after_seconds,
                } => ext.set("retryAfterSeconds", *retry_after_seconds),
                _ => {}
            }
        })
    }
}

/// What an insert guarded by a unique constraint did: stored its row, or found the key taken.
#[derive(Debug)]
pub enum Unique<T> {
    Inserted(T),
    /// A row with the same unique key exists: a taken name for a user's input, or work already done
    /// for an idempotent write.
    Duplicate,
}

/// Turns a unique-constraint violation into [`Unique::Duplicate`], on every SQL backend, so callers
/// match a type instead of the driver's error. Any other error stays an error.
pub trait UniqueViolationExt<T> {
    fn or_duplicate(self) -> Result<Unique<T>, sea_orm::DbErr>;
}

impl<T> UniqueViolationExt<T> for Result<T, sea_orm::DbErr> {
    fn or_duplicate(self) -> Result<Unique<T>, sea_orm::DbErr> {
        match self {
            Ok(row) => Ok(Unique::Inserted(row)),
            Err(err) => match err.sql_err() {
                Some(sea_orm::SqlErr::UniqueConstraintViolation(_)) => Ok(Unique::Duplicate),
                _ => Err(err),
            },
        }
    }
}

/// Lets resolvers write `service_call().await.gql()?`.
pub trait GqlResultExt<T> {
    fn gql(self) -> async_graphql::Result<T>;
}

impl<T> GqlResultExt<T> for AppResult<T> {
    fn gql(self) -> async_graphql::Result<T> {
        self.map_err(|err| err.extend())
    }
}
