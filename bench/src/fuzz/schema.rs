//! The server's schema as the generator needs it: object and input types, their fields, arguments
//! and enum values, read from the checked-in `schema.graphql` so generated operations follow the
//! real API without a hand-kept copy.

use std::collections::HashMap;

use async_graphql_parser::types::{BaseType, Type, TypeKind, TypeSystemDefinition};

const SDL: &str = include_str!("../../../schema.graphql");

pub struct Field {
    pub name: String,
    pub args: Vec<InputValue>,
    pub ty: Type,
}

pub struct InputValue {
    pub name: String,
    pub ty: Type,
}

pub enum TypeDef {
    Scalar,
    /// Objects and interfaces: both are selected with fields; an interface also with inline
    /// fragments on the objects that implement it.
    Composite {
        fields: Vec<Field>,
        implementors: Vec<String>,
    },
    Enum(Vec<String>),
    Input(Vec<InputValue>),
}

pub struct Schema {
    pub types: HashMap<String, TypeDef>,
}

pub const QUERY: &str = "Query";
pub const MUTATION: &str = "Mutation";
pub const SUBSCRIPTION: &str = "Subscription";

impl Schema {
    pub fn load() -> Self {
        let document = async_graphql_parser::parse_schema(SDL).expect("schema.graphql parses");
        let mut types = HashMap::new();
        let mut implements: Vec<(String, String)> = Vec::new();
        for definition in document.definitions {
            let TypeSystemDefinition::Type(definition) = definition else {
                continue;
            };
            let definition = definition.node;
            let name = definition.name.node.to_string();
            let fields = |fields: Vec<
                async_graphql_parser::Positioned<async_graphql_parser::types::FieldDefinition>,
            >| {
                fields
                    .into_iter()
                    .map(|field| Field {
                        name: field.node.name.node.to_string(),
                        args: field.node.arguments.into_iter().map(input_value).collect(),
                        ty: field.node.ty.node,
                    })
                    .collect()
            };
            let def = match definition.kind {
                TypeKind::Scalar | TypeKind::Union(_) => TypeDef::Scalar,
                TypeKind::Object(object) => {
                    for interface in &object.implements {
                        implements.push((interface.node.to_string(), name.clone()));
                    }
                    TypeDef::Composite {
                        fields: fields(object.fields),
                        implementors: Vec::new(),
                    }
                }
                TypeKind::Interface(interface) => TypeDef::Composite {
                    fields: fields(interface.fields),
                    implementors: Vec::new(),
                },
                TypeKind::Enum(values) => TypeDef::Enum(
                    values
                        .values
                        .into_iter()
                        .map(|value| value.node.value.node.to_string())
                        .collect(),
                ),
                TypeKind::InputObject(input) => {
                    TypeDef::Input(input.fields.into_iter().map(input_value).collect())
                }
            };
            types.insert(name, def);
        }
        for (interface, object) in implements {
            if let Some(TypeDef::Composite { implementors, .. }) = types.get_mut(&interface) {
                implementors.push(object);
            }
        }
        Self { types }
    }

    pub fn fields(&self, type_name: &str) -> &[Field] {
        match self.types.get(type_name) {
            Some(TypeDef::Composite { fields, .. }) => fields,
            _ => &[],
        }
    }

    pub fn is_composite(&self, type_name: &str) -> bool {
        matches!(self.types.get(type_name), Some(TypeDef::Composite { .. }))
    }
}

fn input_value(
    value: async_graphql_parser::Positioned<async_graphql_parser::types::InputValueDefinition>,
) -> InputValue {
    InputValue {
        name: value.node.name.node.to_string(),
        ty: value.node.ty.node,
    }
}

/// The named type at the bottom of list and non-null wrappers.
pub fn named(ty: &Type) -> &str {
    match &ty.base {
        BaseType::Named(name) => name.as_str(),
        BaseType::List(inner) => named(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_lists_the_root_fields_and_the_node_implementors() {
        let schema = Schema::load();
        let names = |type_name| -> Vec<&str> {
            schema
                .fields(type_name)
                .iter()
                .map(|field| field.name.as_str())
                .collect()
        };
        assert!(names(QUERY).contains(&"articles"), "{:?}", names(QUERY));
        assert!(names(MUTATION).contains(&"recordView"));
        assert!(names(SUBSCRIPTION).contains(&"articlePublished"));
        let Some(TypeDef::Composite { implementors, .. }) = schema.types.get("Node") else {
            panic!("Node is not an interface");
        };
        assert!(
            implementors.contains(&"Article".to_owned()),
            "{implementors:?}"
        );
    }
}
