//! NVRTC compilation of `kernels/*.cu` for the device's architecture, with the PTX cached on disk
//! under a key of (source hash, architecture, options), so only the first start pays for it.
//!
//! The sources are embedded in the binary (`include_str!`), so one binary runs anywhere without
//! the repository next to it; `kernels/common.cuh` is prepended to each file, which keeps NVRTC
//! free of include paths (the kernels use no CUDA headers).

use std::path::PathBuf;

use cudarc::nvrtc::{CompileOptions, Ptx};

pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// (module name, source) for every kernel file that does not depend on the model's shape; all
/// are compiled when the GPU is opened.
pub const SOURCES: &[(&str, &str)] = &[
    ("embedding", include_str!("../../../kernels/embedding.cu")),
    ("rmsnorm", include_str!("../../../kernels/rmsnorm.cu")),
    ("rope_kv", include_str!("../../../kernels/rope_kv.cu")),
    ("silu_mul", include_str!("../../../kernels/silu_mul.cu")),
    ("kv_gather", include_str!("../../../kernels/kv_gather.cu")),
    (
        "causal_softmax",
        include_str!("../../../kernels/causal_softmax.cu"),
    ),
    ("sample", include_str!("../../../kernels/sample.cu")),
    ("fill", include_str!("../../../kernels/fill.cu")),
    ("gemv", include_str!("../../../kernels/gemv.cu")),
    ("gemv_bulk", include_str!("../../../kernels/gemv_bulk.cu")),
    ("quant_fp8", include_str!("../../../kernels/quant_fp8.cu")),
    (
        "block_table",
        include_str!("../../../kernels/block_table.cu"),
    ),
    ("stamp", include_str!("../../../kernels/stamp.cu")),
    ("copy_out", include_str!("../../../kernels/copy_out.cu")),
    ("kv_stage", include_str!("../../../kernels/kv_stage.cu")),
    (
        "feed_tokens",
        include_str!("../../../kernels/feed_tokens.cu"),
    ),
];

/// The files among `SOURCES` whose kernels write or gather the paged KV cache: built a second
/// time with `-DKV_FP8=1` for an e4m3 cache (`Gpu::set_kv_fp8`). kv_stage moves bytes and needs
/// no build of its own.
pub const KV_SOURCES: &[(&str, &str)] = &[
    ("rope_kv", include_str!("../../../kernels/rope_kv.cu")),
    ("gemv", include_str!("../../../kernels/gemv.cu")),
    ("kv_gather", include_str!("../../../kernels/kv_gather.cu")),
];

/// Most rows `gemv` takes (`gemv_m1..4` in gemv.cu). A fact of the sources above, kept here
/// (re-exported by `kernels`) so `device` can default to it without depending on `kernels`,
/// which depends on `device`.
pub const GEMV_MAX_M: usize = 4;

// The bulk-copy gemv (kernels/gemv_bulk.cu, launched from kernels/gemv_bulk.rs): its build
// constants, here beside the others `Gpu::open` needs.

/// Bytes of one stage of the ring (`GB_STAGE_BYTES`): a consumer warp's unit, and the shortest
/// row the kernel takes.
pub const GEMV_BULK_STAGE_BYTES: usize = 4096;
/// Stages in the ring (`GB_STAGES`): the dynamic shared memory is their product.
pub const GEMV_BULK_STAGES: usize = 32;
/// 16 consumer warps and the producer warp (`GB_THREADS`).
pub const GEMV_BULK_THREADS: u32 = 32 * 17;
/// The shared accumulator's floats (`GB_ACC_FLOATS`): a CTA owns at most this / m rows.
pub const GEMV_BULK_ACC_FLOATS: usize = 4096;

/// Most bytes of x [m, k] (`GB_X_BYTES`), staged in shared memory after the ring.
pub const GEMV_BULK_X_BYTES: usize = 81920;

/// Dynamic shared memory a gemv_bulk kernel is allowed, and what its roomy launches take
/// (`GemvSmem::Roomy`): the ring, the largest x and the largest accumulator.
pub const GEMV_BULK_SMEM: usize =
    GEMV_BULK_STAGES * GEMV_BULK_STAGE_BYTES + GEMV_BULK_X_BYTES + 4 * GEMV_BULK_ACC_FLOATS;

