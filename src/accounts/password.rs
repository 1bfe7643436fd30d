//! Password hashing (argon2id, the crate's recommended parameters). Hashing is deliberately slow, so
//! it runs on the blocking pool, never on the async workers.

use std::sync::LazyLock;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

use crate::error::{AppError, AppResult};

/// Verified against when the handle does not exist, so a sign-in takes as long for an unknown
/// handle as for a wrong password and response times do not reveal which handles exist.
static DECOY_HASH: LazyLock<String> = LazyLock::new(|| {
    hash_blocking("decoy password that matches nothing").expect("hashing a constant succeeds")
});

fn hash_blocking(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)?
        .to_string())
}

fn verify_blocking(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

pub async fn hash(password: String) -> AppResult<String> {
    tokio::task::spawn_blocking(move || hash_blocking(&password))
        .await
        .map_err(|err| AppError::Internal(format!("hashing task failed: {err}")))?
        .map_err(|err| AppError::Internal(format!("cannot hash a password: {err}")))
}

/// Whether `password` matches `hash`; with no hash (unknown user) it still does the work, then says no.
pub async fn verify(password: String, hash: Option<String>) -> AppResult<bool> {
    tokio::task::spawn_blocking(move || match hash {
        Some(hash) => verify_blocking(&password, &hash),
        None => {
            verify_blocking(&password, &DECOY_HASH);
            false
        }
    })
    .await
    .map_err(|err| AppError::Internal(format!("verifying task failed: {err}")))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_hash_verifies_its_password_only() {
        let hash = super::hash("correct horse".into()).await.unwrap();
        assert!(
            super::verify("correct horse".into(), Some(hash.clone()))
                .await
                .unwrap()
        );
        assert!(
            !super::verify("wrong horse".into(), Some(hash))
                .await
                .unwrap()
        );
        assert!(!super::verify("correct horse".into(), None).await.unwrap());
    }
}
