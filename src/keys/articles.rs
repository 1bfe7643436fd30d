//! Articles: the live channels of publications and of an article's counters.

use super::{Keys, LikeKeys as _, ViewKeys as _};

/// The hash tag of the journal of publications and of their channel: the announcing script
/// touches both, so on a cluster it publishes with `SPUBLISH` in the journal's slot.
const PUBLICATIONS_TAG: &str = "{pub}";

pub trait ArticleKeys {
    /// Pub/sub channel announcing newly published articles, in the slot of
    /// [`Self::articles_journal`] (`SPUBLISH` on a cluster).
    fn articles_published_channel(&self) -> String;

    /// Sorted set article id → position: publications in the order they were announced, 1, 2,
    /// 3…, the newest `PULSE_REPLAY_LIMIT` kept, plus the member `epoch` scored -epoch, which names
    /// this run of positions. What a resumed `articlePublished` replays (see
    /// `lua/article_announce.lua`).
    fn articles_journal(&self) -> String;

    /// The pub/sub channels told whenever one of an article's counters moves: its view shard's
    /// (views) and its like shard's (likes and comments). The scripts that count views and likes
    /// each announce in their own slot, so on a cluster a change is carried by that slot's node
    /// only (`SPUBLISH`) instead of by every node, and a watcher of the article listens to both.
    fn article_stats_channels(&self, article: i64) -> Vec<String>;
}

impl ArticleKeys for Keys {
    fn articles_published_channel(&self) -> String {
        format!(
            "{}events:articles:published:{PUBLICATIONS_TAG}",
            self.prefix()
        )
    }

    fn articles_journal(&self) -> String {
        format!("{}articles:journal:{PUBLICATIONS_TAG}", self.prefix())
    }

    fn article_stats_channels(&self, article: i64) -> Vec<String> {
        vec![
            self.view_shard(article).article_stats_channel(article),
            self.like_shard(article).article_stats_channel(article),
        ]
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
        for name in [keys.articles_published_channel(), keys.articles_journal()] {
            assert_eq!(name.matches('{').count(), 1, "{name} has more than one tag");
            assert!(
                name.ends_with(":{pub}"),
                "{name} is not in the journal's slot"
            );
        }
        let channels = keys.article_stats_channels(4);
        assert_eq!(channels.len(), 2);
        assert!(channels.iter().all(|channel| channel.starts_with("t1:")));
        assert_ne!(channels[0], channels[1]);
        assert!(
            keys.article_stats_channels(5)
                .iter()
                .all(|channel| !channels.contains(channel))
        );
    }
}
