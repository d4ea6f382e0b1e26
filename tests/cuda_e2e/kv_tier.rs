//! The KV memory tier on the GPU: pinned host blocks, copies on the copy stream.

use brook::executor::cuda::backend::kv_bytes_per_block;
use brook::executor::cuda::KvCacheDtype;
use brook::scheduler::PreemptionMode;
use brook::step::BlockCopy;

use super::harness::run_with_kv_tier;

use super::*;

fn backend(
    config: &ModelConfig,
    weights: &ModelWeightsAlias,
    device: usize,
    host: usize,
) -> CudaBackend {
    backend_kv(config, weights, device, host, KvCacheDtype::Auto)
}

/// `backend` with a KV cache of `dtype` (blocks counted in its bytes).
fn backend_kv(
    config: &ModelConfig,
    weights: &ModelWeightsAlias,
    device: usize,
    host: usize,
    dtype: KvCacheDtype,
) -> CudaBackend {
    let per_block = kv_bytes_per_block(config, BLOCK, dtype);
    CudaBackend::from_weights(
        config.clone(),
        weights,
        CudaBackendOptions {
            max_kv_cache_bytes: Some(device * per_block),
            max_num_batched_tokens: 256,
            max_num_seqs: 8,
            host_kv_cache_bytes: host * per_block,
            kv_cache_dtype: dtype,
            progress: false,
            ..Default::default()
        },
    )
    .unwrap()
}

type ModelWeightsAlias = brook::model::loader::ModelWeights;

/// The small test model, written to a temporary folder (kept alive by the returned guard).
fn test_model() -> (tempfile::TempDir, ModelConfig, ModelWeightsAlias) {
    testing::load_test_model(&TestModelSpec::kv_tier())
}

/// Writes device block `b`'s bytes, planes in order (`kv_block`'s layout).
fn write_block(gpu: &CudaBackend, b: usize, data: &[u8]) {
    let l = gpu.kv_layout();
    for (p, chunk) in data.chunks(l.plane_bytes).enumerate() {
        let at = l.base + (p * l.plane_stride + b * l.plane_bytes) as u64;
        gpu.gpu().upload(at, chunk).unwrap();
    }
}

/// Fills device block `b` with `byte`.
fn poison_block(gpu: &CudaBackend, b: usize, byte: u8) {
    let l = gpu.kv_layout();
    write_block(gpu, b, &vec![byte; l.planes * l.plane_bytes]);
}

/// A block's bytes go device → host → device (and device → device) bit-exactly, through the
/// copy stream and pinned memory; a poisoned device block is fully overwritten.
#[test]
fn cuda_kv_blocks_round_trip_device_host_device_bit_exactly() {
    if !have_gpu() {
        return;
    }
    let (_dir, config, weights) = test_model();
    let mut gpu = backend(&config, &weights, 16, 8);
    assert_eq!(gpu.info().num_host_blocks, 8);
    assert!(gpu.copy_bytes_per_s() > 0.0, "measured at start");
    let l = gpu.kv_layout();
    let mut r = ChaCha8Rng::seed_from_u64(5);
    let data: Vec<u8> = (0..l.planes * l.plane_bytes).map(|_| r.random()).collect();
    write_block(&gpu, 3, &data);
    gpu.copy_blocks(&[BlockCopy::to_host(3, 1)]).unwrap();
    assert_eq!(gpu.host_kv_block(1), data, "device -> host");
    poison_block(&gpu, 3, 0xab);
    poison_block(&gpu, 5, 0xab);
    gpu.copy_blocks(&[BlockCopy::to_device(1, 5)]).unwrap();
    assert_eq!(gpu.kv_block(5).unwrap(), data, "host -> device");
    gpu.copy_blocks(&[BlockCopy::on_device(5, 7)]).unwrap();
    assert_eq!(gpu.kv_block(7).unwrap(), data, "copy-on-write");
    assert_eq!(
        gpu.kv_block(5).unwrap(),
        data,
        "the source is left as it was"
    );
    assert!(
        gpu.copy_blocks(&[BlockCopy::to_host(3, 8)]).is_err(),
        "host id out of range"
    );
}

