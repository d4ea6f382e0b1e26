// Paged decode attention on tensor cores (mma.sync m16n8k16, fp32 accumulation): the same op,
// parameters, grid semantics, split rule and split merge as paged_decode.cu, to which this file is
// appended before NVRTC compiles it (compile::PAGED_DECODE), so both kernels share
// PagedDecodeParams and merge_splits.
//
// Why: the lane kernel spends G fp32 FMAs (G query heads of the kv head) on every cached element
// of K and of V, plus a widening of each e4m3 byte, on the CUDA cores. With GQA (Llama-3-8B: 4,
// Qwen2.5-7B: 7) or an e4m3 cache that is more arithmetic than the SM can issue while the bytes
// stream in: on the H200 the lane kernel read Qwen2.5-7B's e4m3 cache at 16 % of the copy
// bandwidth at batch 64 (BENCHMARKS.md). Here the group's heads are the rows of the mma's A
// operand (up to 8 of its 16 rows; rows 8..15 are zero), so a warp spends 4 * HD / 16 mma on 16
// keys whatever the group.
//
// One CTA per (split, kv head and slice of up to 8 heads, item) as in paged_decode.cu; its warps
// take 16-key steps in turn, each warp with its own online softmax, merged in shared memory at
// the end. No shared-memory staging: every thread loads exactly the K and V elements its mma
// fragments need, as whole 16-byte vectors, because the head dim is permuted consistently on
// both sides of each product (a dot product does not depend on the order of its terms):
//  - S = Q K^T (m16 heads x n8 keys x k16 dims): thread (r = lane / 4, c = lane % 4) holds the
//    B fragment of key r, whose k columns (2c, 2c+1, 2c+8, 2c+9) of k-step kk are taken to be
//    dims c * HD/4 + 4kk + (0, 1, 2, 3): the thread reads dims [c * HD/4, (c+1) * HD/4) of its
//    key's K row, contiguous. Q's A fragment is read with the same permutation.
//  - O = P V (m16 heads x n8 dims x k16 keys): thread (r, c) holds the B fragment of dim column
//    r, taken to be dim r * HD/8 + nt in n-tile nt: it reads dims [r * HD/8, (r+1) * HD/8) of
//    keys 2c, 2c+1, 2c+8, 2c+9 of the step, contiguous, and pairs two keys' values in a register
//    with one byte permute. Its accumulator columns (2c, 2c+1) of n-tile nt are dims
//    2c * HD/8 + nt and (2c+1) * HD/8 + nt.
// With an e4m3 cache the products run in f16 (e4m3 -> f16x2 is one exact conversion per pair;
// Q is rounded to f16, P in [0, 1]); with a bf16 cache in bf16. Scores are scaled in fp32.
// Needs HD % 16 == 0 (HD % 32 with e4m3: each thread's V slice is whole 32-bit words) and
// HD <= 128.

#define DMMA_ROWS 8   // query heads a CTA: the A operand's rows 0..7
#define DMMA_WARPS 4
#define DMMA_KEYS 16  // keys a warp step
// CTAs per kv head (decode_mma_group_ctas in kernels.rs) and query heads each.
#define DMMA_GROUP_CTAS ((GROUP + DMMA_ROWS - 1) / DMMA_ROWS)
#define DMMA_GC ((GROUP + DMMA_GROUP_CTAS - 1) / DMMA_GROUP_CTAS)

#if KV_FP8
#define DMMA_ES 1
#else
#define DMMA_ES 2
#endif
// Other shapes have only the lane kernel (kernels::decode_mma_supported mirrors this): above
// 128 the accumulators and fragments of a head no longer fit the registers with loads in flight.
#if HD % 16 == 0 && HD <= 128 && (HD / 8 * DMMA_ES) % 4 == 0
// 32-bit words of a thread's K slice (HD/4 elements of one key) and V slice (HD/8 of one key);
// a warp step loads 2 K slices and 4 V slices a thread: HD * DMMA_ES / 4 words.
#define DMMA_KW (HD / 4 * DMMA_ES / 4)
#define DMMA_VW (HD / 8 * DMMA_ES / 4)
// Warp steps whose loads are in flight together: as many as fit 255 registers without spills
// at HD 128 (ptxas: bf16 2 steps, 16 KB a warp; e4m3 3 steps, 12 KB).
#ifndef DMMA_U
#define DMMA_U (HD * DMMA_ES / 4 <= 32 ? 3 : HD * DMMA_ES / 4 <= 64 ? 2 : 1)
#endif

// W words from `src` with the widest vector loads W allows (each slice starts at a multiple of
// its own size, so the vectors are aligned).
template <int W>
__device__ __forceinline__ void dmma_load(u32* dst, const void* src) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int i = 0; i < W / 4; i++) {
      const uint4 v = ((const uint4*)src)[i];
      dst[4 * i] = v.x;
      dst[4 * i + 1] = v.y;
      dst[4 * i + 2] = v.z;
      dst[4 * i + 3] = v.w;
    }
  } else if constexpr (W % 2 == 0) {
#pragma unroll
    for (int i = 0; i < W / 2; i++) {
      const uint2 v = ((const uint2*)src)[i];
      dst[2 * i] = v.x;
      dst[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; i++) dst[i] = ((const u32*)src)[i];
  }
}

