// Paged decode attention on tensor cores (mma.sync m16n8k16, fp32 accumulation): the same op,
// parameters, grid semantics, split rule and split merge as paged_decode.cu, to which this file is
// appended before NVRTC compiles it (compile::PAGED_DECODE), so both kernels share
// PagedDecodeParams, decode_cta and finish_split.
//
// Why: the lane kernel spends G fp32 FMAs (G query heads of the kv head) on every cached element
// of K and of V, plus a widening of each e4m3 byte, on the CUDA cores. With GQA (Llama-3-8B: 4,
// Qwen2.5-7B: 7) or an e4m3 cache that is more arithmetic than the SM can issue while the bytes
// stream in: on the H200 the lane kernel read Qwen2.5-7B's e4m3 cache at 16 % of the copy
// bandwidth at batch 64 (BENCHMARKS.md).
//
// The query heads are the mma's N (8 columns), the keys and head dims its M (16 rows):
// S^T = K Q^T, O^T = V^T P^T, so a warp's 16-key step costs HD/16 products for S and HD/16 for O
// whatever the group (up to 8 heads a CTA; larger groups are cut in slices). With a bf16 cache P
// is kept as hi + lo bf16 (plain bf16 P moved the demo model's logits twice as far from the
// fp32 CPU reference as the lane kernel's fp32 P, and flipped near-tied greedy tokens between
// split counts); for groups of at most 4 the lo half rides in the columns 4..7 the heads leave
// free (the heads' scores are computed twice there, bit for bit the same), else in a second
// product. An e4m3 cache multiplies in f16 (one exact conversion per pair; P in f16).
// (Session 17's first version put the heads in the A operand's rows: half of every product
// multiplied zero rows; H200 figures of both in BENCHMARKS.md, session 18.)
//
// Fragments (m16n8k16; thread r = lane / 4, c = lane % 4):
//  - S^T (keys x heads): A = K, rows = keys b + r and b + 8 + r, k columns (2c, 2c+1, 2c+8,
//    2c+9) of k-step kk taken to be dims c * HD/4 + 4kk + (0..3): the thread reads a quarter of
//    each of its two keys' K rows, contiguous (a dot product does not depend on the order of its
//    terms, so Q is read with the same permutation); B = Q^T, column r = head r. Accumulator:
//    keys (r, r + 8) x heads (2c, 2c+1).
//  - P^T as the next B operand: the accumulator layout holds P[key][head] pairs; one
//    `movmatrix.trans` per 8 keys turns them into B's [keys 2c, 2c+1][head r].
//  - O^T (dims x heads): A = V^T, rows r and r + 8 of m-tile mt taken to be dims
//    r * HD/8 + 2mt and + 1, k columns = keys 2c, 2c+1, 2c+8, 2c+9: the thread reads an eighth
//    of four keys' V rows, contiguous, and pairs two keys' values in a register with one byte
//    permute. Accumulator: dims (r * HD/8 + 2mt, + 1) x heads (2c, 2c+1).
// Every load is a whole 16-byte vector from the paged cache: straight into registers with a bf16
// cache; with e4m3 through a small per-warp ring in shared memory (DMMA_RING below).
// Steps start at multiples of 16 keys, so with blocks of 16 keys or more (the default) a step's
// keys are consecutive rows of one block: one block-table read and one address a step, and the
// loads of a warp's U steps all go out before any is waited on. (The first version computed each
// key's address from its own block-table read; ncu showed the loads then waited on one another's
// registers, at half the bandwidth.)
// The softmax rescales lazily: the running max moves only when a score passes it by more than
// 2^8 (P then stays below 256: exact enough in f16 and in bf16 hi + lo, far from overflow), so
// most steps spend one warp vote instead of the max's shuffles.
// Needs HD % 16 == 0 (HD % 32 with e4m3: each thread's V slice is whole 32-bit words) and
// HD <= 128 (registers).

#define DMMA_HEADS 8  // query heads a CTA: the mma's N
#define DMMA_WARPS 4
#if DMMA_WARPS * 32 != MERGE_THREADS
#error "merge_splits sizes its shared memory for the lane kernel's block"
#endif
#define DMMA_KEYS 16  // keys a warp step
// CTAs per kv head (decode_mma_group_ctas in kernels.rs) and query heads each.
#define DMMA_GROUP_CTAS ((GROUP + DMMA_HEADS - 1) / DMMA_HEADS)
#define DMMA_GC ((GROUP + DMMA_GROUP_CTAS - 1) / DMMA_GROUP_CTAS)

