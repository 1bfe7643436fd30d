//! Validation done once per document, not once per request.
//!
//! async-graphql validates every request's document against the schema: twenty-odd rules walked
//! over the selection, about a tenth of a server's CPU on a one-field mutation (a `perf` profile of
//! `pulse-bench like-toggle`). For a document it has already accepted, almost all of that verdict
//! is a property of the text alone. Two parts of it read the variables' values as well: the check
//! that each value fits its argument's type, and the complexity, whose page sizes come from `Int`
//! arguments. This rests on the schema's complexity functions reading no `ID` or `String` argument,
//! which the app using it must keep so (Pulse's `tests/layering.rs` does). So a
//! verdict is reused only when the variables cannot change it: every variable the operation
//! declares is an `ID` or a `String` (never an `Int`, so no page size, and never a `Boolean`, so no
//! `@skip`), and the value sent for each is a string, or is left out or null where the type allows.
//! Any other request is validated in full, as before.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use async_graphql::parser::types::{BaseType, DocumentOperations, ExecutableDocument};
use async_graphql::{Name, ValidationResult, Value, Variables};

/// A variable whose value validation checks by type only.
#[derive(Debug)]
struct PlainVariable {
    name: Name,
    /// Whether leaving the value out is valid (a nullable type, or a default).
    may_be_absent: bool,
    /// Whether an explicit null is valid (a nullable type).
    nullable: bool,
}

impl PlainVariable {
    fn accepts(&self, variables: &Variables) -> bool {
        match variables.get(&self.name) {
            None => self.may_be_absent,
            Some(Value::Null) => self.nullable,
            Some(Value::String(_)) => true,
            Some(_) => false,
        }
    }
}

/// What a cached document's validation verdict may be reused for.
#[derive(Debug)]
pub struct Validation {
    /// The one operation's variables, when all are plain (see the module docs); `None` when the
    /// document holds several operations or a variable of another type, and is validated always.
    plain: Option<(Option<Name>, Vec<PlainVariable>)>,
    /// The verdict of a full validation with plain variables, kept once the document passed one.
    accepted: OnceLock<ValidationResult>,
}

impl Validation {
    pub fn of(document: &ExecutableDocument) -> Self {
        Self {
            plain: plain_variables(document),
            accepted: OnceLock::new(),
        }
    }

    /// Whether `variables`, sent with `operation_name`, leave the verdict as it was.
    pub fn reusable_for(&self, operation_name: Option<&str>, variables: &Variables) -> bool {
        let Some((name, plain)) = &self.plain else {
            return false;
        };
        let names_it = match operation_name {
            None => true,
            Some(asked) => name.as_deref() == Some(asked),
        };
        names_it && plain.iter().all(|variable| variable.accepts(variables))
    }

    /// The verdict kept from an earlier request, when there is one.
    pub fn accepted(&self) -> Option<ValidationResult> {
        self.accepted.get().copied()
    }

    /// Keeps the verdict of a full validation that passed with reusable variables.
    pub fn accept(&self, result: ValidationResult) {
        let _ = self.accepted.set(result);
    }
}

/// Requests whose validation was skipped, per schema.
#[derive(Debug, Default)]
pub struct ValidationTally {
    skipped: AtomicU64,
}

impl ValidationTally {
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    pub fn count_skip(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("pulse_graphql_validations_skipped_total").increment(1);
    }
}

fn plain_variables(document: &ExecutableDocument) -> Option<(Option<Name>, Vec<PlainVariable>)> {
    let (name, operation) = match &document.operations {
        DocumentOperations::Single(operation) => (None, operation),
        DocumentOperations::Multiple(operations) if operations.len() == 1 => {
            let (name, operation) = operations.iter().next()?;
            (Some(name.clone()), operation)
        }
        DocumentOperations::Multiple(_) => return None,
    };
    let variables = operation
        .node
        .variable_definitions
        .iter()
        .map(|definition| {
            let definition = &definition.node;
            let ty = &definition.var_type.node;
            takes_any_string(&ty.base).then(|| PlainVariable {
                name: definition.name.node.clone(),
                may_be_absent: ty.nullable || definition.default_value.is_some(),
                nullable: ty.nullable,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((name, variables))
}

/// `ID` and `String`: built-in scalars that every string value is valid for.
fn takes_any_string(base: &BaseType) -> bool {
    matches!(base, BaseType::Named(name) if matches!(name.as_str(), "ID" | "String"))
}

#[cfg(test)]
mod tests {
    use async_graphql::parser::parse_query;
    use serde_json::json;

    use super::*;

    fn validation(query: &str) -> Validation {
        Validation::of(&parse_query(query).unwrap())
    }

    fn variables(value: serde_json::Value) -> Variables {
        Variables::from_json(value)
    }

    #[test]
    fn string_values_of_id_and_string_variables_are_reusable() {
        let touch = validation("mutation($s: ID!, $t: String) { touch(id: $s) { done } }");
        assert!(touch.reusable_for(None, &variables(json!({ "s": "QXJ0aWNsZTox" }))));
        assert!(touch.reusable_for(None, &variables(json!({ "s": "x", "t": null }))));
    }

    #[test]
    fn values_validation_could_refuse_are_not() {
        let touch = validation("mutation($s: ID!, $t: String) { touch(id: $s) { done } }");
        for refused in [
            json!({}),
            json!({ "s": null }),
            json!({ "s": 7 }),
            json!({ "s": { "a": 1 } }),
            json!({ "s": ["x"] }),
            json!({ "s": "x", "t": true }),
        ] {
            assert!(
                !touch.reusable_for(None, &variables(refused.clone())),
                "{refused}"
            );
        }
    }

    #[test]
    fn a_default_lets_a_non_null_variable_be_left_out_but_not_nulled() {
        let query = validation("query($s: ID! = \"QXJ0aWNsZTox\") { node(id: $s) { id } }");
        assert!(query.reusable_for(None, &variables(json!({}))));
        assert!(!query.reusable_for(None, &variables(json!({ "s": null }))));
    }

    #[test]
    fn variables_that_size_pages_or_skip_fields_are_never_reusable() {
        for query in [
            "query($n: Int) { items(first: $n) { edges { cursor } } }",
            "query($b: Boolean!) { viewer @skip(if: $b) { id } }",
            "query($s: [ID!]!) { nodes(ids: $s) { id } }",
        ] {
            let validation = validation(query);
            assert!(
                !validation.reusable_for(None, &variables(json!({}))),
                "{query}"
            );
        }
    }

    #[test]
    fn only_the_documents_one_operation_by_its_name() {
        let named = validation("query Mine { viewer { id } }");
        assert!(named.reusable_for(None, &variables(json!({}))));
        assert!(named.reusable_for(Some("Mine"), &variables(json!({}))));
        assert!(!named.reusable_for(Some("Other"), &variables(json!({}))));
        let two = validation("query A { viewer { id } } query B { viewer { id } }");
        assert!(!two.reusable_for(Some("A"), &variables(json!({}))));
    }

    #[test]
    fn a_verdict_is_kept_once() {
        let validation = validation("{ viewer { id } }");
        assert!(validation.accepted().is_none());
        let measured = |depth| ValidationResult {
            cache_control: Default::default(),
            complexity: 2,
            depth,
        };
        validation.accept(measured(2));
        validation.accept(measured(9));
        assert_eq!(validation.accepted().map(|result| result.depth), Some(2));
    }
}
