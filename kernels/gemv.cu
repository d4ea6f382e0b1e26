// Skinny GEMM for decode: y[m, n] = x[m, k] · w[n, k]ᵀ with m <= 4. Reading w is the whole cost.
// `split` warps share each output row (pair) — split-K inside the CTA: the row is cut into 512-byte
// stretches (16 bytes a lane), warp `part` of the row takes every split-th one, keeps U 16-byte
// loads per lane in flight and asks for the next U before it uses the current ones (double
// buffering); the split partial dots then meet in shared memory. Splitting shortens each warp's
// walk on long rows (down: 11008), whose tail one warp per row dragged out (gpu-bench gemv-sweep;
// the host picks `split` from k, kernels::gemv_split).
// fp32 accumulation; x (small) is served from L1/L2.
//
// `gemv_fp8` reads e4m3 weights with one f32 scale for the matrix (`--quantization fp8`,
// quantized by quant_fp8.cu): half the bytes of bf16, so a decode step streams half as much.
// A 16-byte load then holds 16 weights, widened to f32 (cvt e4m3x2 -> f16x2 -> f32) before the
// same fp32 dot with x; the scale multiplies the sum. e4m3 conversions are sm_89+: below
// that its kernels are empty (the host never launches them there).
//
// Two fused variants save a launch and a round trip through memory per layer at batch <= 4:
// `gemv_silu` (gate|up projection + SiLU × up) and `gemv_qkv_rope` (QKV projection + RoPE + the
// paged K/V write). Each warp group of those owns the R = 2 rows its epilogue needs together.
struct GemvParams {
  const bf16* x;   // [m, k]   k % 8 == 0 (k % 16 == 0 for gemv_fp8)
  const bf16* w;   // [n, k]   bf16, or e4m3 bytes for gemv_fp8
  bf16* y;         // [m, n]   bf16 output, or null when y32 is set
  float* y32;      // [m, n]   fp32 output (logits), or null
  int m;
  int n;
  int k;
  int split;       // warps per output row: 1, 2, 4 or 8 (divides GEMV_WARPS)
  const float* w_scale;  // [1]  gemv_fp8: the weight's scale (w = e4m3 value * scale); else unused
};

// Warps per CTA, and 16-byte loads per lane per buffer (split over the R rows of the fused
// variants); with double buffering twice that is in flight (gpu-bench gemv-sweep measures others).
#ifndef GEMV_WARPS
#define GEMV_WARPS 8
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 2
#endif
#define GEMV_THREADS (32 * GEMV_WARPS)

// The output row (pair) of this thread's warp group: CTA b covers GEMV_WARPS / split of them.
__device__ __forceinline__ int gemv_group(int split) {
  return blockIdx.x * (GEMV_WARPS / split) + (threadIdx.x >> 5) / split;
}

// acc[r][m] = dot(w row rows[r], x row m), summed over the `split` warps of the group. Returns
// whether this thread holds the sums (lane 0 of the group's first warp): the one that writes.
// Every thread of the CTA must call it (a barrier joins the split warps); `valid` false (a group
// past the last row) loads nothing. W8: w holds e4m3 bytes (16 a chunk, unscaled), else bf16 (8).
template <int M, int R, bool W8 = false>
__device__ __forceinline__ bool gemv_dot(const bf16* __restrict__ x, const void* __restrict__ w,
                                         const int rows[R], bool valid, int k, int split,
                                         float acc[R][M]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int part = warp % split;
  constexpr int PER = W8 ? 16 : 8;        // weights per 16-byte chunk
  const int chunks = valid ? k / PER : 0;  // 16-byte chunks per row
  const int stride = 32 * split;         // chunks between one lane's successive loads
  constexpr int U = GEMV_UNROLL / R > 0 ? GEMV_UNROLL / R : 1;  // loads per row per buffer
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < M; m++) acc[r][m] = 0.f;
  uint4 cur[R][U], nxt[R][U];
  auto load = [&](uint4 (&buf)[R][U], int c0) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      const uint4* wr = (const uint4*)((const char*)w + (size_t)rows[r] * k * (W8 ? 1 : 2));
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = c0 + u * stride;
        buf[r][u] = c < chunks ? wr[c] : make_uint4(0, 0, 0, 0);
      }
    }
  };
  const int first = part * 32 + lane;
  // The first weights are in flight while the kernel that writes x finishes (PDL).
  load(cur, first);
  pdl_wait();
  for (int c0 = first; c0 < chunks; c0 += stride * U) {
    if (c0 + stride * U < chunks) load(nxt, c0 + stride * U);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int c = c0 + u * stride;
      if (c >= chunks) break;
      if constexpr (W8) {
#pragma unroll
        for (int r = 0; r < R; r++) {
          float wf[16];
          e4m3x16_to_f(cur[r][u], wf);
#pragma unroll
          for (int m = 0; m < M; m++) {
            const uint4* xm = (const uint4*)(x + (size_t)m * k) + 2 * c;
            const uint4 x0 = xm[0], x1 = xm[1];
            const u32 xx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int e = 0; e < 8; e++) {
              acc[r][m] += wf[2 * e] * bf_lo(xx[e]);
              acc[r][m] += wf[2 * e + 1] * bf_hi(xx[e]);
            }
          }
        }
        continue;
      }
