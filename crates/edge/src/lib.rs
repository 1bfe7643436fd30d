//! The request path of a GraphQL server built on async-graphql, for any schema: the parts that sit
//! between a transport and `Schema::execute` and know nothing of what the schema serves.
//!
//! - [`guard`]: bounds on what a document may cost (nesting before it parses, size once its
//!   fragments are spread), which async-graphql does not bound.
//! - [`validated`]: a document's validation verdict kept and reused while the variables cannot
//!   change it.
//! - [`order`]: response fields in the order the document selected them, which async-graphql does
//!   not keep when it resolves fields concurrently.
//! - [`media`]: the media types of GraphQL over HTTP, negotiated from `Accept`, and the status
//!   codes each one's answers carry.
//! - [`pipeline`]: the one extension every request passes: error codes, depth and complexity
//!   limits, per-operation metrics, persisted documents, the guard with a parsed-document cache,
//!   validation once and the response order.
//! - [`http`]: POST and GET at one path and the websocket upgrade at another, for any executor:
//!   one function decides a request's transport, one function serves each; the server says who
//!   asks through a hook that builds each request's data or refuses it.
//! - [`persisted`]: persisted documents (automatic persisted queries, trusted documents) by
//!   their SHA-256, kept in a store the server implements.
//! - [`stream`]: subscriptions over long-lived HTTP responses: Server-Sent Events in both
//!   modes of the `graphql-sse` protocol, and Apollo's multipart subscriptions, bounded as
//!   websockets are.
//! - [`groups`]: identical live operations of any number of websockets resolved and serialized
//!   once per result, with an anonymous caller's data.
//! - [`detached`]: event streams a websocket's driver runs itself between events, so that an
//!   idle one holds its source and its request, not an async-graphql stream.
//! - [`websocket`]: a driver for both websocket protocols that bounds what async-graphql leaves
//!   open (the init timeout, duplicate ids, operations per socket, a close at shutdown).
//!
//! This crate names no domain and depends on no application: an app depends on it, never the
//! other way, so a domain type used here fails to compile.

mod counted;
pub mod detached;
pub mod groups;
pub mod guard;
pub mod http;
pub mod media;
pub mod order;
pub mod persisted;
pub mod pipeline;
pub mod stream;
pub mod validated;
pub mod websocket;
