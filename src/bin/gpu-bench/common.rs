//! What the benchmarks share: JSON figures on stdout, CUDA-event timing, device buffers filled
//! on the GPU, the synthetic-weight backend and its one-sequence batches, and the causal prefill
//! fixture both attention benchmarks time.

use std::sync::Arc;
use std::time::Instant;

use brook::executor::backend::Backend;
use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::executor::cuda::kernels::{self, PrefillAttnParams, PREFILL_TILE};
use brook::executor::cuda::{
    pdl_small, skip, CudaBackend, CudaBackendOptions, DecodeKernel, GemvSmem, Quantization,
};
use brook::model::synthetic::synthetic_config;
use brook::request::RequestId;
use brook::sampling::params::SamplingParams;
use brook::step::{NewRequestData, ScheduledRequest, SchedulerOutput, StepOutput};
use cudarc::driver::sys::CUevent_flags;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One figure: a JSON object on its own line of stdout, tagged with the environment's choices
/// (quantization, kernels, switches) where the figure does not name them itself.
pub fn emit(mut v: serde_json::Value) {
    if let Some(o) = v.as_object_mut() {
        let defines: Vec<String> = decode_defines()
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        let tags: [(&str, serde_json::Value); 13] = [
            ("quantization", quantization().as_str().into()),
            ("decode_kernel", decode_kernel().as_str().into()),
            ("prefill_wgmma", prefill_wgmma().into()),
            ("prefill_wg_stages", prefill_wg_stages().into()),
            ("prefill_tma", prefill_tma().into()),
            ("gate_up_bf16", gate_up_bf16().into()),
            ("gemv_bulk", gemv_bulk().into()),
            ("gemv_smem", gemv_smem().as_str().into()),
            ("residual_gemm", residual_gemm().into()),
            ("decode_cluster", decode_cluster().into()),
            ("pdl_small", pdl_small().into()),
            ("decode_defines", defines.join(",").into()),
            ("block_size", block_size().into()),
        ];
        for (key, value) in tags {
            o.entry(key).or_insert(value);
        }
    }
    println!("{v}");
}

/// The linear weights' quantization of every backend gpu-bench makes: `BROOK_QUANTIZATION`
/// (none or fp8; default none), so that each benchmark runs on fp8 weights unchanged.
pub fn quantization() -> Quantization {
    env_choice("BROOK_QUANTIZATION")
}

/// `var`'s value as one of `T`'s names (as the CLI spells them), `T`'s default when unset; a
/// value that names none ends the run with the names it takes, rather than benchmarking the
/// default under a name the caller did not mean.
fn env_choice<T: clap::ValueEnum + Default>(var: &str) -> T {
    let Ok(v) = std::env::var(var) else {
        return T::default();
    };
    T::from_str(&v, true).unwrap_or_else(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|t| t.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        eprintln!("{var}={v:?}: expected one of {}", names.join(", "));
        std::process::exit(2)
    })
}

/// `var` as 0 or 1, `default` when unset; any other value ends the run (as `env_choice`).
fn env_flag(var: &str, default: bool) -> bool {
    match std::env::var(var).as_deref() {
        Err(_) => default,
        Ok("1") => true,
        Ok("0") => false,
        Ok(v) => {
            eprintln!("{var}={v:?}: expected 0 or 1");
            std::process::exit(2)
        }
    }
}

/// Whether every backend gpu-bench makes runs prefill attention on the wgmma kernel where it is
/// built: `BROOK_PREFILL_WGMMA` (0: the mma.sync kernel; brook's default when unset), for A/B
/// runs.
pub fn prefill_wgmma() -> bool {
    env_flag(
        "BROOK_PREFILL_WGMMA",
        CudaBackendOptions::default().prefill_wgmma,
    )
}

/// K/V tiles of the wgmma prefill kernel in every backend and `Gpu` gpu-bench makes:
/// `BROOK_PREFILL_WG_STAGES` (1 or 2; brook's default when unset), for A/B runs.
pub fn prefill_wg_stages() -> usize {
    env_count(
        "BROOK_PREFILL_WG_STAGES",
        &[1, 2],
        CudaBackendOptions::default().prefill_wg_stages,
    )
}

