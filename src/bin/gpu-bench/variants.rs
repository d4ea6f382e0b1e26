//! `gpu-bench decode-variants`: decode through brook's scheduler and the executor's persistent
//! batch (`Backend::execute`, the serving path), for brook's defaults and each switch of issue
//! 18 (`VARIANTS`), each in its own process (`isolate`), at each context length asked for. Per
//! variant and context: wall ms per step, and with the GPU's step stamps (`step_timing`) the
//! idle gap between one step's last kernel and the next step's first (the host's share of a
//! step; goal ≤ 30 µs), the GPU's busy time per step, the host's phases, and what lookahead
//! kept.
//!
//! `variant_options` is shared with `gpu-bench offline --variants`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brook::executor::backend::Backend;
use brook::executor::cuda::{lookahead, CudaBackend, CudaBackendOptions, StepTiming};
use brook::kv::KvCacheManager;
use brook::model::synthetic::synthetic_config;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::scheduler::{Admission, NewRequest, Scheduler, SchedulerConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::common::{bench_options, elapsed_ms, emit, execute, median};

/// Every variant `variant_options` knows, in the order `decode-variants` runs them by default.
/// "untimed" is the default without the step stamps (two one-thread kernels a step): the figure
/// to compare with `gpu-bench decode --quick`; every other variant stamps its steps.
pub const VARIANTS: &[&str] = &[
    "untimed",
    "default",
    "split2",
    "pinned",
    "lookahead",
    "lookahead-auto",
    "inline",
    "fill4",
    "fill4-inline",
    "fill8-inline",
    "cluster",
    "all",
];

/// `base` with the switches of variant `name` (see `VARIANTS`); "all" is lookahead (with its
/// pinned I/O), fill4 splits and the in-kernel merge together. The step stamps are on except
/// for "untimed"; `offline` turns them off again.
pub fn variant_options(
    name: &str,
    base: &CudaBackendOptions,
) -> anyhow::Result<CudaBackendOptions> {
    let mut o = CudaBackendOptions {
        step_timing: true,
        ..base.clone()
    };
    match name {
        "untimed" => o.step_timing = false,
        "default" => {}
        // The split rule and merge before call c: about 2 CTAs per SM, a separate merge launch.
        "split2" => {
            o.decode_ctas_per_sm = 0;
            o.decode_merge_inline = false;
        }
        "pinned" => o.pinned_io = true,
        "lookahead" => o.lookahead = true,
        // Gated as `--cuda-lookahead auto` serves: at batch 1 with no churn it should launch
        // (and keep) what "lookahead" does.
        "lookahead-auto" => {
            o.lookahead = true;
            o.lookahead_gate_us = Some(lookahead::DEFAULT_GAIN_US);
        }
        "inline" => o.decode_merge_inline = true,
        "fill4" => o.decode_ctas_per_sm = 4,
        "fill4-inline" => {
            o.decode_ctas_per_sm = 4;
            o.decode_merge_inline = true;
        }
        "fill8-inline" => {
            o.decode_ctas_per_sm = 8;
            o.decode_merge_inline = true;
        }
        "cluster" => o.decode_cluster = true,
        "all" => {
            o.lookahead = true;
            o.decode_ctas_per_sm = 4;
            o.decode_merge_inline = true;
        }
        _ => anyhow::bail!("unknown variant {name:?}; known: {}", VARIANTS.join(", ")),
    }
    Ok(o)
}

/// `q`-quantile of `v` (sorted here), NaN (JSON null) when empty.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `decode-variants --same-process`: after each backend is dropped, report the device's memory
/// pool (and first trim it: `trim`).
#[derive(Debug, Clone, Copy)]
pub struct PoolCheck {
    pub trim: bool,
}

pub fn run(
    model: &str,
    input_lens: &[usize],
    output_len: usize,
    batch: usize,
    variants: &[String],
    pool: Option<PoolCheck>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        output_len > 16 && batch > 0,
        "output_len > 16 and batch > 0"
    );
    let max_len = input_lens.iter().max().copied().unwrap_or(0) + output_len + 16;
    let base = CudaBackendOptions {
        max_num_seqs: batch.max(8),
        max_num_batched_tokens: 8192,
        max_model_len: max_len,
        ..bench_options()
    };
    for name in variants {
        let opts = variant_options(name, &base)?;
        let mut cfg = synthetic_config(model)?;
        // Random weights: positions past the model's trained length change nothing measured.
        cfg.max_position_embeddings = cfg.max_position_embeddings.max(max_len);
        let started = Instant::now();
        let mut b = CudaBackend::synthetic(cfg, 0, opts)?;
        eprintln!(
            "{model} [{name}]: ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        // One scheduler, KV manager and clock for every context: the finished requests of one
        // run reach the backend with the next run's first step.
        let info = b.info();
        let mut kv = KvCacheManager::new(info.num_kv_blocks, info.block_size, true);
        let mut sched = Scheduler::new(SchedulerConfig {
            max_num_seqs: batch,
            max_num_batched_tokens: 8192,
            max_model_len: max_len,
            long_prefill_token_threshold: 0,
            ..Default::default()
        });
        let clock = Instant::now();
        for (k, &input_len) in input_lens.iter().enumerate() {
            let first_id = (k * batch) as u64;
            let state = (&mut sched, &mut kv, clock);
            one_run(
                &mut b, state, model, name, input_len, output_len, batch, first_id,
            )?;
        }
        if let Some(check) = pool {
            let device = base.device_ordinal;
            drop(b);
            // A report that fails (no current context once the backend is gone, say) must not
            // end the runs it is there to explain.
            let report = || -> anyhow::Result<String> {
                let (reserved, used) = pool_bytes(device, false)?;
                let trimmed = match check.trim {
                    true => format!(", trimmed to {:.2} GiB", gib(pool_bytes(device, true)?.0)),
                    false => String::new(),
                };
                Ok(format!(
                    "{:.2} GiB reserved, {:.2} GiB used{trimmed}",
                    gib(reserved),
                    gib(used)
                ))
            };
            match report() {
                Ok(r) => eprintln!("{model} [{name}] dropped: memory pool {r}"),
                Err(e) => eprintln!("{model} [{name}] dropped: memory pool not read: {e:#}"),
            }
        }
    }
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// (reserved, used) bytes of `device`'s default memory pool, which cudarc's stream-ordered
/// allocations draw from; `trim`: after releasing its unused bytes to the driver.
fn pool_bytes(device: usize, trim: bool) -> anyhow::Result<(u64, u64)> {
    use cudarc::driver::sys;
    // SAFETY: plain driver queries on an initialised driver (a backend was built before); the
    // attribute outputs are u64 (cuuint64_t).
    unsafe {
        let mut dev: sys::CUdevice = 0;
        sys::cuDeviceGet(&mut dev, device as i32).result()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        sys::cuDeviceGetDefaultMemPool(&mut pool, dev).result()?;
        if trim {
            sys::cuMemPoolTrimTo(pool, 0).result()?;
        }
        let attr = |a: sys::CUmemPool_attribute| -> anyhow::Result<u64> {
            let mut v: u64 = 0;
            sys::cuMemPoolGetAttribute(pool, a, &mut v as *mut u64 as *mut std::ffi::c_void)
                .result()?;
            Ok(v)
        };
        Ok((
            attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        ))
    }
}

/// `batch` requests of `input_len` random tokens decoding `output_len` tokens each (greedy,
/// ignore_eos) through `state`'s scheduler and KV manager (time: seconds since its clock);
/// figures over the pure-decode steps after the first 8 (graph capture).
#[allow(clippy::too_many_arguments)]
fn one_run(
    b: &mut CudaBackend,
    (sched, kv, clock): (&mut Scheduler, &mut KvCacheManager, Instant),
    model: &str,
    name: &str,
    input_len: usize,
    output_len: usize,
    batch: usize,
    first_id: u64,
) -> anyhow::Result<()> {
    let vocab = b.config().vocab_size as u32;
    let now = || clock.elapsed().as_secs_f64();
    let mut rng = ChaCha8Rng::seed_from_u64(7 + first_id);
    let params = Arc::new(SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(output_len)
    });
    for i in 0..batch as u64 {
        let req = NewRequest {
            id: RequestId(first_id + i),
            prompt_token_ids: (0..input_len).map(|_| rng.random_range(0..vocab)).collect(),
            params: params.clone(),
            seed: i,
            eos_token_ids: Arc::from(vec![2u32]),
            n: 1,
        };
        let admitted = sched.add_request(req, now());
        anyhow::ensure!(matches!(admitted, Admission::Accepted), "{admitted:?}");
    }
    let stats0 = b.lookahead_stats();
    // (wall ms of the whole iteration: schedule, execute, update; its timing) per decode step.
    let mut steps: Vec<(f64, Option<StepTiming>)> = Vec::new();
    let mut generated = 0;
    while sched.has_unfinished() {
        let t0 = Instant::now();
        let out = sched.schedule(kv, now());
        let pure_decode =
            !out.is_empty() && out.total_num_scheduled_tokens() == out.scheduled.len();
        let step = execute(b, &out)?;
        generated += step.sampled.len();
        sched.update_from_output(&out, &step, kv, now());
        if pure_decode {
            steps.push((elapsed_ms(t0), b.last_timing()));
        } else {
            steps.clear(); // only the decode steps after the last prefill chunk count
        }
    }
    anyhow::ensure!(
        generated == batch * output_len,
        "generated {generated} tokens"
    );
    anyhow::ensure!(steps.len() > 8, "{} decode steps", steps.len());
    let steps = &steps[8..];
    let ms: Vec<f64> = steps.iter().map(|s| s.0).collect();
    let timings: Vec<StepTiming> = steps.iter().filter_map(|s| s.1).collect();
    let gaps: Vec<f64> = timings
        .windows(2)
        .map(|w| w[1].gpu_start_ns.saturating_sub(w[0].gpu_end_ns) as f64 / 1e3)
        .collect();
    let busy: Vec<f64> = timings
        .iter()
        .map(|t| t.gpu_end_ns.saturating_sub(t.gpu_start_ns) as f64 / 1e6)
        .collect();
    let phase = |f: fn(&StepTiming) -> Duration| median(timings.iter().map(|t| us(f(t))).collect());
    let st = b.lookahead_stats();
    let (hits, misses, launched, unpredictable, held) = (
        st.hits - stats0.hits,
        st.misses - stats0.misses,
        st.launched - stats0.launched,
        st.unpredictable - stats0.unpredictable,
        st.held - stats0.held,
    );
    let (med, p99) = (median(ms.clone()), quantile(ms, 0.99));
    let (gap50, gap99) = (median(gaps.clone()), quantile(gaps, 0.99));
    eprintln!(
        "{model} decode [{name:<12}] batch {batch} ctx {input_len:>5}: {med:.3} ms/step (p99 {p99:.3}); gpu gap p50 {gap50:.1} us p99 {gap99:.1} us; gpu busy {:.3} ms; host prepare {:.0} launch {:.0} wait {:.0} us; lookahead kept {hits}/{launched} (dropped {misses}, unpredictable {unpredictable}, held {held})",
        median(busy.clone()),
        phase(|t| t.prepare),
        phase(|t| t.launch),
        phase(|t| t.wait),
    );
    emit(json!({
        "figure": "decode_variant", "model": model, "variant": name, "batch": batch,
        "input_len": input_len, "output_len": output_len, "median_ms_per_step": med, "p99_ms_per_step": p99,
        "gpu_gap_us_p50": gap50, "gpu_gap_us_p99": gap99, "gpu_busy_ms_p50": median(busy),
        "host_prepare_us_p50": phase(|t| t.prepare), "host_launch_us_p50": phase(|t| t.launch),
        "host_wait_us_p50": phase(|t| t.wait), "host_total_us_p50": phase(|t| t.total),
        "lookahead_kept": hits, "lookahead_launched": launched, "lookahead_dropped": misses,
        "lookahead_unpredictable": unpredictable, "lookahead_held": held,
        "timed_steps": timings.len(),
    }));
    Ok(())
}
