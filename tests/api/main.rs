//! Integration tests: the real server over HTTP and websockets, real Redis, real SQL.

mod accounts;
mod articles;
mod crash;
mod helpers;
mod limits;
mod ops;
mod rollback;
mod subscriptions;
mod views;
