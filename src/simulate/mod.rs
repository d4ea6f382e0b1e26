//! `brook simulate`: a discrete-event simulator that drives the real scheduler core and KV
//! manager with a cost-model executor and no model, to compare scheduling policies on a
//! workload (see `configs/workloads/README.md`).
//!
//! - [`workload`]: the TOML workload file and the request streams it generates.
//! - [`executor`]: step times from a cost model, tokens from the drawn output lengths.
//! - [`sim`]: the event loop.
//! - [`lookahead`]: the CUDA backend's lookahead decode on the simulated step stream.
//! - [`report`]: SLO attainment, latency percentiles, goodput, throughput; table and JSON.
pub mod executor;
pub mod lookahead;
pub mod report;
pub mod sim;
#[cfg(test)]
mod tests;
pub mod workload;

use std::path::PathBuf;

use clap::Args;

use crate::scheduler::Policy;
use crate::simulate::lookahead::LookaheadSetup;
use crate::simulate::report::RunReport;
use crate::simulate::workload::Workload;

#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// Workload file (TOML), e.g. configs/workloads/ecommerce_peak.toml.
    #[arg(long, short)]
    pub workload: PathBuf,
    /// Policies to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "fcfs,adaptive"
    )]
    pub policy: Vec<Policy>,
    /// Mean arrival rate, requests/s (default: the workload's `rate`).
    #[arg(long, conflicts_with_all = ["sweep", "find_rate"])]
    pub rate: Option<f64>,
    /// Rates START:END:STEP, or the workload's `sweep` list when given no value.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    pub sweep: Option<String>,
    /// Finds the lowest rate at which `fcfs` attains its SLOs for at most this fraction of
    /// requests (e.g. 0.88), then runs every policy there.
    #[arg(long, conflicts_with = "sweep")]
    pub find_rate: Option<f64>,
    /// Overrides the workload's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Overrides the workload's duration_s.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Also runs each (rate, policy) with the CUDA backend's lookahead decode modelled: a kept
    /// step ends this many µs sooner (the host gap it hides; 11-27 µs on an H100 at batch 1,
    /// BENCHMARKS.md session 31), a missed one runs unused first. Rows "+la": every
    /// prediction launched (`model.cuda_lookahead = "on"`); "+la-auto": only while the
    /// backend's gate is open ("auto").
    #[arg(long, value_name = "GAIN_US")]
    pub lookahead: Option<f64>,
    /// Prints JSON (an array of runs) instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let mut w = Workload::from_file(&args.workload)?;
    if let Some(seed) = args.seed {
        w.seed = seed;
    }
    if let Some(d) = args.duration {
        anyhow::ensure!(
            d > 0.0 && d.is_finite(),
            "--duration must be > 0 and finite, got {d}"
        );
        w.duration_s = d;
    }
    anyhow::ensure!(!args.policy.is_empty(), "--policy names no policy");
    if let Some(g) = args.lookahead {
        anyhow::ensure!(
            g >= 0.0 && g.is_finite(),
            "--lookahead must be >= 0 µs and finite, got {g}"
        );
    }
    let rates = match (&args.sweep, args.find_rate) {
        (Some(spec), _) => sweep_rates(spec, &w)?,
        (None, Some(target)) => {
            let rate = find_rate(&w, target)?;
            eprintln!(
                "fcfs attains its SLOs for <= {:.1}% of requests from {rate:.3} req/s",
                target * 100.0
            );
            vec![rate]
        }
        (None, None) => vec![args.rate.unwrap_or(w.rate)],
    };
    let mut reports = Vec::new();
    for &rate in &rates {
        for &policy in &args.policy {
            reports.push(simulate(&w, policy, rate, None)?);
            if let Some(gain_us) = args.lookahead {
                for gated in [false, true] {
                    let setup = LookaheadSetup { gain_us, gated };
                    reports.push(simulate(&w, policy, rate, Some(setup))?);
                }
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        println!(
            "workload {} ({} s of arrivals, seed {})",
            w.name, w.duration_s, w.seed
        );
        print!("{}", report::table(&reports));
        if args.lookahead.is_some() {
            print!("\n{}", report::lookahead_table(&reports));
        }
    }
    Ok(())
}

/// One run of `policy` at `rate`, reported; with `lookahead`, lookahead decode modelled.
pub fn simulate(
    w: &Workload,
    policy: Policy,
    rate: f64,
    lookahead: Option<LookaheadSetup>,
) -> anyhow::Result<RunReport> {
    workload::check_rate(rate)?;
    // A Poisson workload's arrivals (a trace brings its own count).
    let expected = rate * w.duration_s;
    anyhow::ensure!(
        !matches!(w.arrival, workload::ArrivalProcess::Poisson)
            || expected <= workload::MAX_SIM_REQUESTS,
        "{rate} req/s for {} s is ~{expected:.0} requests; a run takes at most {}",
        w.duration_s,
        workload::MAX_SIM_REQUESTS
    );
    let run = sim::run_once(w, policy, rate, lookahead)?;
    Ok(report::report(
        &w.name,
        w.duration_s,
        w.judge.as_ref().unwrap_or(&w.slo),
        &run,
    ))
}

fn sweep_rates(spec: &str, w: &Workload) -> anyhow::Result<Vec<f64>> {
    if spec.is_empty() {
        anyhow::ensure!(
            !w.sweep.is_empty(),
            "--sweep without a range needs `sweep = [...]` in the workload"
        );
        return Ok(w.sweep.clone());
    }
    let parts: Vec<f64> = spec
        .split(':')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--sweep expects START:END:STEP, got {spec:?}"))?;
    let [start, end, step] = parts[..] else {
        anyhow::bail!("--sweep expects START:END:STEP, got {spec:?}");
    };
    anyhow::ensure!(
        start > 0.0 && end >= start && step > 0.0,
        "--sweep needs 0 < START <= END and STEP > 0"
    );
    let n = ((end - start) / step + 1e-9).floor() as usize;
    Ok((0..=n).map(|i| start + i as f64 * step).collect())
}

/// The lowest rate (to 1%) at which fcfs's attainment is at most `target`.
pub fn find_rate(w: &Workload, target: f64) -> anyhow::Result<f64> {
    anyhow::ensure!(
        (0.0..1.0).contains(&target),
        "--find-rate must be in [0, 1)"
    );
    let attainment = |rate: f64| -> anyhow::Result<f64> {
        Ok(simulate(w, Policy::Fcfs, rate, None)?.overall.attainment)
    };
    let (mut lo, mut hi) = (w.rate, w.rate);
    if attainment(hi)? <= target {
        while attainment(lo)? <= target {
            anyhow::ensure!(lo > 1e-3, "fcfs misses its SLOs even at {lo} req/s");
            hi = lo;
            lo /= 1.5;
        }
    } else {
        while attainment(hi)? > target {
            anyhow::ensure!(hi < 1e6, "fcfs meets its SLOs at any rate");
            lo = hi;
            hi *= 1.5;
        }
    }
    while hi - lo > 0.01 * hi {
        let mid = (lo + hi) / 2.0;
        if attainment(mid)? <= target {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}
