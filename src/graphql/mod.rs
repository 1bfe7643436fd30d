//! The GraphQL surface: schema assembly, the `Node` interface and persisted documents. What a
//! resolver reaches (services, loaders, the actor), global ids and connections are `pulse_kit`'s.

pub mod node;
mod persisted;
pub mod schema;

pub use pulse_edge::{guard, order, validated};
pub use pulse_kit::ids;
pub use schema::PulseSchema;
