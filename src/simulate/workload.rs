//! Workload files for `brook simulate` (TOML; the format is documented in
//! `configs/workloads/README.md`) and the request streams they generate.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::scheduler::{CostCoefficients, SchedulerConfig, SloConfig};

/// Context length of the simulated scheduler when the workload leaves `max_model_len` at 0
/// ("the model's" in brook's config; there is no model here).
pub const DEFAULT_SIM_MAX_MODEL_LEN: usize = 32768;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Seeds arrivals, lengths and the executor's noise.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Arrivals are generated over this many seconds; the run then drains.
    pub duration_s: f64,
    /// Mean arrival rate (requests/s) when neither `--rate` nor `--sweep` is given.
    pub rate: f64,
    /// Rates of `--sweep` without a range.
    #[serde(default)]
    pub sweep: Vec<f64>,
    pub arrival: ArrivalProcess,
    /// Request mixture (Poisson arrivals); each arrival draws a component by weight.
    #[serde(default)]
    pub mix: Vec<MixComponent>,
    /// Per-class SLOs: both the scheduler's targets and the attainment criterion.
    #[serde(default)]
    pub slo: SloConfig,
    /// The attainment criterion when it differs from the scheduler's targets (`slo`): e.g. a
    /// client that judges mean ITL at 50 ms while the scheduler paces short answers tighter
    /// for their end-to-end latency. Default: `slo`.
    #[serde(default)]
    pub judge: Option<SloConfig>,
    #[serde(default)]
    pub engine: EngineModel,
    /// Scheduler settings (the `[scheduler]` table of brook's config); `--policy` overrides
    /// `policy`, and `slo` above replaces `scheduler.slo`.
    #[serde(default)]
    pub scheduler: SchedulerConfig,
}

fn default_seed() -> u64 {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ArrivalProcess {
    /// Exponential inter-arrival times at the chosen rate.
    Poisson,
    /// Replays a CSV trace (`arrival_s,prompt_tokens,output_tokens[,max_tokens]`, one header
    /// line); `--rate` rescales its time axis to that mean rate. A relative path is relative to
    /// the workload file.
    Trace { path: PathBuf },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixComponent {
    pub name: String,
    pub weight: f64,
    pub prompt: LengthDist,
    /// The output length the simulated model generates before eos.
    pub output: LengthDist,
    /// The client's `max_tokens` (the scheduler sees only this, not the output length).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
}

fn default_max_tokens() -> usize {
    1024
}

/// A token-count distribution, clamped to [min, max] where given.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum LengthDist {
    Constant {
        value: usize,
    },
    Uniform {
        min: usize,
        max: usize,
    },
    /// exp(N(ln median, sigma²)).
    Lognormal {
        median: f64,
        sigma: f64,
        #[serde(default = "one")]
        min: usize,
        #[serde(default = "usize_max")]
        max: usize,
    },
}

fn one() -> usize {
    1
}

fn usize_max() -> usize {
    usize::MAX
}

impl LengthDist {
    /// Refuses a distribution that cannot be what was meant (`what`: where it is).
    pub fn validate(&self, what: &str) -> anyhow::Result<()> {
        match *self {
            LengthDist::Constant { value } => {
                anyhow::ensure!(value > 0, "{what}: a constant of 0 tokens")
            }
            LengthDist::Uniform { min, max } => {
                anyhow::ensure!(min <= max, "{what}: uniform min {min} > max {max}")
            }
            LengthDist::Lognormal {
                median,
                sigma,
                min,
                max,
            } => {
                anyhow::ensure!(
                    median.is_finite() && median > 0.0,
                    "{what}: lognormal median must be > 0, got {median}"
                );
                anyhow::ensure!(
                    sigma.is_finite() && sigma >= 0.0,
                    "{what}: lognormal sigma must be >= 0, got {sigma}"
                );
                anyhow::ensure!(min <= max, "{what}: lognormal min {min} > max {max}");
            }
        }
        Ok(())
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        match *self {
            LengthDist::Constant { value } => value.max(1),
            LengthDist::Uniform { min, max } => rng.random_range(min.max(1)..=max.max(min.max(1))),
            LengthDist::Lognormal {
                median,
                sigma,
                min,
                max,
            } => {
                let x = (median.ln() + sigma * standard_normal(rng)).exp();
                (x.round() as usize).clamp(min.max(1), max.max(min.max(1)))
            }
        }
    }
}

/// Box–Muller.
pub fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// The simulated engine: KV pool and the executor's step-time model.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineModel {
    pub num_kv_blocks: usize,
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    /// The executor's true step-time coefficients (the scheduler has to learn them).
    pub cost: CostCoefficients,
    /// Relative standard deviation of a step's time around the model.
    pub noise: f64,
    /// A prefill chunk's attention costs at least what a chunk of this many queries at the same
    /// context costs (0: off): the floor of a kernel whose short chunks do not fill the GPU. The
    /// scheduler's linear model does not know it. brook's flash prefill kernel once ran one CTA
    /// per 64 queries and head with no split over the keys (a floor of 256 queries for
    /// Llama-2-7B on an H200); it now splits over the keys, which leaves a floor of ~88 queries
    /// at 8-16k context (BENCHMARKS.md, issue 18, calls k3a/k3b).
    pub prefill_attn_min_query: usize,
}

