//! Hostile shapes: documents and variables built to hurt a parser, a validator or an executor —
//! deep nesting, fragment bombs and cycles, thousands of aliases or directives, huge literals and
//! names, awkward unicode, bytes that are not UTF-8 or not JSON.

use std::fmt::Write as _;

use rand::Rng;
use rand::seq::IndexedRandom as _;

use super::generate::{Operation, json_string};

/// The server refuses bodies past 256 KiB; most hostile bodies stay below, so they reach GraphQL.
pub const BODY_BUDGET: usize = 250 * 1024;

/// Characters that trip up text handling: 4-byte, combining, right-to-left, zero-width, BOM,
/// controls.
const AWKWARD: &[&str] = &[
    "😀",
    "𝕏",
    "𐍈",
    "é",
    "e\u{301}",
    "\u{202e}",
    "\u{200f}",
    "\u{200b}",
    "\u{feff}",
    "\u{7f}",
    "\u{1}",
    "\t",
    "ﷺ",
    "漢",
    "Ω",
    "\u{10ffff}",
    "\u{fffd}",
    "a",
];

/// `len` pieces of awkward text (valid UTF-8; NUL only through escapes elsewhere).
pub fn unicode_text(rng: &mut impl Rng, len: usize) -> String {
    (0..len)
        .map(|_| *AWKWARD.choose(rng).expect("not empty"))
        .collect()
}

/// A nesting depth, mostly small, up to thousands: where parsers recurse.
fn depth(rng: &mut impl Rng) -> usize {
    match rng.random_range(0..4) {
        0 => rng.random_range(10..100),
        1 => rng.random_range(100..1000),
        _ => rng.random_range(1000..8000),
    }
}

/// `[[[…1…]]]` or `{a: {a: …1…}}` nested `depth` deep.
fn nested_value(rng: &mut impl Rng, depth: usize) -> String {
    let (open, close) = if rng.random_bool(0.5) {
        ("[", "]")
    } else {
        ("{a: ", "}")
    };
    format!("{}1{}", open.repeat(depth), close.repeat(depth))
}

pub fn nesting(rng: &mut impl Rng) -> Operation {
    let depth = depth(rng);
    let value = nested_value(rng, depth);
    let query = match rng.random_range(0..6) {
        0 => format!("{{ article(id: {value}) {{ id }} }}"),
        1 => format!("query($v: ID = {value}) {{ article(id: $v) {{ id }} }}"),
        2 => format!("{{ viewer @include(if: {value}) {{ id }} }}"),
        3 => format!("{{ topArticles(first: {value}) {{ rank }} }}"),
        4 => format!("{}{}", "{ viewer ".repeat(depth), "}".repeat(depth)),
        _ => format!(
            "{{ node(id: \"x\") {}id{} }}",
            "{ ... on User ".repeat(depth),
            " }".repeat(depth)
        ),
    };
    Operation::new(query)
}

pub fn fragments(rng: &mut impl Rng) -> Operation {
    let mut query = String::new();
    if rng.random_bool(0.3) {
        // A spread cycle, direct or through a few fragments.
        let length = rng.random_range(1..=4);
        query.push_str("{ ...C0 }\n");
        for index in 0..length {
            let next = (index + 1) % length;
            writeln!(
                query,
                "fragment C{index} on Query {{ __typename ...C{next} }}"
            )
            .expect("writing to a String");
        }
        return Operation::new(query);
    }
    // Each fragment spreads the next two or three times: the expansion is exponential.
    let levels = rng.random_range(2..=30);
    let spreads = rng.random_range(2..=3);
    query.push_str("query Bomb { ...F0 }\n");
    for level in 0..levels {
        write!(query, "fragment F{level} on Query {{ __typename").expect("writing to a String");
        if level + 1 < levels {
            for _ in 0..spreads {
                write!(query, " ...F{}", level + 1).expect("writing to a String");
            }
        }
        query.push_str(" }\n");
    }
    Operation::new(query)
}

