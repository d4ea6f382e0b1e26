use clap::Parser;

fn main() {
    let cli = brook::cli::Cli::parse();
    brook::logging::init();
    let result = match cli.command {
        brook::cli::Command::Serve(args) => brook::serve::run(args),
        brook::cli::Command::Bench(args) => brook::bench::run(args),
        brook::cli::Command::Simulate(args) => brook::simulate::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
