//! A board as ranked for reading: every option of the poll (one the board has not seen yet
//! scores 0), best first, ties by option id; ranks by the poll's tie policy; the standing of one
//! option against the one ahead; and keyset pages over the ranking.

use std::collections::HashMap;

use pulse_runtime::error::{AppError, AppResult};
use pulse_runtime::pagination::{Cursor, Position, SortKey, Walk};

/// How tied options are ranked: 1, 2, 3 (ORDINAL, ties by option id), 1, 1, 2 (DENSE) or 1, 1, 3
/// (COMPETITION).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TiePolicy {
    Ordinal,
    Dense,
    Competition,
}

impl TiePolicy {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ordinal => "ORDINAL",
            Self::Dense => "DENSE",
            Self::Competition => "COMPETITION",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Ordinal, Self::Dense, Self::Competition]
            .into_iter()
            .find(|policy| policy.name() == name)
    }
}

/// One option's place on a board.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ranked {
    pub option: i64,
    pub score: f64,
    pub rank: i64,
}

/// Every option of `options` ranked by its score on the board (`scores`), best first.
pub fn rank(scores: &HashMap<i64, f64>, options: &[i64], policy: TiePolicy) -> Vec<Ranked> {
    let mut ordered: Vec<(i64, f64)> = options
        .iter()
        .map(|&option| (option, scores.get(&option).copied().unwrap_or(0.0)))
        .collect();
    ordered.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut ranked: Vec<Ranked> = Vec::with_capacity(ordered.len());
    for (index, (option, score)) in ordered.into_iter().enumerate() {
        let rank = match ranked.last() {
            Some(last) if last.score == score && policy != TiePolicy::Ordinal => last.rank,
            Some(last) if policy == TiePolicy::Dense => last.rank + 1,
            _ => index as i64 + 1,
        };
        ranked.push(Ranked {
            option,
            score,
            rank,
        });
    }
    ranked
}

/// The option ranked just ahead of the one at `index`, and the score it leads by. Under DENSE and
/// COMPETITION a tied option is not ahead: the one ahead is the nearest with a better rank.
pub fn ahead(ranked: &[Ranked], index: usize) -> Option<(Ranked, f64)> {
    let own = ranked.get(index)?;
    ranked[..index]
        .iter()
        .rev()
        .find(|other| other.rank < own.rank)
        .map(|other| (*other, other.score - own.score))
}

/// The walk of a board's pages; its cursors carry the score and the option.
pub const LEADERBOARD: Walk = Walk("leaderboard");

/// A board score as a cursor key; Rust's shortest round-trip form, so the position is exact.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score(pub f64);

impl SortKey for Score {
    fn write(&self) -> String {
        self.0.to_string()
    }

    fn read(raw: &str) -> Option<Self> {
        raw.parse::<f64>()
            .ok()
            .filter(|score| score.is_finite())
            .map(Score)
    }
}

pub fn cursor(entry: &Ranked) -> String {
    Cursor::encode(
        LEADERBOARD,
        &Position {
            key: Score(entry.score),
            id: entry.option,
        },
    )
    .into_string()
}

/// Which slice of `ranked` a page covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub end: usize,
}

impl Window {
    pub fn has_previous(&self) -> bool {
        self.start > 0
    }

    pub fn has_next(&self, ranked: &[Ranked]) -> bool {
        self.end < ranked.len()
    }
}

/// The page of `first` entries after the cursor `after`, or centred on the option `around`, or
/// from the top. A cursor names a position, not an index: entries that moved since are neither
/// repeated nor skipped relative to it.
pub fn page(
    ranked: &[Ranked],
    first: usize,
    after: Option<&str>,
    around: Option<i64>,
) -> AppResult<Window> {
    let start = match (after, around) {
        (Some(_), Some(_)) => {
            return Err(AppError::bad_input(
                "around",
                "give either after or around, not both",
            ));
        }
        (Some(raw), None) => {
            let position = Cursor::decode::<Score>(LEADERBOARD, raw)?;
            ranked.partition_point(|entry| {
                entry
                    .score
                    .total_cmp(&position.key.0)
                    .reverse()
                    .then(entry.option.cmp(&position.id))
                    .is_le()
            })
        }
        (None, Some(option)) => {
            let index = ranked
                .iter()
                .position(|entry| entry.option == option)
                .ok_or_else(|| AppError::bad_input("around", "not an option of this poll"))?;
            index
                .saturating_sub(first / 2)
                .min(ranked.len().saturating_sub(first))
        }
        (None, None) => 0,
    };
    Ok(Window {
        start,
        end: (start + first).min(ranked.len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> (HashMap<i64, f64>, Vec<i64>) {
        let scores = HashMap::from([(1, 10.0), (2, 30.0), (3, 30.0), (4, 10.0), (5, 5.0)]);
        (scores, vec![1, 2, 3, 4, 5, 6])
    }

    fn ranks(policy: TiePolicy) -> Vec<(i64, i64)> {
        let (scores, options) = board();
        rank(&scores, &options, policy)
            .into_iter()
            .map(|entry| (entry.option, entry.rank))
            .collect()
    }

    #[test]
    fn tie_policies_rank_ties_as_documented() {
        assert_eq!(
            ranks(TiePolicy::Ordinal),
            vec![(2, 1), (3, 2), (1, 3), (4, 4), (5, 5), (6, 6)]
        );
        assert_eq!(
            ranks(TiePolicy::Dense),
            vec![(2, 1), (3, 1), (1, 2), (4, 2), (5, 3), (6, 4)]
        );
        assert_eq!(
            ranks(TiePolicy::Competition),
            vec![(2, 1), (3, 1), (1, 3), (4, 3), (5, 5), (6, 6)]
        );
    }

    #[test]
    fn the_option_ahead_is_the_nearest_with_a_better_rank() {
        let (scores, options) = board();
        let dense = rank(&scores, &options, TiePolicy::Dense);
        let (leader, gap) = ahead(&dense, 3).unwrap();
        assert_eq!((leader.option, gap), (3, 20.0));
        assert!(ahead(&dense, 1).is_none());
        let ordinal = rank(&scores, &options, TiePolicy::Ordinal);
        let (leader, gap) = ahead(&ordinal, 1).unwrap();
        assert_eq!((leader.option, gap), (2, 0.0));
    }

    #[test]
    fn keyset_pages_and_around_cover_every_option_once() {
        let (scores, options) = board();
        let ranked = rank(&scores, &options, TiePolicy::Competition);
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let window = page(&ranked, 4, after.as_deref(), None).unwrap();
            seen.extend(ranked[window.start..window.end].iter().map(|e| e.option));
            if !window.has_next(&ranked) {
                break;
            }
            after = Some(cursor(&ranked[window.end - 1]));
        }
        assert_eq!(seen, vec![2, 3, 1, 4, 5, 6]);
        let centred = page(&ranked, 3, None, Some(4)).unwrap();
        assert_eq!((centred.start, centred.end), (2, 5));
        let at_bottom = page(&ranked, 3, None, Some(6)).unwrap();
        assert_eq!((at_bottom.start, at_bottom.end), (3, 6));
        assert!(page(&ranked, 3, None, Some(99)).is_err());
    }
}