impl Default for EngineModel {
    /// A 7B model on one H200: 90% of 141 GB less 13.5 GB of weights leaves ~113 GB of KV at
    /// 512 KiB per token (32 layers × 4096 × K,V × bf16) ≈ 220k tokens.
    fn default() -> Self {
        EngineModel {
            num_kv_blocks: 13_800,
            block_size: 16,
            enable_prefix_caching: true,
            cost: CostCoefficients::default(),
            noise: 0.03,
            prefill_attn_min_query: 0,
        }
    }
}

/// One generated request.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    pub arrival_s: f64,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub max_tokens: usize,
}

impl Workload {
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read workload {}: {e}", path.display()))?;
        let mut w: Workload = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("workload {}: {e}", path.display()))?;
        if let ArrivalProcess::Trace { path: trace } = &mut w.arrival {
            if trace.is_relative() {
                *trace = path.parent().unwrap_or(Path::new(".")).join(&*trace);
            }
        }
        // There is no model to take a context length from: 0 ("the model's") means 32k here.
        if w.scheduler.max_model_len == 0 {
            w.scheduler.max_model_len = DEFAULT_SIM_MAX_MODEL_LEN;
        }
        w.validate()?;
        Ok(w)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.duration_s > 0.0 && self.duration_s.is_finite(),
            "duration_s must be > 0 and finite, got {}",
            self.duration_s
        );
        check_rate(self.rate)?;
        for m in &self.mix {
            m.prompt.validate(&format!("mix {:?} prompt", m.name))?;
            m.output.validate(&format!("mix {:?} output", m.name))?;
            anyhow::ensure!(m.max_tokens > 0, "mix {:?}: max_tokens must be > 0", m.name);
        }
        if matches!(self.arrival, ArrivalProcess::Poisson) {
            anyhow::ensure!(
                !self.mix.is_empty(),
                "a poisson workload needs [[mix]] components"
            );
            anyhow::ensure!(
                self.mix.iter().all(|m| m.weight >= 0.0) && self.mix.iter().any(|m| m.weight > 0.0),
                "mix weights must be >= 0 and not all 0"
            );
        }
        anyhow::ensure!(self.engine.block_size > 0, "engine.block_size must be > 0");
        anyhow::ensure!(
            self.engine.num_kv_blocks > 0,
            "engine.num_kv_blocks must be > 0"
        );
        anyhow::ensure!(
            (0.0..0.5).contains(&self.engine.noise),
            "engine.noise must be in [0, 0.5)"
        );
        self.engine.cost.validate().map_err(anyhow::Error::msg)?;
        self.scheduler.validate().map_err(anyhow::Error::msg)?;
        Ok(())
    }

    /// The request stream at `rate` requests/s, sorted by arrival.
    pub fn requests(&self, rate: f64) -> anyhow::Result<Vec<SimRequest>> {
        match &self.arrival {
            ArrivalProcess::Poisson => Ok(self.poisson(rate)),
            ArrivalProcess::Trace { path } => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read trace {}: {e}", path.display()))?;
                let mut reqs = parse_trace(&text)
                    .map_err(|e| anyhow::anyhow!("trace {}: {e}", path.display()))?;
                rescale(&mut reqs, rate);
                Ok(reqs)
            }
        }
    }

    fn poisson(&self, rate: f64) -> Vec<SimRequest> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let total: f64 = self.mix.iter().map(|m| m.weight).sum();
        let mut out = Vec::new();
        let mut t = 0.0;
        loop {
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            if t >= self.duration_s {
                return out;
            }
            let mut pick = rng.random::<f64>() * total;
            let m = self
                .mix
                .iter()
                .find(|m| {
                    pick -= m.weight;
                    pick < 0.0
                })
                .unwrap_or_else(|| self.mix.last().expect("validated non-empty"));
            let max_tokens = m.max_tokens.max(1);
            out.push(SimRequest {
                arrival_s: t,
                prompt_tokens: m.prompt.sample(&mut rng),
                output_tokens: m.output.sample(&mut rng).min(max_tokens),
                max_tokens,
            });
        }
    }
}

