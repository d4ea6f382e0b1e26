//! brook: an LLM inference-serving engine. Actix actors (session, scheduler, KV-block manager,
//! executor) exchange typed messages; tokens stream out over WebSockets.
pub mod error;
pub mod executor;
pub mod kv;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod simulate;
