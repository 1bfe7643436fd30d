//! Random operations built from the real schema: fields with aliases, arguments as literals or
//! variables (with and without defaults), `@include`/`@skip` directives, inline and named
//! fragments. Most operations are meant to validate, so they reach the resolvers; the others
//! ("sloppy") also get wrong types, unknown fields, arguments and directives, and an
//! `operationName` the document does not hold.

use std::fmt::Write as _;

use async_graphql_parser::types::{BaseType, Type};
use rand::Rng;
use rand::seq::IndexedRandom as _;
use serde_json::{Map, Value, json};

use super::hostile;
use super::schema::{self, Schema, TypeDef};

/// One GraphQL request as a client sends it. `variables` is JSON text rather than a `Value`, so it
/// can hold nesting deeper than serde_json would build (or drop) without overflowing our stack.
#[derive(Clone, Debug)]
pub struct Operation {
    pub query: String,
    pub variables: Option<String>,
    pub operation_name: Option<String>,
}

impl Operation {
    pub fn new(query: String) -> Self {
        Self {
            query,
            variables: None,
            operation_name: None,
        }
    }

    /// `{"query": …, "variables": …, "operationName": …}`.
    pub fn to_json(&self) -> String {
        let mut json = format!("{{\"query\":{}", json_string(&self.query));
        if let Some(variables) = &self.variables {
            write!(json, ",\"variables\":{variables}").expect("writing to a String");
        }
        if let Some(name) = &self.operation_name {
            write!(json, ",\"operationName\":{}", json_string(name)).expect("writing to a String");
        }
        json.push('}');
        json
    }

    /// Whether this may be a live subscription, which answers only when an article is published.
    pub fn may_stay_open(&self) -> bool {
        self.query.contains("subscription")
    }
}

pub fn json_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// What generated requests can refer to: real ids, so that resolvers past validation run too.
pub struct Known {
    pub ids: Vec<String>,
}

/// Fields selected below this depth are leaves only; the server's depth limit is 15, and deep
/// documents are the `nesting` class's business.
const MAX_SELECTION_DEPTH: usize = 5;

pub struct Generator<'a, R> {
    schema: &'a Schema,
    known: &'a Known,
    rng: &'a mut R,
    variable_definitions: Vec<String>,
    variables: Map<String, Value>,
    fragments: Vec<String>,
    sloppy: bool,
}

impl<'a, R: Rng> Generator<'a, R> {
    pub fn new(schema: &'a Schema, known: &'a Known, rng: &'a mut R) -> Self {
        Self {
            schema,
            known,
            rng,
            variable_definitions: Vec::new(),
            variables: Map::new(),
            fragments: Vec::new(),
            sloppy: false,
        }
    }

    /// Whether this operation gets deliberate mistakes: drawn once per operation.
    fn mistake(&mut self, probability: f64) -> bool {
        self.sloppy && self.rng.random_bool(probability)
    }

    pub fn operation(mut self) -> Operation {
        self.sloppy = self.rng.random_bool(0.4);
        let (keyword, root) = match self.rng.random_range(0..10) {
            0..=6 => ("query", schema::QUERY),
            7..=8 => ("mutation", schema::MUTATION),
            _ => ("subscription", schema::SUBSCRIPTION),
        };
        let selection = self.selection_set(root, 0);
        let name = self
            .rng
            .random_bool(0.6)
            .then(|| format!("Op{}", self.rng.random_range(0..50)));
        let mut query = String::new();
        let shorthand = keyword == "query"
            && name.is_none()
            && self.variable_definitions.is_empty()
            && self.rng.random_bool(0.5);
        if !shorthand {
            query.push_str(keyword);
            if let Some(name) = &name {
                write!(query, " {name}").expect("writing to a String");
            }
            if !self.variable_definitions.is_empty() {
                write!(query, "({})", self.variable_definitions.join(", "))
                    .expect("writing to a String");
            }
            if self.mistake(0.1) {
                query.push_str(" @unknownOperationDirective");
            }
            query.push(' ');
        }
        query.push_str(&selection);
        for fragment in &self.fragments {
            query.push('\n');
            query.push_str(fragment);
        }
        let operation_name = if self.mistake(0.2) {
            Some("NotInTheDocument".to_owned())
        } else if self.rng.random_bool(0.7) {
            name
        } else {
            None
        };
        let variables = (!self.variables.is_empty() || self.rng.random_bool(0.2))
            .then(|| Value::Object(self.variables).to_string());
        Operation {
            query,
            variables,
            operation_name,
        }
    }

    fn selection_set(&mut self, type_name: &str, depth: usize) -> String {
        let mut selections = Vec::new();
        let count = self.rng.random_range(1..=4);
        for _ in 0..count {
            selections.push(self.selection(type_name, depth));
        }
        if let Some(TypeDef::Composite { implementors, .. }) = self.schema.types.get(type_name)
            && !implementors.is_empty()
            && self.rng.random_bool(0.7)
        {
            let object = implementors.choose(self.rng).expect("not empty").to_owned();
            let inner = self.selection_set(&object, depth + 1);
            selections.push(format!("... on {object}{} {inner}", self.directives()));
        }
        if depth > 0 && self.rng.random_bool(0.15) {
            let inner = self.selection_set(type_name, depth + 1);
            let name = format!("F{}", self.fragments.len());
            self.fragments
                .push(format!("fragment {name} on {type_name} {inner}"));
            selections.push(format!("...{name}{}", self.directives()));
        }
        format!("{{ {} }}", selections.join(" "))
    }

