// Per-tensor e4m3 quantization (`--quantization fp8`): q = x / s rounded to nearest even and
// saturated, s = max |x| / 448 (1 for a tensor of zeros), so the largest value lands on e4m3's
// largest, 448. Used once per weight matrix at load and before every fp8 GEMM on its input
// activations (dynamic scale, as vLLM's default fp8): cuBLASLt multiplies both scales back in its
// epilogue (scalar scale pointers; the per-row "outer vector" scales cuBLASLt offers answered
// CUBLAS_STATUS_INVALID_VALUE on the H200 with CUDA 13.0), gemv_fp8 the weight's.
//
// Two launches: `amax_scale` (every CTA's max into `partial`; the last CTA to finish reduces
// them, writes the scale and its inverse and resets the arrival counter, so the pair needs no
// memset and replays in a CUDA graph), then `quant_scaled`.
struct AmaxScaleParams {
  const bf16* x;     // [n]  n % 8 == 0
  float* partial;    // [gridDim.x]  scratch
  u32* counter;      // [1]  zero between launches
  float* scale;      // [2]  out: s, then 1 / s (as 448 / amax)
  long long n;
};

struct QuantScaledParams {
  const bf16* x;       // [n]  n % 8 == 0
  unsigned char* q;    // [n]  e4m3
  const float* scale;  // [2]  from amax_scale
  long long n;
};

#define QUANT_THREADS 256

// grid: at most the host's AMAX_MAX_CTAS, block: QUANT_THREADS. Empty below sm_89 (e4m3: the
// host never launches these there).
extern "C" __global__ void __launch_bounds__(QUANT_THREADS) amax_scale(AmaxScaleParams p) {
#if __CUDA_ARCH__ >= 890
  __shared__ float scratch[32];
  __shared__ u32 s_last;
  const uint4* x = (const uint4*)p.x;
  const long long chunks = p.n / 8;
  float amax = 0.f;
  for (long long c = blockIdx.x * (long long)QUANT_THREADS + threadIdx.x; c < chunks;
       c += (long long)gridDim.x * QUANT_THREADS) {
    const uint4 v = x[c];
    const u32 xx[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; e++) amax = fmaxf(amax, fmaxf(fabsf(bf_lo(xx[e])), fabsf(bf_hi(xx[e]))));
  }
  amax = block_max(amax, scratch);
  if (threadIdx.x == 0) {
    p.partial[blockIdx.x] = amax;
    __threadfence();  // the partial reaches L2 before this CTA is counted
    const u32 prev = atomicAdd(p.counter, 1u);
    s_last = prev == gridDim.x - 1;
    if (s_last) *p.counter = 0;  // all arrived: ready for the next launch
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  float m = 0.f;
  for (int i = threadIdx.x; i < gridDim.x; i += QUANT_THREADS) m = fmaxf(m, __ldcg(p.partial + i));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) {
    // A NaN or inf amax saturates everything; zeros quantize to zeros with scale 1.
    p.scale[0] = m > 0.f ? m / 448.f : 1.f;
    p.scale[1] = m > 0.f ? 448.f / m : 1.f;
  }
#endif
}

// grid: at most the host's AMAX_MAX_CTAS (grid-stride), block: QUANT_THREADS.
extern "C" __global__ void __launch_bounds__(QUANT_THREADS) quant_scaled(QuantScaledParams p) {
#if __CUDA_ARCH__ >= 890
  const float inv = p.scale[1];
  const uint4* x = (const uint4*)p.x;
  uint2* q = (uint2*)p.q;
  const long long chunks = p.n / 8;
  for (long long c = blockIdx.x * (long long)QUANT_THREADS + threadIdx.x; c < chunks;
       c += (long long)gridDim.x * QUANT_THREADS) {
    const uint4 v = x[c];
    const u32 xx[4] = {v.x, v.y, v.z, v.w};
    u32 out[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const unsigned short a = f2e4m3x2(bf_lo(xx[2 * h]) * inv, bf_hi(xx[2 * h]) * inv);
      const unsigned short b = f2e4m3x2(bf_lo(xx[2 * h + 1]) * inv, bf_hi(xx[2 * h + 1]) * inv);
      out[h] = (u32)a | ((u32)b << 16);
    }
    q[c] = make_uint2(out[0], out[1]);
  }
#endif
}
