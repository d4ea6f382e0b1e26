//! Shared set-up and checks of the kernel tests: the device (or a clean skip), seeded random
//! inputs, device buffers (uploaded, or poisoned so an unwritten output can never pass), and
//! error checks against CPU references computed in f64.

use brook::executor::cuda::device::{DevBuf, Gpu};
use brook::model::config::{RopeConfig, RopeScaling};
use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The GPU, or `None` (after saying why) when there is none; with `BROOK_REQUIRE_GPU=1` a
/// missing GPU panics instead, so a GPU run cannot pass by skipping.
pub fn gpu() -> Option<Gpu> {
    let required = std::env::var("BROOK_REQUIRE_GPU").is_ok_and(|v| v == "1");
    match brook::executor::cuda::probe() {
        Ok(()) => Some(Gpu::open(0).expect("a GPU is present, so opening it must work")),
        Err(e) if required => panic!("BROOK_REQUIRE_GPU=1 but no GPU: {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// `gpu()` with the KV cache kernels for an e4m3 cache when `fp8` (`Gpu::set_kv_fp8`).
pub fn kv_gpu(fp8: bool) -> Option<Gpu> {
    let mut g = gpu()?;
    g.set_kv_fp8(fp8)
        .unwrap_or_else(|e| panic!("fp8 KV kernels: {e:#}"));
    Some(g)
}

/// `gpu()` with the attention kernels of one shape loaded (`Gpu::load_attention`), for a cache
/// of either dtype (`fp8`: e4m3).
pub fn attention_gpu_kv(head_dim: usize, group: usize, fp8: bool) -> Option<Gpu> {
    attention_gpu_tuned(head_dim, group, fp8, &[])
}

/// `attention_gpu_kv` with the decode kernels built with `defines` (`Gpu::decode_defines`).
pub fn attention_gpu_tuned(
    head_dim: usize,
    group: usize,
    fp8: bool,
    defines: &[(&str, usize)],
) -> Option<Gpu> {
    let mut g = kv_gpu(fp8)?;
    g.decode_defines = defines.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    g.load_attention(head_dim, group)
        .unwrap_or_else(|e| panic!("attention kernels hd{head_dim} g{group} fp8 {fp8}: {e:#}"));
    Some(g)
}

/// The CPU reference quantizer of the fp8 KV cache: `x` as e4m3 bits, rounded to nearest even
/// and saturated at ±448 (the kernels' `cvt.rn.satfinite.e4m3x2.f32`), NaN to NaN.
pub fn e4m3(x: f32) -> u8 {
    float8::F8E4M3::from_f32(x).to_bits()
}

/// The value of e4m3 bits (0xff, what `poisoned` leaves, is NaN).
pub fn e4m3_to_f32(b: u8) -> f32 {
    float8::F8E4M3::from_bits(b).to_f32()
}

/// `x` through the e4m3 cache: quantized and read back.
pub fn through_e4m3(x: f32) -> f32 {
    e4m3_to_f32(e4m3(x))
}

/// `n` e4m3 values of a device buffer, as f32.
pub fn read_e4m3(g: &Gpu, b: &DevBuf, n: usize) -> Vec<f32> {
    let raw: Vec<u8> = read(g, b, n);
    raw.into_iter().map(e4m3_to_f32).collect()
}

/// `gpu()` and a random source seeded with `seed`, for a test that draws its inputs once.
pub fn setup(seed: u64) -> Option<(Gpu, ChaCha8Rng)> {
    Some((gpu()?, rng(seed)))
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn rand_f32(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

pub fn rand_bf16(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<bf16> {
    rand_f32(r, n, scale)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

pub fn to_f32(xs: &[bf16]) -> Vec<f32> {
    xs.iter().map(|x| x.to_f32()).collect()
}

/// A device buffer holding `data`.
pub fn dev<T: Copy>(g: &Gpu, data: &[T]) -> DevBuf {
    let b = g.alloc(std::mem::size_of_val(data)).unwrap();
    g.upload(b.ptr(), data).unwrap();
    b
}

/// A device buffer of `n` elements of `T`, every byte 0xff (NaN for floats and bf16).
pub fn poisoned<T>(g: &Gpu, n: usize) -> DevBuf {
    let bytes = n * std::mem::size_of::<T>();
    let b = g.alloc(bytes).unwrap();
    g.memset(b.ptr(), 0xff, bytes).unwrap();
    b
}

pub fn read<T: Copy + Default>(g: &Gpu, b: &DevBuf, n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    g.download(&mut v, b.ptr()).unwrap();
    v
}

pub fn read_bf16(g: &Gpu, b: &DevBuf, n: usize) -> Vec<f32> {
    let raw: Vec<u16> = read(g, b, n);
    raw.into_iter()
        .map(|x| bf16::from_bits(x).to_f32())
        .collect()
}

/// ‖a − b‖ / ‖b‖, NaN-propagating (a NaN never passes).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((*x - *y) as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Relative error under `tol` and every value finite.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let e = rel_err(got, want);
    assert!(
        e < tol && got.iter().all(|x| x.is_finite()),
        "{what}: relative error {e:.3e} (tolerance {tol:.0e})"
    );
}

/// Every element within `tol` of its reference (a NaN never passes); names the worst one.
pub fn assert_max_abs(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = (0..got.len())
        .map(|i| (i, (got[i] - want[i]).abs()))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((i, e)) = worst {
        assert!(
            e < tol,
            "{what}: element {i} is {} vs {} (tolerance {tol:.0e})",
            got[i],
            want[i]
        );
    }
}

/// y[m, n] = x[m, k] · w[n, k]ᵀ in f64.
pub fn matmul_ref(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    (0..m * n)
        .map(|i| {
            let (a, b) = (i / n, i % n);
            (0..k)
                .map(|j| x[a * k + j] as f64 * w[b * k + j] as f64)
                .sum::<f64>() as f32
        })
        .collect()
}

/// RoPE inverse frequencies as the kernels take them (f32).
pub fn inv_freqs(theta: f64, scaling: RopeScaling, head_dim: usize) -> Vec<f32> {
    RopeConfig { theta, scaling }
        .inv_freqs(head_dim)
        .into_iter()
        .map(|f| f as f32)
        .collect()
}

/// One head rotated by RoPE (rotate-half layout) at `pos`, in f64.
pub fn rope_ref(x: &[f32], pos: u32, inv_freq: &[f32]) -> Vec<f32> {
    let half = x.len() / 2;
    let mut o = vec![0f32; x.len()];
    for i in 0..half {
        let (s, c) = (pos as f64 * inv_freq[i] as f64).sin_cos();
        o[i] = (x[i] as f64 * c - x[i + half] as f64 * s) as f32;
        o[i + half] = (x[i + half] as f64 * c + x[i] as f64 * s) as f32;
    }
    o
}