    fn selection(&mut self, type_name: &str, depth: usize) -> String {
        let fields = self.schema.fields(type_name);
        if fields.is_empty() || self.rng.random_bool(0.05) {
            return "__typename".to_owned();
        }
        if self.mistake(0.05) {
            return "noSuchField".to_owned();
        }
        let leaves: Vec<_> = fields
            .iter()
            .filter(|field| !self.schema.is_composite(schema::named(&field.ty)))
            .collect();
        let field = if depth >= MAX_SELECTION_DEPTH && !leaves.is_empty() {
            *leaves.choose(self.rng).expect("not empty")
        } else {
            fields.choose(self.rng).expect("not empty")
        };
        let mut text = String::new();
        if self.rng.random_bool(0.25) {
            write!(text, "a{}: ", self.rng.random_range(0..20)).expect("writing to a String");
        }
        text.push_str(&field.name);
        let mut arguments = Vec::new();
        for arg in &field.args {
            if !arg.ty.nullable || self.rng.random_bool(0.5) {
                let value = self.argument(&arg.ty);
                arguments.push(format!("{}: {value}", arg.name));
            }
        }
        if self.mistake(0.05) {
            arguments.push("unknownArgument: 1".to_owned());
        }
        if !arguments.is_empty() {
            write!(text, "({})", arguments.join(", ")).expect("writing to a String");
        }
        text.push_str(&self.directives());
        let target = schema::named(&field.ty).to_owned();
        if self.schema.is_composite(&target) {
            text.push(' ');
            text.push_str(&self.selection_set(&target, depth + 1));
        }
        text
    }

    fn directives(&mut self) -> String {
        let mut text = String::new();
        let count = match self.rng.random_range(0..20) {
            0..=14 => 0,
            15..=18 => 1,
            _ => self.rng.random_range(2..=4),
        };
        for _ in 0..count {
            let name = if self.mistake(0.3) {
                ["deprecated", "fuzz"].choose(self.rng)
            } else {
                ["include", "skip"].choose(self.rng)
            }
            .expect("not empty");
            let condition = if self.mistake(0.2) {
                "1".to_owned()
            } else if self.rng.random_bool(0.2) {
                let value = json!(self.rng.random_bool(0.5));
                format!("${}", self.variable("Boolean!", Some(value)))
            } else {
                self.rng.random_bool(0.5).to_string()
            };
            write!(text, " @{name}(if: {condition})").expect("writing to a String");
        }
        text
    }

    /// An argument of type `ty`: a literal, or a variable declared for it.
    fn argument(&mut self, ty: &Type) -> String {
        let value = if self.mistake(0.15) {
            self.any_value(2)
        } else {
            self.value(ty, 0)
        };
        if self.rng.random_bool(0.3) {
            let default = self
                .rng
                .random_bool(0.3)
                .then(|| self.value(ty, 0).graphql());
            let omitted = self.mistake(0.2) || (default.is_some() && self.rng.random_bool(0.5));
            let declared = match default {
                Some(default) => format!("{ty} = {default}"),
                None => ty.to_string(),
            };
            let provided = (!omitted).then(|| value.json());
            format!("${}", self.variable(&declared, provided))
        } else {
            value.graphql()
        }
    }

    /// Declares a variable `$vN: <declared>` and gives it `value` if any; returns `vN`.
    fn variable(&mut self, declared: &str, value: Option<Value>) -> String {
        let name = format!("v{}", self.variable_definitions.len());
        self.variable_definitions
            .push(format!("${name}: {declared}"));
        if let Some(value) = value {
            self.variables.insert(name.clone(), value);
        }
        name
    }

    fn value(&mut self, ty: &Type, depth: usize) -> Literal {
        if ty.nullable && self.rng.random_bool(0.1) {
            return Literal::Null;
        }
        match &ty.base {
            BaseType::List(inner) => {
                let count = self.rng.random_range(0..4);
                Literal::List((0..count).map(|_| self.value(inner, depth + 1)).collect())
            }
            BaseType::Named(name) => self.named_value(name, depth),
        }
    }

    fn named_value(&mut self, name: &str, depth: usize) -> Literal {
        match name {
            "ID" => Literal::String(self.id()),
            "String" => Literal::String(self.string()),
            "Int" => Literal::Int(self.int()),
            "Float" => Literal::Float(self.rng.random_range(-1e6..1e6)),
            "Boolean" => Literal::Boolean(self.rng.random_bool(0.5)),
            "DateTime" => Literal::String("2026-11-22T06:00:00Z".to_owned()),
            _ => match self.schema.types.get(name) {
                Some(TypeDef::Enum(values)) => {
                    Literal::Enum(values.choose(self.rng).cloned().unwrap_or_default())
                }
                Some(TypeDef::Input(fields)) if depth < 4 => {
                    let mut entries = Vec::new();
                    for field in fields {
                        if !field.ty.nullable || self.rng.random_bool(0.6) {
                            entries.push((field.name.clone(), self.value(&field.ty, depth + 1)));
                        }
                    }
                    Literal::Object(entries)
                }
                _ => Literal::Null,
            },
        }
    }

