//! Response fields in the order the document selected them (the GraphQL spec's CollectFields and
//! "serialized map ordering").
//!
//! async-graphql resolves the fields of a query's objects concurrently and inserts each into the
//! response object when it completes (`do_resolve_container` drains a `FuturesUnordered`), so a
//! field selected first but answered from Redis after its neighbour comes out second, and the order
//! changes from one request to the next. This module puts every object back in selection order
//! once execution is over: a walk of the response beside the document, typed by the schema.
//!
//! Where the order depends on an object's runtime type (fragments on some of the possible types of
//! an interface or a union), the document also asks for `__typename` under [`TYPE_PROBE`], which the
//! walk reads and removes.

use std::collections::{HashMap, HashSet};

use async_graphql::indexmap::IndexMap;
use async_graphql::parser::types::{
    BaseType, DocumentOperations, ExecutableDocument, Field, OperationDefinition, OperationType,
    Selection, SelectionSet, TypeKind, TypeSystemDefinition,
};
use async_graphql::{Name, Pos, Positioned, Value};

/// The alias under which a probed selection set asks for its object's `__typename`.
pub const TYPE_PROBE: &str = "__pulseRuntimeType";

/// What the walk needs of the schema: each type's field types, and who implements what.
pub struct SchemaTypes {
    field_types: HashMap<String, HashMap<String, String>>,
    /// Interface or union name → the object types it may be at run time.
    possible_types: HashMap<String, HashSet<String>>,
    roots: [String; 3],
}

impl SchemaTypes {
    pub fn from_sdl(sdl: &str) -> anyhow::Result<Self> {
        let document = async_graphql::parser::parse_schema(sdl)?;
        let mut types = Self {
            field_types: HashMap::new(),
            possible_types: HashMap::new(),
            roots: ["Query".into(), "Mutation".into(), "Subscription".into()],
        };
        for definition in document.definitions {
            match definition {
                TypeSystemDefinition::Schema(schema) => {
                    let schema = schema.node;
                    let roots = [schema.query, schema.mutation, schema.subscription];
                    for (slot, root) in types.roots.iter_mut().zip(roots) {
                        if let Some(root) = root {
                            *slot = root.node.to_string();
                        }
                    }
                }
                TypeSystemDefinition::Type(definition) => {
                    let definition = definition.node;
                    let name = definition.name.node.to_string();
                    let (fields, implements) = match definition.kind {
                        TypeKind::Object(object) => (object.fields, object.implements),
                        TypeKind::Interface(interface) => {
                            types.possible_types.entry(name.clone()).or_default();
                            (interface.fields, interface.implements)
                        }
                        TypeKind::Union(union) => {
                            let members = union.members.iter().map(|m| m.node.to_string());
                            types
                                .possible_types
                                .entry(name.clone())
                                .or_default()
                                .extend(members);
                            continue;
                        }
                        _ => continue,
                    };
                    for interface in implements {
                        let possible = types.possible_types.entry(interface.node.to_string());
                        possible.or_default().insert(name.clone());
                    }
                    let fields = fields.into_iter().map(|field| {
                        let field = field.node;
                        (field.name.node.to_string(), named_type(&field.ty.node.base))
                    });
                    types.field_types.insert(name, fields.collect());
                }
                TypeSystemDefinition::Directive(_) => {}
            }
        }
        Ok(types)
    }

    fn is_abstract(&self, type_name: &str) -> bool {
        self.possible_types.contains_key(type_name)
    }

    /// The named type of `field` on `type_name`; `None` for meta fields and types the SDL does not
    /// show (introspection's), whose fragments can only name the type itself.
    fn field_type(&self, type_name: Option<&str>, field: &str) -> Option<&str> {
        let fields = self.field_types.get(type_name?)?;
        fields.get(field).map(String::as_str)
    }

    /// Whether a fragment on `condition` applies to an object of `runtime` type (unknown: it does).
    fn applies(&self, condition: &str, runtime: Option<&str>) -> bool {
        let Some(runtime) = runtime else { return true };
        condition == runtime
            || self
                .possible_types
                .get(condition)
                .is_some_and(|possible| possible.contains(runtime))
    }

    fn root(&self, operation: OperationType) -> &str {
        match operation {
            OperationType::Query => &self.roots[0],
            OperationType::Mutation => &self.roots[1],
            OperationType::Subscription => &self.roots[2],
        }
    }
}

fn named_type(base: &BaseType) -> String {
    match base {
        BaseType::Named(name) => name.to_string(),
        BaseType::List(inner) => named_type(&inner.base),
    }
}

