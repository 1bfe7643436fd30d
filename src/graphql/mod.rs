//! The GraphQL surface: schema assembly, per-request context, ids, pagination and limits.

pub mod ids;
pub mod loaders;
pub mod node;
pub mod pagination;
mod persisted;
pub mod schema;

use async_graphql::Context;

use crate::actor::Actor;

pub use pulse_edge::{guard, order, validated};
pub use schema::PulseSchema;

use crate::services::Services;

/// The services the schema was built with.
pub fn services<'a>(ctx: &Context<'a>) -> &'a Services {
    ctx.data_unchecked::<std::sync::Arc<Services>>()
}

/// The request's DataLoaders.
pub fn loaders<'a>(ctx: &Context<'a>) -> &'a loaders::Loaders {
    ctx.data_unchecked::<loaders::Loaders>()
}

/// Who is asking, from where.
pub fn actor<'a>(ctx: &Context<'a>) -> &'a Actor {
    ctx.data_unchecked::<Actor>()
}