/// `var` as one of the counts `allowed`, `default` when unset; any other value ends the run
/// (as `env_flag`).
fn env_count(var: &str, allowed: &[usize], default: usize) -> usize {
    let Ok(v) = std::env::var(var) else {
        return default;
    };
    match v.parse() {
        Ok(n) if allowed.contains(&n) => n,
        _ => {
            eprintln!("{var}={v:?}: expected one of {allowed:?}");
            std::process::exit(2)
        }
    }
}

/// Tokens per KV block in every backend and attention case gpu-bench makes: `BROOK_BLOCK_SIZE`
/// (brook's default, 16, when unset), for A/B runs: a block of one kv head is `block_size` rows
/// of contiguous cache (2 KB at 16 keys of 128 e4m3 dims).
pub fn block_size() -> usize {
    env_count(
        "BROOK_BLOCK_SIZE",
        &[8, 16, 32, 64],
        CudaBackendOptions::default().block_size,
    )
}

/// Whether the gate|up projection writes bf16 (and `silu_mul` reads it) in every backend
/// gpu-bench makes: `BROOK_GATE_UP_BF16` (0 or 1; brook's default when unset), for A/B runs.
pub fn gate_up_bf16() -> bool {
    env_flag(
        "BROOK_GATE_UP_BF16",
        CudaBackendOptions::default().gate_up_bf16,
    )
}

/// Whether the wgmma prefill kernel loads K/V by TMA in every backend and `Gpu` gpu-bench
/// makes: `BROOK_PREFILL_TMA` (0 or 1; brook's default when unset), for A/B runs.
pub fn prefill_tma() -> bool {
    env_flag(
        "BROOK_PREFILL_TMA",
        CudaBackendOptions::default().prefill_tma,
    )
}

/// `BROOK_DECODE_CLUSTER` (0 or 1; brook's default when unset): decode splits merged in a
/// thread-block cluster in every backend gpu-bench makes, for A/B runs.
pub fn decode_cluster() -> bool {
    env_flag(
        "BROOK_DECODE_CLUSTER",
        CudaBackendOptions::default().decode_cluster,
    )
}

/// Whether decode GEMVs run on the bulk-copy kernel in every backend and `Gpu` gpu-bench makes:
/// `BROOK_GEMV_BULK` (0 or 1; brook's default when unset), for A/B runs.
pub fn gemv_bulk() -> bool {
    env_flag("BROOK_GEMV_BULK", CudaBackendOptions::default().gemv_bulk)
}

/// The bulk gemv launches' shared memory in every backend and `Gpu` gpu-bench makes:
/// `BROOK_GEMV_SMEM` (roomy or tight; `GemvSmem`; brook's default when unset), for A/B runs.
pub fn gemv_smem() -> GemvSmem {
    env_choice("BROOK_GEMV_SMEM")
}

/// Extra defines for the decode attention builds of every backend and `Gpu` gpu-bench makes
/// (`CudaBackendOptions::decode_defines`): `BROOK_DECODE_DEFINES`, comma-separated `NAME=N`
/// where NAME is one of the `DMMA_*` overrides kernels/paged_decode_mma.cu reads; none when
/// unset. For A/B runs of the decode kernel's tuning in one binary.
pub fn decode_defines() -> Vec<(String, usize)> {
    const NAMES: [&str; 4] = ["DMMA_U_SET", "DMMA_CTAS_SET", "DMMA_BT_AHEAD", "DMMA_RING"];
    let Ok(v) = std::env::var("BROOK_DECODE_DEFINES") else {
        return Vec::new();
    };
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|item| {
            let parsed = item
                .split_once('=')
                .filter(|(n, _)| NAMES.contains(n))
                .and_then(|(n, x)| Some((n.to_string(), x.parse().ok()?)));
            parsed.unwrap_or_else(|| {
                eprintln!("BROOK_DECODE_DEFINES: {item:?} is not NAME=N with NAME in {NAMES:?}");
                std::process::exit(2)
            })
        })
        .collect()
}

