//! Likes of articles and comments, and the comments themselves.
//!
//! Truth: SQL. `likes` holds every user's current relation to a subject, `like_events` every like
//! and unlike ever archived, `articles.like_count` and `comments.like_count` the counts they add up
//! to; `comments` and `articles.comment_count` are written in one transaction. Between the request
//! and SQL, a change lives in Redis: the like script changes the relation, the counter and appends
//! the event to the shard's archive stream in one atomic step, before the mutation answers, and the
//! archive job ([`archive`]) moves it to SQL; an event in the stream is never lost while Redis
//! keeps its data.
//!
//! Cache, rebuildable from SQL (`pulse rebuild likes`): the relations (they expire a while after
//! their last write: memory stays bounded by recent activity), the counts' SQL bases, the rankings,
//! the featured comments. What is not a cache: the changes not yet archived (the unarchived
//! relations and the pending count changes, beside their stream entries). A relation missing from
//! the cache is decided by the unarchived ones, then by SQL, never assumed unliked, so liking stays
//! idempotent forever, not for a cache's lifetime.
//!
//! May be lost: changes not yet archived when Redis loses its data (as the README says for AOF and
//! snapshots). A Redis that comes back older than SQL never makes SQL count twice: the archiver
//! applies each event as a state transition against SQL's own `likes` row, and its settle step puts
//! SQL's counts and relations back into Redis.

pub mod archive;
pub mod comments;
mod counts;
pub mod featured;
pub mod graphql;
pub mod loader;
pub mod rebuild;
pub mod service;

pub use archive::LikeArchiver;
pub use comments::CommentService;
pub use service::LikeService;

/// A comment's global id names this type.
pub const COMMENT: pulse_kit::ids::NodeType = pulse_kit::ids::NodeType::named("Comment");

/// What can be liked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Article(i64),
    Comment(i64),
}

impl Subject {
    pub fn id(self) -> i64 {
        match self {
            Self::Article(id) | Self::Comment(id) => id,
        }
    }

    /// The kind as stored in SQL (`subject_kind`): 1 for an article, 2 for a comment.
    pub fn kind_code(self) -> i16 {
        match self {
            Self::Article(_) => 1,
            Self::Comment(_) => 2,
        }
    }

    pub fn from_kind_code(kind: i16, id: i64) -> Option<Self> {
        match kind {
            1 => Some(Self::Article(id)),
            2 => Some(Self::Comment(id)),
            _ => None,
        }
    }

    /// The subject's name in Redis hash fields and keys: `a42` for an article, `c7` for a comment,
    /// so that an article and a comment with one id never share a counter.
    pub fn field(self) -> String {
        match self {
            Self::Article(id) => format!("a{id}"),
            Self::Comment(id) => format!("c{id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Subject;

    #[test]
    fn an_article_and_a_comment_with_one_id_are_different_subjects() {
        assert_ne!(Subject::Article(3).field(), Subject::Comment(3).field());
    }
}