#if KV_FP8
#define DMMA_ES 1
#else
#define DMMA_ES 2
#endif
// Other shapes have only the lane kernel (kernels::decode_mma_supported mirrors this).
#if HD % 16 == 0 && HD <= 128 && (HD / 8 * DMMA_ES) % 4 == 0
// 32-bit words of a thread's K slice (HD/4 elements of one key) and V slice (HD/8 of one key);
// a warp step loads 2 K slices and 4 V slices a thread: HD * DMMA_ES / 4 words.
#define DMMA_KW (HD / 4 * DMMA_ES / 4)
#define DMMA_VW (HD / 8 * DMMA_ES / 4)
// Warp steps whose loads are in flight together, and CTAs an SM (forward::decode_fill aims the
// split rule at twice this many). Measured on the H200 (session 18, Llama-3-8B and Qwen2.5-7B
// heads): bf16 at HD 128 ran best with 2 steps in flight at 2 CTAs an SM (~215 registers), e4m3
// with 2 steps at 3 CTAs (~150 registers; 3 steps at 2 CTAs: 2 % slower summed over the
// attention cases, 7 % in a batch-1000 decode step). With the e4m3 ring (DMMA_RING below) 4 CTAs
// (119 registers, 32 KB of ring each).
#if KV_FP8
#define DMMA_U 2
#define DMMA_MIN_CTAS (DMMA_RING ? 4 : 3)
#else
#define DMMA_U (HD <= 64 ? 3 : 2)
#define DMMA_MIN_CTAS 2
#endif
// Each pass reads the next pass's block-table entries while its own K/V loads are in flight (0:
// at the pass's start, a round trip before its loads). On an H100 (session 47, two calls) alone
// 1-2.5 % faster at 192 keys x 512 sequences, either cache, level where a split is one pass
// (4k x 1); BENCHMARKS.md issue 18.
#ifndef DMMA_BT_AHEAD
#define DMMA_BT_AHEAD 1
#endif
// Benchmark overrides (`Gpu::decode_defines`, BROOK_DECODE_DEFINES in gpu-bench): steps a pass
// and the launch bound's CTAs an SM.
#ifdef DMMA_U_SET
#undef DMMA_U
#define DMMA_U DMMA_U_SET
#endif
#ifdef DMMA_CTAS_SET
#undef DMMA_MIN_CTAS
#define DMMA_MIN_CTAS DMMA_CTAS_SET
#endif
// Warp steps each warp keeps in flight in a ring of shared memory (cp.async, per thread: each
// reads back only what it copied, so no barrier), refilled as each step is consumed; 0: the
// steps of a pass are loaded into registers, waited on and consumed before the next pass's
// loads go out. Blocks of 16 keys or more only. Shared memory (dynamic, `decode_ring_smem` in
// compile.rs, default `compile::decode_ring`): DMMA_WARPS * DMMA_RING steps of HD * DMMA_ES
// bytes a lane. On an H100 (session 49, BENCHMARKS.md) with the e4m3 cache, against the register
// passes at 3 CTAs: 2 slots at 4 CTAs 6 % faster at 192 keys x 512 sequences, 11-14 % at 4k x 1
// back to back, 12 % at GQA 4k x 16, level at 1000 x 512; 3 slots level, 4 slots (3 CTAs)
// slower. With bf16, 2 slots at 3 CTAs were 2-10 % slower: off.
#ifndef DMMA_RING
#define DMMA_RING (KV_FP8 ? 2 : 0)
#endif
#define DMMA_TW (2 * DMMA_KW + 4 * DMMA_VW)  // 32-bit words of a thread's step: K, then V
#if KV_FP8
#define DMMA_DUP 0  // P in f16: one product
#define DMMA_TWO 0
#else
#define DMMA_DUP (DMMA_GC <= 4)  // P's lo half in columns 4..7
#define DMMA_TWO (DMMA_GC > 4)   // P's lo half in a second product
#endif
#define DMMA_SLACK 8.f  // log2 of how far a score may pass the running max before a rescale