/// Which of `rope_kv`, `silu_mul` and `sample` are launched with PDL in every backend and `Gpu`
/// gpu-bench makes: `BROOK_PDL_SMALL` (bits of `options::pdl_small`, 0-7; brook's default when
/// unset), for A/B runs.
pub fn pdl_small() -> u32 {
    let all = pdl_small::ALL as usize;
    env_count(
        "BROOK_PDL_SMALL",
        &(0..=all).collect::<Vec<_>>(),
        CudaBackendOptions::default().pdl_small as usize,
    ) as u32
}

/// Whether the o and down projections on cuBLAS add into the residual in every backend
/// gpu-bench makes: `BROOK_RESIDUAL_GEMM` (0 or 1; brook's default when unset), for A/B runs.
pub fn residual_gemm() -> bool {
    env_flag(
        "BROOK_RESIDUAL_GEMM",
        CudaBackendOptions::default().residual_gemm,
    )
}

/// The decode attention kernel of every backend gpu-bench makes: `BROOK_DECODE_KERNEL` (auto,
/// lanes or mma; default auto), for A/B runs of whole steps.
pub fn decode_kernel() -> DecodeKernel {
    env_choice("BROOK_DECODE_KERNEL")
}

/// The median; NaN (JSON null) for no samples, e.g. the GPU gaps of a variant without stamps.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each step's wall time, and with `CudaBackendOptions::step_timing` its GPU span (first
/// kernel's start to last kernel's end) and host phases; medians past a warm-up.
#[derive(Default)]
pub struct StepTimes {
    pub walls: Vec<f64>,
    spans: Vec<f64>,
    hosts: Vec<[f64; 3]>,
}

/// Medians of `StepTimes`, ms: wall, GPU span and host (prepare, launch, wait); None without
/// step stamps.
pub type StepMedians = (f64, Option<f64>, Option<[f64; 3]>);

impl StepTimes {
    /// Records the step `b` has just run in `wall_ms`.
    pub fn push(&mut self, b: &CudaBackend, wall_ms: f64) {
        self.walls.push(wall_ms);
        if let Some(t) = b.last_timing() {
            self.spans
                .push(t.gpu_end_ns.saturating_sub(t.gpu_start_ns) as f64 / 1e6);
            self.hosts
                .push([t.prepare, t.launch, t.wait].map(|d| d.as_secs_f64() * 1e3));
        }
    }

    /// Medians over the steps after the first `warm`.
    pub fn medians(&self, warm: usize) -> StepMedians {
        let wall = median(self.walls[warm.min(self.walls.len())..].to_vec());
        let gpu = (self.spans.len() > warm).then(|| median(self.spans[warm..].to_vec()));
        let host = (self.hosts.len() > warm)
            .then(|| [0, 1, 2].map(|k| median(self.hosts[warm..].iter().map(|h| h[k]).collect())));
        (wall, gpu, host)
    }
}

