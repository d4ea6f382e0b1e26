//! Command line: `brook serve`, `brook bench` and `brook simulate`. The root of the module
//! graph's command side: each command's flags live with the command (`serve::ServeArgs`,
//! `bench::BenchArgs`, `simulate::SimulateArgs`), the flags they share in `engine_args`.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "brook",
    version,
    about = "LLM inference serving: tokens over WebSockets"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a model over HTTP + WebSocket (GET / is a chat page; /v1/ws is the API).
    Serve(crate::serve::ServeArgs),
    /// Run an offline workload through the engine and print throughput and latency figures.
    Bench(crate::bench::BenchArgs),
    /// Discrete-event simulation of the real scheduler under a workload (no model): SLO
    /// attainment, latency percentiles and throughput per policy.
    Simulate(crate::simulate::SimulateArgs),
}
