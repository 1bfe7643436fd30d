//! A search query as a client types it: plain words and `"quoted phrases"`, never the engine's
//! syntax. Operators, field names, wildcards and brackets are punctuation here: the analyzer drops
//! them, so no input can build a query the engine would reject or find expensive. An unbalanced
//! quote opens a phrase that runs to the end. The text is bounded before any work: at most
//! [`MAX_QUERY_CHARS`] characters and [`MAX_CLAUSES`] words and phrases.

use tantivy::tokenizer::TextAnalyzer;

use super::tokenizer::{query_analyzer, terms};
use crate::error::{AppError, AppResult};

pub const MAX_QUERY_CHARS: usize = 256;
pub const MAX_CLAUSES: usize = 16;
/// Most words of one phrase: longer phrases are cut, since positions past it add little.
const MAX_PHRASE_WORDS: usize = 16;

/// A parsed query: clauses that must all match, each a word or a phrase given as its analysed
/// terms with their relative positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchQuery {
    clauses: Vec<Vec<(usize, String)>>,
}

impl SearchQuery {
    /// `BAD_USER_INPUT` for a query that is blank, too long or has too many words; a query whose
    /// words are all punctuation parses, and matches nothing.
    pub fn parse(raw: &str) -> AppResult<Self> {
        let chars = raw.chars().count();
        if chars > MAX_QUERY_CHARS {
            return Err(AppError::bad_input(
                "query",
                format!("the query has {chars} characters; at most {MAX_QUERY_CHARS} are searched"),
            ));
        }
        // Control characters (NUL included) separate words like spaces do.
        let text: String = raw
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if text.trim().is_empty() {
            return Err(AppError::bad_input("query", "the query is empty"));
        }
        let mut analyzer = query_analyzer();
        let mut clauses = Vec::new();
        for (quoted, part) in text.split('"').enumerate().map(|(i, p)| (i % 2 == 1, p)) {
            if quoted {
                push_clause(&mut clauses, &mut analyzer, part);
            } else {
                for word in part.split_whitespace() {
                    push_clause(&mut clauses, &mut analyzer, word);
                }
            }
            if clauses.len() > MAX_CLAUSES {
                return Err(AppError::bad_input(
                    "query",
                    format!("the query has more than {MAX_CLAUSES} words and phrases"),
                ));
            }
        }
        clauses.dedup();
        Ok(Self { clauses })
    }

    pub fn clauses(&self) -> &[Vec<(usize, String)>] {
        &self.clauses
    }
}

/// A word that the analyzer cuts into several (a Chinese run, `e-mail`) is a phrase of them.
fn push_clause(clauses: &mut Vec<Vec<(usize, String)>>, analyzer: &mut TextAnalyzer, text: &str) {
    let mut terms = terms(analyzer, text);
    terms.truncate(MAX_PHRASE_WORDS);
    let Some(&(first, _)) = terms.first() else {
        return;
    };
    for term in &mut terms {
        term.0 -= first;
    }
    clauses.push(terms);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(raw: &str) -> Vec<Vec<String>> {
        SearchQuery::parse(raw)
            .unwrap()
            .clauses
            .into_iter()
            .map(|clause| clause.into_iter().map(|(_, word)| word).collect())
            .collect()
    }

    /// `-views)^2` is one run of text, so its two words make a phrase.
    #[test]
    fn engine_syntax_is_punctuation() {
        assert_eq!(
            words("title:rust AND (count* OR -views)^2 ~ [a TO z]"),
            [
                vec!["titl", "rust"],
                vec!["and"],
                vec!["count"],
                vec!["or"],
                vec!["view", "2"],
                vec!["a"],
                vec!["to"],
                vec!["z"],
            ]
        );
    }

    #[test]
    fn quotes_make_phrases_and_an_unbalanced_one_runs_to_the_end() {
        assert_eq!(
            words(r#"fast "view counting" "open ended"#),
            [vec!["fast"], vec!["view", "count"], vec!["open", "end"]]
        );
    }

    #[test]
    fn blank_long_and_wordy_queries_are_refused() {
        for raw in ["", "   ", "\0\0"] {
            assert!(SearchQuery::parse(raw).is_err(), "{raw:?}");
        }
        assert!(SearchQuery::parse(&"a".repeat(MAX_QUERY_CHARS + 1)).is_err());
        assert!(SearchQuery::parse(&"w ".repeat(MAX_CLAUSES + 1)).is_err());
    }

    #[test]
    fn punctuation_alone_parses_into_nothing() {
        assert!(SearchQuery::parse("+-&& || !").unwrap().clauses.is_empty());
    }
}