/// Adds the `__typename` probe to every selection set of an abstract type that holds a fragment on
/// some other type: there, which fields the object has, and so their order, depends on what it is.
pub fn add_type_probes(types: &SchemaTypes, document: &mut ExecutableDocument) {
    let conditions: HashMap<Name, String> = document
        .fragments
        .iter()
        .map(|(name, fragment)| {
            let on = fragment.node.type_condition.node.on.node.to_string();
            (name.clone(), on)
        })
        .collect();
    let probe = Probe {
        types,
        conditions: &conditions,
    };
    let operations: Vec<&mut Positioned<OperationDefinition>> = match &mut document.operations {
        DocumentOperations::Single(operation) => vec![operation],
        DocumentOperations::Multiple(operations) => operations.values_mut().collect(),
    };
    for operation in operations {
        let root = types.root(operation.node.ty).to_owned();
        probe.selection_set(Some(&root), &mut operation.node.selection_set.node);
    }
    for fragment in document.fragments.values_mut() {
        let on = fragment.node.type_condition.node.on.node.to_string();
        probe.selection_set(Some(&on), &mut fragment.node.selection_set.node);
    }
}

struct Probe<'a> {
    types: &'a SchemaTypes,
    conditions: &'a HashMap<Name, String>,
}

impl Probe<'_> {
    fn selection_set(&self, parent: Option<&str>, set: &mut SelectionSet) {
        let mut needs_probe = false;
        for item in &mut set.items {
            match &mut item.node {
                Selection::Field(field) => {
                    let field = &mut field.node;
                    if !field.selection_set.node.items.is_empty() {
                        let child = self.types.field_type(parent, &field.name.node);
                        self.selection_set(child, &mut field.selection_set.node);
                    }
                }
                Selection::InlineFragment(fragment) => {
                    let fragment = &mut fragment.node;
                    let condition = fragment.type_condition.as_ref();
                    let on = condition.map(|condition| condition.node.on.node.to_string());
                    needs_probe |= on.as_deref().is_some_and(|on| Some(on) != parent);
                    self.selection_set(on.as_deref().or(parent), &mut fragment.selection_set.node);
                }
                Selection::FragmentSpread(spread) => {
                    let on = self.conditions.get(&spread.node.fragment_name.node);
                    needs_probe |= on.is_some_and(|on| Some(on.as_str()) != parent);
                }
            }
        }
        if needs_probe && parent.is_some_and(|parent| self.types.is_abstract(parent)) {
            set.items.push(Positioned::new(
                Selection::Field(Positioned::new(type_probe(), Pos::default())),
                Pos::default(),
            ));
        }
    }
}

fn type_probe() -> Field {
    Field {
        alias: Some(Positioned::new(Name::new(TYPE_PROBE), Pos::default())),
        name: Positioned::new(Name::new("__typename"), Pos::default()),
        arguments: Vec::new(),
        directives: Vec::new(),
        selection_set: Positioned::new(SelectionSet::default(), Pos::default()),
    }
}

/// The operation a request runs: the named one, or the document's only one.
pub fn operation<'a>(
    document: &'a ExecutableDocument,
    name: Option<&str>,
) -> Option<&'a Positioned<OperationDefinition>> {
    match (&document.operations, name) {
        (DocumentOperations::Single(operation), None) => Some(operation),
        (DocumentOperations::Multiple(operations), Some(name)) => operations.get(name),
        (DocumentOperations::Multiple(operations), None) if operations.len() == 1 => {
            operations.values().next()
        }
        _ => None,
    }
}

/// Puts the fields of `data`, the answer to `operation_name` in `document`, in selection order.
pub fn order_response(
    types: &SchemaTypes,
    document: &ExecutableDocument,
    operation_name: Option<&str>,
    data: &mut Value,
) {
    let Some(operation) = operation(document, operation_name) else {
        return;
    };
    let walk = Walk { types, document };
    let root = types.root(operation.node.ty);
    walk.value(Some(root), &[&operation.node.selection_set.node], data);
}

struct Walk<'a> {
    types: &'a SchemaTypes,
    document: &'a ExecutableDocument,
}

/// The fields one response key stands for: the type they return, and their selection sets merged.
struct Collected<'a> {
    field_type: Option<&'a str>,
    selections: Vec<&'a SelectionSet>,
}

