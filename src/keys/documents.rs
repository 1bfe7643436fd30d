//! Persisted queries: the text of a document by its hex SHA-256, one key each.

use super::Keys;

pub trait DocumentKeys {
    /// String: the document whose SHA-256 is `sha256`, registered by an automatic persisted query.
    fn persisted_query(&self, sha256: &str) -> String;
}

impl DocumentKeys for Keys {
    fn persisted_query(&self, sha256: &str) -> String {
        format!("{}apq:{sha256}", self.prefix())
    }
}