/// kernels/gemv_chain.cu: a chain of decode gemvs in one cooperative launch, compiled after
/// gemv_bulk.cu (its ring). Not in `SOURCES`: only `gpu-bench stream-floor` builds it.
pub const GEMV_CHAIN: &str = include_str!("../../../kernels/gemv_chain.cu");

/// Dynamic shared memory of the chain built with `stage_bytes` stages: its ring and x.
pub fn chain_smem(stage_bytes: usize) -> usize {
    GEMV_BULK_STAGES * stage_bytes + GEMV_BULK_X_BYTES
}

/// The loaded name of the chain kernel for `m` rows with `stage_bytes` stages.
pub fn chain_kernel_name(m: usize, stage_bytes: usize) -> String {
    format!("gemv_chain_m{m}_sb{stage_bytes}")
}

/// The source NVRTC compiles for gemv_chain: gemv_bulk.cu, then gemv_chain.cu.
pub fn gemv_chain_source() -> String {
    let bulk = include_str!("../../../kernels/gemv_bulk.cu");
    format!("{bulk}\n{GEMV_CHAIN}")
}

/// The kernels of gemv_bulk.cu, by name (`Gpu::open` gives each its shared memory).
pub fn gemv_bulk_kernels() -> impl Iterator<Item = String> {
    (1..=GEMV_MAX_M).map(|m| format!("gemv_bulk_m{m}"))
}

/// Stages of gemv_bulk.cu's deep ring (`GB_DEEP_STAGES`, `gemv_bulk_deep_m*`; `GemvSmem::Deep`).
pub const GEMV_BULK_DEEP_STAGES: usize = 48;
/// Most rows the deep kernels take (`gemv_bulk_deep_m1`): at two rows (x of the down
/// projection no longer fits beside the ring, the others' does) decode lost ~0.5 % on an H100
/// (BENCHMARKS.md, session 41).
pub const GEMV_BULK_DEEP_MAX_M: usize = 1;
/// Dynamic shared memory the deep kernels are allowed: sm_90's 227 KB a CTA less their static
/// mbarriers (full and empty, 8 bytes each a stage).
pub const GEMV_BULK_DEEP_SMEM: usize = 232_448 - 2 * 8 * GEMV_BULK_DEEP_STAGES;

/// The deep-ring kernels of gemv_bulk.cu, by name.
pub fn gemv_bulk_deep_kernels() -> impl Iterator<Item = String> {
    (1..=GEMV_BULK_DEEP_MAX_M).map(|m| format!("gemv_bulk_deep_m{m}"))
}

/// The attention kernels, compiled per model shape with `-DHD=<head dim>` (both) and
/// `-DGROUP=<query heads per kv head>` (decode) by `Gpu::load_attention`: compile-time loop
/// bounds for any head size and group, without a list of instantiations.
/// paged_decode.cu with paged_decode_mma.cu appended: the tensor-core decode kernel shares the
/// lane kernel's parameters and split merge.
pub const PAGED_DECODE: (&str, &str) = (
    "paged_decode",
    concat!(
        include_str!("../../../kernels/paged_decode.cu"),
        include_str!("../../../kernels/paged_decode_mma.cu")
    ),
);
pub const PREFILL_ATTN: (&str, &str) = (
    "prefill_attn",
    include_str!("../../../kernels/prefill_attn.cu"),
);
/// prefill_attn.cu with prefill_attn_wgmma.cu appended (the wgmma kernel shares its parameters,
/// K/V offsets and split merge), built for `WGMMA_ARCH` at the head dims `prefill_wgmma_supported`
/// allows.
pub const PREFILL_ATTN_WG: (&str, &str) = (
    "prefill_attn",
    concat!(
        include_str!("../../../kernels/prefill_attn.cu"),
        include_str!("../../../kernels/prefill_attn_wgmma.cu")
    ),
);
/// wgmma is an sm_90a instruction: PTX for compute_90a runs on compute capability 9.0 only.
pub const WGMMA_ARCH: &str = "compute_90a";

