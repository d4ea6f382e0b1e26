// Shared by every kernel in this folder; prepended to each .cu before NVRTC compiles it, so the
// kernels need no CUDA headers (bf16 is handled as raw 16-bit values through PTX conversions).
#pragma once

typedef unsigned short bf16;  // bfloat16 bits
typedef unsigned int u32;
typedef unsigned long long u64;

#define NEG_INF (-__int_as_float(0x7f800000))
#define LOG2E 1.4426950408889634f

// Programmatic dependent launch (sm_90+). A kernel launched with it (Gpu::launch_pdl) may start
// while the kernel before it on the stream is still running: before pdl_wait() it may only read
// what no earlier kernel writes (weights). pdl_trigger() lets the next such kernel launch early.
// Both are no-ops on older GPUs and for kernels launched normally.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float bf2f(bf16 x) { return __uint_as_float(((u32)x) << 16); }

__device__ __forceinline__ bf16 f2bf(float f) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// Two floats to one register of two bf16: `lo` in the low half (the lower address in memory).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float bf_lo(u32 x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf_hi(u32 x) { return __uint_as_float(x & 0xffff0000u); }

// e4m3 (fp8) conversions: the KV cache's e4m3 build (below) and the fp8 weights
// (`--quantization fp8`: quant_fp8.cu, gemv.cu's gemv_fp8). Each is one PTX instruction of
// sm_89+; a kernel that uses them is compiled for sm_89+ only (the others never emit them).

// Two floats to two e4m3 (`lo` in the low byte, the lower address), rounded to nearest even and
// saturated at +-448.
__device__ __forceinline__ unsigned short f2e4m3x2(float lo, float hi) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two e4m3 (the low byte first in memory) to two f16 in one register, the low byte's low.
__device__ __forceinline__ u32 e4m3x2_to_f16x2(unsigned short x) {
  u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(x));
  return r;
}

__device__ __forceinline__ float h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// Four e4m3 (one 32-bit word, the low byte first in memory) to four floats, in memory order.
__device__ __forceinline__ void e4m3x4_to_f(u32 w, float* out) {
  const u32 lo = e4m3x2_to_f16x2((unsigned short)(w & 0xffffu));
  const u32 hi = e4m3x2_to_f16x2((unsigned short)(w >> 16));
  out[0] = h2f((unsigned short)(lo & 0xffffu));
  out[1] = h2f((unsigned short)(lo >> 16));
  out[2] = h2f((unsigned short)(hi & 0xffffu));
  out[3] = h2f((unsigned short)(hi >> 16));
}

// Sixteen e4m3 (one 16-byte load) to sixteen floats, in memory order.
__device__ __forceinline__ void e4m3x16_to_f(uint4 v, float* out) {
  e4m3x4_to_f(v.x, out);
  e4m3x4_to_f(v.y, out + 4);
  e4m3x4_to_f(v.z, out + 8);
  e4m3x4_to_f(v.w, out + 12);
}

// Sixteen e4m3 to sixteen bf16 (exact: e4m3 fits bf16), in memory order, as two 16-byte words.
__device__ __forceinline__ void e4m3x16_to_bf16(uint4 v, uint4* lo, uint4* hi) {
  float f[16];
  e4m3x16_to_f(v, f);
  *lo = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                   pack_bf16x2(f[6], f[7]));
  *hi = make_uint4(pack_bf16x2(f[8], f[9]), pack_bf16x2(f[10], f[11]),
                   pack_bf16x2(f[12], f[13]), pack_bf16x2(f[14], f[15]));
}

// The paged KV cache's element type. Default: bf16, the model's dtype. With -DKV_FP8=1 (`--kv-cache-dtype
// fp8`, Gpu::set_kv_fp8): fp8 e4m3 with a per-tensor scale of 1 (no calibration, vLLM's default):
// half the bytes a token. Writes saturate at +-448 (cvt .satfinite, what cuda_fp8.h's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) compiles to); reads are exact (every e4m3
// value is an f16 and a bf16). Both conversions are sm_89+ instructions: the host refuses fp8 on
// older GPUs. KV_VEC: cache elements in one 16-byte load.
#ifndef KV_FP8
#define KV_FP8 0
#endif
#if KV_FP8
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "KV_FP8 needs sm_89 or newer (e4m3 conversions)"
#endif
typedef unsigned char kv_t;  // e4m3 bits
#define KV_VEC 16

__device__ __forceinline__ kv_t f2kv(float f) {
  return (kv_t)f2e4m3x2(f, 0.f);  // f went to the low byte
}

// A 16-byte load of the cache (KV_VEC elements) as bf16: KV_VEC / 8 16-byte words.
__device__ __forceinline__ void kv_widen16(uint4 v, uint4 out[KV_VEC / 8]) {
  e4m3x16_to_bf16(v, &out[0], &out[1]);
}
#else
typedef bf16 kv_t;
#define KV_VEC 8
__device__ __forceinline__ kv_t f2kv(float f) { return f2bf(f); }
__device__ __forceinline__ void kv_widen16(uint4 v, uint4 out[KV_VEC / 8]) { out[0] = v; }
#endif

// Sum (kMax false) or max (kMax true) over the warp; every lane gets the result.
template <bool kMax>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<false>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<true>(v); }

// Sum or max over the block, as warp_reduce; every thread gets the result. `scratch` holds >= 32
// floats; blockDim.x is a multiple of 32. Ends with a barrier so `scratch` can be reused at once.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_reduce<kMax>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? scratch[lane] : (kMax ? NEG_INF : 0.f);
  t = warp_reduce<kMax>(t);
  __syncthreads();
  return t;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce<false>(v, scratch);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce<true>(v, scratch);
}

// Address of token `slot`'s row for kv head `kh` in a paged cache laid out
// [num_blocks, num_kv_heads, block_size, head_dim]: one (block, head) is a contiguous tile.
__device__ __forceinline__ size_t kv_offset(int block, int kh, int off, int num_kv_heads,
                                            int block_size, int head_dim) {
  return (((size_t)block * num_kv_heads + kh) * block_size + off) * head_dim;
}

// 16-byte loads of what other CTAs of this launch may have written: from L2 (.cg), never from
// this SM's L1, which is not coherent with their stores.
__device__ __forceinline__ uint4 ld_cg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Shared-memory address of a generic pointer into shared memory (for ldmatrix and friends).
__device__ __forceinline__ u32 smem_addr(const void* ptr) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(ptr));
  return r;
}

// mbarriers (sm_90): the completion of bulk and TMA copies into shared memory (expect_tx /
// complete_tx) and the hand-back of their buffers (arrive). Used by prefill_attn_wgmma.cu's TMA
// build and gemv_bulk.cu.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival (the barriers count one a phase) that also expects `bytes` from the copies.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits until the barrier's phase `phase` (0 or 1) has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 phase) {
  u32 done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  } while (!done);
}
// One plain arrival.
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// SplitMix64: a counter-based hash, used for seeded draws and synthetic weights.
__device__ __forceinline__ u64 splitmix64(u64 x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 24 random bits, a pure function of (seed, index).
__device__ __forceinline__ float uniform01(u64 seed, u64 index) {
  return (float)(splitmix64(seed ^ splitmix64(index)) >> 40) * (1.0f / 16777216.0f);
}