impl<'a> Walk<'a> {
    fn value(&self, static_type: Option<&'a str>, sets: &[&'a SelectionSet], value: &mut Value) {
        match value {
            Value::List(items) => {
                for item in items {
                    self.value(static_type, sets, item);
                }
            }
            Value::Object(object) => self.object(static_type, sets, object),
            _ => {}
        }
    }

    fn object(
        &self,
        static_type: Option<&'a str>,
        sets: &[&'a SelectionSet],
        object: &mut IndexMap<Name, Value>,
    ) {
        let probed = object.shift_remove(TYPE_PROBE);
        let runtime = match &probed {
            Some(Value::String(name)) => Some(name.as_str()),
            _ => None,
        };
        // The runtime type decides which fragments apply, but the walk only borrows from the
        // document and the schema: look the probed name up in the schema to keep its lifetime.
        let runtime = runtime
            .and_then(|name| self.types.field_types.get_key_value(name))
            .map(|(name, _)| name.as_str());
        let object_type = runtime.or(static_type);
        let mut collected: IndexMap<&'a str, Collected<'a>> = IndexMap::new();
        for set in sets {
            self.collect(object_type, runtime, set, &mut collected);
        }
        if collected.len() < 2 && collected.values().all(|c| c.selections.is_empty()) {
            return;
        }
        let mut unordered = std::mem::take(object);
        object.reserve(unordered.len());
        for (key, fields) in &collected {
            if let Some((name, mut value)) = unordered.swap_remove_entry(*key) {
                if !fields.selections.is_empty() {
                    self.value(fields.field_type, &fields.selections, &mut value);
                }
                object.insert(name, value);
            }
        }
        object.extend(unordered);
    }

    fn collect(
        &self,
        object_type: Option<&'a str>,
        runtime: Option<&str>,
        set: &'a SelectionSet,
        collected: &mut IndexMap<&'a str, Collected<'a>>,
    ) {
        for item in &set.items {
            match &item.node {
                Selection::Field(field) => {
                    let field = &field.node;
                    let entry = collected
                        .entry(field.response_key().node.as_str())
                        .or_insert_with(|| Collected {
                            field_type: self.types.field_type(object_type, &field.name.node),
                            selections: Vec::new(),
                        });
                    if !field.selection_set.node.items.is_empty() {
                        entry.selections.push(&field.selection_set.node);
                    }
                }
                Selection::InlineFragment(fragment) => {
                    let fragment = &fragment.node;
                    let applies = fragment.type_condition.as_ref().is_none_or(|condition| {
                        self.types.applies(&condition.node.on.node, runtime)
                    });
                    if applies {
                        self.collect(
                            object_type,
                            runtime,
                            &fragment.selection_set.node,
                            collected,
                        );
                    }
                }
                Selection::FragmentSpread(spread) => {
                    let Some(fragment) =
                        self.document.fragments.get(&spread.node.fragment_name.node)
                    else {
                        continue;
                    };
                    let fragment = &fragment.node;
                    if self
                        .types
                        .applies(&fragment.type_condition.node.on.node, runtime)
                    {
                        self.collect(
                            object_type,
                            runtime,
                            &fragment.selection_set.node,
                            collected,
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SDL: &str = "
        interface Node { id: ID! }
        type A implements Node { id: ID! x: Int y: Int child: A list: [A] }
        type B implements Node { id: ID! y: Int x: Int }
        union AB = A | B
        type Query { node: Node any: AB a: A }
    ";

    fn ordered(query: &str, data: serde_json::Value) -> String {
        let types = SchemaTypes::from_sdl(SDL).unwrap();
        let mut document = async_graphql::parser::parse_query(query).unwrap();
        add_type_probes(&types, &mut document);
        let mut data = Value::from_json(data).unwrap();
        order_response(&types, &document, None, &mut data);
        serde_json::to_string(&data).unwrap()
    }

    #[test]
    fn objects_lists_and_aliases_follow_the_selection() {
        let out = ordered(
            "{ a { y second: x child { x y } list { y x } } node { id } }",
            serde_json::json!({
                "node": { "id": "1" },
                "a": { "list": [{ "x": 1, "y": 2 }], "child": { "y": 1, "x": 2 }, "second": 3, "y": 4 }
            }),
        );
        assert_eq!(
            out,
            r#"{"a":{"y":4,"second":3,"child":{"x":2,"y":1},"list":[{"y":2,"x":1}]},"node":{"id":"1"}}"#
        );
    }

    #[test]
    fn fragments_on_runtime_types_order_by_the_type_the_object_is() {
        let query = "{ node { ... on A { x } ... on B { y x } id } }";
        let types = SchemaTypes::from_sdl(SDL).unwrap();
        let mut document = async_graphql::parser::parse_query(query).unwrap();
        add_type_probes(&types, &mut document);
        let selection = &operation(&document, None).unwrap().node.selection_set.node;
        let Selection::Field(node) = &selection.items[0].node else {
            panic!("the node field comes first")
        };
        let probe = node.node.selection_set.node.items.last().unwrap();
        assert!(
            matches!(&probe.node, Selection::Field(field) if field.node.response_key().node == TYPE_PROBE),
            "a selection set on an interface with fragments on its types asks for the type"
        );
        let out = ordered(
            query,
            serde_json::json!({ "node": { "id": "1", "x": 2, "y": 3, TYPE_PROBE: "B" } }),
        );
        assert_eq!(out, r#"{"node":{"y":3,"x":2,"id":"1"}}"#);
        let out = ordered(
            "fragment F on B { y x } { any { ... on A { x id } ...F } }",
            serde_json::json!({ "any": { "x": 2, "y": 3, TYPE_PROBE: "B" } }),
        );
        assert_eq!(out, r#"{"any":{"y":3,"x":2}}"#);
    }

    #[test]
    fn concrete_types_are_not_probed() {
        let types = SchemaTypes::from_sdl(SDL).unwrap();
        let query = "fragment F on A { y } { a { ...F ... on A { x } } }";
        let mut document = async_graphql::parser::parse_query(query).unwrap();
        let before = format!("{document:?}");
        add_type_probes(&types, &mut document);
        assert_eq!(format!("{document:?}"), before);
    }
}