// d += a * b on one m16n8k16 tile; a: rows 0..7 only (a1 = a3 = 0), so d[2], d[3] stay unused.
__device__ __forceinline__ void dmma(float* d, u32 a0, u32 a2, u32 b0, u32 b1) {
#if KV_FP8
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
#endif
}

// Two floats to the products' input type (f16 with an e4m3 cache, else bf16), `lo` low.
__device__ __forceinline__ u32 dmma_pack(float lo, float hi) {
#if KV_FP8
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return pack_bf16x2(lo, hi);
#endif
}

// grid: (num_splits, num_kv_heads * DMMA_GROUP_CTAS, num_items), block: DMMA_WARPS * 32
extern "C" __global__ void __launch_bounds__(DMMA_WARPS * 32) paged_decode_mma(PagedDecodeParams p) {
  constexpr int G = DMMA_GC;
  constexpr int KK = HD / 16;  // k-steps of S = Q K^T
  constexpr int NT = HD / 8;   // n-tiles of O = P V
  __shared__ float s_o[DMMA_WARPS][G][HD];
  __shared__ float s_m[DMMA_WARPS][G];
  __shared__ float s_l[DMMA_WARPS][G];

  pdl_trigger();  // the O projection may start streaming its weights
  const DecodeCta cta = decode_cta<G>(p, DMMA_GROUP_CTAS);
  const int split = cta.split, item = cta.item, kh = cta.kh, h0 = cta.h0, gn = cta.gn;
  const int row = cta.row, begin = cta.begin, end = cta.end;
  const int bshift = cta.bshift, bmask = cta.bmask;
  const int* bt = cta.bt;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane >> 2, c = lane & 3;

  // Q's A fragments (rows r < gn; the others zero): a0 = dims c*HD/4 + 4kk + (0, 1), a2 = + (2, 3).
  u32 qa[KK][2];
  {
    u32 qw[HD / 8];
    if (r < gn) {
      dmma_load<HD / 8>(qw, p.q + ((size_t)row * p.num_heads + h0 + r) * HD + c * (HD / 4));
    } else {
#pragma unroll
      for (int i = 0; i < HD / 8; i++) qw[i] = 0u;
    }
#pragma unroll
    for (int kk = 0; kk < KK; kk++) {
#if KV_FP8
      qa[kk][0] = dmma_pack(bf_lo(qw[2 * kk]), bf_hi(qw[2 * kk]));
      qa[kk][1] = dmma_pack(bf_lo(qw[2 * kk + 1]), bf_hi(qw[2 * kk + 1]));
#else
      qa[kk][0] = qw[2 * kk];
      qa[kk][1] = qw[2 * kk + 1];
#endif
    }
  }

  float o[NT][2];  // O[r][2c, 2c+1] of each n-tile, unnormalised
#pragma unroll
  for (int nt = 0; nt < NT; nt++) o[nt][0] = o[nt][1] = 0.f;
  float m_r = NEG_INF;  // row r's running max (log2 domain)
  float l_r = 0.f;      // this thread's share of row r's sum (its 4 columns; quad-summed at the end)
  const float qs = p.scale * LOG2E;
  const kv_t* kc = p.k_cache + c * (HD / 4);
  const kv_t* vc = p.v_cache + r * (HD / 8);

  constexpr int STRIDE = DMMA_WARPS * DMMA_KEYS;
  // The loop bound is uniform across the warp (the mma and shuffles need every lane).
  for (int base = begin + warp * DMMA_KEYS; base < end; base += STRIDE * DMMA_U) {
    u32 kw[DMMA_U][2][DMMA_KW];  // keys base + 8t + r
    u32 vw[DMMA_U][4][DMMA_VW];  // keys base + 2c + (i & 1) + 8 (i >> 1)
#pragma unroll
    for (int u = 0; u < DMMA_U; u++) {
      const int b = base + u * STRIDE;
#pragma unroll
      for (int t = 0; t < 2; t++) {
        const int j = b + 8 * t + r;
        if (j < end) {
          dmma_load<DMMA_KW>(kw[u][t], kc + kv_offset(bt[j >> bshift], kh, j & bmask,
                                                       p.num_kv_heads, p.block_size, HD));
        } else {
#pragma unroll
          for (int i = 0; i < DMMA_KW; i++) kw[u][t][i] = 0u;
        }
      }
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = b + 2 * c + (i & 1) + 8 * (i >> 1);
        if (j < end) {
          dmma_load<DMMA_VW>(vw[u][i], vc + kv_offset(bt[j >> bshift], kh, j & bmask,
                                                       p.num_kv_heads, p.block_size, HD));
        } else {
#pragma unroll
          for (int w = 0; w < DMMA_VW; w++) vw[u][i][w] = 0u;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < DMMA_U; u++) {
      const int b = base + u * STRIDE;
      if (b >= end) break;  // uniform: b depends on the warp only
      float s[2][4];
#pragma unroll
      for (int t = 0; t < 2; t++) {
        s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KK; kk++) {
#if KV_FP8
          const u32 w = kw[u][t][kk];
          dmma(s[t], qa[kk][0], qa[kk][1], e4m3x2_to_f16x2((unsigned short)(w & 0xffffu)),
               e4m3x2_to_f16x2((unsigned short)(w >> 16)));
#else
          dmma(s[t], qa[kk][0], qa[kk][1], kw[u][t][2 * kk], kw[u][t][2 * kk + 1]);
#endif
        }
      }
      // Row r's scores of keys b + 8t + 2c + e (t, e in 0..1), masked past the split's end.
      float x[4];
#pragma unroll
      for (int t = 0; t < 2; t++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          x[2 * t + e] = b + 8 * t + 2 * c + e < end ? s[t][e] * qs : NEG_INF;
        }
      }
      float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m_r, mx);  // finite: key b < end is in every row's step
      // Rescale only when some row's max rose (after the first steps, seldom): 2 * NT
      // multiplies a step saved, the warp's rows agreeing on the branch (corr 1 elsewhere).
      if (__any_sync(0xffffffffu, mn > m_r)) {
        const float corr = exp2f(m_r - mn);
        l_r *= corr;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
          o[nt][0] *= corr;
          o[nt][1] *= corr;
        }
        m_r = mn;
      }
      float pr[4];