    fn any_value(&mut self, depth: usize) -> Literal {
        match self.rng.random_range(0..8) {
            0 => Literal::Null,
            1 => Literal::Int(self.int()),
            2 => Literal::Float(self.rng.random_range(-1e300..1e300)),
            3 => Literal::String(self.string()),
            4 => Literal::Boolean(self.rng.random_bool(0.5)),
            5 => Literal::Enum("VIEWS".to_owned()),
            6 if depth > 0 => {
                let count = self.rng.random_range(0..3);
                Literal::List((0..count).map(|_| self.any_value(depth - 1)).collect())
            }
            _ if depth > 0 => Literal::Object(vec![("a".to_owned(), self.any_value(depth - 1))]),
            _ => Literal::Null,
        }
    }

    fn id(&mut self) -> String {
        match self.rng.random_range(0..6) {
            0..=2 if !self.known.ids.is_empty() => {
                self.known.ids.choose(self.rng).expect("not empty").clone()
            }
            3 => "QXJ0aWNsZTo5OTk5OTk5OTk5OTk5OTk5OTk5".to_owned(),
            4 => hostile::unicode_text(self.rng, 8),
            _ => format!("{}", self.rng.random::<u32>()),
        }
    }

    fn string(&mut self) -> String {
        match self.rng.random_range(0..8) {
            0 => String::new(),
            1 => hostile::unicode_text(self.rng, 40),
            2 => "a".repeat(self.rng.random_range(190..=260)),
            3 => format!("fuzz_{}", self.rng.random_range(0..100_000)),
            4 => "VIEWS".to_owned(),
            _ => format!("text {}", self.rng.random::<u32>()),
        }
    }

    fn int(&mut self) -> i64 {
        let choices: &[i64] = if self.mistake(0.3) {
            &[i64::from(i32::MAX) + 1, i64::from(i32::MIN) - 1, i64::MAX]
        } else {
            &[
                0,
                1,
                -1,
                5,
                20,
                100,
                101,
                i64::from(i32::MAX),
                i64::from(i32::MIN),
            ]
        };
        *choices.choose(self.rng).expect("not empty")
    }
}

/// A value both as a GraphQL literal and as JSON (for a variable).
pub enum Literal {
    Null,
    Int(i64),
    Float(f64),
    String(String),
    Boolean(bool),
    Enum(String),
    List(Vec<Literal>),
    Object(Vec<(String, Literal)>),
}

impl Literal {
    pub fn graphql(&self) -> String {
        match self {
            Self::Null => "null".to_owned(),
            Self::Int(value) => value.to_string(),
            Self::Float(value) => format!("{value:e}"),
            Self::String(value) => json_string(value),
            Self::Boolean(value) => value.to_string(),
            Self::Enum(value) => value.clone(),
            Self::List(items) => format!(
                "[{}]",
                items
                    .iter()
                    .map(Self::graphql)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Self::Object(entries) => format!(
                "{{{}}}",
                entries
                    .iter()
                    .map(|(name, value)| format!("{name}: {}", value.graphql()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    pub fn json(&self) -> Value {
        match self {
            Self::Null => Value::Null,
            Self::Int(value) => json!(value),
            Self::Float(value) => json!(value),
            Self::String(value) | Self::Enum(value) => json!(value),
            Self::Boolean(value) => json!(value),
            Self::List(items) => Value::Array(items.iter().map(Self::json).collect()),
            Self::Object(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(name, value)| (name.clone(), value.json()))
                    .collect(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn generated_operations_parse() {
        let schema = Schema::load();
        let known = Known {
            ids: vec!["QXJ0aWNsZTox".to_owned()],
        };
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..500 {
            let operation = Generator::new(&schema, &known, &mut rng).operation();
            if let Err(err) = async_graphql_parser::parse_query(&operation.query) {
                panic!("{err}: {}", operation.query);
            }
            if let Some(variables) = &operation.variables {
                serde_json::from_str::<Value>(variables).expect("variables are JSON");
            }
        }
    }

    #[test]
    fn generated_operations_select_fields_of_every_root() {
        let schema = Schema::load();
        let known = Known { ids: Vec::new() };
        let mut rng = StdRng::seed_from_u64(11);
        let queries: Vec<String> = (0..300)
            .map(|_| Generator::new(&schema, &known, &mut rng).operation().query)
            .collect();
        for root_field in ["articles", "recordView", "articlePublished", "node"] {
            assert!(
                queries.iter().any(|query| query.contains(root_field)),
                "no operation selects {root_field}"
            );
        }
    }
}
