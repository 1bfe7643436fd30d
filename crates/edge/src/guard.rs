//! Bounds on what a GraphQL document may cost, checked before async-graphql walks it.
//!
//! async-graphql's parser turns nested values into a tree by recursing once per level, with no
//! bound of its own (pest, underneath, stops only when the stack is nearly gone), and its validation
//! walks every fragment spread as if the fragment were written out in its place. Both are cheap for
//! the documents clients send and unbounded for hostile ones: a 6 KB list nested 3,000 deep
//! overflows the stack and aborts the process, and 24 fragments that each spread the next one twice
//! expand to 16 million selections. So the text is scanned for nesting before anything parses it, and
//! the parsed document's size after expansion is computed without expanding it, before validation.
//! Both checks are linear in the document.

use std::collections::{HashMap, HashSet};

use async_graphql::Positioned;
use async_graphql::parser::types::{Directive, ExecutableDocument, Selection, SelectionSet};
use async_graphql_value::Value;

/// Deepest nesting of brackets (`[`, `{`, `(`, in any mix) a document may have, and the longest chain
/// of fragments spreading one another. Queries within the depth limit nest a few dozen levels at
/// most. Values nested 350 deep overflowed a 2 MiB worker stack in a debug build (300 did not), so
/// this leaves a wide margin; the limits tests send the deepest accepted documents to a server on
/// worker threads.
pub const MAX_NESTING: usize = 64;

/// Why a document is refused before it is parsed or validated.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the document nests brackets more than {MAX_NESTING} levels deep")]
    TooDeep,
    #[error("fragments spread one another more than {MAX_NESTING} levels deep")]
    ChainTooLong,
    #[error("fragment `{0}` spreads itself, directly or through other fragments")]
    SpreadCycle(String),
    #[error(
        "the document selects more than {limit} fields, fragments, arguments and directives once \
         its fragment spreads are expanded"
    )]
    TooLarge { limit: usize },
}

/// Refuses a document nested deeper than [`MAX_NESTING`], counting brackets outside strings, block
/// strings and comments as GraphQL's lexer reads them. Where the text stops being valid GraphQL the
/// parser stops too, so what comes after cannot make it recurse deeper than counted here.
pub fn check_nesting(query: &str) -> Result<(), Refusal> {
    let bytes = query.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        i = match bytes[i] {
            b'[' | b'{' | b'(' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(Refusal::TooDeep);
                }
                i + 1
            }
            b']' | b'}' | b')' => {
                depth = depth.saturating_sub(1);
                i + 1
            }
            b'#' => end_of_comment(bytes, i),
            b'"' if bytes[i..].starts_with(b"\"\"\"") => end_of_block_string(bytes, i + 3),
            b'"' => end_of_string(bytes, i + 1),
            _ => i + 1,
        };
    }
    Ok(())
}

/// A comment runs to the end of its line.
fn end_of_comment(bytes: &[u8], start: usize) -> usize {
    bytes[start..]
        .iter()
        .position(|&b| b == b'\n' || b == b'\r')
        .map_or(bytes.len(), |offset| start + offset)
}

/// A block string ends at the first `"""` that is not escaped as `\"""`.
fn end_of_block_string(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() {
        if bytes[i..].starts_with(b"\\\"\"\"") {
            i += 4;
        } else if bytes[i..].starts_with(b"\"\"\"") {
            return i + 3;
        } else {
            i += 1;
        }
    }
    bytes.len()
}

/// A string ends at its closing quote. One cut by a line end does not parse; the scan goes on after
/// the line end rather than hiding the rest of the document in the string.
fn end_of_string(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            b'\n' | b'\r' => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Refuses a document whose operations, with every fragment spread expanded, add up to more than
/// `limit` nodes (fields, spreads, inline fragments, directives and argument values), which is what
/// async-graphql's validation walks. Also refuses spread cycles and over-long chains of spreads,
/// which its validation recurses through, used or not: a chain of 5,000 unused fragments overflowed
/// the stack of a debug build. Spreads of fragments the document does not define
/// count as one node each and are left for validation to report.
pub fn check_expansion(document: &ExecutableDocument, limit: usize) -> Result<(), Refusal> {
    if expanded_size(document)? > limit {
        return Err(Refusal::TooLarge { limit });
    }
    Ok(())
}

/// The number of nodes the document's operations select once their spreads are expanded.
fn expanded_size(document: &ExecutableDocument) -> Result<usize, Refusal> {
    let fragments: HashMap<&str, Part<'_>> = document
        .fragments
        .iter()
        .map(|(name, fragment)| {
            let part = Part::of(&fragment.node.selection_set.node, &fragment.node.directives);
            (name.as_str(), part)
        })
        .collect();
    let expanded = expand(&fragments)?;
    let size = document
        .operations
        .iter()
        .map(|(_, operation)| {
            let part = Part::of(
                &operation.node.selection_set.node,
                &operation.node.directives,
            );
            part.expanded_size(&expanded)
        })
        .fold(0, usize::saturating_add);
    Ok(size)
}

/// An operation or fragment as written: its own nodes, and the fragments it spreads (once per spread).
struct Part<'a> {
    own: usize,
    spreads: Vec<&'a str>,
}

