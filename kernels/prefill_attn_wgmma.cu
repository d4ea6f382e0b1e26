// Causal varlen prefill attention on Hopper's warpgroup tensor cores (wgmma, sm_90a): the flash
// prefill kernel of prefill_attn.cu (appended to it: the same parameters, tiles, splits, K/V
// offsets and split merge) with its two products on wgmma instead of mma.sync.
//
// One CTA = one warpgroup = 64 query rows of one sequence and one head (PF_BM), as in
// prefill_attn.cu, so the host's tiling and split rule are the same. Q, K and V tiles sit in
// shared memory in the 128-byte swizzled layout wgmma reads (rows of 64 bf16, 16-byte chunk c of
// row r at chunk c ^ (r % 8); a head of 128 dims is two such halves, one after the other):
//   S = Q K^T:  wgmma m64n64k16, A = Q and B = K from shared memory, both K-major (head dims
//               contiguous), HD / 16 steps;
//   O += P V:   wgmma m64n{HD}k16, A = P from registers (the S accumulator's layout is the
//               register A-fragment's, as with mma.sync), B = V from shared memory N-major (V's
//               rows are keys: transposed by the instruction, no ldmatrix.trans), 4 steps.
// The mma.sync kernel issues 2 shared-memory loads per 16x8x16 product for K's fragments and an
// ldmatrix.trans per two for V's; here the tensor cores read the tiles themselves.
//
// K/V are cp.async'ed into the swizzled tiles (chunk offsets from the block table as in
// prefill_attn.cu), with the same interleaving: V of tile j loads during S and the softmax of tile
// j, K of tile j + 1 during O += PV. Writes by cp.async are generic-proxy writes and wgmma reads
// through the async proxy: each thread fences (fence.proxy.async) after its copies land, before
// the barrier that publishes the tile.
//
// An e4m3 cache (-DKV_FP8=1) is staged and widened to bf16 in shared memory as in prefill_attn.cu.
//
// Built only for sm_90a (Gpu::load_attention on compute capability 9.0) at head dims 64 and 128;
// other shapes and other GPUs run prefill_attn.
#if !(HD == 64 || HD == 128)
#error "prefill_attn_wgmma.cu is built for head dims 64 and 128"
#endif

#define WG_BN 64                          // keys a tile (PF_BN at these head dims)
#define WG_Q_BYTES (PF_BM * HD * 2)       // 16 KB at HD 128
#define WG_KV_BYTES (WG_BN * HD * 2)      // 16 KB at HD 128
// K/V tiles in shared memory (compile::PREFILL_WG_STAGES passes it): 1, one K and one V tile
// loaded in turns; 2, two of each, with tile t's S and tile t - 1's O += PV in flight together
// (the pipelined loop at the end).
#ifndef WG_STAGES
#define WG_STAGES 1
#endif
#if WG_STAGES != 1 && WG_STAGES != 2
#error "prefill_attn_wgmma.cu is built with WG_STAGES 1 or 2"
#endif
// WG_TMA 1: K/V tiles arrive by TMA (cp.async.bulk.tensor through p.kv_maps, one copy per
// cache block and 64-dim half, issued by warp 0 and completing on an mbarrier) instead of every
// thread computing and issuing 16 cp.async a tile; bf16 caches, WG_STAGES 1.
#ifndef WG_TMA
#define WG_TMA 0
#endif
#if WG_TMA && KV_FP8
#error "the TMA build takes a bf16 cache"
#endif
#if KV_FP8
// An e4m3 cache: each tile is cp.async'ed as e4m3 into a staging buffer (K and V take turns in
// it) and each thread widens the chunks it copied into the swizzled bf16 tile (exact), as in
// prefill_attn.cu; with one K and one V tile only.
#if WG_STAGES != 1
#error "prefill_attn_wgmma.cu stages an e4m3 cache with WG_STAGES 1 only"
#endif
#define WG_STAGE_BYTES (WG_BN * HD)
#else
#define WG_STAGE_BYTES 0
#endif
#define WG_SMEM (WG_Q_BYTES + WG_STAGES * 2 * WG_KV_BYTES + WG_STAGE_BYTES)
static_assert(WG_BN == PF_BN, "PF_CHUNKS counts the chunks of a PF_BN-key tile");
static_assert(WG_SMEM >= PF_MERGE_BYTES + 4, "the split merge's weights and flag reuse the tiles");