#pragma unroll
      for (int m = 0; m < M; m++) {
        const uint4 xv = ((const uint4*)(x + (size_t)m * k))[c];
        const u32 xx[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int r = 0; r < R; r++) {
          const u32 ww[4] = {cur[r][u].x, cur[r][u].y, cur[r][u].z, cur[r][u].w};
#pragma unroll
          for (int e = 0; e < 4; e++) {
            acc[r][m] += bf_lo(ww[e]) * bf_lo(xx[e]);
            acc[r][m] += bf_hi(ww[e]) * bf_hi(xx[e]);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int u = 0; u < U; u++) cur[r][u] = nxt[r][u];
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < M; m++) acc[r][m] = warp_sum(acc[r][m]);
  if (split > 1) {
    __shared__ float red[GEMV_WARPS][R * M];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) red[warp][r * M + m] = acc[r][m];
    }
    __syncthreads();
    if (part == 0 && lane == 0) {
      for (int q = 1; q < split; q++)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
          for (int m = 0; m < M; m++) acc[r][m] += red[warp + q][r * M + m];
    }
  }
  return valid && part == 0 && lane == 0;
}

template <int M, bool W8 = false>
__device__ __forceinline__ void gemv_impl(const GemvParams& p) {
  pdl_trigger();
  const int row = gemv_group(p.split);
  const bool valid = row < p.n;
  const int rows[1] = {valid ? row : 0};
  float acc[1][M];
  if (gemv_dot<M, 1, W8>(p.x, p.w, rows, valid, p.k, p.split, acc)) {
    const float s = W8 ? p.w_scale[0] : 1.f;
#pragma unroll
    for (int m = 0; m < M; m++) {
      if (p.y32) p.y32[(size_t)m * p.n + row] = acc[0][m] * s;
      else p.y[(size_t)m * p.n + row] = f2bf(acc[0][m] * s);
    }
  }
}