// W words into registers with the widest vector loads W allows, word w read at `at(w)` (each
// vector's words contiguous there and aligned to its size).
template <int W, typename At>
__device__ __forceinline__ void dmma_gather(u32* dst, At at) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int i = 0; i < W / 4; i++) {
      const uint4 v = *(const uint4*)at(4 * i);
      dst[4 * i] = v.x;
      dst[4 * i + 1] = v.y;
      dst[4 * i + 2] = v.z;
      dst[4 * i + 3] = v.w;
    }
  } else if constexpr (W % 2 == 0) {
#pragma unroll
    for (int i = 0; i < W / 2; i++) {
      const uint2 v = *(const uint2*)at(2 * i);
      dst[2 * i] = v.x;
      dst[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; i++) dst[i] = *at(i);
  }
}

// W words from `src` (each slice starts at a multiple of its own size, so the vectors are
// aligned).
template <int W>
__device__ __forceinline__ void dmma_load(u32* dst, const void* src) {
  dmma_gather<W>(dst, [&](int w) { return (const u32*)src + w; });
}

// Word w of a thread's step within its ring slot, counted from the lane's first word: 16-byte
// chunks interleaved across the lanes, so a quarter warp's 16-byte reads hit distinct banks.
__device__ __forceinline__ int dmma_rw(int w) { return (w >> 2) * 128 + (w & 3); }

// W words from `src` into the lane's slot (shared address `lane_s`) from its word w0, with the
// widest copies W allows; the source is aligned as dmma_load's.
template <int W>
__device__ __forceinline__ void dmma_cp(u32 lane_s, int w0, const void* src) {
  const char* g = (const char*)src;
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int i = 0; i < W / 4; i++) {
      const u32 d = lane_s + 4 * dmma_rw(w0 + 4 * i);
      // Through L1 (.ca): a lane's slice spans several 16-byte chunks of one 32-byte sector, so
      // each copy asks for half of every sector it touches, and only L1 merges the halves.
      // Around it (.cg) the ring saturated L2 at 54 % of DRAM on an H100 (ncu, session 49),
      // 1.5x slower than the register passes; copying whole rows for one another did not help.
      asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(d), "l"(g + 16 * i) : "memory");
    }
  } else if constexpr (W % 2 == 0) {
#pragma unroll
    for (int i = 0; i < W / 2; i++) {
      const u32 d = lane_s + 4 * dmma_rw(w0 + 2 * i);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(g + 8 * i) : "memory");
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; i++) {
      const u32 d = lane_s + 4 * dmma_rw(w0 + i);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(g + 4 * i) : "memory");
    }
  }
}

