use std::sync::Arc;

use async_graphql::{MergedObject, MergedSubscription, Schema};

use super::extensions::{DocumentGuard, OperationMetrics, QueryLimitsCheck, RequestPipeline};
use super::loaders::Loaders;
use super::node::NodeQuery;
use super::order::SchemaTypes;
use super::validated::ValidationTally;
use crate::accounts::graphql::{AccountsMutation, AccountsQuery};
use crate::actor::Actor;
use crate::articles::graphql::{ArticlesMutation, ArticlesQuery, ArticlesSubscription};
use crate::feed::graphql::{FeedQuery, FeedSubscription};
use crate::follows::graphql::FollowsMutation;
use crate::likes::graphql::LikesMutation;
use crate::search::graphql::SearchQueryRoot;
use crate::services::Services;
use crate::views::graphql::{ViewsMutation, ViewsQuery};
use crate::votes::graphql::{VotesMutation, VotesQuery, VotesSubscription};

#[derive(MergedObject, Default)]
pub struct Query(
    NodeQuery,
    AccountsQuery,
    ArticlesQuery,
    ViewsQuery,
    VotesQuery,
    FeedQuery,
    SearchQueryRoot,
);

#[derive(MergedObject, Default)]
pub struct Mutation(
    AccountsMutation,
    ArticlesMutation,
    ViewsMutation,
    LikesMutation,
    VotesMutation,
    FollowsMutation,
);

#[derive(MergedSubscription, Default)]
pub struct Subscription(ArticlesSubscription, VotesSubscription, FeedSubscription);

pub type PulseSchema = Schema<Query, Mutation, Subscription>;

/// Adds what one request (or one websocket connection) needs: who asks, and loaders that batch
/// within it and cache nothing across requests.
pub fn attach_request_data(services: &Arc<Services>, data: &mut async_graphql::Data, actor: Actor) {
    data.insert(actor);
    data.insert(Loaders::new(services.clone()));
}

/// Limits every request is held to.
#[derive(Clone, Copy, Debug)]
pub struct QueryLimits {
    pub max_depth: usize,
    pub max_complexity: usize,
    pub introspection: bool,
}

/// The server's schema: its shape, its limits and the pipeline every request passes through (see
/// [`RequestPipeline`]).
pub fn build(
    limits: QueryLimits,
    services: Arc<Services>,
    validations: Arc<ValidationTally>,
) -> PulseSchema {
    let types = SchemaTypes::from_sdl(&sdl()).expect("async-graphql prints SDL its parser reads");
    let builder = Schema::build(
        Query::default(),
        Mutation::default(),
        Subscription::default(),
    )
    // Bounds async-graphql's walks through nested selections and spreads after parsing; the parser's
    // own recursion is bounded by `DocumentGuard`'s scan.
    .limit_recursive_depth(limits.max_depth.saturating_mul(2).max(32))
    .limit_directives(16)
    // A cached document skips the parse and the guard's checks, which it passed when it was cached.
    .extension(RequestPipeline {
        limits: QueryLimitsCheck {
            max_depth: limits.max_depth,
            max_complexity: limits.max_complexity,
        },
        metrics: OperationMetrics::default(),
        documents: services.documents.clone(),
        guard: DocumentGuard::new(limits.max_complexity, Arc::new(types), validations),
    });
    let builder = if limits.introspection {
        builder
    } else {
        builder.disable_introspection()
    };
    builder.data(services).finish()
}

/// The schema in SDL, as checked in at `schema.graphql`.
pub fn sdl() -> String {
    Schema::build(
        Query::default(),
        Mutation::default(),
        Subscription::default(),
    )
    .finish()
    .sdl()
}
