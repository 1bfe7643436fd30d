//! The replica's view and like counts, kept beside the Tantivy index rather than in its
//! documents: a count change is a write to this table, not a delete and re-add of a document
//! (whose title and body jieba would segment again) nor a segment for the merges to rewrite.
//!
//! The table is immutable once published: a change makes a new table that shares every chunk it
//! does not touch, so a searcher kept for a walk's cursors keeps the counts it ranked by while
//! newer tables replace it.

use std::collections::HashMap;
use std::sync::Arc;

/// Articles per chunk: a change copies the chunks it touches (4 KiB each).
const CHUNK: i64 = 256;

/// Views and likes of one article.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub views: i64,
    pub likes: i64,
}

/// Counts by article id, in chunks of consecutive ids (SQL ids are dense, so a million articles
/// take about 3,900 chunks; a sparse id costs one chunk of its own).
#[derive(Clone, Debug, Default)]
pub struct CountTable {
    chunks: HashMap<i64, Arc<[Counts; CHUNK as usize]>>,
}

fn slot(id: i64) -> (i64, usize) {
    (id.div_euclid(CHUNK), id.rem_euclid(CHUNK) as usize)
}

impl CountTable {
    /// An article's counts; zero for one the table does not hold.
    pub fn get(&self, id: i64) -> Counts {
        let (chunk, at) = slot(id);
        self.chunks
            .get(&chunk)
            .map_or_else(Counts::default, |chunk| chunk[at])
    }

    /// A table with `changes` applied (`None`: the article is gone), sharing the untouched chunks
    /// with this one.
    pub fn with(&self, changes: impl IntoIterator<Item = (i64, Option<Counts>)>) -> Self {
        let mut next = self.clone();
        for (id, counts) in changes {
            let (chunk, at) = slot(id);
            let chunk = next
                .chunks
                .entry(chunk)
                .or_insert_with(|| Arc::new([Counts::default(); CHUNK as usize]));
            Arc::make_mut(chunk)[at] = counts.unwrap_or_default();
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_table_shares_what_it_does_not_change_and_leaves_the_old_one_as_it_was() {
        let old = CountTable::default().with(HashMap::from([
            (1, Some(Counts { views: 5, likes: 1 })),
            (1_000, Some(Counts { views: 7, likes: 0 })),
        ]));
        let new = old.with(HashMap::from([
            (1, Some(Counts { views: 6, likes: 1 })),
            (2, Some(Counts { views: 1, likes: 2 })),
        ]));
        assert_eq!(old.get(1), Counts { views: 5, likes: 1 });
        assert_eq!(old.get(2), Counts::default());
        assert_eq!(new.get(1), Counts { views: 6, likes: 1 });
        assert_eq!(new.get(2), Counts { views: 1, likes: 2 });
        assert_eq!(new.get(1_000), Counts { views: 7, likes: 0 });
        assert!(Arc::ptr_eq(
            &old.chunks[&slot(1_000).0],
            &new.chunks[&slot(1_000).0]
        ));
        let gone = new.with([(1, None)]);
        assert_eq!(gone.get(1), Counts::default());
        assert_eq!(gone.get(-3), Counts::default());
    }
}
