use async_graphql::{Context, ID, Interface, Object};

use super::ids;
use crate::accounts::graphql::{User, load_user};
use crate::articles::graphql::{Article, load_article};
use crate::error::GqlResultExt;
use crate::likes::graphql::{Comment, load_comment};
use crate::votes::graphql::{Poll, PollOption, load_poll, load_poll_option};

/// The types a global id can name: one variant per type in [`Node`], and its name in the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeType {
    User,
    Article,
    Comment,
    Poll,
    PollOption,
}

impl NodeType {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::User => "User",
            Self::Article => "Article",
            Self::Comment => "Comment",
            Self::Poll => "Poll",
            Self::PollOption => "PollOption",
        }
    }

    pub(super) fn from_name(name: &str) -> Option<Self> {
        match name {
            "User" => Some(Self::User),
            "Article" => Some(Self::Article),
            "Comment" => Some(Self::Comment),
            "Poll" => Some(Self::Poll),
            "PollOption" => Some(Self::PollOption),
            _ => None,
        }
    }
}

/// Anything with a global id.
#[derive(Interface)]
#[graphql(field(name = "id", ty = "ID"))]
pub enum Node {
    User(User),
    Article(Article),
    Comment(Comment),
    Poll(Poll),
    PollOption(PollOption),
}

#[derive(Default)]
pub struct NodeQuery;

#[Object]
impl NodeQuery {
    /// Resolves any global id; null when nothing has it.
    #[graphql(cache_control(max_age = 5))]
    async fn node(&self, ctx: &Context<'_>, id: ID) -> async_graphql::Result<Option<Node>> {
        Ok(match ids::decode_any(&id, "id").gql()? {
            (NodeType::User, id) => load_user(ctx, id).await?.map(Node::User),
            (NodeType::Article, id) => load_article(ctx, id).await?.map(Node::Article),
            (NodeType::Comment, id) => load_comment(ctx, id).await?.map(Node::Comment),
            (NodeType::Poll, id) => load_poll(ctx, id).await?.map(Node::Poll),
            (NodeType::PollOption, id) => load_poll_option(ctx, id).await?.map(Node::PollOption),
        })
    }
}
