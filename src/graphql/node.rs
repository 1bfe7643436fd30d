//! The `Node` interface and `node(id:)`, generated from the list of node types in
//! [`crate::services`] by [`node_types!`], so a domain with a new type adds one line there.

/// Declares the types a global id can name, one `Type(NODE_TYPE) => loader` per type, where `Type`
/// is the object type in scope, `NODE_TYPE` the domain's [`pulse_kit::ids::NodeType`] for it (its
/// name must be the type's GraphQL name, which [`node_types`]'s caller tests) and
/// `loader(ctx, row_id)` reads it (`Ok(None)` when nothing has the id). It defines the `Node`
/// interface over the types, `NodeQuery`, the root part answering `node(id:)`, and `node_types()`,
/// each type a global id can name with the GraphQL type it names.
macro_rules! node_types {
    ($($name:ident($node_type:path) => $load:path),+ $(,)?) => {
        /// Anything with a global id.
        #[derive(async_graphql::Interface)]
        #[graphql(field(name = "id", ty = "async_graphql::ID"))]
        pub enum Node {
            $($name($name)),+
        }

        /// Each type a global id can name, with the name of the GraphQL type it resolves to.
        pub fn node_types() -> Vec<(pulse_kit::ids::NodeType, String)> {
            vec![$((
                $node_type,
                <$name as async_graphql::OutputType>::type_name().into_owned(),
            )),+]
        }

        #[derive(Default)]
        pub struct NodeQuery;

        #[async_graphql::Object]
        impl NodeQuery {
            /// Resolves any global id; null when nothing has it.
            #[graphql(cache_control(max_age = 5))]
            async fn node(
                &self,
                ctx: &async_graphql::Context<'_>,
                id: async_graphql::ID,
            ) -> async_graphql::Result<Option<Node>> {
                use $crate::error::GqlResultExt as _;
                let decoded = pulse_kit::ids::decode_among(&id, &[$($node_type),+], "id").gql()?;
                let Some((node_type, id)) = decoded else {
                    return Err($crate::error::AppError::bad_input("id", "malformed id")).gql();
                };
                $(if node_type == $node_type {
                    return Ok($load(ctx, id).await?.map(Node::$name));
                })+
                Ok(None)
            }
        }
    };
}

pub(crate) use node_types;
