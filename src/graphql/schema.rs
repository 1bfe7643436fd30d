use std::sync::Arc;

use async_graphql::Schema;
use pulse_edge::pipeline::{DocumentGuard, OperationMetrics, QueryLimitsCheck, RequestPipeline};
use pulse_kit::{Actor, FreshEachEvent, FreshLoaders, Registry};

use super::order::SchemaTypes;
use super::validated::ValidationTally;
use crate::documents::DocumentStore;
use crate::services::{Mutation, Query, Subscription};

pub type PulseSchema = Schema<Query, Mutation, Subscription>;

/// Whether a field's answer depends on who asks: a live operation that selects one ends when its
/// socket's token expires, and is never grouped with other sockets' (`pulse_edge::websocket`).
/// Such fields are named `viewer…`, apart from the viewer's own timeline (`feed`, and the
/// subscription that follows it) and `User.isAdmin`, which only the user themself sees. Every
/// resolver outside mutations that reads the [`Actor`] is one of them (the test below pins the
/// list).
pub fn reads_viewer(field: &str) -> bool {
    field.starts_with("viewer") || matches!(field, "feed" | "feedItemAdded" | "isAdmin")
}

/// Adds what one request (or one websocket connection) needs: who asks. Each operation gets its
/// loaders from the schema's [`FreshLoaders`], not from here, so that none outlives it.
pub fn attach_request_data(data: &mut async_graphql::Data, actor: Actor) {
    data.insert(actor);
}

/// The data a group of live operations shared by many sockets runs with: a caller who is no one,
/// from no address, so that a shared answer can only be what anyone may see; and loaders afresh
/// for each event, read once per group.
pub fn anonymous_request_data() -> async_graphql::Data {
    let mut data = async_graphql::Data::default();
    data.insert(FreshEachEvent);
    let anonymous = Actor {
        user: None,
        client_ip: std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        user_agent: None,
    };
    attach_request_data(&mut data, anonymous);
    data
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
    services: Arc<Registry>,
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
    .extension(FreshLoaders::new(services.clone()))
    // A cached document skips the parse and the guard's checks, which it passed when it was cached.
    .extension(RequestPipeline {
        limits: QueryLimitsCheck {
            max_depth: limits.max_depth,
            max_complexity: limits.max_complexity,
        },
        metrics: OperationMetrics::default(),
        documents: Arc::new(services.get::<DocumentStore>().clone()),
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

#[cfg(test)]
mod tests {
    use async_graphql::parser::types::{TypeKind, TypeSystemDefinition};

    use super::*;

    /// A new field named otherwise whose resolver reads the actor must be added to
    /// [`reads_viewer`], or one viewer's answer could be shared with others.
    #[test]
    fn the_fields_that_read_the_viewer_are_these() {
        let document = async_graphql::parser::parse_schema(sdl()).expect("the SDL parses");
        let mut reading: Vec<String> = document
            .definitions
            .iter()
            .filter_map(|definition| match definition {
                TypeSystemDefinition::Type(definition) => Some(&definition.node),
                _ => None,
            })
            .filter(|definition| definition.name.node != "Mutation")
            .filter_map(|definition| match &definition.kind {
                TypeKind::Object(object) => Some((&definition.name.node, &object.fields)),
                TypeKind::Interface(interface) => Some((&definition.name.node, &interface.fields)),
                _ => None,
            })
            .flat_map(|(owner, fields)| {
                fields
                    .iter()
                    .map(move |field| format!("{owner}.{}", field.node.name.node))
            })
            .filter(|field| reads_viewer(field.rsplit('.').next().unwrap_or_default()))
            .collect();
        reading.sort();
        assert_eq!(
            reading,
            [
                "Article.viewerHasLiked",
                "Comment.viewerHasLiked",
                "Query.feed",
                "Query.viewer",
                "Subscription.feedItemAdded",
                "User.isAdmin",
                "User.viewerFollows",
            ]
        );
    }
}
