//! brook: an LLM inference-serving engine. Actix actors (session, scheduler, KV-block manager,
//! executor) exchange typed messages; tokens stream out over WebSockets.
pub mod chat;
pub mod detok;
pub mod error;
pub mod executor;
pub mod output;
pub mod request;
pub mod sampling;
pub mod stop;
pub mod tokenizer;
#[cfg(test)]
pub(crate) mod tokenizer_fixture;