/// Gathered copies (the staging buffer, `kv_stage`) and per-plane copies move the same bytes:
/// 70 blocks out (more than one staging batch, host ids in runs and scattered), a copy back
/// that reads a host block written earlier in the same list (a new segment), copy-on-write of
/// it, all in one list; the device blocks written are poisoned first.
#[test]
fn cuda_gathered_copies_move_what_per_plane_copies_move() {
    if !have_gpu() {
        return;
    }
    let (_dir, config, weights) = test_model();
    let mut gpu = backend(&config, &weights, 100, 100);
    let l = gpu.kv_layout();
    let block = l.planes * l.plane_bytes;
    let mut r = ChaCha8Rng::seed_from_u64(9);
    for gathered in [true, false] {
        assert_eq!(gpu.set_gathered_copies(gathered), gathered);
        let data: Vec<Vec<u8>> = (0..100)
            .map(|_| (0..block).map(|_| r.random()).collect())
            .collect();
        for (b, d) in data.iter().enumerate() {
            write_block(&gpu, b, d);
        }
        // Device 0..70 out: host 0..40 in a run, then 99, 97, ... scattered.
        let host_of = |i: u32| if i < 40 { i } else { 99 - 2 * (i - 40) };
        let mut list: Vec<BlockCopy> = (0..70).map(|i| BlockCopy::to_host(i, host_of(i))).collect();
        // Back from host 5 (device 5's bytes) into device 80 (poisoned), then CoW 80 -> 81.
        list.push(BlockCopy::to_device(5, 80));
        list.push(BlockCopy::on_device(80, 81));
        poison_block(&gpu, 80, 0xff);
        poison_block(&gpu, 81, 0xff);
        gpu.copy_blocks(&list).unwrap();
        for i in 0..70u32 {
            let h = gpu.host_kv_block(host_of(i) as usize);
            assert!(
                h == data[i as usize],
                "gathered {gathered}: device {i} -> host"
            );
        }
        assert!(
            gpu.kv_block(80).unwrap() == data[5],
            "gathered {gathered}: back"
        );
        assert!(
            gpu.kv_block(81).unwrap() == data[5],
            "gathered {gathered}: cow"
        );
        // All 70 back, into other blocks (poisoned by the list's own order: 99 - i).
        let back: Vec<BlockCopy> = (0..70)
            .map(|i| BlockCopy::to_device(host_of(i), 99 - i))
            .collect();
        gpu.copy_blocks(&back).unwrap();
        for i in 0..70u32 {
            let want = &data[i as usize];
            assert!(
                &gpu.kv_block(99 - i as usize).unwrap() == want,
                "host -> {}",
                99 - i
            );
        }
    }
}

/// Greedy outputs with forced swap-out/in mid-generation (a pool of 12 blocks: three prompts of
/// 2-3 blocks are all admitted, then their decodes grow to 5-6 blocks each; a host tier, `swap`
/// mode; copies back run under the forward, the next forward waits on their event; gathered
/// and per-plane copies), and with `n = 2` forks, equal those of a pool that never preempts
/// serving the same requests. A mismatch far into a sequence may be a bf16 near-tie (batch
/// shapes differ between the runs): check the logits' top-2 gap before suspecting the tier.
#[test]
fn cuda_greedy_output_is_unchanged_by_swapping_and_forking() {
    swapping_and_forking(KvCacheDtype::Auto);
}

/// As above over an fp8 (e4m3) cache: its blocks (half the bytes) swap, come back and fork
/// bit-exactly, so greedy output equals the fp8 pool's that never preempts.
#[test]
fn cuda_fp8_greedy_output_is_unchanged_by_swapping_and_forking() {
    swapping_and_forking(KvCacheDtype::Fp8);
}

fn swapping_and_forking(dtype: KvCacheDtype) {
    if !have_gpu() {
        return;
    }
    let backend =
        |c: &ModelConfig, w: &ModelWeightsAlias, d: usize, h: usize| backend_kv(c, w, d, h, dtype);
    let (_dir, config, weights) = test_model();
    let mut r = ChaCha8Rng::seed_from_u64(17);
    let vocab = config.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..30 + 5 * i).map(|_| r.random_range(1..vocab)).collect())
        .collect();
    let mut big = backend(&config, &weights, 64, 0);
    let want = run_with_kv_tier(&mut big, &prompts, 1, 48, PreemptionMode::Recompute)
        .unwrap()
        .tokens;
    drop(big);
    // A backend of its own for each run: a backend serves one scheduler for its life (the
    // requests finishing in a run's last step stay in its persistent batch, to be dropped with
    // a next step that never comes, and the next run reuses their ids; H200 call g).
    let small = || backend(&config, &weights, 12, 64);
    for gathered in [true, false] {
        let mut small = small();
        assert_eq!(small.info().num_kv_blocks, 12);
        assert_eq!(small.set_gathered_copies(gathered), gathered);
        let got = run_with_kv_tier(&mut small, &prompts, 1, 48, PreemptionMode::Swap).unwrap();
        assert!(got.swaps > 0, "the small pool must swap");
        assert!(
            got.overlapped_copies > 0,
            "copies back run under the forward"
        );
        assert_eq!(
            got.tokens, want,
            "swap-out/in changed greedy output (gathered {gathered})"
        );
    }
    // The fork against the same request in the large pool, not against `want[0]`: there the
    // prompt was prefilled in a 64-token step beside the next prompt's first chunk, and cuBLAS
    // need not give a row the same bits at another row count (with `residual_gemm` the fp32
    // residual keeps them; H100, session 28: the forks left `want[0]` at the 9th token).
    let fork_want = run_with_kv_tier(
        &mut backend(&config, &weights, 64, 0),
        &prompts[..1],
        2,
        48,
        PreemptionMode::Recompute,
    )
    .unwrap()
    .tokens;
    assert_eq!(fork_want[0], fork_want[1], "greedy forks agree");
    let forked =
        run_with_kv_tier(&mut small(), &prompts[..1], 2, 48, PreemptionMode::Swap).unwrap();
    assert!(forked.cow_blocks > 0, "the fork copies the partial block");
    assert_eq!(forked.tokens, fork_want);
}
