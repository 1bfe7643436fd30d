//! The `Node` interface and `node(id:)`, generated from the list of node types in
//! [`crate::services`] by [`node_types!`], so a domain with a new type adds one line there.

/// Declares the types a global id can name, one `Type => loader` per type, where `Type` is the
/// object type in scope (its name is the one written in its ids) and `loader(ctx, row_id)` reads it
/// (`Ok(None)` when nothing has the id). It defines `NodeType` (the name in an id), the `Node`
/// interface over the types, and `NodeQuery`, the root part answering `node(id:)`.
macro_rules! node_types {
    ($($name:ident => $load:path),+ $(,)?) => {
        /// The types a global id can name: one variant per type in [`Node`], and its name in the id.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum NodeType {
            $($name),+
        }

        impl NodeType {
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$name => stringify!($name)),+
                }
            }

            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $(stringify!($name) => Some(Self::$name),)+
                    _ => None,
                }
            }
        }

        /// Anything with a global id.
        #[derive(async_graphql::Interface)]
        #[graphql(field(name = "id", ty = "async_graphql::ID"))]
        pub enum Node {
            $($name($name)),+
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
                Ok(match $crate::graphql::ids::decode_any(&id, "id").gql()? {
                    $((NodeType::$name, id) => $load(ctx, id).await?.map(Node::$name),)+
                })
            }
        }
    };
}

pub(crate) use node_types;
