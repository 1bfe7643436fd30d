//! Pulse: a GraphQL engagement API. See README.md for the architecture and DESIGN.md for principles.

pub mod accounts;
pub mod app;
pub mod articles;
pub mod commands;
pub mod config;
pub mod db;
pub mod entities;
pub mod error;
pub mod graphql;
pub mod http;
pub mod jobs;
pub mod realtime;
pub mod redis;
pub mod telemetry;
pub mod text;
pub mod views;

pub use app::App;
pub use config::Config;