impl<'a> Part<'a> {
    fn of(selection_set: &'a SelectionSet, directives: &'a [Positioned<Directive>]) -> Self {
        let mut part = Part {
            own: directives_size(directives),
            spreads: Vec::new(),
        };
        // An explicit stack: the parser bounds selection nesting, but this walk need not rely on it.
        let mut pending = vec![selection_set];
        while let Some(selection_set) = pending.pop() {
            for selection in &selection_set.items {
                part.own = part
                    .own
                    .saturating_add(1 + directives_size(selection.node.directives()));
                match &selection.node {
                    Selection::Field(field) => {
                        for (_, value) in &field.node.arguments {
                            part.own = part.own.saturating_add(value_size(&value.node));
                        }
                        pending.push(&field.node.selection_set.node);
                    }
                    Selection::FragmentSpread(spread) => {
                        part.spreads.push(spread.node.fragment_name.node.as_str());
                    }
                    Selection::InlineFragment(inline) => {
                        pending.push(&inline.node.selection_set.node);
                    }
                }
            }
        }
        part
    }

    fn expanded_size(&self, expanded: &HashMap<&str, Expanded>) -> usize {
        self.spreads
            .iter()
            .filter_map(|name| expanded.get(name))
            .fold(self.own, |size, fragment| {
                size.saturating_add(fragment.size)
            })
    }
}

fn directives_size(directives: &[Positioned<Directive>]) -> usize {
    directives
        .iter()
        .flat_map(|directive| &directive.node.arguments)
        .map(|(_, value)| value_size(&value.node))
        .fold(directives.len(), usize::saturating_add)
}

/// Nodes in an argument value: a list or object counts itself and its items.
fn value_size(value: &Value) -> usize {
    let mut size = 0usize;
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        size = size.saturating_add(1);
        match value {
            Value::List(items) => pending.extend(items),
            Value::Object(fields) => pending.extend(fields.values()),
            _ => {}
        }
    }
    size
}

/// A fragment with its spreads expanded: its size, and the longest chain of spreads from it.
struct Expanded {
    size: usize,
    chain: usize,
}

/// Every fragment's expanded size, each computed once from those of the fragments it spreads, in a
/// depth-first walk over an explicit stack (a chain of spreads can be as long as the document).
fn expand<'a>(
    fragments: &HashMap<&'a str, Part<'a>>,
) -> Result<HashMap<&'a str, Expanded>, Refusal> {
    let mut expanded: HashMap<&str, Expanded> = HashMap::with_capacity(fragments.len());
    let mut on_path: HashSet<&str> = HashSet::new();
    for &root in fragments.keys() {
        if expanded.contains_key(root) {
            continue;
        }
        // Each frame: a fragment, and how many of its spreads have been followed.
        let mut stack = vec![(root, 0usize)];
        on_path.insert(root);
        while let Some(&mut (name, ref mut followed)) = stack.last_mut() {
            let part = &fragments[name];
            if let Some(&target) = part.spreads.get(*followed) {
                *followed += 1;
                if expanded.contains_key(target) || !fragments.contains_key(target) {
                    continue;
                }
                if on_path.contains(target) {
                    return Err(Refusal::SpreadCycle(target.to_owned()));
                }
                on_path.insert(target);
                stack.push((target, 0));
                continue;
            }
            let mut fragment = Expanded {
                size: part.own,
                chain: 1,
            };
            for target in &part.spreads {
                if let Some(spread) = expanded.get(target) {
                    fragment.size = fragment.size.saturating_add(spread.size);
                    fragment.chain = fragment.chain.max(spread.chain + 1);
                }
            }
            if fragment.chain > MAX_NESTING {
                return Err(Refusal::ChainTooLong);
            }
            expanded.insert(name, fragment);
            on_path.remove(name);
            stack.pop();
        }
    }
    Ok(expanded)
}

#[cfg(test)]
mod tests {
    use async_graphql::parser::parse_query;

    use super::*;

    fn nested(open: &str, close: &str, levels: usize) -> String {
        format!("{}1{}", open.repeat(levels), close.repeat(levels))
    }

    #[test]
    fn nesting_up_to_the_limit_passes_and_one_more_level_is_refused() {
        // The query's braces and the argument's parentheses are two levels.
        let at_limit = format!("{{ a(x: {}) }}", nested("[", "]", MAX_NESTING - 2));
        assert_eq!(check_nesting(&at_limit), Ok(()));
        let beyond = format!("{{ a(x: {}) }}", nested("[", "]", MAX_NESTING - 1));
        assert_eq!(check_nesting(&beyond), Err(Refusal::TooDeep));
    }

