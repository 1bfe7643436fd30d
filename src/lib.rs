//! Pulse: a GraphQL engagement API. ARCHITECTURE.md holds the principles, the module map, the data
//! flow and the layering.

pub mod accounts;
pub mod app;
pub mod articles;
pub mod commands;
pub mod config;
pub mod db;
pub mod documents;
pub mod entities;
pub mod feed;
pub mod follows;
pub mod graphql;
pub mod http;
pub mod keys;
pub mod likes;
pub mod ownership;
pub mod scripts;
pub mod search;
pub mod seed_demo;
pub mod services;
pub mod telemetry;
pub mod views;

pub use pulse_kit::actor;
pub use pulse_runtime::{error, jobs, pagination, realtime, redis, text};
pub use pulse_votes as votes;

pub use app::App;
pub use config::Config;
