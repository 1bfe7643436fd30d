//! Integration tests: the real server over HTTP and websockets, real Redis, real SQL.

mod accounts;
mod articles;
mod connections;
mod crash;
mod field_order;
mod helpers;
mod http_conformance;
mod jobs;
mod likes;
mod likes_comments;
mod likes_reads;
mod limits;
mod ops;
mod private_redis;
mod rollback;
mod sql_input;
mod subscriptions;
mod views;
mod votes;
mod votes_limits;
mod votes_live;
mod votes_reads;
mod votes_rebuild;
