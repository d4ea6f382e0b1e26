//! `gpu-bench stream-floor`'s last part: where a kernel boundary's time goes in the per-matrix
//! chain of bulk GEMVs. A `GB_DIAG 2` build of gemv_bulk.cu (the full kernel) has thread 0 of
//! each CTA stamp `%globaltimer` at six points (`POINTS`); the chain of a token's matrices runs
//! once to warm up and once stamped, and the stamps give, per boundary between launch j - 1 and
//! j (medians over the CTAs, then over the boundaries of each kind of matrix):
//!
//! - `tail`: the previous launch's last CTA exit after its median exit (its slabs' spread);
//! - `land`: this launch's median CTA entry after the previous launch's median exit (how soon
//!   a CTA gets onto an SM the previous launch leaves);
//! - `release`: this launch's median return from `pdl_wait` after the previous launch's last
//!   exit (the dependency's own latency);
//! - `x`: staging x after the wait; `first`: warp 0's first stage landed after x was staged (0
//!   when it had landed before); `stream`: every stage consumed after the first; `write`: y.
//!
//! Per boundary `gap` = this launch's median first stage after the previous launch's median
//! "every stage consumed": the time in which no CTA consumes weights. `%globaltimer`'s
//! resolution is printed with the figures (the smallest non-zero step between two stamps).

use serde_json::json;

use brook::executor::cuda::device::Gpu;

use crate::common::emit;

/// Stamps a CTA records (`GB_STAMPS` in gemv_bulk.cu): entry, after `pdl_wait`, x staged,
/// warp 0's first stage landed, every stage consumed, y written.
pub const POINTS: usize = 6;
const NAMES: [&str; 4] = ["qkv", "o", "gate_up", "down"];

/// Launches matrix `j` ([n, k] at `w`) of the stamped build with PDL, its stamps at `stamps`
/// (u64 [ctas][POINTS]); returns its CTA count.
pub type Launch<'a> = dyn Fn(u64, usize, usize, u64) -> anyhow::Result<usize> + 'a;

/// Runs the chain of `mats` (laid out from `base`) stamped, and reports the boundaries.
pub fn run(
    gpu: &Gpu,
    model: &str,
    variant: &str,
    mats: &[(usize, usize)],
    base: u64,
    launch: &Launch,
) -> anyhow::Result<()> {
    let ctas = gpu.num_sms as usize;
    let per = ctas * POINTS;
    let buf = gpu.alloc(mats.len() * per * 8)?;
    let mut used = vec![0usize; mats.len()];
    for _ in 0..2 {
        gpu.memset(buf.ptr(), 0, mats.len() * per * 8)?;
        let mut w = base;
        for (j, &(n, k)) in mats.iter().enumerate() {
            used[j] = launch(w, n, k, buf.ptr() + (j * per * 8) as u64)?;
            anyhow::ensure!(used[j] <= ctas, "matrix {j}: {} CTAs", used[j]);
            w += (n * k * 2) as u64;
        }
        gpu.sync()?;
    }
    let mut raw = vec![0u64; mats.len() * per];
    gpu.download(&mut raw, buf.ptr())?;
    let launches: Vec<Vec<[u64; POINTS]>> = (0..mats.len())
        .map(|j| {
            (0..used[j])
                .map(|c| std::array::from_fn(|i| raw[j * per + c * POINTS + i]))
                .collect()
        })
        .collect();
    anyhow::ensure!(
        launches.iter().flatten().flatten().all(|&t| t != 0),
        "a CTA left a stamp unwritten"
    );
    report(model, variant, &launches, resolution(&raw));
    Ok(())
}

/// The smallest non-zero difference between two stamps (ns): the timer's step.
fn resolution(raw: &[u64]) -> u64 {
    let mut v: Vec<u64> = raw.iter().copied().filter(|&t| t != 0).collect();
    v.sort_unstable();
    v.windows(2)
        .map(|p| p[1] - p[0])
        .filter(|&d| d > 0)
        .min()
        .unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median over a launch's CTAs of stamp `i` (ns).
fn at(l: &[[u64; POINTS]], i: usize) -> f64 {
    median(l.iter().map(|c| c[i] as f64).collect())
}

/// The latest stamp `i` of a launch (ns).
fn last(l: &[[u64; POINTS]], i: usize) -> f64 {
    l.iter().map(|c| c[i]).max().unwrap_or(0) as f64
}

fn report(model: &str, variant: &str, launches: &[Vec<[u64; POINTS]>], res_ns: u64) {
    // Per boundary j (1..): the phases in µs, then grouped by the kind of matrix j is.
    let phases = |j: usize| -> [f64; 8] {
        let (p, l) = (&launches[j - 1], &launches[j]);
        let us = |ns: f64| ns / 1e3;
        [
            us(last(p, 5) - at(p, 5)),
            us(at(l, 0) - at(p, 5)),
            us(at(l, 1) - last(p, 5)),
            us(at(l, 2) - at(l, 1)),
            us(at(l, 3) - at(l, 2)),
            us(at(l, 4) - at(l, 3)),
            us(at(l, 5) - at(l, 4)),
            us(at(l, 3) - at(p, 4)),
        ]
    };
    let labels = [
        "tail", "land", "release", "x", "first", "stream", "write", "gap",
    ];
    let total_ms = (last(&launches[launches.len() - 1], 5) - at(&launches[0], 0)) / 1e6;
    eprintln!(
        "stream floor {model} stamps ({variant}): {} launches in {total_ms:.3} ms, timer step \
         {res_ns} ns; medians over boundaries, us",
        launches.len()
    );
    // The layers' matrices come in fours (QKV, O, gate|up, down); the LM head is the last.
    let layers = launches.len() - 1;
    for (kind, name) in NAMES.iter().enumerate() {
        let js: Vec<usize> = (1..layers).filter(|j| j % 4 == kind).collect();
        let med: Vec<f64> = (0..labels.len())
            .map(|i| median(js.iter().map(|&j| phases(j)[i]).collect()))
            .collect();
        let line: Vec<String> = labels
            .iter()
            .zip(&med)
            .map(|(l, v)| format!("{l} {v:.2}"))
            .collect();
        eprintln!(
            "  into {name} ({} boundaries): {}",
            js.len(),
            line.join(", ")
        );
        let fields: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .zip(&med)
            .map(|(l, v)| (format!("{l}_us"), json!(v)))
            .collect();
        emit(
            json!({"figure": "boundary_stamps", "model": model, "variant": variant,
            "into": name, "boundaries": js.len(), "timer_step_ns": res_ns,
            "chain_ms": total_ms, "phases": fields}),
        );
    }
}
