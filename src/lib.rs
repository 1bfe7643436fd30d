//! Pulse: a GraphQL engagement API. ARCHITECTURE.md holds the module map, the data flow and the
//! layering; the design principles (DESIGN.md) live in the project's shared docs, not in this repo.

pub mod accounts;
pub mod actor;
pub mod app;
pub mod articles;
pub mod commands;
pub mod config;
pub mod db;
pub mod documents;
pub mod entities;
pub mod error;
pub mod feed;
pub mod follows;
pub mod graphql;
pub mod http;
pub mod jobs;
pub mod likes;
pub mod pagination;
pub mod realtime;
pub mod redis;
pub mod seed_demo;
pub mod services;
pub mod telemetry;
pub mod text;
pub mod views;
pub mod votes;

pub use app::App;
pub use config::Config;
