//! The analyzers of the search index: Chinese words by jieba-rs (its dictionary plus an HMM for
//! words it lacks), English and other alphabetic runs as whole words, both lowercased and then
//! stemmed by tantivy's English (Snowball) stemmer, which leaves Han characters alone.
//!
//! Why our own adapter over jieba-rs rather than `tantivy-jieba` (0.21, which does build against
//! tantivy 0.27's tokenizer API 0.7): its positions are character offsets, so two consecutive words
//! are not consecutive positions and phrase queries (`"浏览量 计数"`, `"view counting"`) never
//! match; and it hands whitespace and punctuation to the index as tokens. This adapter numbers
//! words (0, 1, 2, … skipping whitespace and punctuation), and puts the dictionary's sub-words of
//! a long word (search mode: 浏览 and 浏览量 of 浏览量) at the position of the word they are part
//! of. Documents are analysed in search mode, queries in default mode, so that a query's longer
//! word finds the document's, and its shorter words find the sub-words.

use std::sync::{Arc, LazyLock};

use jieba_rs::{Jieba, TokenizeMode};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, Stemmer, TextAnalyzer, Token, TokenStream, Tokenizer,
};

/// The analyzer name of the indexed text fields.
pub const DOCUMENT_ANALYZER: &str = "zh_en_words";

/// Tokens longer than this (in bytes) are dropped: no one searches for them, and they bloat the
/// term dictionary.
const LONGEST_TOKEN: usize = 64;

/// The dictionary is loaded once per process (a few MB, some 100 ms), on first use.
static JIEBA: LazyLock<Arc<Jieba>> = LazyLock::new(|| Arc::new(Jieba::new()));

/// How a text is segmented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Words plus their dictionary sub-words: what documents are indexed with.
    Document,
    /// Words alone: what queries are cut into.
    Query,
    /// As `Document`, but every sub-word carries the offsets of its whole word: tantivy's snippet
    /// generator needs offsets that never go back (it underflows otherwise), and a match on a
    /// sub-word then highlights its word.
    Snippet,
}

#[derive(Clone)]
pub struct WordTokenizer {
    jieba: Arc<Jieba>,
    mode: Mode,
}

impl WordTokenizer {
    fn new(mode: Mode) -> Self {
        Self {
            jieba: JIEBA.clone(),
            mode,
        }
    }
}

pub struct WordStream {
    tokens: Vec<Token>,
    next: usize,
}

impl TokenStream for WordStream {
    fn advance(&mut self) -> bool {
        self.next += 1;
        self.next <= self.tokens.len()
    }

    fn token(&self) -> &Token {
        &self.tokens[self.next - 1]
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.next - 1]
    }
}

impl Tokenizer for WordTokenizer {
    type TokenStream<'a> = WordStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> WordStream {
        let jieba_mode = match self.mode {
            Mode::Document | Mode::Snippet => TokenizeMode::Search,
            Mode::Query => TokenizeMode::Default,
        };
        let cut = self.jieba.tokenize(text, jieba_mode, true);
        // In search mode a word's sub-words come just before it and lie inside it: walking back
        // from the end, a token outside the last whole word seen is the next whole word.
        let mut whole_words = vec![false; cut.len()];
        let mut words = vec![0..0; cut.len()];
        let mut word = usize::MAX..usize::MAX;
        for (index, token) in cut.iter().enumerate().rev() {
            if !(word.start <= token.byte_start && token.byte_end <= word.end) {
                whole_words[index] = true;
                word = token.byte_start..token.byte_end;
            }
            words[index] = word.clone();
        }
        let mut tokens = Vec::with_capacity(cut.len());
        let mut position = 0;
        for ((token, whole_word), word) in cut.iter().zip(whole_words).zip(words) {
            if token.word.chars().any(char::is_alphanumeric) {
                let offsets = match self.mode {
                    Mode::Snippet => word,
                    Mode::Document | Mode::Query => token.byte_start..token.byte_end,
                };
                tokens.push(Token {
                    offset_from: offsets.start,
                    offset_to: offsets.end,
                    position,
                    text: token.word.to_owned(),
                    position_length: 1,
                });
                if whole_word {
                    position += 1;
                }
            }
        }
        WordStream { tokens, next: 0 }
    }
}

