// Skinny GEMM for decode: y[m, n] = x[m, k] · w[n, k]ᵀ with m <= 4. Reading w is the whole cost,
// so one warp streams one row of w with 16-byte loads (UNROLL in flight per lane) and dots it
// with the m rows of x (small, served from L1/L2); fp32 accumulation, one warp reduction per row.
struct GemvParams {
  const bf16* x;   // [m, k]   k % 8 == 0
  const bf16* w;   // [n, k]
  bf16* y;         // [m, n]   bf16 output, or null when y32 is set
  float* y32;      // [m, n]   fp32 output (logits), or null
  int m;
  int n;
  int k;
};

#define GEMV_WARPS 8
#define GEMV_UNROLL 4

template <int M>
__device__ __forceinline__ void gemv_impl(const GemvParams& p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * GEMV_WARPS + warp;
  if (row >= p.n) return;
  const uint4* w = (const uint4*)(p.w + (size_t)row * p.k);
  const int chunks = p.k / 8;  // 16-byte chunks per row
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  for (int c0 = lane; c0 < chunks; c0 += 32 * GEMV_UNROLL) {
    uint4 wv[GEMV_UNROLL];
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
      const int c = c0 + u * 32;
      wv[u] = c < chunks ? w[c] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
      const int c = c0 + u * 32;
      if (c >= chunks) break;
      const u32 ww[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
      for (int m = 0; m < M; m++) {
        const uint4 xv = ((const uint4*)(p.x + (size_t)m * p.k))[c];
        const u32 xx[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
          acc[m] += bf_lo(ww[e]) * bf_lo(xx[e]);
          acc[m] += bf_hi(ww[e]) * bf_hi(xx[e]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; m++) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) {
      if (p.y32) p.y32[(size_t)m * p.n + row] = v;
      else p.y[(size_t)m * p.n + row] = f2bf(v);
    }
  }
}

// grid: ceil(n / GEMV_WARPS), block: 32 * GEMV_WARPS
extern "C" __global__ void __launch_bounds__(256) gemv_m1(GemvParams p) { gemv_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(256) gemv_m2(GemvParams p) { gemv_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(256) gemv_m3(GemvParams p) { gemv_impl<3>(p); }
extern "C" __global__ void __launch_bounds__(256) gemv_m4(GemvParams p) { gemv_impl<4>(p); }