/// Most requests one simulated run takes (each is held, with its record, until the report).
pub const MAX_SIM_REQUESTS: f64 = 10_000_000.0;

/// A request rate: positive and finite.
pub fn check_rate(rate: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        rate > 0.0 && rate.is_finite(),
        "rate must be > 0 and finite, got {rate}"
    );
    Ok(())
}

/// `arrival_s,prompt_tokens,output_tokens[,max_tokens]` with one header line.
pub fn parse_trace(text: &str) -> anyhow::Result<Vec<SimRequest>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || {
            anyhow::anyhow!(
                "line {}: expected arrival_s,prompt_tokens,output_tokens[,max_tokens]",
                i + 1
            )
        };
        anyhow::ensure!(f.len() == 3 || f.len() == 4, bad());
        let arrival_s: f64 = f[0].parse().map_err(|_| bad())?;
        let prompt_tokens: usize = f[1].parse().map_err(|_| bad())?;
        let output_tokens: usize = f[2].parse().map_err(|_| bad())?;
        let max_tokens: usize = match f.get(3) {
            Some(v) => v.parse().map_err(|_| bad())?,
            None => output_tokens,
        };
        anyhow::ensure!(
            arrival_s >= 0.0 && arrival_s.is_finite(),
            "line {}: arrival_s must be >= 0, got {arrival_s}",
            i + 1
        );
        anyhow::ensure!(
            prompt_tokens > 0 && output_tokens > 0,
            "line {}: prompt_tokens and output_tokens must be > 0",
            i + 1
        );
        out.push(SimRequest {
            arrival_s,
            prompt_tokens,
            output_tokens: output_tokens.min(max_tokens.max(1)),
            max_tokens: max_tokens.max(1),
        });
    }
    anyhow::ensure!(!out.is_empty(), "trace has no requests");
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(out)
}

/// Stretches or compresses the time axis so the trace's mean rate is `rate`.
fn rescale(reqs: &mut [SimRequest], rate: f64) {
    let span = reqs.last().map_or(0.0, |r| r.arrival_s);
    if span <= 0.0 || reqs.len() < 2 {
        return;
    }
    let factor = (reqs.len() as f64 / span) / rate;
    for r in reqs {
        r.arrival_s *= factor;
    }
}