/// K/V tiles of the wgmma prefill kernel over a bf16 cache (`-DWG_STAGES`, `Gpu::
/// prefill_wg_stages`): 1, one K and one V tile loaded in turns at 3 CTAs an SM; 2, two of each
/// and FlashAttention-3's overlap of one tile's softmax with the previous tile's O += PV, at 2
/// CTAs an SM: correct, but no faster than 1 on the H200 (BENCHMARKS.md, session 20), so a
/// variant that gpu-bench prefill-chunks and ttft time (`BROOK_PREFILL_WG_STAGES`).
pub const PREFILL_WG_STAGES: usize = 1;

/// Dynamic shared memory of the wgmma prefill kernel: Q's 64 rows and `stages` (K, V) tiles of
/// 64 keys, plus 1 KB to align them to the 128-byte swizzle's 1024-byte atoms
/// (prefill_attn_wgmma.cu's WG_SMEM).
/// With an e4m3 cache, also the staging buffer of one tile (64 keys of e4m3).
pub fn prefill_wgmma_smem(head_dim: usize, stages: usize, kv_fp8: bool) -> usize {
    let row = head_dim * 2;
    let staging = if kv_fp8 { 64 * head_dim } else { 0 };
    64 * row + stages * 2 * 64 * row + staging + 1024
}

/// Warp steps the tensor-core decode kernel keeps in flight in its shared-memory ring when
/// `decode_defines` does not say (`DMMA_RING`'s default in paged_decode_mma.cu): 2 with an e4m3
/// cache, none (its register passes) with bf16.
pub fn decode_ring(kv_fp8: bool) -> usize {
    if kv_fp8 {
        2
    } else {
        0
    }
}

/// Dynamic shared memory of the tensor-core decode kernel with a ring of `ring` warp steps
/// (`DMMA_RING` in paged_decode_mma.cu; 0: none, and none taken): 4 warps × `ring` slots × 32
/// lanes × `head_dim` cache elements (a lane's quarter of two K rows and eighth of four V rows).
pub fn decode_ring_smem(head_dim: usize, kv_fp8: bool, ring: usize) -> usize {
    4 * ring * 32 * head_dim * if kv_fp8 { 1 } else { 2 }
}

/// Whether the wgmma prefill kernel (kernels/prefill_attn_wgmma.cu) is built for this GPU and
/// shape: Hopper (9.0), head dim 64 or 128 (whole 128-byte swizzle rows); bf16 or e4m3 cache.
pub fn prefill_wgmma_supported(cc: (i32, i32), head_dim: usize) -> bool {
    cc == (9, 0) && matches!(head_dim, 64 | 128)
}

/// Head dims and GQA groups the attention kernels compile for (`Gpu::load_attention`): the flash
/// prefill kernel's tensor-core steps need head_dim % 16 == 0, and the decode kernel's lanes hold
/// head_dim / 8 ≤ 32 slices of a head; any group (query heads per kv head). A fact of the
/// sources above, kept here (re-exported by `kernels`) for the same reason as `GEMV_MAX_M`.
pub fn attention_supported(head_dim: usize, group: usize) -> bool {
    head_dim % 16 == 0 && (16..=256).contains(&head_dim) && group >= 1
}

/// Where compiled PTX is kept: `$BROOK_CACHE_DIR/ptx`, else `$XDG_CACHE_HOME/brook/ptx`, else
/// `~/.cache/brook/ptx`; None when none can be named (then every start compiles).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("BROOK_CACHE_DIR") {
        return Some(PathBuf::from(d).join("ptx"));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("brook/ptx"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/brook/ptx"))
}

/// FNV-1a: stable across Rust versions and runs, unlike `DefaultHasher`.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

fn options(arch: &str, defines: &[(&str, usize)]) -> Vec<String> {
    let mut opts = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    opts.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    opts
}

