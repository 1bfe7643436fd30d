use async_graphql::{Context, ID, Interface, Object};

use super::ids::{self, NodeType};
use crate::accounts::graphql::{User, load_user};
use crate::articles::graphql::{Article, load_article};
use crate::error::GqlResultExt;

/// Anything with a global id.
#[derive(Interface)]
#[graphql(field(name = "id", ty = "ID"))]
pub enum Node {
    User(User),
    Article(Article),
}

#[derive(Default)]
pub struct NodeQuery;

#[Object]
impl NodeQuery {
    /// Resolves any global id; null when nothing has it.
    async fn node(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Option<Node>> {
        Ok(match ids::decode_any(&id, "id").gql()? {
            (NodeType::User, id) => load_user(ctx, id).await?.map(Node::User),
            (NodeType::Article, id) => load_article(ctx, id).await?.map(Node::Article),
        })
    }
}