// Byte offset of 16-byte chunk c16 (of HD / 8) of row r in a [rows, HD] tile in the 128-byte
// swizzled layout.
__device__ __forceinline__ u32 wg_swizzled(int r, int c16, int rows) {
  return (u32)((c16 >> 3) * rows * 128 + r * 128 + (((c16 & 7) ^ (r & 7)) << 4));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (each >> 4), layout type 1 in bits 62-63. The tiles are 1024-byte aligned (a
// swizzle atom: 8 rows of 128 bytes), so the base offset field stays 0.
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3ffff) >> 4) | ((u64)((lbo >> 4) & 0x3fff) << 16) |
         ((u64)((sbo >> 4) & 0x3fff) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma's reads.
__device__ __forceinline__ void wg_fence_proxy() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Pins accumulator registers after wg_wait_all: the compiler sees the wgmma asm write them, not
// the wait, and could otherwise read them between the two.
template <int N>
__device__ __forceinline__ void wg_pin(float (&x)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
    asm volatile("" : "+f"(x[i][0]), "+f"(x[i][1]), "+f"(x[i][2]), "+f"(x[i][3])::"memory");
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]; A and B in shared memory, both K-major.
__device__ __forceinline__ void wgmma_ss_n64(float* d, u64 desc_a, u64 desc_b, int accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 64] += A[64 x 16] B[16 x 64]; A in registers, B in shared memory N-major
// (imm-trans-b 1).
__device__ __forceinline__ void wgmma_rs_n64_nmajor(float* d, const u32* a, u64 desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// D[64 x 128] += A[64 x 16] B[16 x 128]; A in registers, B in shared memory N-major
// (imm-trans-b 1).
__device__ __forceinline__ void wgmma_rs_n128_nmajor(float* d, const u32* a, u64 desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// One thread's two query rows' online-softmax state (rows g and g + 8 of its warp's 16: the
// m16n8 accumulator layout).
struct PfRows {
  int pos_a, pos_b;  // their positions (rows past the chunk: the chunk's last)
  int lo_a, lo_b;    // their first visible keys under a window
  float m_a, m_b;    // running max, log2 domain (lazy: see WG_SLACK)
  float l_a, l_b;    // running sum of this thread's columns (reduced over the row at the end)
  float sl2;         // softmax scale in the log2 domain
};

// The running max moves only when a score passes it by more than 2^WG_SLACK (FlashAttention-4's
// lazy rescale; the decode kernel's DMMA_SLACK): P = 2^(s - m) then stays below 2^8, exact
// enough in bf16 and far from fp32's range, and most tiles skip O's rescale.
#define WG_SLACK 8.f

__device__ __forceinline__ float wg_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Masks (causal and window), scales and exponentiates one tile of scores s (BN keys from kv0,
// becoming P) and, when a row's max moves, rescales the sums and returns true with O's factors
// in corr_a / corr_b (wg_rescale: the caller applies them once O is its own, which with the
// pipelined loop is after the previous tile's O += PV lands). `whole`: every row of the CTA
// sees every key of the tile (no mask; uniform over the CTA, so one branch a tile).
template <int BN>
__device__ __forceinline__ bool pf_softmax_tile(float (&s)[BN / 8][4], PfRows& r, int kv0,
                                                bool whole, int tig, float& corr_a,
                                                float& corr_b) {
  float mx_a = NEG_INF, mx_b = NEG_INF;
  if (whole) {
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        mx_a = fmaxf(mx_a, s[nt][e]);
        mx_b = fmaxf(mx_b, s[nt][2 + e]);
      }
    }
  } else {
    // Key k is visible to a row when lo <= k <= pos: one unsigned compare of k - lo (the
    // window's start; -2^30 without a window).
    const unsigned span_a = r.pos_a - r.lo_a, span_b = r.pos_b - r.lo_b;
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int key = kv0 + nt * 8 + tig * 2 + e;
        s[nt][e] = (unsigned)(key - r.lo_a) <= span_a ? s[nt][e] : NEG_INF;
        s[nt][2 + e] = (unsigned)(key - r.lo_b) <= span_b ? s[nt][2 + e] : NEG_INF;
        mx_a = fmaxf(mx_a, s[nt][e]);
        mx_b = fmaxf(mx_b, s[nt][2 + e]);
      }
    }
  }
  // The scale (> 0) keeps the order: the max of the raw scores, scaled once; the scale of every
  // score rides in the exponent's FMA below.
  mx_a *= r.sl2;
  mx_b *= r.sl2;
  mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
  mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
  mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
  mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
  // A row's first visible key always moves its max (from -inf); a row that has seen none
  // keeps -inf, and base 0 keeps 2^(-inf - base) = 0 (rather than NaN).
  const bool moved = __any_sync(0xffffffffu, mx_a > r.m_a + WG_SLACK || mx_b > r.m_b + WG_SLACK);
  if (moved) {
    const float na = fmaxf(r.m_a, mx_a), nb = fmaxf(r.m_b, mx_b);
    corr_a = na == NEG_INF ? 1.f : wg_exp2(r.m_a - na);
    corr_b = nb == NEG_INF ? 1.f : wg_exp2(r.m_b - nb);
    r.m_a = na;
    r.m_b = nb;
    r.l_a *= corr_a;
    r.l_b *= corr_b;
  }
  const float base_a = r.m_a == NEG_INF ? 0.f : r.m_a, base_b = r.m_b == NEG_INF ? 0.f : r.m_b;
  float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
  for (int nt = 0; nt < BN / 8; nt++) {
    s[nt][0] = wg_exp2(fmaf(s[nt][0], r.sl2, -base_a));
    s[nt][1] = wg_exp2(fmaf(s[nt][1], r.sl2, -base_a));
    s[nt][2] = wg_exp2(fmaf(s[nt][2], r.sl2, -base_b));
    s[nt][3] = wg_exp2(fmaf(s[nt][3], r.sl2, -base_b));
    sum_a += s[nt][0] + s[nt][1];
    sum_b += s[nt][2] + s[nt][3];
  }
  // l stays a per-thread partial sum (the 4 lanes of a row share m); reduced at the end.
  r.l_a += sum_a;
  r.l_b += sum_b;
  return moved;
}

