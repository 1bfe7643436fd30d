//! Integration tests: the real server over HTTP and websockets, real Redis, real SQL.

mod accounts;
mod articles;
mod connections;
mod crash;
mod feed;
mod feed_fanout;
mod feed_live;
mod feed_upkeep;
mod follows;
mod helpers;
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