fn analyzer(mode: Mode) -> TextAnalyzer {
    TextAnalyzer::builder(WordTokenizer::new(mode))
        .filter(RemoveLongFilter::limit(LONGEST_TOKEN))
        .filter(LowerCaser)
        .filter(Stemmer::new(Language::English))
        .build()
}

/// What title and body are indexed with.
pub fn document_analyzer() -> TextAnalyzer {
    analyzer(Mode::Document)
}

/// What snippets are cut with: see [`Mode::Snippet`].
pub fn snippet_analyzer() -> TextAnalyzer {
    analyzer(Mode::Snippet)
}

/// What a query's words are cut with.
pub fn query_analyzer() -> TextAnalyzer {
    analyzer(Mode::Query)
}

/// The terms of `text` with their positions, as `analyzer` makes them.
pub fn terms(analyzer: &mut TextAnalyzer, text: &str) -> Vec<(usize, String)> {
    let mut stream = analyzer.token_stream(text);
    let mut terms = Vec::new();
    while let Some(token) = stream.next() {
        terms.push((token.position, token.text.clone()));
    }
    terms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(analyzer: &mut TextAnalyzer, text: &str) -> Vec<String> {
        terms(analyzer, text).into_iter().map(|(_, t)| t).collect()
    }

    const TITLE: &str = "高并发文章浏览量计数";

    #[test]
    fn a_chinese_title_is_found_by_its_words() {
        let indexed = words(&mut document_analyzer(), TITLE);
        for query in ["浏览量", "计数"] {
            let asked = words(&mut query_analyzer(), query);
            assert!(!asked.is_empty(), "{query} cuts into no words");
            for word in &asked {
                assert!(
                    indexed.contains(word),
                    "{word} (of {query}) is not among {indexed:?}"
                );
            }
        }
    }

    #[test]
    fn english_words_are_stemmed_on_both_sides() {
        let indexed = words(&mut document_analyzer(), "Counting views, at scale");
        assert_eq!(indexed, ["count", "view", "at", "scale"]);
        assert_eq!(words(&mut query_analyzer(), "count"), ["count"]);
        assert_eq!(words(&mut query_analyzer(), "COUNTED"), ["count"]);
    }

    #[test]
    fn positions_number_words_and_skip_punctuation() {
        let positions: Vec<usize> = terms(&mut query_analyzer(), "view, counting!  fast")
            .into_iter()
            .map(|(position, _)| position)
            .collect();
        assert_eq!(positions, [0, 1, 2]);
    }

    #[test]
    fn sub_words_share_the_position_of_their_word() {
        let terms = terms(&mut document_analyzer(), "中华人民共和国 成立");
        let last = terms.last().unwrap();
        assert_eq!(last.1, "成立");
        assert_eq!(last.0, 1, "{terms:?}");
        assert!(terms.iter().filter(|(position, _)| *position == 0).count() > 1);
    }

    #[test]
    fn snippet_offsets_never_go_back() {
        let mut analyzer = snippet_analyzer();
        let mut stream = analyzer.token_stream("中华人民共和国成立 counting 高并发文章浏览量计数");
        let mut last = 0..0;
        while let Some(token) = stream.next() {
            assert!(token.offset_from >= last.start && token.offset_to >= last.end);
            last = token.offset_from..token.offset_to;
        }
        assert!(last.end > 0);
    }

    #[test]
    fn mixed_text_keeps_both_scripts() {
        let indexed = words(&mut document_analyzer(), "Redis计数器 flushing");
        assert!(indexed.contains(&"redi".to_owned()) || indexed.contains(&"redis".to_owned()));
        assert!(indexed.contains(&"flush".to_owned()), "{indexed:?}");
    }
}
