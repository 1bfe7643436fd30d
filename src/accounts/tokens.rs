//! Signed session tokens (HS256 JWT) with an expiry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::config::Secret;
use crate::error::{AppError, AppResult};

/// Shortest secret accepted: HS256 is only as strong as its key.
pub const MIN_SECRET_BYTES: usize = 32;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    iat: i64,
    exp: i64,
}

pub struct TokenSigner {
    /// The secret, kept for [`TokenSigner::tag`].
    secret: Vec<u8>,
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    ttl: Duration,
}

impl TokenSigner {
    /// A signer with a random secret, for a process that signs no session (the one-shot
    /// commands and the demo seed) but builds services that want one all the same.
    pub fn throwaway(ttl: Duration) -> anyhow::Result<Self> {
        let secret = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 48]>());
        Self::new(&Secret::new(secret), ttl)
    }

    pub fn new(secret: &Secret, ttl: Duration) -> anyhow::Result<Self> {
        let bytes = secret.expose().as_bytes();
        anyhow::ensure!(
            bytes.len() >= MIN_SECRET_BYTES,
            "PULSE_TOKEN_SECRET must be at least {MIN_SECRET_BYTES} bytes"
        );
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 5;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Ok(Self {
            secret: bytes.to_vec(),
            encoding: EncodingKey::from_secret(bytes),
            decoding: DecodingKey::from_secret(bytes),
            validation,
            ttl,
        })
    }

    /// A keyed 62-bit tag of `message` (HMAC-SHA256 under the token secret): what other opaque
    /// values the server hands out (feed cursors) carry, so a client can neither forge one nor
    /// use another user's.
    pub fn tag(&self, message: &[u8]) -> i64 {
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.secret)
            .expect("HMAC takes a key of any length");
        mac.update(message);
        let digest = mac.finalize().into_bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(first) >> 2) as i64
    }

    pub fn issue(&self, user_id: i64) -> AppResult<String> {
        self.issue_at(user_id, chrono::Utc::now().timestamp())
    }

    /// A token as if issued at `issued_at` (unix seconds); tests use it to make expired tokens.
    pub fn issue_at(&self, user_id: i64, issued_at: i64) -> AppResult<String> {
        let claims = Claims {
            sub: user_id.to_string(),
            iat: issued_at,
            exp: issued_at.saturating_add(self.ttl.as_secs() as i64),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|err| AppError::Internal(format!("cannot sign a token: {err}")))
    }

    /// The user id a token was issued to, if it is genuine and unexpired.
    pub fn verify(&self, token: &str) -> AppResult<i64> {
        self.verify_until(token).map(|(user, _)| user)
    }

    /// The user id a token was issued to and when it expires, if it is genuine and unexpired: a
    /// websocket opened with it ends its private operations then.
    pub fn verify_until(&self, token: &str) -> AppResult<(i64, SystemTime)> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|err| match err.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => {
                    AppError::Unauthenticated("token expired; sign in again")
                }
                _ => AppError::Unauthenticated("invalid token"),
            })?;
        let user = data
            .claims
            .sub
            .parse()
            .map_err(|_| AppError::Unauthenticated("invalid token"))?;
        let expires = UNIX_EPOCH + Duration::from_secs(data.claims.exp.max(0) as u64);
        Ok((user, expires))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(secret: &str) -> TokenSigner {
        TokenSigner::new(&Secret::new(secret), Duration::from_secs(3600)).unwrap()
    }

    #[test]
    fn a_token_names_its_user() {
        let signer = signer("0123456789abcdef0123456789abcdef");
        assert_eq!(signer.verify(&signer.issue(17).unwrap()).unwrap(), 17);
    }

    #[test]
    fn a_token_says_when_it_expires() {
        let signer = signer("0123456789abcdef0123456789abcdef");
        let issued_at = chrono::Utc::now().timestamp();
        let token = signer.issue_at(17, issued_at).unwrap();
        let (user, expires) = signer.verify_until(&token).unwrap();
        assert_eq!(user, 17);
        let expected = UNIX_EPOCH + Duration::from_secs(issued_at as u64 + 3600);
        assert_eq!(expires, expected);
    }

    #[test]
    fn a_token_signed_with_another_secret_is_refused() {
        let token = signer("0123456789abcdef0123456789abcdef")
            .issue(17)
            .unwrap();
        let err = signer("fedcba9876543210fedcba9876543210")
            .verify(&token)
            .unwrap_err();
        assert_eq!(err.code(), "UNAUTHENTICATED");
    }

    #[test]
    fn an_expired_token_is_refused() {
        let signer = signer("0123456789abcdef0123456789abcdef");
        let token = signer
            .issue_at(17, chrono::Utc::now().timestamp() - 7200)
            .unwrap();
        assert!(
            matches!(signer.verify(&token), Err(AppError::Unauthenticated(m)) if m.contains("expired"))
        );
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(TokenSigner::new(&Secret::new("short"), Duration::from_secs(1)).is_err());
    }
}