#pragma unroll
      for (int e = 0; e < 4; e++) pr[e] = exp2f(x[e] - m_r);
      l_r += (pr[0] + pr[1]) + (pr[2] + pr[3]);
      // P's A fragment: a0 = keys 2c, 2c+1 (n-tile 0), a2 = keys 8 + 2c, 8 + 2c + 1 (n-tile 1).
      const u32 pa0 = dmma_pack(pr[0], pr[1]), pa2 = dmma_pack(pr[2], pr[3]);
#if !KV_FP8
      // bf16 keeps 8 bits of P: the rounding error (2^-9 relative) moved the demo model's
      // logits against the fp32 CPU reference twice as far as the lane kernel's fp32 P, and
      // flipped near-tied greedy tokens between split counts. P = hi + lo in two bf16 products
      // keeps 16 bits (e4m3 caches run in f16: 11 bits, below the cache's own 4).
      const u32 pl0 = pack_bf16x2(pr[0] - bf_lo(pa0), pr[1] - bf_hi(pa0));
      const u32 pl2 = pack_bf16x2(pr[2] - bf_lo(pa2), pr[3] - bf_hi(pa2));
#endif
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        float d[4] = {o[nt][0], o[nt][1], 0.f, 0.f};
#if KV_FP8
        // Byte nt of each key's slice; keys (2c, 2c+1) paired into b0, (2c+8, 2c+9) into b1.
        const int w = nt >> 2, sh = (nt & 1) * 16;
        const u32 sel = (nt & 2) ? 0x7362u : 0x5140u;
        const u32 k01 = __byte_perm(vw[u][0][w], vw[u][1][w], sel);
        const u32 k89 = __byte_perm(vw[u][2][w], vw[u][3][w], sel);
        dmma(d, pa0, pa2, e4m3x2_to_f16x2((unsigned short)(k01 >> sh)),
             e4m3x2_to_f16x2((unsigned short)(k89 >> sh)));
#else
        // Half nt of each key's slice; keys (2c, 2c+1) paired into b0, (2c+8, 2c+9) into b1.
        const int w = nt >> 1;
        const u32 sel = (nt & 1) ? 0x7632u : 0x5410u;
        const u32 b0 = __byte_perm(vw[u][0][w], vw[u][1][w], sel);
        const u32 b1 = __byte_perm(vw[u][2][w], vw[u][3][w], sel);
        dmma(d, pa0, pa2, b0, b1);
        dmma(d, pl0, pl2, b0, b1);
#endif
        o[nt][0] = d[0];
        o[nt][1] = d[1];
      }
    }
  }
  l_r += __shfl_xor_sync(0xffffffffu, l_r, 1);
  l_r += __shfl_xor_sync(0xffffffffu, l_r, 2);

  if (r < gn) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      s_o[warp][r][2 * c * NT + nt] = o[nt][0];
      s_o[warp][r][(2 * c + 1) * NT + nt] = o[nt][1];
    }
    if (c == 0) {
      s_m[warp][r] = m_r;
      s_l[warp][r] = l_r;
    }
  }
  __syncthreads();
  finish_split<DMMA_WARPS, G>(p, item, row, split, h0, gn, s_o, s_m, s_l);
}
#else
// Every module holds each kernel the loader looks for; the host never launches this one
// (kernels::decode_kernel falls back to the lane kernel for these shapes).
extern "C" __global__ void paged_decode_mma(PagedDecodeParams p) { __trap(); }
#endif  // shapes with a tensor-core decode