pub fn aliases(rng: &mut impl Rng) -> Operation {
    let count = rng.random_range(1000..=20_000);
    let mut query = String::from("{");
    match rng.random_range(0..6) {
        0 => (0..count)
            .for_each(|index| write!(query, " a{index}: __typename").expect("writing to a String")),
        1 => (0..count / 4).for_each(|index| {
            write!(query, " a{index}: viewer {{ id }}").expect("writing to a String")
        }),
        2 => {
            query.push_str(" viewer");
            query.push_str(&" @skip(if: false)".repeat(count / 4));
            query.push_str(" { id }");
        }
        // An error per field: duplicate or unknown directives, unknown fields. (async-graphql
        // does not check directives on `__typename`, hence `viewer`.)
        3 => (0..count / 4).for_each(|index| {
            write!(
                query,
                " a{index}: viewer @skip(if: false) @skip(if: false) {{ id }}"
            )
            .expect("writing to a String")
        }),
        4 => (0..count / 4).for_each(|index| {
            write!(query, " a{index}: viewer @fuzz {{ id }}").expect("writing to a String")
        }),
        5 => (0..count / 4).for_each(|index| {
            write!(query, " a{index}: noSuchField").expect("writing to a String")
        }),
        _ => (0..count / 2).for_each(|_| query.push_str(" __typename")),
    }
    query.push_str(" }");
    Operation::new(query)
}

/// A huge string, number or block string where the schema expects a value.
pub fn literals(rng: &mut impl Rng) -> Operation {
    let size = rng.random_range(1_000..BODY_BUDGET / 2);
    let literal = match rng.random_range(0..6) {
        0 => json_string(&"x".repeat(size)),
        1 => "9".repeat(size),
        2 => format!("-0.{}e-{}", "1".repeat(size), "9".repeat(20)),
        3 => format!("1e{}", "9".repeat(size.min(5000))),
        4 => format!("\"\"\"{}\"\"\"", "line \\\"\"\" \n".repeat(size / 12)),
        _ => json_string(&unicode_text(rng, size / 4)),
    };
    let query = match rng.random_range(0..4) {
        0 => format!("{{ article(id: {literal}) {{ id }} }}"),
        1 => format!("{{ articles(first: {literal}) {{ nodes {{ id }} }} }}"),
        2 => format!(
            "mutation {{ publishArticle(input: {{ title: {literal}, body: {literal} }}) {{ id }} }}"
        ),
        _ => format!("{{ user(handle: {literal}) {{ id }} }}"),
    };
    Operation::new(query)
}

/// Long and many operation names; the name may be missing from the document.
pub fn names(rng: &mut impl Rng) -> Operation {
    let length = rng.random_range(64..BODY_BUDGET / 2);
    let name = format!("N{}{}", rng.random::<u32>(), "n".repeat(length));
    let query = format!("query {name} {{ __typename }}");
    let operation_name = if rng.random_bool(0.7) {
        name
    } else {
        format!("Other{}", "o".repeat(length))
    };
    Operation {
        query,
        variables: None,
        operation_name: Some(operation_name),
    }
}

/// GraphQL escapes the server must decode: NUL, lone surrogates, surrogate pairs, out of range.
const ESCAPES: &[&str] = &[
    "\\u0000",
    "\\ud800",
    "\\udfff",
    "\\ud83d\\ude00",
    "\\u{1F600}",
    "\\u{110000}",
    "\\u{0}",
    "\\uZZZZ",
    "\\x41",
    "\\",
    "\\n",
    "\\\"",
];

pub fn unicode(rng: &mut impl Rng) -> Operation {
    let mut text = String::new();
    for _ in 0..rng.random_range(1..200) {
        if rng.random_bool(0.3) {
            text.push_str(ESCAPES.choose(rng).expect("not empty"));
        } else {
            text.push_str(AWKWARD.choose(rng).expect("not empty"));
        }
    }
    let query = match rng.random_range(0..6) {
        0 => format!("{{ user(handle: \"{text}\") {{ id }} }}"),
        1 => format!(
            "mutation {{ publishArticle(input: {{ title: \"{text}\", body: \"\"\"{text}\"\"\" }}) {{ id title body }} }}"
        ),
        2 => format!("# {text}\n{{ viewer {{ id }} }} # {text}"),
        3 => format!("{{ article(id: \"{text}\") {{ id }} }}"),
        4 => format!("{{ {} }}", unicode_text(rng, 5)),
        _ => format!("mutation {{ signUp(handle: \"{text}\", password: \"{text}\") {{ token }} }}"),
    };
    Operation::new(query)
}

/// Variables of random types, deeply nested or huge, for operations that declare some.
pub fn variables(rng: &mut impl Rng, max_depth: usize) -> Operation {
    let query = *[
        "query($id: ID!) { article(id: $id) { id } }",
        "query($first: Int, $after: String) { articles(first: $first, after: $after) { nodes { id } } }",
        "mutation($input: PublishArticleInput!) { publishArticle(input: $input) { id } }",
        "query($by: ArticleMetric!, $w: RankingWindow!) { topArticles(by: $by, window: $w) { rank } }",
        "query($b: Boolean!) { viewer @include(if: $b) { id } }",
    ]
    .choose(rng)
    .expect("not empty");
    let names = ["id", "first", "after", "input", "by", "w", "b", "extra"];
    let mut variables = String::from("{");
    for name in names {
        if rng.random_bool(0.5) {
            continue;
        }
        if variables.len() > 1 {
            variables.push(',');
        }
        write!(variables, "\"{name}\":{}", json_value(rng, max_depth))
            .expect("writing to a String");
    }
    variables.push('}');
    Operation {
        query: query.to_owned(),
        variables: Some(variables),
        operation_name: None,
    }
}

