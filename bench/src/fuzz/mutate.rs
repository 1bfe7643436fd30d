//! Mutations of a corpus of valid documents: the README's examples (read at build time, so the
//! corpus follows the documentation) and the operations the tests and the load tool send.

use rand::Rng;
use rand::seq::IndexedRandom as _;

const README: &str = include_str!("../../../README.md");

const EXTRA: &[&str] = &[
    "mutation($h:String!,$p:String!){ signUp(handle:$h,password:$p){ token user { id handle isAdmin } } }",
    r#"mutation($t:String!){ publishArticle(input:{title:$t, body:"bench"}){ id title author { handle } } }"#,
    "mutation($a:ID!){ recordView(articleId:$a){ counted skipReason viewCount article { id } } }",
    r#"mutation { editArticle(id: "QXJ0aWNsZTox", input: { title: "t" }) { id updatedAt } }"#,
    "query($c:String){ articles(first:100, after:$c){ edges{ cursor node{ viewCount } } pageInfo{ hasNextPage endCursor } } }",
    "{ viewer { id handle articles(first: 3) { nodes { id title viewCount } } } }",
    "subscription { articlePublished { title author { handle } } }",
    "subscription($a: ID) { articlePublished(authorId: $a) { id } }",
    "query Q($b: Boolean! = true) { viewer @include(if: $b) { ...U } } fragment U on User { id handle }",
];

/// The GraphQL blocks of the README, and the extra operations.
pub fn corpus() -> Vec<String> {
    let mut documents: Vec<String> = README
        .split("```graphql")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .map(|block| block.trim().to_owned())
        .filter(|block| !block.is_empty())
        .collect();
    documents.extend(EXTRA.iter().map(|document| (*document).to_owned()));
    documents
}

/// Bytes that matter to GraphQL's grammar.
const PUNCTUATION: &[u8] = b"{}[]()$@!:=.|&\"\\#,\n ";

/// Applies one to eight random edits to `document`, splicing from `corpus`. Never panics, for any
/// input including empty ones.
pub fn mutate(rng: &mut impl Rng, document: &[u8], corpus: &[String]) -> Vec<u8> {
    let mut bytes = document.to_vec();
    for _ in 0..rng.random_range(1..=8) {
        let len = bytes.len();
        let at = rng.random_range(0..=len);
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let index = rng.random_range(0..len);
                bytes[index] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let index = rng.random_range(0..len);
                bytes[index] = *PUNCTUATION.choose(rng).expect("not empty");
            }
            2 => bytes.insert(at, *PUNCTUATION.choose(rng).expect("not empty")),
            3 if at < len => {
                let end = rng.random_range(at..=len);
                bytes.drain(at..end);
            }
            4 if at < len => {
                let end = rng.random_range(at..=len.min(at + 200));
                let range = bytes[at..end].to_vec();
                let times = rng.random_range(1..=50);
                for _ in 0..times {
                    bytes.splice(at..at, range.iter().copied());
                }
            }
            5 => {
                if let Some(other) = corpus.choose(rng).filter(|other| !other.is_empty()) {
                    let other = other.as_bytes();
                    let start = rng.random_range(0..other.len());
                    let end = rng.random_range(start..=other.len());
                    bytes.splice(at..at, other[start..end].iter().copied());
                }
            }
            6 => {
                // Unbalance the brackets: drop one, or add a run of openers or closers.
                if let Some(index) = bytes.iter().position(|byte| b"{}[]()".contains(byte))
                    && rng.random_bool(0.5)
                {
                    bytes.remove(index);
                } else {
                    let bracket = *b"{}[]()".choose(rng).expect("not empty");
                    let run = rng.random_range(1..=100);
                    bytes.splice(at..at, std::iter::repeat_n(bracket, run));
                }
            }
            _ => bytes.truncate(at),
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn the_corpus_holds_the_readme_examples() {
        let corpus = corpus();
        assert!(
            corpus
                .iter()
                .any(|document| document.starts_with("mutation SignUp")),
            "{corpus:?}"
        );
        for document in &corpus {
            async_graphql_parser::parse_query(document)
                .unwrap_or_else(|err| panic!("{err}: {document}"));
        }
    }

    #[test]
    fn mutating_never_panics_on_any_input() {
        let corpus = corpus();
        let mut rng = StdRng::seed_from_u64(1);
        let mut inputs: Vec<Vec<u8>> = vec![Vec::new(), vec![b'{'], vec![0xff; 3]];
        inputs.extend(corpus.iter().map(|document| document.as_bytes().to_vec()));
        for _ in 0..2000 {
            let input = inputs.choose(&mut rng).expect("not empty").clone();
            let mutated = mutate(&mut rng, &input, &corpus);
            inputs.push(mutated);
            if inputs.len() > 200 {
                inputs.swap_remove(3);
            }
        }
        mutate(&mut rng, b"", &[]);
        mutate(&mut rng, b"", &[String::new()]);
    }
}