// O's rows scaled by pf_softmax_tile's factors.
__device__ __forceinline__ void wg_rescale(float (&o)[HD / 8][4], float corr_a, float corr_b) {
#pragma unroll
  for (int nd = 0; nd < HD / 8; nd++) {
    o[nd][0] *= corr_a;
    o[nd][1] *= corr_a;
    o[nd][2] *= corr_b;
    o[nd][3] *= corr_b;
  }
}

// Starts the copy of one WG_BN-key tile of `cache` (K or V) at this thread's chunk offsets
// (0xffffffff: zero-filled; the caller commits): into the swizzled tile `dst`, or with an e4m3
// cache into the staging buffer `dst` (chunk c of 16 e4m3 at c * 16).
__device__ __forceinline__ void wg_copy_tile(unsigned char* dst, const kv_t* cache, const u32* off) {
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    const bool valid = off[i] != 0xffffffffu;
    const kv_t* src = cache + (valid ? (size_t)off[i] * KV_VEC : 0);
#if KV_FP8
    cp_async16(dst + c * KV_VEC, src, valid);
#else
    cp_async16(dst + wg_swizzled(c / (HD / 8), c % (HD / 8), WG_BN), src, valid);
#endif
  }
}

#if KV_FP8
// This thread's staged e4m3 chunks widened to bf16 into the swizzled tile `dst` (zero-filled
// chunks become zeros); made visible to wgmma by the caller's proxy fence and barrier.
__device__ __forceinline__ void wg_widen_tile(unsigned char* dst, const unsigned char* staging) {
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    const int j = c / (HD / KV_VEC), c16 = (c % (HD / KV_VEC)) * 2;
    uint4 lo, hi;
    e4m3x16_to_bf16(*(const uint4*)(staging + c * KV_VEC), &lo, &hi);
    *(uint4*)(dst + wg_swizzled(j, c16, WG_BN)) = lo;
    *(uint4*)(dst + wg_swizzled(j, c16 + 1, WG_BN)) = hi;
  }
}
#endif

// Waits until at most N of this thread's cp.async groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// This thread's chunks of the WG_BN-key tile at kv0, in two steps so that the block-table loads
// (the first) are in flight long before the copies need their offsets (the second): the block
// of each chunk's key, -1 outside [kv_begin, kv_end).
__device__ __forceinline__ void wg_tile_blocks(int* blk, const int* bt, int kv0, int kv_begin,
                                               int kv_end, int block_size) {
  const int bshift = __ffs(block_size) - 1;
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int key = kv0 + (threadIdx.x + i * 128) / (HD / KV_VEC);
    blk[i] = key >= kv_begin && key < kv_end ? bt[key >> bshift] : -1;
  }
}

// The chunks' offsets into a cache in 16-byte units (tile_offsets' form) from wg_tile_blocks.
// A chunk is 8 bf16 or 16 e4m3 (KV_VEC) of one key.
__device__ __forceinline__ void wg_tile_offsets(u32* off, const int* blk, int kv0, int kh,
                                                const PrefillAttnParams& p) {
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    const int key = kv0 + c / (HD / KV_VEC), d = (c % (HD / KV_VEC)) * KV_VEC;
    off[i] = blk[i] >= 0 ? (u32)((kv_offset(blk[i], kh, key & (p.block_size - 1),
                                            p.num_kv_heads, p.block_size, HD) + d) / KV_VEC)
                         : 0xffffffffu;
  }
}