// grid: ceil(n / (GEMV_WARPS / split)), block: 32 * GEMV_WARPS
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_m1(GemvParams p) { gemv_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_m2(GemvParams p) { gemv_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_m3(GemvParams p) { gemv_impl<3>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_m4(GemvParams p) { gemv_impl<4>(p); }

// e4m3 weights (W8A16); same grid and block as gemv. Empty below sm_89 (see the top).
#if __CUDA_ARCH__ >= 890
#define GEMV_FP8(M) gemv_impl<M, true>(p)
#else
#define GEMV_FP8(M)
#endif
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_fp8_m1(GemvParams p) { GEMV_FP8(1); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_fp8_m2(GemvParams p) { GEMV_FP8(2); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_fp8_m3(GemvParams p) { GEMV_FP8(3); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_fp8_m4(GemvParams p) { GEMV_FP8(4); }

// out[m, j] = silu(x[m]·w[j]) * (x[m]·w[inter + j]): the gate|up projection with the SwiGLU
// activation in its epilogue (the fused weight keeps gate rows first, then up rows).
struct GemvSiluParams {
  const bf16* x;  // [m, k]
  const bf16* w;  // [2 * inter, k]  gate rows [0, inter), up rows [inter, 2 inter)
  bf16* out;      // [m, inter]
  int m;
  int inter;
  int k;
  int split;      // warps per output (row pair), as GemvParams
};

template <int M>
__device__ __forceinline__ void gemv_silu_impl(const GemvSiluParams& p) {
  pdl_trigger();
  const int j = gemv_group(p.split);
  const bool valid = j < p.inter;
  const int rows[2] = {valid ? j : 0, valid ? p.inter + j : 0};
  float acc[2][M];
  if (gemv_dot<M, 2>(p.x, p.w, rows, valid, p.k, p.split, acc)) {
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float g = acc[0][m];
      p.out[(size_t)m * p.inter + j] = f2bf(g / (1.f + expf(-g)) * acc[1][m]);
    }
  }
}

// grid: ceil(inter / (GEMV_WARPS / split)), block: 32 * GEMV_WARPS
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_silu_m1(GemvSiluParams p) { gemv_silu_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_silu_m2(GemvSiluParams p) { gemv_silu_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_silu_m3(GemvSiluParams p) { gemv_silu_impl<3>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_silu_m4(GemvSiluParams p) { gemv_silu_impl<4>(p); }

// The QKV projection of m decode tokens with RoPE (rotate-half, as rope_kv.cu) and the paged K/V
// write in its epilogue. Warp w owns element pair (i, i + head_dim/2) of head w / (head_dim/2)
// (q heads, then k heads, then v heads), which is exactly what one rotation needs.
struct GemvQkvRopeParams {
  const bf16* x;          // [m, k]
  const bf16* w;          // [(num_heads + 2 * num_kv_heads) * head_dim, k]  q rows, k rows, v rows
  const u32* positions;   // [m]
  const u32* slots;       // [m]  block_id * block_size + offset; 0xffffffff: don't write K/V
  const float* inv_freq;  // [head_dim / 2]
  bf16* q_out;            // [m, num_heads, head_dim]
  kv_t* k_cache;          // [num_blocks, num_kv_heads, block_size, head_dim]  bf16, or e4m3
  kv_t* v_cache;          // same                                               (KV_FP8)
  int m;
  int k;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int block_size;
  int split;              // warps per row pair, as GemvParams
};

template <int M>
__device__ __forceinline__ void gemv_qkv_rope_impl(const GemvQkvRopeParams& p) {
  pdl_trigger();
  const int half = p.head_dim / 2;
  const int wid = gemv_group(p.split);
  const int head = wid / half, i = wid % half;
  const bool valid = head < p.num_heads + 2 * p.num_kv_heads;
  const int rows[2] = {valid ? head * p.head_dim + i : 0, valid ? head * p.head_dim + i + half : 0};
  float acc[2][M];
  if (!gemv_dot<M, 2>(p.x, p.w, rows, valid, p.k, p.split, acc)) return;
  const bool is_q = head < p.num_heads, is_v = head >= p.num_heads + p.num_kv_heads;
#pragma unroll
  for (int m = 0; m < M; m++) {
    float a = acc[0][m], b = acc[1][m];
    if (!is_v) {
      float s, c;
      sincosf((float)p.positions[m] * p.inv_freq[i], &s, &c);
      const float a2 = a * c - b * s;
      b = b * c + a * s;
      a = a2;
    }
#if KV_FP8
    // q stays bf16, k and v go to the cache in its dtype. (The bf16 build keeps its own shape
    // below: one store site for q and the cache compiles to the code measured on the H200; the
    // shared shape changes its PTX.)
    if (is_q) {
      bf16* dst = p.q_out + ((size_t)m * p.num_heads + head) * p.head_dim;
      dst[i] = f2bf(a);
      dst[i + half] = f2bf(b);
    } else {
      const u32 slot = p.slots[m];
      if (slot == 0xffffffffu) continue;  // padding token: nothing to write
      const int kh = head - p.num_heads - (is_v ? p.num_kv_heads : 0);
      const size_t o = kv_offset((int)(slot / p.block_size), kh, (int)(slot % p.block_size),
                                 p.num_kv_heads, p.block_size, p.head_dim);
      kv_t* dst = (is_v ? p.v_cache : p.k_cache) + o;
      dst[i] = f2kv(a);
      dst[i + half] = f2kv(b);
    }
#else
    bf16* dst;
    if (is_q) {
      dst = p.q_out + ((size_t)m * p.num_heads + head) * p.head_dim;
    } else {
      const u32 slot = p.slots[m];
      if (slot == 0xffffffffu) continue;  // padding token: nothing to write
      const int kh = head - p.num_heads - (is_v ? p.num_kv_heads : 0);
      const size_t o = kv_offset((int)(slot / p.block_size), kh, (int)(slot % p.block_size),
                                 p.num_kv_heads, p.block_size, p.head_dim);
      dst = (is_v ? p.v_cache : p.k_cache) + o;
    }
    dst[i] = f2bf(a);
    dst[i + half] = f2bf(b);
#endif
  }
}

// grid: ceil((num_heads + 2 * num_kv_heads) * head_dim / 2 / (GEMV_WARPS / split)), block: 32 * GEMV_WARPS
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_qkv_rope_m1(GemvQkvRopeParams p) { gemv_qkv_rope_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_qkv_rope_m2(GemvQkvRopeParams p) { gemv_qkv_rope_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_qkv_rope_m3(GemvQkvRopeParams p) { gemv_qkv_rope_impl<3>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_qkv_rope_m4(GemvQkvRopeParams p) { gemv_qkv_rope_impl<4>(p); }