// dmma_cp's W words back from the lane's slot (`lane`: its first word) into registers.
template <int W>
__device__ __forceinline__ void dmma_lds(u32* dst, const u32* lane, int w0) {
  dmma_gather<W>(dst, [&](int w) { return lane + dmma_rw(w0 + w); });
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

// d += a * b on one m16n8k16 tile, every register of the operands in use.
__device__ __forceinline__ void dmma4(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if KV_FP8
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The 8x8 16-bit matrix whose row lane / 4 holds `x` (columns 2 (lane % 4), + 1), transposed:
// returns the same part of the transpose.
__device__ __forceinline__ u32 dmma_trans(u32 x) {
  u32 y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// The kernel body. ONE_BLOCK: blocks of 16 keys or more (a step's keys share one block). s_o,
// s_m, s_l: the warps' softmax states, merged by finish_split.
template <bool ONE_BLOCK>
__device__ __forceinline__ void dmma_body(const PagedDecodeParams& p,
                                         float (&s_o)[DMMA_WARPS][DMMA_GC][HD],
                                         float (&s_m)[DMMA_WARPS][DMMA_GC],
                                         float (&s_l)[DMMA_WARPS][DMMA_GC]) {
  constexpr int G = DMMA_GC;
  constexpr int KK = HD / 16;  // k-steps of S^T = K Q^T
  constexpr int MT = HD / 16;  // m-tiles of O^T = V^T P^T

  pdl_trigger();  // the O projection may start streaming its weights
  const DecodeCta cta = decode_cta<G>(p, DMMA_GROUP_CTAS);
  const int split = cta.split, item = cta.item, kh = cta.kh, h0 = cta.h0, gn = cta.gn;
  const int row = cta.row, begin = cta.begin, end = cta.end;
  const int bshift = cta.bshift, bmask = cta.bmask;
  const int* bt = cta.bt;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane >> 2, c = lane & 3;

  // Q^T's B fragments of column r: head r, or r % 4 where columns 4..7 carry P's lo half.
  const int qh = DMMA_DUP ? (r & 3) : r;
  u32 qb[KK][2];
  {
    u32 qw[HD / 8];
    if (qh < gn) {
      dmma_load<HD / 8>(qw, p.q + ((size_t)row * p.num_heads + h0 + qh) * HD + c * (HD / 4));
    } else {
#pragma unroll
      for (int i = 0; i < HD / 8; i++) qw[i] = 0u;
    }
#pragma unroll
    for (int kk = 0; kk < KK; kk++) {
#if KV_FP8
      qb[kk][0] = dmma_pack(bf_lo(qw[2 * kk]), bf_hi(qw[2 * kk]));
      qb[kk][1] = dmma_pack(bf_lo(qw[2 * kk + 1]), bf_hi(qw[2 * kk + 1]));
#else
      qb[kk][0] = qw[2 * kk];
      qb[kk][1] = qw[2 * kk + 1];
#endif
    }
  }

  float o[MT][4];  // O^T: dims (r * HD/8 + 2mt, + 1) x heads (2c, 2c+1), unnormalised
#pragma unroll
  for (int mt = 0; mt < MT; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  float m_h[2] = {NEG_INF, NEG_INF};  // heads 2c, 2c+1: running max (log2 domain)
  float l_h[2] = {0.f, 0.f};          // this thread's keys' share of each sum
  const float qs = p.scale * LOG2E;
  const kv_t* kc = p.k_cache + c * (HD / 4);
  const kv_t* vc = p.v_cache + r * (HD / 8);

  // A step's V slices of keys outside the split zeroed (P = 0 times a stale row could be NaN;
  // K's scores are masked in `step`). The test is uniform: only a step at a split's edge.
  const auto zero_v_outside = [&](u32(&vwu)[4][DMMA_VW], int b) {
    if (b < begin || b + DMMA_KEYS > end) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = b + 2 * c + (i & 1) + 8 * (i >> 1);
        if (j < begin || j >= end) {
#pragma unroll
          for (int w = 0; w < DMMA_VW; w++) vwu[i][w] = 0u;
        }
      }
    }
  };
  // One warp step of 16 keys from b: S^T = K Q^T, the lazy softmax, O^T += V^T P^T. kwu, vwu:
  // its K and V slices (fragment layouts above), V zeroed outside the split.
  const auto step = [&](const u32(&kwu)[2][DMMA_KW], const u32(&vwu)[4][DMMA_VW], int b) {
    // S^T, two accumulators (even and odd k-steps) to halve the dependent chain.
    float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < KK; kk++) {
#if KV_FP8
      const u32 w0 = kwu[0][kk], w1 = kwu[1][kk];
      const u32 a[4] = {e4m3x2_to_f16x2((unsigned short)(w0 & 0xffffu)),
                        e4m3x2_to_f16x2((unsigned short)(w1 & 0xffffu)),
                        e4m3x2_to_f16x2((unsigned short)(w0 >> 16)),
                        e4m3x2_to_f16x2((unsigned short)(w1 >> 16))};
#else
      const u32 a[4] = {kwu[0][2 * kk], kwu[1][2 * kk], kwu[0][2 * kk + 1],
                        kwu[1][2 * kk + 1]};
#endif
      dmma4(kk & 1 ? s2 : s, a, qb[kk][0], qb[kk][1]);
    }
    // x[h][k]: head 2c + h, key b + r + 8k; masked outside the split.
    float x[2][2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const int j = b + r + 8 * k;
      const bool in = j >= begin && j < end;
#pragma unroll
      for (int h = 0; h < 2; h++) x[h][k] = in ? (s[2 * k + h] + s2[2 * k + h]) * qs : NEG_INF;
    }
    const bool past = x[0][0] > m_h[0] + DMMA_SLACK || x[0][1] > m_h[0] + DMMA_SLACK ||
                      x[1][0] > m_h[1] + DMMA_SLACK || x[1][1] > m_h[1] + DMMA_SLACK;
    if (__any_sync(0xffffffffu, past)) {
      // Every step has a key in the split, so each head's max over the step is finite.
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = fmaxf(x[h][0], x[h][1]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float mn = fmaxf(m_h[h], mx);
        const float corr = exp2f(m_h[h] - mn);
        l_h[h] *= corr;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          o[mt][h] *= corr;
          o[mt][h + 2] *= corr;
        }
        m_h[h] = mn;
      }
    }
    float pr[2][2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      pr[h][0] = exp2f(x[h][0] - m_h[h]);
      pr[h][1] = exp2f(x[h][1] - m_h[h]);
      l_h[h] += pr[h][0] + pr[h][1];
    }
    // P[key r + 8k][heads 2c, 2c+1] packed, then transposed into B's [keys][head r].
    u32 pb[2];
#if DMMA_TWO
    u32 pl[2];
#endif
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const u32 hi = dmma_pack(pr[0][k], pr[1][k]);
#if DMMA_DUP || DMMA_TWO
      // bf16 keeps 8 bits of P; hi + lo keeps 16 (paged_decode_mma.cu says why it matters).
      const u32 lo = pack_bf16x2(pr[0][k] - bf_lo(hi), pr[1][k] - bf_hi(hi));
#endif
#if DMMA_DUP
      pb[k] = dmma_trans(c < 2 ? hi : lo);
#else
      pb[k] = dmma_trans(hi);
#endif
#if DMMA_TWO
      pl[k] = dmma_trans(lo);
#endif
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      u32 a[4];
#if KV_FP8
      // Bytes 2mt, 2mt+1 of each key's slice: keys (2c, 2c+1) paired, then (2c+8, 2c+9).
      const int w = mt >> 1;
      const u32 sel = (mt & 1) ? 0x7362u : 0x5140u;
      const u32 k01 = __byte_perm(vwu[0][w], vwu[1][w], sel);
      const u32 k89 = __byte_perm(vwu[2][w], vwu[3][w], sel);
      a[0] = e4m3x2_to_f16x2((unsigned short)(k01 & 0xffffu));
      a[1] = e4m3x2_to_f16x2((unsigned short)(k01 >> 16));
      a[2] = e4m3x2_to_f16x2((unsigned short)(k89 & 0xffffu));
      a[3] = e4m3x2_to_f16x2((unsigned short)(k89 >> 16));
#else
      // Word mt of each key's slice (dims 2mt, 2mt+1): keys (2c, 2c+1) paired per dim.
      a[0] = __byte_perm(vwu[0][mt], vwu[1][mt], 0x5410u);
      a[1] = __byte_perm(vwu[0][mt], vwu[1][mt], 0x7632u);
      a[2] = __byte_perm(vwu[2][mt], vwu[3][mt], 0x5410u);
      a[3] = __byte_perm(vwu[2][mt], vwu[3][mt], 0x7632u);
#endif
      dmma4(o[mt], a, pb[0], pb[1]);
#if DMMA_TWO
      dmma4(o[mt], a, pl[0], pl[1]);
#endif
    }
  };

  constexpr int STRIDE = DMMA_WARPS * DMMA_KEYS;
  const int base0 = (begin & ~(DMMA_KEYS - 1)) + warp * DMMA_KEYS;
