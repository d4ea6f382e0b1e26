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

// Shared-memory address of a generic pointer into shared memory (for ldmatrix and friends).
__device__ __forceinline__ u32 smem_addr(const void* ptr) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(ptr));
  return r;
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
