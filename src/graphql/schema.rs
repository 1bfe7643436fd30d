use std::sync::Arc;

use async_graphql::Schema;
use pulse_edge::pipeline::{DocumentGuard, OperationMetrics, QueryLimitsCheck, RequestPipeline};

use super::loaders::Loaders;
use super::order::SchemaTypes;
use super::validated::ValidationTally;
use crate::actor::Actor;
use crate::services::{Mutation, Query, Services, Subscription};

pub type PulseSchema = Schema<Query, Mutation, Subscription>;

/// Whether a field's answer depends on who asks: a live operation that selects one ends when its
/// socket's token expires (`pulse_edge::websocket`). Such fields are named `viewer…`, apart from
/// the subscriptions that follow the viewer's own data.
pub fn reads_viewer(field: &str) -> bool {
    field.starts_with("viewer") || field == "feedItemAdded"
}

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
        documents: Arc::new(services.documents.clone()),
        guard: DocumentGuard::new(limits.max_complexity, Arc::new(types), validations),
        websocket_url: crate::http::WEBSOCKET_PATH.to_owned(),
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