    #[test]
    fn every_kind_of_bracket_counts_towards_the_nesting() {
        let mixed = "{a(x:[{y:".repeat(20);
        assert_eq!(check_nesting(&mixed), Err(Refusal::TooDeep));
    }

    #[test]
    fn brackets_closed_in_sequence_do_not_add_up() {
        let flat = "{ a(x: [[1]]) }".repeat(10_000);
        assert_eq!(check_nesting(&flat), Ok(()));
    }

    #[test]
    fn brackets_in_strings_block_strings_and_comments_do_not_count() {
        let deep = "[".repeat(1_000);
        for query in [
            format!("{{ a(x: \"{deep}\") }}"),
            format!("{{ a(x: \"\\\"{deep}\") }}"),
            format!("{{ a(x: \"\"\"{deep}\\\"\"\"{deep}\"\"\") }}"),
            format!("{{ a # {deep}\n }}"),
            format!("{{ a(x: \"\") b(y: \"\"\"\"\"\") # {deep}\r }}"),
        ] {
            assert_eq!(check_nesting(&query), Ok(()), "{query}");
        }
    }

    #[test]
    fn brackets_after_a_string_or_comment_ends_count_again() {
        let deep = "[".repeat(100);
        for query in [
            format!("{{ a(x: \"\\\\\" y: {deep}) }}"),
            format!("{{ a(x: \"\"\"\\\"\"\" \"\"\" y: {deep}) }}"),
            format!("{{ a # comment\n (y: {deep}) }}"),
            format!("{{ a(x: \"cut by a line end\n y: {deep}) }}"),
        ] {
            assert_eq!(check_nesting(&query), Err(Refusal::TooDeep), "{query}");
        }
    }

    fn size(query: &str) -> Result<usize, Refusal> {
        expanded_size(&parse_query(query).expect("the test document parses"))
    }

    #[test]
    fn the_size_counts_each_spread_as_its_fragment_written_out() {
        // Operation: a, two spreads, b(x: [1, 2]) with 3 value nodes, @skip(if: true) with 1.
        let query = "{ a ...F ...F b(x: [1, 2]) @skip(if: true) } fragment F on Q { c { d } }";
        assert_eq!(size(query), Ok(1 + 2 + 1 + 3 + 2 + 2 * 2));
    }

    #[test]
    fn spreads_of_unknown_fragments_are_left_for_validation() {
        assert_eq!(size("{ a ...Missing }"), Ok(2));
    }

    /// Fragments that each spread the next one `width` times, the last selecting `last`.
    fn bomb(levels: usize, width: usize, last: &str) -> String {
        let mut query = String::from("{ ...F0 }");
        for level in 0..levels {
            let spreads = format!("...F{} ", level + 1).repeat(width);
            query.push_str(&format!(" fragment F{level} on Q {{ {spreads}}}"));
        }
        query.push_str(&format!(" fragment F{levels} on Q {{ {last} }}"));
        query
    }

    #[test]
    fn a_fragment_bomb_is_measured_without_being_expanded() {
        // 2 + 2 * (2 + 2 * (… 1)): three times 2^30, less two, plus the operation's spread.
        assert_eq!(size(&bomb(30, 2, "a")), Ok(3 * (1 << 30) - 1));
        let document = parse_query(bomb(24, 2, "a")).unwrap();
        assert_eq!(
            check_expansion(&document, 20_000),
            Err(Refusal::TooLarge { limit: 20_000 })
        );
    }

    #[test]
    fn sizes_saturate_instead_of_overflowing() {
        assert_eq!(size(&bomb(40, 4, "a")), Ok(usize::MAX));
    }

    #[test]
    fn bombs_of_fragments_that_select_nothing_still_count_their_spreads() {
        assert!(size(&bomb(30, 2, "...Missing")).unwrap() > 1 << 30);
    }

    #[test]
    fn spread_cycles_are_refused_even_in_unused_fragments() {
        assert_eq!(
            size("{ a } fragment A on Q { ...A }"),
            Err(Refusal::SpreadCycle("A".into()))
        );
        let refusal = size("{ ...A } fragment A on Q { ...B } fragment B on Q { x ...A }");
        assert!(
            matches!(refusal, Err(Refusal::SpreadCycle(_))),
            "{refusal:?}"
        );
    }

    #[test]
    fn a_chain_of_spreads_longer_than_the_nesting_limit_is_refused() {
        let chain = |length: usize| {
            let mut query = String::from("{ a }");
            for link in 1..length {
                query.push_str(&format!(" fragment F{link} on Q {{ ...F{} }}", link + 1));
            }
            query.push_str(&format!(" fragment F{length} on Q {{ b }}"));
            query
        };
        assert!(size(&chain(MAX_NESTING)).is_ok());
        assert_eq!(size(&chain(MAX_NESTING + 1)), Err(Refusal::ChainTooLong));
        assert_eq!(size(&chain(20_000)), Err(Refusal::ChainTooLong));
    }
}
