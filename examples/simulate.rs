//! `brook simulate` through the library, until the CLI carries the subcommand:
//! `cargo run --release --example simulate -- --workload configs/workloads/ecommerce_peak.toml`.
use clap::Parser;

#[derive(Parser)]
#[command(name = "simulate")]
struct Cli {
    #[command(flatten)]
    args: brook::simulate::SimulateArgs,
}

fn main() -> anyhow::Result<()> {
    brook::simulate::run(Cli::parse().args)
}
