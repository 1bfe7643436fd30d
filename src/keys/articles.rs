//! Articles: the live channels of publications and of an article's counters.

use super::Keys;

pub trait ArticleKeys {
    /// Pub/sub channel announcing newly published articles.
    fn articles_published_channel(&self) -> String;

    /// Sorted set article id → position: publications in the order they were announced, 1, 2,
    /// 3…, the newest `PULSE_REPLAY_LIMIT` kept, plus the member `epoch` scored -epoch, which names
    /// this run of positions. What a resumed `articlePublished` replays (see
    /// `lua/article_announce.lua`).
    fn articles_journal(&self) -> String;

    /// Pub/sub channel told whenever one of an article's counters (views, likes, comments) moves.
    fn article_stats_channel(&self, article: i64) -> String;
}

impl ArticleKeys for Keys {
    fn articles_published_channel(&self) -> String {
        format!("{}events:articles:published", self.prefix())
    }

    fn articles_journal(&self) -> String {
        format!("{}articles:journal", self.prefix())
    }

    fn article_stats_channel(&self, article: i64) -> String {
        format!("{}events:article-stats:{article}", self.prefix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_carry_the_prefix() {
        let keys = Keys::new("t1:");
        assert!(keys.articles_published_channel().starts_with("t1:"));
        assert!(keys.articles_journal().starts_with("t1:"));
        assert!(keys.article_stats_channel(4).starts_with("t1:"));
        assert_ne!(keys.article_stats_channel(4), keys.article_stats_channel(5));
    }
}
