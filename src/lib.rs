//! Pulse: a GraphQL engagement API. ARCHITECTURE.md holds the principles, the module map, the data
//! flow and the layering.

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
pub mod keys;
pub mod likes;
pub mod ownership;
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