// Waits until at most N of this warpgroup's wgmma groups are pending (they complete in order).
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// S = Q K^T for 64 rows x WG_BN keys: HD / 16 steps of 16 head dims (32 bytes of a swizzled
// row; the second half of a 128-dim head is the next 64-dim tile), one wgmma group, not waited
// for (after the caller's wg_fence).
__device__ __forceinline__ void wg_scores_issue(float (&s)[WG_BN / 8][4], u32 qs, u32 ks) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    const u32 step = (kk & 3) * 32;
    const u64 da = wg_desc(qs + (kk >> 2) * (PF_BM * 128) + step, 16, 1024);
    const u64 db = wg_desc(ks + (kk >> 2) * (WG_BN * 128) + step, 16, 1024);
    wgmma_ss_n64(&s[0][0], da, db, kk > 0);
  }
  wg_commit();
}

// S = Q K^T, waited for.
__device__ __forceinline__ void wg_scores(float (&s)[WG_BN / 8][4], u32 qs, u32 ks) {
  wg_fence();
  wg_scores_issue(s, qs, ks);
  wg_wait_all();
  wg_pin(s);
}

// P (the scores after pf_softmax_tile) as wgmma's register A-fragments: the accumulator layout
// is the A-fragment's, as with mma.sync.
__device__ __forceinline__ void wg_pack_p(u32 (&pa)[WG_BN / 16][4], const float (&s)[WG_BN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < WG_BN / 16; kk++) {
    pa[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// O += P V, 4 steps of 16 keys; V's 16 rows of a step are two swizzle atoms (1024 bytes apart:
// the stride byte offset), its two 64-dim halves a tile apart (the leading one). One wgmma
// group, not waited for (after the caller's wg_fence); pa and o stay untouched until it lands.
__device__ __forceinline__ void wg_pv_issue(float (&o)[HD / 8][4], const u32 (&pa)[WG_BN / 16][4],
                                            u32 vs) {
#pragma unroll
  for (int kk = 0; kk < WG_BN / 16; kk++) {
    const u64 dv = wg_desc(vs + kk * 2048, WG_BN * 128, 1024);
#if HD == 128
    wgmma_rs_n128_nmajor(&o[0][0], pa[kk], dv);
#else
    wgmma_rs_n64_nmajor(&o[0][0], pa[kk], dv);
#endif
  }
  wg_commit();
}

// O += P V with P from s, waited for.
__device__ __forceinline__ void wg_accumulate(float (&o)[HD / 8][4], const float (&s)[WG_BN / 8][4],
                                              u32 vs) {
  u32 pa[WG_BN / 16][4];
  wg_pack_p(pa, s);
  wg_fence();
  wg_pv_issue(o, pa, vs);
  wg_wait_all();
  wg_pin(o);
}

// Keeps the A-fragments of an O += PV in flight alive (in their registers) up to this point.
__device__ __forceinline__ void wg_keep(const u32 (&pa)[WG_BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < WG_BN / 16; kk++)
    asm volatile("" ::"r"(pa[kk][0]), "r"(pa[kk][1]), "r"(pa[kk][2]), "r"(pa[kk][3]) : "memory");
}

#if WG_TMA
// TMA: the box at (c0, c1) of the tensor `map` into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(u32 dst, const void* map, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// Lane j of warp 0 copies block j of a tile (min(block_size, WG_BN) keys, one box): this is its
// block-table entry for the tile at kv0, read a tile ahead; -1 for a block with no key in
// [kv_begin, kv_end), which is not copied.
__device__ __forceinline__ int wg_tma_block(const int* bt, int kv0, int kv_begin, int kv_end,
                                            int block_size) {
  const int lane = threadIdx.x & 31, rows = min(block_size, WG_BN);
  const int key0 = kv0 + lane * rows;
  const bool in = lane * rows < WG_BN && key0 < kv_end && key0 + rows > kv_begin;
  return in ? bt[key0 >> (__ffs(block_size) - 1)] : -1;
}

// Warp 0 starts the TMA copies of the tile at kv0 into the swizzled tile at `dst` (the tensor
// map's 128-byte swizzle is the layout wgmma reads), completing on `bar`: per block, a box of
// its keys for each 64-dim half. The maps view a cache as [blocks x kv heads x block_size, HD].
__device__ __forceinline__ void wg_tma_tile(u32 dst, const void* map, u32 bar, int blk, int kv0,
                                            int kh, const PrefillAttnParams& p) {
  const int lane = threadIdx.x & 31, rows = min(p.block_size, WG_BN);
  const bool load = blk >= 0;
  const u32 boxes = __popc(__ballot_sync(0xffffffffu, load));
  if (lane == 0) mbar_expect_tx(bar, boxes * rows * HD * 2);
  __syncwarp();
  if (load) {
    const int row = (blk * p.num_kv_heads + kh) * p.block_size + ((kv0 + lane * rows) & (p.block_size - 1));
#pragma unroll
    for (int h = 0; h < HD / 64; h++)
      tma_load_2d(dst + h * WG_BN * 128 + lane * rows * 128, map, h * 64, row, bar);
  }
}

// Zeroes the rows of keys outside [kv_begin, kv_end) in the swizzled tile: a V row there is
// weighted by P = 0, but an uncopied or never-written row may hold NaN, and 0 * NaN is NaN.
// (K's rows there are masked to -inf by a select, whatever they hold.)
__device__ __forceinline__ void wg_zero_rows(unsigned char* tile, int kv0, int kv_begin, int kv_end) {
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    const int r = c / (HD / 8), key = kv0 + r;
    if (key < kv_begin || key >= kv_end)
      *(uint4*)(tile + wg_swizzled(r, c % (HD / 8), WG_BN)) = make_uint4(0, 0, 0, 0);
  }
}
#endif

// CTAs an SM: with one K and one V tile (WG_STAGES 1, 49 KB) three fit at the 168 registers
// the bound leaves; with two of each two (81 KB).
#define WG_MIN_CTAS (WG_STAGES == 1 ? 3 : 2)

// grid: (num_tiles, num_heads, num_splits), block: 128 (one warpgroup); dynamic shared memory
// WG_SMEM + 1024 (compile::prefill_wgmma_smem: the tiles start at the first 1024-byte boundary).
extern "C" __global__ void __launch_bounds__(128, WG_MIN_CTAS) prefill_attn_wg(PrefillAttnParams p) {
  extern __shared__ unsigned char wg_raw[];
  unsigned char* smem = wg_raw + ((1024 - (smem_addr(wg_raw) & 1023)) & 1023);
  unsigned char* Qs = smem;  // [PF_BM, HD] swizzled
  // Stage i: K at smem + WG_Q_BYTES + 2 i WG_KV_BYTES, V a tile after; [WG_BN, HD] swizzled.
  const u32 qs = smem_addr(Qs), kv_base = qs + WG_Q_BYTES;

  // Tiles in reverse: a sequence's later tiles see more keys (causal), and starting them first
  // leaves the short ones for the grid's last wave.
  const int tile = p.num_tiles - 1 - blockIdx.x, h = blockIdx.y;
  const int kh = h / (p.num_heads / p.num_kv_heads);
  const int seq = p.tile_seq[tile], q0 = p.tile_q0[tile];
  const int qlen = p.q_len[seq], ctx = p.context_lens[seq], row0 = p.q_start[seq];
  const int first_pos = ctx - qlen;
  const int* bt = p.block_tables + (size_t)seq * p.max_blocks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;

  // This thread's two rows (g and g + 8 of its warp's 16); rows past the chunk compute a copy
  // of the last row and are not stored.
  const int qa = q0 + warp * 16 + g, qb = qa + 8;
  const int win = p.window > 0 ? p.window : 1 << 30;
  PfRows rows;
  rows.pos_a = first_pos + min(qa, qlen - 1);
  rows.pos_b = first_pos + min(qb, qlen - 1);
  rows.lo_a = rows.pos_a - win + 1;
  rows.lo_b = rows.pos_b - win + 1;
  rows.m_a = rows.m_b = NEG_INF;
  rows.l_a = rows.l_b = 0.f;
  rows.sl2 = p.scale * LOG2E;

  const int last_q = min(q0 + PF_BM, qlen) - 1;
  const int kv_end = first_pos + last_q + 1;  // keys 0..kv_end-1 are seen by some row here
  const int kv_begin = max(0, first_pos + q0 - win + 1);
  // This CTA's share of the key tiles: split blockIdx.z of num_splits (all of them when 1).
  const int kt0 = kv_begin / WG_BN, ktn = (kv_end + WG_BN - 1) / WG_BN - kt0;
  const int per_split = (ktn + p.num_splits - 1) / p.num_splits;
  const int kv_first = (kt0 + min(ktn, (int)blockIdx.z * per_split)) * WG_BN;
  const int kv_stop = min(kv_end, (kt0 + min(ktn, ((int)blockIdx.z + 1) * per_split)) * WG_BN);
  const int ntiles = kv_first < kv_stop ? (kv_stop - kv_first + WG_BN - 1) / WG_BN : 0;

  // Q's 64 rows (past the chunk: its last query), in the first cp.async group.
#pragma unroll
  for (int i = 0; i < PF_BM * HD / 8 / 128; i++) {
    const int c = threadIdx.x + i * 128;
    const int r = c / (HD / 8), c16 = c % (HD / 8);
    const size_t row = row0 + min(q0 + r, qlen - 1);
    cp_async16(Qs + wg_swizzled(r, c16, PF_BM), p.q + (row * p.num_heads + h) * HD + c16 * 8, true);
  }
  float o[HD / 8][4];
#pragma unroll
  for (int nd = 0; nd < HD / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
#if !WG_TMA
  // This thread's chunks of the first tile: block-table entries now, offsets when it copies.
  int blk[PF_CHUNKS];
  u32 off[PF_CHUNKS];
  wg_tile_blocks(blk, bt, kv_first, kv_begin, kv_end, p.block_size);
#endif
  // Every row of the CTA sees every key of the tile at kv0 (no window, below the diagonal).
  auto whole = [&](int kv0) { return p.window == 0 && kv0 + WG_BN - 1 <= first_pos + q0; };

#if WG_TMA
  // As the cp.async loops below, with warp 0 starting each tile's TMA copies where every
  // thread started its cp.async; each K and V tile buffer completes on its own mbarrier.
  __shared__ alignas(8) unsigned long long wg_bars[2 * WG_STAGES];  // K buffers', then V's
  const void* kmap = p.kv_maps;
  const void* vmap = (const unsigned char*)p.kv_maps + 128;
  cp_async_commit();  // Q's group: the loop's first cp_async_wait waits for it
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2 * WG_STAGES; b++) mbar_init(smem_addr(&wg_bars[b]), 1);
    mbar_fence_init();
  }
  __syncthreads();
#endif
#if WG_STAGES == 1 && WG_TMA
  const u32 kbar = smem_addr(&wg_bars[0]), vbar = smem_addr(&wg_bars[1]);
  const u32 ks = kv_base, vs = kv_base + WG_KV_BYTES;
  unsigned char* const Vs = smem + WG_Q_BYTES + WG_KV_BYTES;
  int tb = warp == 0 ? wg_tma_block(bt, kv_first, kv_begin, kv_end, p.block_size) : -1;
  if (ntiles > 0 && warp == 0) wg_tma_tile(ks, kmap, kbar, tb, kv_first, kh, p);
  for (int t = 0; t < ntiles; t++) {
    const int kv0 = kv_first + t * WG_BN;
    const u32 phase = t & 1;
    // Q (cp.async, the first tile) and K of this tile have landed, and every warp is done with
    // the previous tile's V.
    cp_async_wait<0>();
    wg_fence_proxy();
    mbar_wait(kbar, phase);
    __syncthreads();
    if (warp == 0) {
      wg_tma_tile(vs, vmap, vbar, tb, kv0, kh, p);
      if (t + 1 < ntiles) tb = wg_tma_block(bt, kv0 + WG_BN, kv_begin, kv_end, p.block_size);
    }
    float s[WG_BN / 8][4], corr_a, corr_b;
    wg_scores(s, qs, ks);
    if (pf_softmax_tile<WG_BN>(s, rows, kv0, whole(kv0), tig, corr_a, corr_b))
      wg_rescale(o, corr_a, corr_b);
    // V has landed (its rows outside the keys zeroed) and every warp's S is done with K: the
    // next tile's K copies during O += PV.
    mbar_wait(vbar, phase);
    if (kv0 < kv_begin || kv0 + WG_BN > kv_end) {
      wg_zero_rows(Vs, kv0, kv_begin, kv_end);
      wg_fence_proxy();
    }
    __syncthreads();
    if (warp == 0 && t + 1 < ntiles) wg_tma_tile(ks, kmap, kbar, tb, kv0 + WG_BN, kh, p);
    wg_accumulate(o, s, vs);
  }
#elif WG_STAGES == 1
  // One K and one V tile: V of tile t loads during S and the softmax of tile t, K of tile t + 1
  // during O += PV of tile t (FlashAttention-2's interleaving); tile t + 1's block-table
  // entries load from the start of tile t.
  const u32 ks = kv_base, vs = kv_base + WG_KV_BYTES;
  unsigned char* const Ks = smem + WG_Q_BYTES;
  unsigned char* const Vs = Ks + WG_KV_BYTES;
#if KV_FP8
  // Where the copies land: the e4m3 staging buffer, which K and V take in turns.
  unsigned char* const Kin = Vs + WG_KV_BYTES;
  unsigned char* const Vin = Kin;
#else
  unsigned char* const Kin = Ks;
  unsigned char* const Vin = Vs;
#endif
  if (ntiles > 0) {
    wg_tile_offsets(off, blk, kv_first, kh, p);
    wg_copy_tile(Kin, p.k_cache, off);
  }
  cp_async_commit();
  for (int t = 0; t < ntiles; t++) {
    const int kv0 = kv_first + t * WG_BN;
    // K of this tile (and Q) has landed, and every warp is done with the previous tile's V
    // (and S: with an e4m3 cache each thread widens its own staged chunks of K into Ks, and
    // reuses only those staging chunks for V).
    cp_async_wait<0>();
#if KV_FP8
    wg_widen_tile(Ks, Kin);
#endif
    wg_fence_proxy();
    __syncthreads();
    wg_copy_tile(Vin, p.v_cache, off);
    cp_async_commit();
    if (t + 1 < ntiles) wg_tile_blocks(blk, bt, kv0 + WG_BN, kv_begin, kv_end, p.block_size);

    float s[WG_BN / 8][4], corr_a, corr_b;
    wg_scores(s, qs, ks);
    if (pf_softmax_tile<WG_BN>(s, rows, kv0, whole(kv0), tig, corr_a, corr_b))
      wg_rescale(o, corr_a, corr_b);

    // V has landed and every warp's S is done with K: the next tile's K loads during O += PV.
    cp_async_wait<0>();
#if KV_FP8
    wg_widen_tile(Vs, Vin);
#endif
    wg_fence_proxy();
    __syncthreads();
    if (t + 1 < ntiles) {
      wg_tile_offsets(off, blk, kv0 + WG_BN, kh, p);
      wg_copy_tile(Kin, p.k_cache, off);
    }
    cp_async_commit();
    wg_accumulate(o, s, vs);
  }
#else
  // WG_STAGES 2: FlashAttention-3's intra-warpgroup overlap. Tile t's S = Q K^T and tile t-1's
  // O += P V are issued together, and the softmax of tile t runs while O += PV still occupies
  // the tensor cores; O's rescale waits for it. Two K and two V tiles (tile t in buffers
  // t % 2): V of tile t and K of tile t + 1 start loading as tile t's products start, into the
  // buffers tile t - 1's S and tile t - 2's O += PV have released, so each lands during a whole
  // tile's work. The loads are the build's (load_first, load_next; k_ready and v_ready wait
  // for them), the loop is shared.
  auto k_at = [&](int t) { return (u32)((t & 1) * WG_KV_BYTES); };
  auto v_at = [&](int t) { return (u32)((2 + (t & 1)) * WG_KV_BYTES); };
#if WG_TMA
  // Each buffer's mbarrier completes once every two tiles (phase (t / 2) % 2). Warp 0's lanes
  // hold the block-table entries of the tile whose V loads next (cur) and of the tile whose K
  // loads next (nxt).
  auto kbar = [&](int t) { return smem_addr(&wg_bars[t & 1]); };
  auto vbar = [&](int t) { return smem_addr(&wg_bars[2 + (t & 1)]); };
  auto phase = [](int t) { return (u32)((t >> 1) & 1); };
  int tb_cur = -1, tb_nxt = -1;
  if (warp == 0) {
    tb_cur = wg_tma_block(bt, kv_first, kv_begin, kv_end, p.block_size);
    if (ntiles > 1) tb_nxt = wg_tma_block(bt, kv_first + WG_BN, kv_begin, kv_end, p.block_size);
  }
  auto load_first = [&]() {
    if (warp == 0) wg_tma_tile(kv_base + k_at(0), kmap, kbar(0), tb_cur, kv_first, kh, p);
  };
  // V of tile t and K of tile t + 1, then the entries move on a tile.
  auto load_next = [&](int t) {
    if (warp != 0) return;
    const int kv0 = kv_first + t * WG_BN;
    wg_tma_tile(kv_base + v_at(t), vmap, vbar(t), tb_cur, kv0, kh, p);
    if (t + 1 < ntiles) {
      wg_tma_tile(kv_base + k_at(t + 1), kmap, kbar(t + 1), tb_nxt, kv0 + WG_BN, kh, p);
      tb_cur = tb_nxt;
      if (t + 2 < ntiles)
        tb_nxt = wg_tma_block(bt, kv0 + 2 * WG_BN, kv_begin, kv_end, p.block_size);
    }
  };
  // K of tile t (and for tile 0 Q, a cp.async group) has landed.
  auto k_ready = [&](int t) {
    if (t == 0) {
      cp_async_wait<0>();
      wg_fence_proxy();
    }
    mbar_wait(kbar(t), phase(t));
  };
  // V of tile t has landed, its rows outside the keys zeroed (made visible to wgmma by the
  // caller's barrier).
  auto v_ready = [&](int t) {
    const int kv0 = kv_first + t * WG_BN;
    mbar_wait(vbar(t), phase(t));
    if (kv0 < kv_begin || kv0 + WG_BN > kv_end) {
      wg_zero_rows(smem + WG_Q_BYTES + v_at(t), kv0, kv_begin, kv_end);
      wg_fence_proxy();
    }
  };
#else
  // One cp.async group a tile, so every wait is "all groups landed"; Q's is its own (an empty
  // split waits for it before the merge).
  unsigned char* const KV = smem + WG_Q_BYTES;  // K tiles 0 and 1, then V tiles 0 and 1
  cp_async_commit();
  auto load_first = [&]() {
    wg_tile_offsets(off, blk, kv_first, kh, p);
    wg_copy_tile(KV + k_at(0), p.k_cache, off);
    cp_async_commit();
    if (ntiles > 1) wg_tile_blocks(blk, bt, kv_first + WG_BN, kv_begin, kv_end, p.block_size);
  };
  // Starts the copies of V of tile t (at `off`, tile t's offsets) and K of tile t + 1 (whose
  // offsets then replace them), and reads tile t + 2's block-table entries.
  auto load_next = [&](int t) {
    wg_copy_tile(KV + v_at(t), p.v_cache, off);
    if (t + 1 < ntiles) {
      const int kv1 = kv_first + (t + 1) * WG_BN;
      wg_tile_offsets(off, blk, kv1, kh, p);
      wg_copy_tile(KV + k_at(t + 1), p.k_cache, off);
      if (t + 2 < ntiles) wg_tile_blocks(blk, bt, kv1 + WG_BN, kv_begin, kv_end, p.block_size);
    }
    cp_async_commit();
  };
  auto k_ready = [&](int) {
    cp_async_wait<0>();
    wg_fence_proxy();
  };
  auto v_ready = k_ready;
#endif
  float s[WG_BN / 8][4], corr_a = 1.f, corr_b = 1.f;
  u32 pa[WG_BN / 16][4];
  if (ntiles > 0) {
    // K of tile 0 loads (the first tile's copies start here); then it and Q have landed.
    load_first();
    k_ready(0);
    __syncthreads();
    wg_fence();
    wg_scores_issue(s, qs, kv_base + k_at(0));
    load_next(0);
    wg_wait<0>();
    wg_pin(s);
    // O is still zero: its factors need not be applied.
    pf_softmax_tile<WG_BN>(s, rows, kv_first, whole(kv_first), tig, corr_a, corr_b);
    wg_pack_p(pa, s);
  }
  for (int t = 1; t < ntiles; t++) {
    const int kv0 = kv_first + t * WG_BN;
    // K of tile t and V of tile t - 1 have landed, and every warp is done with tile t - 1's S
    // and tile t - 2's O += PV (their buffers take V of tile t and K of tile t + 1).
    k_ready(t);
    v_ready(t - 1);
    __syncthreads();
    wg_fence();
    wg_scores_issue(s, qs, kv_base + k_at(t));
    wg_pv_issue(o, pa, kv_base + v_at(t - 1));
    load_next(t);
    // S of tile t is done; O += PV of tile t - 1 may still run.
    wg_wait<1>();
    wg_pin(s);
    const bool moved = pf_softmax_tile<WG_BN>(s, rows, kv0, whole(kv0), tig, corr_a, corr_b);
    wg_wait<0>();
    wg_pin(o);
    wg_keep(pa);
    if (moved) wg_rescale(o, corr_a, corr_b);
    wg_pack_p(pa, s);
  }
  if (ntiles > 0) {
    // V of the last tile has landed.
    v_ready(ntiles - 1);
    __syncthreads();
    wg_fence();
    wg_pv_issue(o, pa, kv_base + v_at(ntiles - 1));
    wg_wait<0>();
    wg_pin(o);
  }
#endif
  // Every group (and an empty split's Q copy) lands before the merge reuses shared memory.
  cp_async_wait<0>();
  __syncthreads();
  pf_finish(p, o, rows.m_a, rows.m_b, rows.l_a, rows.l_b, tile, h, q0, qlen, row0, (float*)smem);
}