#if DMMA_RING
  if constexpr (ONE_BLOCK) {
    // The warp's steps j = 0, 1, ... (keys base0 + j * STRIDE on) through a ring of DMMA_RING
    // slots: step j + DMMA_RING is copied into step j's slot as soon as step j is read out, so
    // DMMA_RING steps stay in flight however long the split (the register passes drain to
    // nothing between passes). One commit group a step, empty past the split, so that
    // wait_group's count is the same every step.
    extern __shared__ __align__(16) u32 dmma_ring[];  // [DMMA_WARPS][DMMA_RING][DMMA_TW/4][32][4]
    constexpr int SLOT = DMMA_TW * 32;                 // words a slot
    const u32* mine = dmma_ring + warp * DMMA_RING * SLOT + lane * 4;
    const u32 mine_s = smem_addr(mine);
    const auto entry = [&](int j) {  // step j's block, or 0 past the split
      const int b = base0 + j * STRIDE;
      return b < end ? bt[b >> bshift] : 0;
    };
    const auto issue = [&](int j, int blk, int slot) {
      const int b = base0 + j * STRIDE;
      if (b < end) {
        const size_t row0 = kv_offset(blk, kh, b & bmask, p.num_kv_heads, p.block_size, HD);
        const u32 at = mine_s + slot * SLOT * 4;
#pragma unroll
        for (int t = 0; t < 2; t++) dmma_cp<DMMA_KW>(at, t * DMMA_KW, kc + row0 + (8 * t + r) * HD);
#pragma unroll
        for (int i = 0; i < 4; i++) {
          dmma_cp<DMMA_VW>(at, 2 * DMMA_KW + i * DMMA_VW,
                           vc + row0 + (2 * c + (i & 1) + 8 * (i >> 1)) * HD);
        }
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    };
    {
      int first[DMMA_RING];  // one round trip for every first step's block
#pragma unroll
      for (int j = 0; j < DMMA_RING; j++) first[j] = entry(j);
#pragma unroll
      for (int j = 0; j < DMMA_RING; j++) issue(j, first[j], j);
    }
    int next = entry(DMMA_RING);  // read while the ring's steps are in flight
    int slot = 0;
    for (int j = 0; base0 + j * STRIDE < end; j++) {  // uniform across the warp
      asm volatile("cp.async.wait_group %0;" ::"n"(DMMA_RING - 1) : "memory");
      const u32* at = mine + slot * SLOT;
      u32 kw[2][DMMA_KW], vw[4][DMMA_VW];
#pragma unroll
      for (int t = 0; t < 2; t++) dmma_lds<DMMA_KW>(kw[t], at, t * DMMA_KW);
#pragma unroll
      for (int i = 0; i < 4; i++) dmma_lds<DMMA_VW>(vw[i], at, 2 * DMMA_KW + i * DMMA_VW);
      const int b = base0 + j * STRIDE;
      zero_v_outside(vw, b);
      step(kw, vw, b);
      // The slot's registers are consumed (the products above read them), so it can be refilled.
      issue(j + DMMA_RING, next, slot);
      next = entry(j + DMMA_RING + 1);
      slot = slot + 1 == DMMA_RING ? 0 : slot + 1;
    }
  } else
#endif
  {
    // Steps a pass: with the ring this path serves only blocks of fewer than 16 keys, at one step
    // a pass, so that it does not set the kernel's register count.
    constexpr int U = DMMA_RING ? 1 : DMMA_U;
#if DMMA_BT_AHEAD
    // The block of each step of the next pass, read while this pass's K/V loads are in flight:
    // a pass then costs one round trip, not two (block table, then rows).
    int blk[U];
    if constexpr (ONE_BLOCK) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int b = base0 + u * STRIDE;
        blk[u] = b < end ? bt[b >> bshift] : 0;
      }
    }
