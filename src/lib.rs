//! brook: an LLM inference-serving engine. Actix actors (session, scheduler, KV-block manager,
//! executor) exchange typed messages; tokens stream out over WebSockets.
pub mod access;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod config;
pub mod engine;
pub mod engine_args;
pub mod error;
pub mod executor;
pub mod health;
pub mod kv;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod output;
pub mod parallel;
pub mod protocol;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod serve;
pub mod server;
pub mod session;
pub mod simulate;
pub mod spec;
pub mod step;
pub mod tokenizer;
#[cfg(test)]
pub(crate) mod tokenizer_fixture;
pub mod validation;

// Lets `model/testing.rs`, which the integration tests also include, name the library `brook::`
// in unit tests too.
#[cfg(test)]
extern crate self as brook;