/// Times `f` with CUDA events: `warmup` untimed runs, then the median of `reps` (ms).
pub fn time_ms(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    for i in 0..warmup {
        f(i)?;
    }
    let (start, end) = (
        gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
    );
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps {
        start.record(&gpu.stream)?;
        f(i)?;
        end.record(&gpu.stream)?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    Ok(median(times))
}

/// As `time_ms`, with `launches` calls of `f` between each pair of events (call i of rep r is
/// `f(r * launches + i)`), per call: the GPU runs them back to back, as a step's kernels run,
/// so the host's launch latency, which a lone launch between two events pays on an idle GPU,
/// stays out of a short kernel's time.
pub fn time_ms_back_to_back(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    launches: usize,
    mut f: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let launches = launches.max(1);
    let rep = time_ms(gpu, warmup, reps, |r| {
        (0..launches).try_for_each(|i| f(r * launches + i))
    })?;
    Ok(rep / launches as f64)
}

/// `n` bf16 values of a device buffer, as f32 (NaN stays NaN).
pub fn read_bf16(gpu: &Gpu, b: &DevBuf, n: usize) -> anyhow::Result<Vec<f32>> {
    let mut raw = vec![0u16; n];
    gpu.download(&mut raw, b.ptr())?;
    Ok(raw
        .into_iter()
        .map(|x| f32::from_bits((x as u32) << 16))
        .collect())
}

/// ‖a − b‖ / ‖b‖ (NaN when either holds a NaN, so a check `< tol` fails).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Milliseconds since `t0`, by the host clock (for whole engine steps).
pub fn elapsed_ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

pub fn upload<T: Copy>(gpu: &Gpu, data: &[T]) -> anyhow::Result<DevBuf> {
    let b = gpu.alloc(std::mem::size_of_val(data))?;
    gpu.upload(b.ptr(), data)?;
    Ok(b)
}

/// `elems` bf16 of random values in [-1, 1) (seeded, generated on the GPU).
pub fn random_bf16(gpu: &Gpu, elems: usize, seed: u64) -> anyhow::Result<DevBuf> {
    let b = gpu.alloc(elems * 2)?;
    let p = kernels::FillParams {
        out: b.ptr(),
        n: elems as u64,
        seed,
        scale: 1.0,
        offset: 0.0,
    };
    // SAFETY: b holds `elems` bf16.
    unsafe { kernels::fill_uniform(gpu, &p) }?;
    Ok(b)
}

/// `elems` KV cache elements of random values in the cache's dtype (`Gpu::kv_fp8`): bf16 as
/// `random_bf16`; e4m3 bytes of either sign, magnitudes 2^-4 to 0.94 (exponent fields 3..6, any
/// mantissa: never NaN, which a random byte can be), generated on the host as one seeded 16 MiB
/// pattern repeated over the buffer (benchmark caches reach gigabytes; the timing does not care
/// that the values repeat).
pub fn random_kv(gpu: &Gpu, elems: usize, seed: u64) -> anyhow::Result<DevBuf> {
    if !gpu.kv_fp8() {
        return random_bf16(gpu, elems, seed);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pattern = vec![0u8; elems.min(16 << 20)];
    for chunk in pattern.chunks_mut(8) {
        let r: u64 = rng.random();
        for (i, b) in chunk.iter_mut().enumerate() {
            let x = (r >> (8 * i)) as u8;
            *b = (x & 0x87) | ((3 + ((x >> 3) & 3)) << 3);
        }
    }
    let buf = gpu.alloc(elems)?;
    for at in (0..elems).step_by(pattern.len().max(1)) {
        let n = pattern.len().min(elems - at);
        gpu.upload(buf.ptr() + at as u64, &pattern[..n])?;
    }
    Ok(buf)
}

/// Bytes of one KV cache element on `gpu` (`Gpu::kv_fp8`).
pub fn kv_elem_bytes(gpu: &Gpu) -> usize {
    if gpu.kv_fp8() {
        1
    } else {
        2
    }
}

/// The head shape of one attention layer and the KV block size.
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

impl AttnShape {
    /// The head shape of the synthetic model `name`, with `block_size()`-token blocks.
    pub fn of_model(name: &str) -> anyhow::Result<AttnShape> {
        let cfg = synthetic_config(name)?;
        Ok(AttnShape {
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            block_size: block_size(),
        })
    }

    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// `seqs` causal prompts of `len` tokens each (no cached prefix) over a paged cache of
/// `num_blocks` random blocks, each prompt's blocks drawn at random from the pool; Q random too.
/// The device buffers the flash kernel and the GEMM path read.
pub struct CausalPrefill {
    pub seqs: usize,
    pub len: usize,
    pub blocks_per_seq: usize,
    pub num_tiles: usize,
    pub q: DevBuf,
    pub k_cache: DevBuf,
    pub v_cache: DevBuf,
    pub tile_seq: DevBuf,
    pub tile_q0: DevBuf,
    pub q_start: DevBuf,
    /// Each prompt's length, which is also its context length (no cached prefix).
    pub lens: DevBuf,
    pub block_tables: DevBuf,
}

impl CausalPrefill {
    /// K, V and Q filled with seeds `seed`, `seed + 1` and `seed + 2`; K and V in the cache's
    /// dtype (`random_kv`).
    pub fn new(
        gpu: &Gpu,
        shape: &AttnShape,
        (seqs, len): (usize, usize),
        num_blocks: usize,
        seed: u64,
        rng: &mut ChaCha8Rng,
    ) -> anyhow::Result<Self> {
        let (h, kvh, hd, bs) = (
            shape.heads,
            shape.kv_heads,
            shape.head_dim,
            shape.block_size,
        );
        let cache_elems = num_blocks * kvh * bs * hd;
        let (k_cache, v_cache) = (
            random_kv(gpu, cache_elems, seed)?,
            random_kv(gpu, cache_elems, seed + 1)?,
        );
        let q = random_bf16(gpu, seqs * len * h * hd, seed + 2)?;
        let blocks_per_seq = len.div_ceil(bs);
        let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
        perm.shuffle(rng);
        let (mut tile_seq, mut tile_q0) = (Vec::new(), Vec::new());
        for s in 0..seqs {
            for q0 in (0..len).step_by(PREFILL_TILE) {
                tile_seq.push(s as i32);
                tile_q0.push(q0 as i32);
            }
        }
        let q_start: Vec<i32> = (0..seqs).map(|s| (s * len) as i32).collect();
        Ok(CausalPrefill {
            seqs,
            len,
            blocks_per_seq,
            num_tiles: tile_seq.len(),
            q,
            k_cache,
            v_cache,
            tile_seq: upload(gpu, &tile_seq)?,
            tile_q0: upload(gpu, &tile_q0)?,
            q_start: upload(gpu, &q_start)?,
            lens: upload(gpu, &vec![len as i32; seqs])?,
            block_tables: upload(gpu, &perm[..seqs * blocks_per_seq])?,
        })
    }

    pub fn tokens(&self) -> usize {
        self.seqs * self.len
    }

    /// The flash kernel over every prompt, into `out` ([tokens, heads, head_dim] bf16).
    pub fn flash_params(&self, shape: &AttnShape, out: &DevBuf) -> PrefillAttnParams {
        PrefillAttnParams {
            q: self.q.ptr(),
            k_cache: self.k_cache.ptr(),
            v_cache: self.v_cache.ptr(),
            tile_seq: self.tile_seq.ptr(),
            tile_q0: self.tile_q0.ptr(),
            q_start: self.q_start.ptr(),
            q_len: self.lens.ptr(),
            context_lens: self.lens.ptr(),
            block_tables: self.block_tables.ptr(),
            out: out.ptr(),
            part_acc: 0,
            part_ml: 0,
            counters: 0,
            kv_maps: 0,
            num_tiles: self.num_tiles as i32,
            num_heads: shape.heads as i32,
            num_kv_heads: shape.kv_heads as i32,
            block_size: shape.block_size as i32,
            max_blocks: self.blocks_per_seq as i32,
            window: 0,
            num_splits: 1,
            scale: shape.scale(),
        }
    }
}

/// brook's defaults with the progress bar off; each bench overrides what it measures.
/// Leave-one-out variants (`CudaBackendOptions::skip`): what each kind of launch costs inside a
/// step is the default's time minus the time with that kind left out.
pub const SKIPS: [(&str, u32); 6] = [
    ("norms", skip::NORMS),
    ("rope", skip::ROPE),
    ("attention", skip::ATTENTION),
    ("silu", skip::SILU),
    (
        "all but linear",
        skip::NORMS | skip::ROPE | skip::ATTENTION | skip::SILU,
    ),
    ("linear", skip::LINEAR),
];

pub fn bench_options() -> CudaBackendOptions {
    CudaBackendOptions {
        progress: false,
        quantization: quantization(),
        decode_kernel: decode_kernel(),
        prefill_wgmma: prefill_wgmma(),
        prefill_wg_stages: prefill_wg_stages(),
        prefill_tma: prefill_tma(),
        gate_up_bf16: gate_up_bf16(),
        gemv_bulk: gemv_bulk(),
        gemv_smem: gemv_smem(),
        decode_cluster: decode_cluster(),
        pdl_small: pdl_small(),
        decode_min_split_keys: env_count("BROOK_DECODE_MIN_KEYS", &[0, 32, 64, 128, 256], 0),
        decode_defines: decode_defines(),
        // The base step without lookahead, as every figure before session 34 ran it (serving's
        // default is "auto": the `lookahead-auto` variant of decode-variants; `brook bench`).
        lookahead: false,
        lookahead_gate_us: None,
        residual_gemm: residual_gemm(),
        block_size: block_size(),
        ..Default::default()
    }
}

/// The GPU of the kernel benchmarks, with the prefill kernel choices the environment names
/// (`BROOK_PREFILL_WGMMA`, `BROOK_PREFILL_WG_STAGES`, `BROOK_PREFILL_TMA`, `BROOK_GEMV_BULK`), as
/// `bench_options` gives the backends.
pub fn open_gpu() -> anyhow::Result<Gpu> {
    let mut gpu = Gpu::open(0)?;
    gpu.prefill_wgmma = prefill_wgmma();
    gpu.prefill_wg_stages = prefill_wg_stages();
    gpu.prefill_tma = prefill_tma();
    gpu.gemv_bulk &= gemv_bulk();
    gpu.gemv_smem = gemv_smem();
    gpu.pdl_small = pdl_small();
    gpu.decode_defines = decode_defines();
    Ok(gpu)
}

pub fn backend(model: &str, opts: CudaBackendOptions) -> anyhow::Result<CudaBackend> {
    let cfg = synthetic_config(model)?;
    let started = Instant::now();
    let b = CudaBackend::synthetic(cfg, 0, opts)?;
    eprintln!(
        "{model}: synthetic weights and KV pool ready in {:.1} s; {:?}",
        started.elapsed().as_secs_f64(),
        b.info()
    );
    Ok(b)
}

/// A step of one request decoding alone, through the executor's persistent input batch as the
/// server runs it: `n` tokens from position `start`; the first step (`start` 0) sends the prompt
/// and every block, later ones nothing but the count (the executor feeds back its own tokens).
/// `drop`: a request the executor should forget first.
pub fn one_seq_step(
    id: u64,
    prompt: &[u32],
    start: usize,
    n: usize,
    blocks: &[u32],
    drop: Option<u64>,
) -> SchedulerOutput {
    let new = (start == 0).then(|| NewRequestData {
        token_ids: prompt.to_vec(),
        num_prompt_tokens: prompt.len(),
        params: Arc::new(SamplingParams::greedy(1)),
        seed: id,
    });
    SchedulerOutput {
        scheduled: vec![ScheduledRequest {
            id: RequestId(id),
            num_computed_tokens: start,
            num_tokens: n,
            num_draft_tokens: 0,
            sample: true,
            truncate_blocks_to: None,
            num_freed_blocks: 0,
            new_block_ids: if start == 0 {
                blocks.to_vec()
            } else {
                Vec::new()
            },
            new,
        }],
        finished_req_ids: drop.map(RequestId).into_iter().collect(),
        ..SchedulerOutput::default()
    }
}

/// Run `rep` of a one-prompt benchmark: a fresh random prompt of `len` tokens as request `rep`
/// on blocks of its own (the rep-th run of `len.div_ceil(block_size)`), the previous run's
/// request dropped.
pub fn fresh_prompt_step(
    rep: usize,
    len: usize,
    block_size: usize,
    vocab: u32,
    rng: &mut ChaCha8Rng,
) -> SchedulerOutput {
    let tokens: Vec<u32> = (0..len).map(|_| rng.random_range(0..vocab)).collect();
    let per = len.div_ceil(block_size);
    let blocks: Vec<u32> = (rep * per..(rep + 1) * per).map(|b| b as u32).collect();
    let last = rep.checked_sub(1).map(|r| r as u64);
    one_seq_step(rep as u64, &tokens, 0, len, &blocks, last)
}

/// A step of `b` on `out` (an empty step runs nothing and samples nothing).
pub fn execute(b: &mut CudaBackend, out: &SchedulerOutput) -> anyhow::Result<StepOutput> {
    if out.is_empty() {
        Ok(Default::default())
    } else {
        b.execute(out)
    }
}

/// Prints and emits a per-launch trace (`Gpu::take_trace`) summed by launch name (GEMMs by
/// shape), largest first, beside `span_ms`, the untraced step's GPU span: the trace's own
/// events add a little to each launch, and its total against the span says how much.
pub fn report_trace(label: &str, trace: &[(String, f64)], span_ms: Option<f64>) {
    let mut by_name: Vec<(String, usize, f64)> = Vec::new();
    for (name, ms) in trace {
        match by_name.iter_mut().find(|(n, _, _)| n == name) {
            Some(row) => {
                row.1 += 1;
                row.2 += ms;
            }
            None => by_name.push((name.clone(), 1, *ms)),
        }
    }
    by_name.sort_by(|a, b| b.2.total_cmp(&a.2));
    let total: f64 = trace.iter().map(|(_, ms)| ms).sum();
    eprintln!(
        "{label}: trace of {} launches, {total:.2} ms in all (untraced GPU span {span_ms:.2?} ms); each row is launch time plus the gap before it",
        trace.len()
    );
    for (name, count, ms) in &by_name {
        eprintln!(
            "  {name:<40} {count:>4} × {:>8.1} µs = {ms:>7.3} ms ({:>4.1} %)",
            ms * 1e3 / *count as f64,
            100.0 * ms / total
        );
    }
    let rows: Vec<_> = by_name
        .iter()
        .map(
            |(name, count, ms)| serde_json::json!({"launch": name, "count": count, "total_ms": ms}),
        )
        .collect();
    emit(
        serde_json::json!({"figure": "step_trace", "label": label, "total_ms": total, "gpu_span_ms": span_ms, "launches": rows}),
    );
}

/// `batch` sequences (ids from `first_id`, blocks `per_seq` each from block `first_id ×
/// per_seq`) that enter as prefix-cache hits of `context - 1` tokens on blocks of their own (the
/// cache holds whatever the pool held: attention reads every byte all the same) and decode one
/// token a step: a large decode batch at a long context in one step instead of a prefill.
pub struct PrefixHitBatch {
    pub first_id: usize,
    pub batch: usize,
    pub context: usize,
    pub per_seq: usize,
    pub vocab: u32,
    pub params: Arc<SamplingParams>,
}

impl PrefixHitBatch {
    /// Decode step `i` (0: the sequences enter).
    pub fn step(&self, i: usize) -> SchedulerOutput {
        SchedulerOutput {
            scheduled: (self.first_id..self.first_id + self.batch)
                .map(|s| {
                    let blocks = (s * self.per_seq) as u32..((s + 1) * self.per_seq) as u32;
                    ScheduledRequest {
                        id: RequestId(s as u64),
                        num_computed_tokens: self.context - 1 + i,
                        num_tokens: 1,
                        num_draft_tokens: 0,
                        sample: true,
                        truncate_blocks_to: None,
                        num_freed_blocks: 0,
                        new_block_ids: if i == 0 { blocks.collect() } else { Vec::new() },
                        new: (i == 0).then(|| NewRequestData {
                            token_ids: (0..self.context as u32)
                                .map(|t| (t * 7919 + s as u32) % self.vocab)
                                .collect(),
                            num_prompt_tokens: self.context,
                            params: self.params.clone(),
                            seed: s as u64,
                        }),
                    }
                })
                .collect(),
            num_decode_seqs: self.batch,
            ..SchedulerOutput::default()
        }
    }

    /// The batch's request ids (a later step's `finished_req_ids` frees their rows).
    pub fn ids(&self) -> Vec<RequestId> {
        (self.first_id..self.first_id + self.batch)
            .map(|s| RequestId(s as u64))
            .collect()
    }
}