#endif
    // The loop bound is uniform across the warp (the mma, movmatrix and votes need every lane).
    for (int base = base0; base < end; base += STRIDE * U) {
      u32 kw[U][2][DMMA_KW];  // keys base + 8t + r
      u32 vw[U][4][DMMA_VW];  // keys base + 2c + (i & 1) + 8 (i >> 1)
      // Every step's row first (block-table reads, unless DMMA_BT_AHEAD read them during the pass
      // before): one round trip for all of them.
      size_t row0[U];
      if constexpr (ONE_BLOCK) {
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int b = base + u * STRIDE;
#if DMMA_BT_AHEAD
          row0[u] = b < end ? kv_offset(blk[u], kh, b & bmask, p.num_kv_heads, p.block_size, HD)
                            : 0;
#else
          row0[u] = b < end ? kv_offset(bt[b >> bshift], kh, b & bmask, p.num_kv_heads,
                                        p.block_size, HD)
                            : 0;
#endif
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int b = base + u * STRIDE;
        if constexpr (ONE_BLOCK) {
          // The step's 16 keys are consecutive rows of one block (b's block holds begin or a key
          // before end: a valid entry, and its rows past the context are allocated): one
          // block-table read and one address a step, every load unconditional, so no load
          // waits on another's registers. V of keys outside the split is zeroed after
          // (`zero_v_outside`).
          if (b < end) {
#pragma unroll
            for (int t = 0; t < 2; t++) {
              dmma_load<DMMA_KW>(kw[u][t], kc + row0[u] + (8 * t + r) * HD);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
              dmma_load<DMMA_VW>(vw[u][i], vc + row0[u] + (2 * c + (i & 1) + 8 * (i >> 1)) * HD);
            }
            zero_v_outside(vw[u], b);
          }
        } else {
          // Blocks of fewer than 16 keys: each key looked up alone.
          const auto at = [&](int j) {
            return kv_offset(bt[j >> bshift], kh, j & bmask, p.num_kv_heads, p.block_size, HD);
          };
#pragma unroll
          for (int t = 0; t < 2; t++) {
            const int j = b + 8 * t + r;
            if (j >= begin && j < end) {
              dmma_load<DMMA_KW>(kw[u][t], kc + at(j));
            } else {
#pragma unroll
              for (int i = 0; i < DMMA_KW; i++) kw[u][t][i] = 0u;
            }
          }
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const int j = b + 2 * c + (i & 1) + 8 * (i >> 1);
            if (j >= begin && j < end) {
              dmma_load<DMMA_VW>(vw[u][i], vc + at(j));
            } else {
#pragma unroll
              for (int w = 0; w < DMMA_VW; w++) vw[u][i][w] = 0u;
            }
          }
        }
      }