/// PTX of module `name` for `arch` (e.g. "compute_90"), from the cache or freshly compiled.
/// Returns whether it came from the cache, for logging.
pub fn ptx_for(name: &str, src: &str, arch: &str) -> anyhow::Result<(Ptx, bool)> {
    ptx_with(name, src, arch, &[])
}

/// `ptx_for` with preprocessor defines (the shaped attention kernels); they are part of the
/// cache key.
pub fn ptx_with(
    name: &str,
    src: &str,
    arch: &str,
    defines: &[(&str, usize)],
) -> anyhow::Result<(Ptx, bool)> {
    ptx_cached_in(cache_dir().as_deref(), name, src, arch, defines)
}

/// `ptx_with` over the PTX cache in `cache` (None: compile every time).
fn ptx_cached_in(
    cache: Option<&std::path::Path>,
    name: &str,
    src: &str,
    arch: &str,
    defines: &[(&str, usize)],
) -> anyhow::Result<(Ptx, bool)> {
    let opts = options(arch, defines);
    let key = fnv1a(&[COMMON, src, arch, &opts.join(" ")]);
    let path = cache.map(|d| d.join(format!("{name}-{arch}-{key:016x}.ptx")));
    if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok((Ptx::from_src(text), true));
    }
    let full = format!("{COMMON}\n#line 1 \"{name}.cu\"\n{src}");
    let compile_opts = CompileOptions {
        options: opts,
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(full, compile_opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            anyhow::anyhow!(
                "NVRTC failed on kernels/{name}.cu {defines:?}:\n{}",
                log.to_string_lossy()
            )
        }
        other => anyhow::anyhow!("NVRTC failed on kernels/{name}.cu {defines:?}: {other:?}"),
    })?;
    if let Some(p) = &path {
        // A cache that cannot be written only costs the next start a compile.
        let _ = std::fs::create_dir_all(p.parent().expect("cache path has a parent"))
            .and_then(|_| std::fs::write(p.with_extension("tmp"), ptx.to_src()))
            .and_then(|_| std::fs::rename(p.with_extension("tmp"), p));
    }
    Ok((ptx, false))
}