/// JSON text of a random value; nesting at most `max_depth`.
fn json_value(rng: &mut impl Rng, max_depth: usize) -> String {
    match rng.random_range(0..10) {
        0 => "null".to_owned(),
        1 => rng.random::<i64>().to_string(),
        2 => format!("{:e}", rng.random::<f64>() * 1e300),
        3 => "true".to_owned(),
        4 => json_string(&unicode_text(rng, 20)),
        5 => {
            let depth = rng.random_range(1..=max_depth.max(1));
            format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
        }
        6 => {
            let depth = rng.random_range(1..=max_depth.max(1));
            format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
        }
        7 => {
            let count = rng.random_range(1000..50_000);
            format!("[{}1]", "1,".repeat(count))
        }
        8 => "\"VIEWS\"".to_owned(),
        _ => format!(
            "{{\"title\":{},\"body\":{}}}",
            json_string(&unicode_text(rng, 10)),
            json_string("b")
        ),
    }
}

/// Bodies that are not a well-formed request: not UTF-8, not JSON, truncated, batched, of the
/// wrong JSON shape. Built from a valid `operation`.
pub fn malformed_body(rng: &mut impl Rng, operation: &Operation) -> Vec<u8> {
    let json = operation.to_json();
    match rng.random_range(0..9) {
        0 => {
            // Invalid UTF-8 inside the query string.
            let mut body = json.into_bytes();
            let at = rng.random_range(10.min(body.len())..=body.len());
            let garbage: &[u8] = [&[0xff, 0xfe][..], &[0xc3], &[0xed, 0xa0, 0x80], &[0x80]]
                .choose(rng)
                .expect("not empty");
            body.splice(at..at, garbage.iter().copied());
            body
        }
        1 => {
            let cut = rng.random_range(0..json.len());
            json.as_bytes()[..cut].to_vec()
        }
        2 => format!("[{json},{json}]").into_bytes(),
        3 => b"[]".to_vec(),
        4 => (*[
            "null",
            "1",
            "\"query\"",
            "{}",
            "{\"query\":1}",
            "{\"query\":null}",
            "{\"query\":\"{__typename}\",\"variables\":[1]}",
            "{\"query\":\"{__typename}\",\"variables\":\"x\"}",
            "{\"query\":\"{__typename}\",\"operationName\":{}}",
            "{\"query\":\"{__typename}\",\"extensions\":{\"persistedQuery\":{\"version\":1}}}",
            "{\"query\":\"\\ud800\"}",
            "{\"query\":\"\\u0000\"}",
            "",
            " ",
        ]
        .choose(rng)
        .expect("not empty"))
        .as_bytes()
        .to_vec(),
        5 => {
            let mut body = json.into_bytes();
            body.extend(std::iter::repeat_n(b' ', rng.random_range(1..BODY_BUDGET)));
            body
        }
        6 => format!("{json}{json}").into_bytes(),
        7 => {
            // Just past the body limit.
            let mut body = json.into_bytes();
            body.resize(257 * 1024, b' ');
            body
        }
        _ => (0..rng.random_range(1..2000))
            .map(|_| rng.random::<u8>())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn fragment_chains_spread_the_next_fragment_more_than_once() {
        let mut rng = StdRng::seed_from_u64(3);
        let bombs: Vec<Operation> = (0..50).map(|_| fragments(&mut rng)).collect();
        assert!(
            bombs
                .iter()
                .any(|bomb| bomb.query.contains("...F1 ...F1 ...F1"))
        );
        assert!(bombs.iter().any(|bomb| bomb.query.contains("...C0")));
    }

    #[test]
    fn nesting_reaches_thousands_of_levels() {
        let mut rng = StdRng::seed_from_u64(5);
        let deepest = (0..50)
            .map(|_| nesting(&mut rng).query.matches(['[', '{']).count())
            .max()
            .unwrap_or(0);
        assert!(deepest > 1000, "deepest: {deepest}");
    }

    #[test]
    fn variables_are_json_when_shallow() {
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..200 {
            let operation = variables(&mut rng, 64);
            let variables = operation.variables.expect("variables");
            serde_json::from_str::<serde_json::Value>(&variables).expect("JSON");
        }
    }
}