#if DMMA_BT_AHEAD
      if constexpr (ONE_BLOCK) {
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int b = base + (U + u) * STRIDE;
          blk[u] = b < end ? bt[b >> bshift] : 0;
        }
      }
#endif
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int b = base + u * STRIDE;
        if (b >= end) break;  // uniform: b depends on the warp only
        step(kw[u], vw[u], b);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l_h[h] += __shfl_xor_sync(0xffffffffu, l_h[h], 4);
    l_h[h] += __shfl_xor_sync(0xffffffffu, l_h[h], 8);
    l_h[h] += __shfl_xor_sync(0xffffffffu, l_h[h], 16);
  }
#if DMMA_DUP
  // Columns 4..7 hold the lo half of heads 0..3: add them to their heads (lane c ^ 2).
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int i = 0; i < 4; i++) o[mt][i] += __shfl_xor_sync(0xffffffffu, o[mt][i], 2);
  }
  const bool writer = c < 2;
#else
  const bool writer = true;
#endif
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int hh = 2 * c + h;
    if (writer && hh < gn) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        s_o[warp][hh][r * (HD / 8) + 2 * mt] = o[mt][h];
        s_o[warp][hh][r * (HD / 8) + 2 * mt + 1] = o[mt][h + 2];
      }
      if (r == 0) {
        s_m[warp][hh] = m_h[h];
        s_l[warp][hh] = l_h[h];
      }
    }
  }
  __syncthreads();
  finish_split<DMMA_WARPS, G>(p, item, row, split, h0, gn, s_o, s_m, s_l);
}

// grid: (num_splits, num_kv_heads * DMMA_GROUP_CTAS, num_items), block: DMMA_WARPS * 32
extern "C" __global__ void __launch_bounds__(DMMA_WARPS * 32, DMMA_MIN_CTAS) paged_decode_mma(PagedDecodeParams p) {
  __shared__ float s_o[DMMA_WARPS][DMMA_GC][HD];
  __shared__ float s_m[DMMA_WARPS][DMMA_GC];
  __shared__ float s_l[DMMA_WARPS][DMMA_GC];
  if (p.block_size >= DMMA_KEYS) {
    dmma_body<true>(p, s_o, s_m, s_l);
  } else {
    dmma_body<false>(p, s_o, s_m, s_l);
  }
}
#else
// Every module holds each kernel the loader looks for; the host never launches this one
// (kernels::decode_kernel falls back to the lane kernel for these shapes).
extern "C" __global__ void paged_decode_mma(PagedDecodeParams p) { __trap(); }
#endif  // shapes with a tensor-core decode