/// The NVRTC architecture for a compute capability: PTX for the exact major.minor.
pub fn arch_for(major: i32, minor: i32) -> String {
    format!("compute_{major}{minor}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_depends_on_source_and_arch() {
        let a = fnv1a(&["x", "compute_90"]);
        assert_ne!(a, fnv1a(&["y", "compute_90"]));
        assert_ne!(a, fnv1a(&["x", "compute_89"]));
        // Part boundaries count: ("ab", "c") is not ("a", "bc").
        assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
    }

    /// The PTX of `name` built for `arch` with `defines` (fresh or cached), assembled by ptxas
    /// where one is found (`ptxas_path`): NVRTC passes inline PTX (wgmma, TMA, mbarriers)
    /// through as text, and only the assembler reads it. Returns the PTX text.
    fn build_checked(
        cache: &std::path::Path,
        name: &str,
        src: &str,
        arch: &str,
        defines: &[(&str, usize)],
    ) -> String {
        let what = format!("{name} {arch} {defines:?}");
        let (ptx, _) = ptx_cached_in(Some(cache), name, src, arch, defines)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let text = ptx.to_src();
        assert!(
            text.contains(".entry"),
            "{what}: no kernel entry in the PTX"
        );
        if let Some(ptxas) = ptxas_path() {
            assemble(&ptxas, &text, arch, &what);
        }
        text
    }

    /// ptxas from `$BROOK_PTXAS` (CI installs one: .ci/run), else from PATH.
    fn ptxas_path() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("BROOK_PTXAS") {
            return Some(PathBuf::from(p));
        }
        std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|d| PathBuf::from(d).join("ptxas"))
            .find(|p| p.is_file())
    }

    /// Assembles `ptx` for `arch`'s SASS (compute_90a → sm_90a); fails on any ptxas error and
    /// prints each kernel's spills, and with `BROOK_PTXAS_REPORT` set its registers too (what a
    /// kernel change costs in occupancy, read without a GPU).
    fn assemble(ptxas: &std::path::Path, ptx: &str, arch: &str, what: &str) {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("k.ptx");
        std::fs::write(&input, ptx).unwrap();
        let out = std::process::Command::new(ptxas)
            .arg(format!("-arch={}", arch.replace("compute_", "sm_")))
            .arg("-v")
            .arg("-o")
            .arg(dir.path().join("k.cubin"))
            .arg(&input)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas failed on {what}:\n{log}");
        // "Compiling entry function 'f' for 'sm_90'" precedes each function's report.
        let report = std::env::var_os("BROOK_PTXAS_REPORT").is_some();
        let mut function = "";
        for line in log.lines() {
            if let Some(rest) = line.split("entry function '").nth(1) {
                function = rest.split('\'').next().unwrap_or("");
            } else if (report && line.contains("registers"))
                || (line.contains("spill") && !line.contains(" 0 bytes spill stores"))
            {
                eprintln!("{what} {function}: {}", line.trim());
            }
        }
    }

    /// NVRTC needs no GPU: wherever libnvrtc loads, every kernel must compile for sm_80 and sm_90,
    /// and assemble where ptxas is found. CI installs both (.ci/run) and sets
    /// `BROOK_REQUIRE_NVRTC=1`, so there a missing libnvrtc fails instead of skipping.
    #[test]
    fn every_kernel_compiles_where_nvrtc_is_present() {
        // SAFETY: only tries to dlopen libnvrtc.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            assert!(
                std::env::var_os("BROOK_REQUIRE_NVRTC").is_none(),
                "BROOK_REQUIRE_NVRTC is set and libnvrtc was not found (LD_LIBRARY_PATH?)"
            );
            eprintln!("libnvrtc not found: kernel compilation not checked");
            return;
        }
        // A cache of the test's own (not the environment's, which other tests may read).
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path();
        let compiled = |name: &str, src: &str, arch: &str, defines: &[(&str, usize)]| {
            build_checked(cache, name, src, arch, defines)
        };
        let cached = |name: &str, src: &str, arch: &str, defines: &[(&str, usize)]| {
            ptx_cached_in(Some(cache), name, src, arch, defines).map(|(_, hit)| hit)
        };
        for arch in ["compute_80", "compute_90"] {
            for (name, src) in SOURCES {
                assert!(!cached(name, src, arch, &[]).unwrap_or_else(|e| panic!("{e:#}")));
                compiled(name, src, arch, &[]);
                assert!(
                    cached(name, src, arch, &[]).unwrap(),
                    "{name}: second compile should hit the cache"
                );
            }
        }
        // The shaped attention kernels over the head sizes brook's families use and group sizes
        // with odd slices (5, 7) and two CTAs per kv head (12, 16), for sm_90.
        for hd in [64, 80, 96, 128, 256] {
            let (name, src) = PREFILL_ATTN;
            let ptx = compiled(name, src, "compute_90", &[("HD", hd)]);
            assert!(ptx.contains(".entry prefill_attn"), "hd {hd}");
            for group in [1, 5, 7, 12, 16] {
                let (name, src) = PAGED_DECODE;
                let ptx = compiled(name, src, "compute_90", &[("HD", hd), ("GROUP", group)]);
                assert!(ptx.contains(".entry paged_decode"), "hd {hd} g {group}");
            }
        }
        // The wgmma prefill kernel, for sm_90a at the head dims it is built for: over bf16 and
        // e4m3 caches, and its pipelined (2-stage) and TMA builds over bf16 caches.
        for hd in [64, 128] {
            assert!(prefill_wgmma_supported((9, 0), hd));
            for (fp8, stages, tma) in [(0, 1, 0), (1, 1, 0), (0, 2, 0), (0, 1, 1)] {
                let (name, src) = PREFILL_ATTN_WG;
                let defines = [
                    ("HD", hd),
                    ("WG_STAGES", stages),
                    ("KV_FP8", fp8),
                    ("WG_TMA", tma),
                ];
                let what = format!("hd {hd} fp8 {fp8} stages {stages} tma {tma}");
                let ptx = compiled(name, src, WGMMA_ARCH, &defines);
                assert!(ptx.contains(".entry prefill_attn_wg"), "{what}");
                assert!(ptx.contains("wgmma.mma_async"), "{what}");
                assert_eq!(ptx.contains("cp.async.bulk.tensor"), tma == 1, "{what}");
            }
        }
        assert!(!prefill_wgmma_supported((8, 0), 128));
        assert!(!prefill_wgmma_supported((9, 0), 96));
        // The e4m3-cache builds (-DKV_FP8=1, sm_89+): the cache writers and gatherer, and the
        // attention kernels down to the tiny checkpoints' head dim 16.
        for (name, src) in KV_SOURCES {
            compiled(name, src, "compute_90", &[("KV_FP8", 1)]);
        }
        for hd in [16, 64, 80, 96, 128, 256] {
            let fp8 = ("KV_FP8", 1);
            let (name, src) = PREFILL_ATTN;
            let ptx = compiled(name, src, "compute_90", &[("HD", hd), fp8]);
            assert!(ptx.contains(".entry prefill_attn"), "hd {hd} fp8");
            for group in [1, 4, 5, 8, 16] {
                let (name, src) = PAGED_DECODE;
                let defines = [("HD", hd), ("GROUP", group), fp8];
                let ptx = compiled(name, src, "compute_90", &defines);
                assert!(ptx.contains(".entry paged_decode"), "hd {hd} g {group} fp8");
            }
        }
        // The tensor-core decode kernel's tuning overrides (`Gpu::decode_defines`), both caches.
        for tuning in [
            &[("DMMA_BT_AHEAD", 0)][..],
            &[("DMMA_U_SET", 3), ("DMMA_CTAS_SET", 2)],
            &[("DMMA_RING", 3), ("DMMA_CTAS_SET", 4)],
            &[("DMMA_RING", 0)],
        ] {
            for fp8 in [0, 1] {
                let (name, src) = PAGED_DECODE;
                let defines = [&[("HD", 128), ("GROUP", 4), ("KV_FP8", fp8)][..], tuning].concat();
                let ptx = compiled(name, src, "compute_90", &defines);
                assert!(ptx.contains(".entry paged_decode_mma"), "{defines:?}");
            }
        }
        for stage in [512, 4096] {
            let defines = [("GB_STAGE_BYTES", stage)];
            let ptx = compiled("gemv_chain", &gemv_chain_source(), "compute_90", &defines);
            for m in 1..=GEMV_MAX_M {
                let entry = format!(".entry gemv_chain_m{m}");
                assert!(ptx.contains(&entry), "stage {stage}");
            }
        }
        // gpu-bench stream-floor's builds: two CTAs an SM (16 stages), the ring alone, stamped, the
        // ring with its loads.
        let gemv_bulk = SOURCES.iter().find(|(n, _)| *n == "gemv_bulk").unwrap().1;
        for defines in [
            &[("GB_STAGES", 16), ("GB_MIN_CTAS", 2)][..],
            &[("GB_DIAG", 1)],
            &[("GB_DIAG", 2)],
            &[("GB_DIAG", 3)],
        ] {
            let ptx = compiled("gemv_bulk", gemv_bulk, "compute_90", defines);
            assert!(ptx.contains(".entry gemv_bulk_m1"), "gemv_bulk {defines:?}");
        }
        let (name, src) = PAGED_DECODE;
        let hit = cached(name, src, "compute_90", &[("HD", 64), ("GROUP", 1)]).unwrap();
        let other = cached(name, src, "compute_90", &[("HD", 64), ("GROUP", 2)]).unwrap();
        assert!(hit, "a shape compiled above comes from the cache");
        assert!(!other, "another shape is compiled under its own key");
    }

    #[test]
    fn every_kernel_source_is_embedded() {
        assert!(COMMON.contains("bf2f"));
        for (name, src) in SOURCES.iter().chain([&PAGED_DECODE, &PREFILL_ATTN]) {
            assert!(
                src.contains("extern \"C\" __global__"),
                "{name} has no kernel"
            );
        }
    }
}
