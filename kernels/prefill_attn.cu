// Causal varlen prefill attention over the paged KV cache, flash-attention-2 style, on bf16
// tensor cores (mma.sync m16n8k16, fp32 accumulation).
//
// The chunk's own K/V were written to the cache by rope_kv before this runs, so the keys of a
// cached prefix and of the chunk are read the same way, through the block table. One CTA = 64
// query rows of one sequence and one head; each of its 4 warps owns 16 rows. Q stays in registers
// as mma A-fragments; each 64-key tile of K and V is staged in shared memory row-major; S = QK^T
// stays in registers, and its accumulator layout is reused as the A-fragment of P for O += PV
// (V's B-fragments come from ldmatrix.trans). Query i of a sequence sits at position
// context_len - q_len + i and sees keys 0..position, or, under a sliding window, the last
// `window` of them (the blocks before the tile's first visible key may be freed: block id -1, never
// read).
//
// Split over the keys (flash-decoding style) for chunks too short to fill the GPU: with
// num_splits > 1 each (tile, head) is spread over num_splits CTAs (grid z), each walking an even
// share of the tile's key tiles and writing its unnormalised partial O with each row's max and sum
// (log2 domain) to part_acc / part_ml; the last CTA of the group to arrive (an atomic counter per
// (tile, head), reset by that CTA for the next launch) merges the partials into out. A chunk of 64
// queries at 16k context is 32 CTAs unsplit (a quarter of an H200); the host picks num_splits from
// the shape (kernels::prefill_splits): 1 when the tiles x heads already fill the GPU.
//
// K/V loads are asynchronous (cp.async.ca, FlashAttention-2's interleaving, no extra shared memory):
// V of tile j is in flight while S = QK^T and the softmax of tile j compute, and K of tile j + 1
// while O += PV of tile j does.
//
// An e4m3 cache (-DKV_FP8=1): each tile is cp.async'ed as e4m3 into a one-tile staging buffer
// (K and V take turns in it), and each thread widens the chunks it loaded into the bf16 tile
// (exact) right after its wait, before the barrier that publishes the tile. So the mma loops,
// the ldmatrix.trans of V and the pipelining are the bf16 kernel's, and each element is converted
// once per CTA; converting while building fragments instead would repeat it in all 4 warps, and
// ldmatrix.trans cannot transpose 8-bit V into bf16 fragments. The staging costs PF_BN * HD bytes
// of shared memory (8 KB at HD 128: 43 KB in all, within the static 48 KB); a thread reuses only
// the staging chunks it converted itself, so the turns need no extra barrier.
//
// Compiled per head dim (Gpu::load_attention, -DHD=<head dim>, a multiple of 16 up to 256); the
// GQA group is a run-time value (one CTA per query head). Key tiles are 64 keys, 32 for HD > 128
// (K and V tiles must fit the 48 KB of static shared memory).
struct PrefillAttnParams {
  const bf16* q;            // [num_tokens, num_heads, HD]
  const kv_t* k_cache;      // [num_blocks, num_kv_heads, block_size, HD]  bf16, or e4m3 (KV_FP8)
  const kv_t* v_cache;      // [num_blocks, num_kv_heads, block_size, HD]
  const int* tile_seq;      // [num_tiles]  sequence of each 64-query tile
  const int* tile_q0;       // [num_tiles]  its first query, counted within the sequence's chunk
  const int* q_start;       // [num_seqs]   token row of each sequence's first query
  const int* q_len;         // [num_seqs]
  const int* context_lens;  // [num_seqs]
  const int* block_tables;  // [num_seqs, max_blocks]
  bf16* out;                // [num_tokens, num_heads, HD]
  float* part_acc;          // [num_tiles, num_heads, num_splits, PF_BM, HD]  unnormalised partial O
  float* part_ml;           // [num_tiles, num_heads, num_splits, PF_BM, 2]   (max, sum), log2 domain
  u32* counters;            // [num_tiles, num_heads] arrivals, zero between launches
  int num_tiles;
  int num_heads;
  int num_kv_heads;
  int block_size;
  int max_blocks;
  int window;               // sliding window in keys; 0: the whole context
  int num_splits;           // CTAs per (tile, head) over its keys; 1: no partials, no counters
  float scale;
  const void* kv_maps;      // [2] CUtensorMap (K, V) of this layer's cache for the wgmma kernel's
                            // TMA build (prefill_attn_wgmma.cu, WG_TMA), else null
};

#ifndef HD
#error "prefill_attn.cu is compiled with -DHD=<head dim>"
#endif
#define PF_BM 64
#define PF_BN (HD > 128 ? 32 : 64)

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// How K/V tiles reach shared memory (-DPF_LOADS, for gpu-bench's comparisons): 2 (default)
// cp.async.ca (through L1), 1 cp.async.cg (L2 only), 0 synchronous loads (K and V together, then
// compute: the kernel before cp.async). On the H200 .ca measured 0-10 % faster than .cg, and
// both 5-15 % faster than synchronous loads (BENCHMARKS.md, issue 18, calls k3a/k3b).
#ifndef PF_LOADS
#define PF_LOADS 2
#endif
// 16-byte chunks of one K or V tile that each thread moves.
#if KV_FP8
// 16 e4m3 a chunk: at HD 16 a tile is 64 chunks, and half the threads idle.
#define PF_TILE_CHUNKS (PF_BN * HD / KV_VEC)
#define PF_CHUNKS ((PF_TILE_CHUNKS + 127) / 128)
#define PF_STAGE_BYTES (PF_BN * HD)
#else
#define PF_CHUNKS (PF_BN * HD / 8 / 128)
static_assert(PF_BN * HD / 8 % 128 == 0, "a tile's 16-byte chunks split evenly over 128 threads");
#define PF_STAGE_BYTES 0
#endif

// 16 bytes global -> shared, asynchronous; `valid` false zero-fills (keys outside the tile's range
// must be finite zeros: P = 0 times garbage could be NaN).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if PF_LOADS == 2
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// This thread's chunks of the PF_BN-key tile at kv0: offsets into a cache in 16-byte units
// (the same for K and V: computed once a tile), 0xffffffff for keys outside [kv_begin, kv_end).
__device__ __forceinline__ void tile_offsets(u32* off, const int* bt, int kv0, int kv_begin,
                                             int kv_end, int kh, const PrefillAttnParams& p) {
  const int bshift = __ffs(p.block_size) - 1;
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    const int j = c / (HD / KV_VEC), d8 = (c % (HD / KV_VEC)) * KV_VEC;
    const int key = kv0 + j;
#if KV_FP8
    if (c >= PF_TILE_CHUNKS) {  // past the tile (HD 16): never loaded
      off[i] = 0xffffffffu;
      continue;
    }
#endif
    // block_size is a power of two (config.rs): a shift and a mask, not two integer divisions.
    off[i] = key >= kv_begin && key < kv_end
                 ? (u32)((kv_offset(bt[key >> bshift], kh, key & (p.block_size - 1),
                                    p.num_kv_heads, p.block_size, HD) + d8) / KV_VEC)
                 : 0xffffffffu;
  }
}

// Starts the copy of one tile of `cache` (K or V) into `dst` at this thread's offsets.
__device__ __forceinline__ void load_tile_async(bf16* dst, const bf16* cache, const u32* off) {
  constexpr int KP = HD + 8;
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    const int j = c / (HD / 8), d8 = (c % (HD / 8)) * 8;
    const bool valid = off[i] != 0xffffffffu;
    // Any valid address when !valid: nothing is read.
    cp_async16(&dst[j * KP + d8], cache + (valid ? (size_t)off[i] * 8 : 0), valid);
  }
  cp_async_commit();
}

#if KV_FP8
// Starts the copy of one e4m3 tile of `cache` into the staging buffer `dst` ([PF_BN * HD], this
// thread's chunks at c * 16).
__device__ __forceinline__ void load_tile_async(kv_t* dst, const kv_t* cache, const u32* off) {
#pragma unroll
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    if (c < PF_TILE_CHUNKS) {
      const bool valid = off[i] != 0xffffffffu;
      cp_async16(&dst[c * KV_VEC], cache + (valid ? (size_t)off[i] * KV_VEC : 0), valid);
    }
  }
  cp_async_commit();
}

// This thread's staged chunks widened to bf16 into the tile `dst` ([PF_BN, HD + 8]). Zero-filled
// chunks (keys outside the range) become bf16 zeros.
__device__ __forceinline__ void widen_tile(bf16* dst, const kv_t* src) {
  constexpr int KP = HD + 8;
#pragma unroll 1  // one chunk's 16 values live at a time: the mma loop's registers are all taken
  for (int i = 0; i < PF_CHUNKS; i++) {
    const int c = threadIdx.x + i * 128;
    if (c < PF_TILE_CHUNKS) {
      const int j = c / (HD / KV_VEC), d16 = (c % (HD / KV_VEC)) * KV_VEC;
      uint4 lo, hi;
      e4m3x16_to_bf16(*(const uint4*)&src[c * KV_VEC], &lo, &hi);
      *(uint4*)&dst[j * KP + d16] = lo;
      *(uint4*)&dst[j * KP + d16 + 8] = hi;
    }
  }
}
#endif

// The merge's per-(split, row) weights (at most 32 splits) live in the K/V tiles' shared memory
// (free by then); at small head dims (16) the tiles are smaller than the weights, so the shared
// array is the larger of the two.
#define PF_MERGE_BYTES (32 * PF_BM * 4)

// The last CTA of a (tile, head): merges the num_splits partials of its rows into out. Weights
// first (row r's split s: exp2(m_s - M) / L, into shared memory), then every (row, 4 dims)
// sums its splits with independent 16-byte loads. Partials other CTAs wrote are read through
// L2 (__ldcg): L1 is not coherent across SMs.
__device__ __forceinline__ void merge_prefill_splits(const PrefillAttnParams& p, size_t group,
                                                     int row0, int q0, int qlen, int h,
                                                     float* w) {
  const int rows = min(PF_BM, qlen - q0), S = p.num_splits;
  const float2* ml = (const float2*)p.part_ml + group * S * PF_BM;
  const float4* acc = (const float4*)p.part_acc + group * S * PF_BM * (HD / 4);
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    float mx = NEG_INF;
    for (int s = 0; s < S; s++) mx = fmaxf(mx, __ldcg(&ml[s * PF_BM + r]).x);
    float L = 0.f;
    for (int s = 0; s < S; s++) {
      const float2 v = __ldcg(&ml[s * PF_BM + r]);
      const float e = v.x == NEG_INF ? 0.f : exp2f(v.x - mx);
      w[s * PF_BM + r] = e;
      L += v.y * e;
    }
    const float inv = 1.f / L;
    for (int s = 0; s < S; s++) w[s * PF_BM + r] *= inv;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * (HD / 4); i += blockDim.x) {
    const int r = i / (HD / 4), c = i % (HD / 4);
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int s = 0; s < S; s++) {
      const float ws = w[s * PF_BM + r];
      const float4 v = __ldcg(&acc[((size_t)s * PF_BM + r) * (HD / 4) + c]);
      a.x += ws * v.x;
      a.y += ws * v.y;
      a.z += ws * v.z;
      a.w += ws * v.w;
    }
    bf16* out = p.out + ((size_t)(row0 + q0 + r) * p.num_heads + h) * HD + c * 4;
    *(uint2*)out = make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w));
  }
}

// Writes this thread's rows of O (normalised by the row sums), or with num_splits > 1 its
// split's partials (unnormalised O, max, sum), and the last split of the (tile, head) to arrive
// merges them. `smem`: PF_MERGE_BYTES + 4 bytes of shared memory that no warp reads any more.
// m_*, l_*: this thread's rows' max (log2 domain) and its columns' share of their sums. Shared
// by both prefill kernels.
__device__ __forceinline__ void pf_finish(const PrefillAttnParams& p, float (&o)[HD / 8][4],
                                          float m_a, float m_b, float l_a, float l_b, int tile,
                                          int h, int q0, int qlen, int row0, float* smem) {
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, tig = threadIdx.x & 3;
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  if (p.num_splits > 1) {
    // Every row of the tile (rows past the chunk too: the merge skips them). A row that saw no
    // key of this split has max -inf, sum 0, O 0.
    const size_t group = (size_t)tile * p.num_heads + h;
    const size_t ps = (group * p.num_splits + blockIdx.z) * PF_BM + warp * 16 + g;
    float* acc_a = p.part_acc + ps * HD + tig * 2;
    float* acc_b = acc_a + 8 * HD;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) {
      *(float2*)(acc_a + nd * 8) = make_float2(o[nd][0], o[nd][1]);
      *(float2*)(acc_b + nd * 8) = make_float2(o[nd][2], o[nd][3]);
    }
    if (tig == 0) {
      *(float2*)(p.part_ml + ps * 2) = make_float2(m_a, l_a);
      *(float2*)(p.part_ml + (ps + 8) * 2) = make_float2(m_b, l_b);
    }
    u32* last = (u32*)(smem + PF_MERGE_BYTES / 4);  // past the merge's weights
    __threadfence();  // this CTA's partials reach L2 before it is counted
    __syncthreads();
    if (threadIdx.x == 0) {
      u32* n = p.counters + group;
      *last = atomicAdd(n, 1u) == (u32)(p.num_splits - 1);
      if (*last) *n = 0;  // every split has arrived: ready for the next launch
    }
    __syncthreads();
    if (!*last) return;
    __threadfence();
    merge_prefill_splits(p, group, row0, q0, qlen, h, smem);
    return;
  }
  const int qa = q0 + warp * 16 + g, qb = qa + 8;
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  if (qa < qlen) {
    bf16* out = p.out + ((size_t)(row0 + qa) * p.num_heads + h) * HD + tig * 2;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
      *(u32*)(out + nd * 8) = pack_bf16x2(o[nd][0] * inv_a, o[nd][1] * inv_a);
  }
  if (qb < qlen) {
    bf16* out = p.out + ((size_t)(row0 + qb) * p.num_heads + h) * HD + tig * 2;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
      *(u32*)(out + nd * 8) = pack_bf16x2(o[nd][2] * inv_b, o[nd][3] * inv_b);
  }
}

// HD is the -DHD define.
__device__ __forceinline__ void prefill_attn_impl(const PrefillAttnParams& p) {
  static_assert(HD % 16 == 0 && HD <= 256, "HD must be a multiple of 16, at most 256");
  constexpr int KP = HD + 8;  // padded row (bf16): 16-byte aligned rows, conflict-free reads
  constexpr int KV_BYTES = 2 * PF_BN * KP * (int)sizeof(bf16);
  constexpr int TILE_BYTES = KV_BYTES + PF_STAGE_BYTES;
  constexpr int MERGE_BYTES = PF_MERGE_BYTES + 16;  // the weights and pf_finish's flag
  __shared__ __align__(16) unsigned char smem[TILE_BYTES > MERGE_BYTES ? TILE_BYTES : MERGE_BYTES];
  bf16* Ks = (bf16*)smem;        // [PF_BN, KP]
  bf16* Vs = Ks + PF_BN * KP;    // [PF_BN, KP]
#if PF_LOADS && KV_FP8
  kv_t* Kin = (kv_t*)(smem + KV_BYTES);  // [PF_BN * HD] e4m3 staging, K's and V's in turn
  kv_t* Vin = Kin;
#elif PF_LOADS
  bf16* Kin = Ks;  // cp.async lands in the tiles themselves
  bf16* Vin = Vs;
#endif

  const int tile = blockIdx.x, h = blockIdx.y;
  const int kh = h / (p.num_heads / p.num_kv_heads);
  const int seq = p.tile_seq[tile], q0 = p.tile_q0[tile];
  const int qlen = p.q_len[seq], ctx = p.context_lens[seq], row0 = p.q_start[seq];
  const int first_pos = ctx - qlen;
  const int* bt = p.block_tables + (size_t)seq * p.max_blocks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;

  // This thread's two rows (g and g + 8 of the warp's 16); rows past the chunk compute a copy
  // of the last row and are not stored.
  const int qa = q0 + warp * 16 + g, qb = qa + 8;
  const int ra = min(qa, qlen - 1), rb = min(qb, qlen - 1);
  const int pos_a = first_pos + ra, pos_b = first_pos + rb;

  u32 qf[HD / 16][4];
  {
    const bf16* qpa = p.q + ((size_t)(row0 + ra) * p.num_heads + h) * HD + tig * 2;
    const bf16* qpb = p.q + ((size_t)(row0 + rb) * p.num_heads + h) * HD + tig * 2;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      qf[kk][0] = *(const u32*)(qpa + kk * 16);
      qf[kk][1] = *(const u32*)(qpb + kk * 16);
      qf[kk][2] = *(const u32*)(qpa + kk * 16 + 8);
      qf[kk][3] = *(const u32*)(qpb + kk * 16 + 8);
    }
  }
  float o[HD / 8][4];
#pragma unroll
  for (int nd = 0; nd < HD / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.f, l_b = 0.f;
  const float sl2 = p.scale * LOG2E;

  const int last_q = min(q0 + PF_BM, qlen) - 1;
  const int kv_end = first_pos + last_q + 1;  // keys 0..kv_end-1 are seen by some row here
  // The first key any row here sees (the tile's first query's window start), and that row's
  // and this thread's rows' first keys.
  const int win = p.window > 0 ? p.window : 1 << 30;
  const int kv_begin = max(0, first_pos + q0 - win + 1);
  const int lo_a = pos_a - win + 1, lo_b = pos_b - win + 1;

  // This CTA's share of the key tiles: split blockIdx.z of num_splits (all of them when 1).
  const int kt0 = kv_begin / PF_BN, ktn = (kv_end + PF_BN - 1) / PF_BN - kt0;
  const int per_split = (ktn + p.num_splits - 1) / p.num_splits;
  const int kv_first = (kt0 + min(ktn, (int)blockIdx.z * per_split)) * PF_BN;
  const int kv_stop = min(kv_end, (kt0 + min(ktn, ((int)blockIdx.z + 1) * per_split)) * PF_BN);

  u32 off[PF_CHUNKS];
#if PF_LOADS
  if (kv_first < kv_stop) {
    tile_offsets(off, bt, kv_first, kv_begin, kv_end, kh, p);
    load_tile_async(Kin, p.k_cache, off);
  }
#endif
  for (int kv0 = kv_first; kv0 < kv_stop; kv0 += PF_BN) {
#if PF_LOADS
    // K of this tile has landed, and every warp is done with the previous tile's V: load this
    // tile's V while S and the softmax compute.
    cp_async_wait_all();
#if KV_FP8
    widen_tile(Ks, Kin);  // every warp is past the previous tile's S (the mid-loop barrier)
#endif
    __syncthreads();
    load_tile_async(Vin, p.v_cache, off);
#else
    __syncthreads();  // the previous tile's shared-memory reads are done
    tile_offsets(off, bt, kv0, kv_begin, kv_end, kh, p);
#pragma unroll
    for (int i = 0; i < PF_CHUNKS; i++) {
      const int c = threadIdx.x + i * 128;
#if KV_FP8
      if (c >= PF_TILE_CHUNKS) continue;
      const int j = c / (HD / KV_VEC), d16 = (c % (HD / KV_VEC)) * KV_VEC;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (off[i] != 0xffffffffu) {
        kv = *(const uint4*)(p.k_cache + (size_t)off[i] * KV_VEC);
        vv = *(const uint4*)(p.v_cache + (size_t)off[i] * KV_VEC);
      }
      uint4 lo, hi;
      e4m3x16_to_bf16(kv, &lo, &hi);
      *(uint4*)(&Ks[j * KP + d16]) = lo;
      *(uint4*)(&Ks[j * KP + d16 + 8]) = hi;
      e4m3x16_to_bf16(vv, &lo, &hi);
      *(uint4*)(&Vs[j * KP + d16]) = lo;
      *(uint4*)(&Vs[j * KP + d16 + 8]) = hi;
#else
      const int j = c / (HD / 8), d8 = (c % (HD / 8)) * 8;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (off[i] != 0xffffffffu) {
        kv = *(const uint4*)(p.k_cache + (size_t)off[i] * 8);
        vv = *(const uint4*)(p.v_cache + (size_t)off[i] * 8);
      }
      *(uint4*)(&Ks[j * KP + d8]) = kv;
      *(uint4*)(&Vs[j * KP + d8]) = vv;
#endif
    }
    __syncthreads();
#endif

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float s[PF_BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; nt++) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      const bf16* krow = &Ks[(nt * 8 + g) * KP + tig * 2];
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) {
        mma_bf16(s[nt], qf[kk], *(const u32*)(krow + kk * 16), *(const u32*)(krow + kk * 16 + 8));
      }
    }
    // Causal mask (key <= position also keeps keys < context) and window, scale into the log2
    // domain; a tile that every row of the CTA sees whole (no window) skips the mask.
    const bool whole = p.window == 0 && kv0 + PF_BN - 1 <= first_pos + q0;
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int key = kv0 + nt * 8 + tig * 2 + e;
        s[nt][e] = whole || (key <= pos_a && key >= lo_a) ? s[nt][e] * sl2 : NEG_INF;
        s[nt][2 + e] = whole || (key <= pos_b && key >= lo_b) ? s[nt][2 + e] * sl2 : NEG_INF;
        mx_a = fmaxf(mx_a, s[nt][e]);
        mx_b = fmaxf(mx_b, s[nt][2 + e]);
      }
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    // Under a window a row may see no key of the first tiles: its max stays -inf, and the base
    // 0 keeps exp2f(-inf - base) = 0 (rather than NaN) until its first key comes.
    const float base_a = mx_a == NEG_INF ? 0.f : mx_a, base_b = mx_b == NEG_INF ? 0.f : mx_b;
    const float corr_a = exp2f(m_a - base_a), corr_b = exp2f(m_b - base_b);
    m_a = mx_a;
    m_b = mx_b;
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; nt++) {
      s[nt][0] = exp2f(s[nt][0] - base_a);
      s[nt][1] = exp2f(s[nt][1] - base_a);
      s[nt][2] = exp2f(s[nt][2] - base_b);
      s[nt][3] = exp2f(s[nt][3] - base_b);
      sum_a += s[nt][0] + s[nt][1];
      sum_b += s[nt][2] + s[nt][3];
    }
    // l stays a per-thread partial sum (the 4 lanes of a row share corr); reduced at the end.
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) {
      o[nd][0] *= corr_a;
      o[nd][1] *= corr_a;
      o[nd][2] *= corr_b;
      o[nd][3] *= corr_b;
    }
#if PF_LOADS
    // V has landed and every warp is done with K: load the next tile's K while O += PV runs.
    cp_async_wait_all();
#if KV_FP8
    widen_tile(Vs, Vin);  // every warp is past the previous tile's PV (the loop-top barrier)
#endif
    __syncthreads();
    if (kv0 + PF_BN < kv_stop) {
      tile_offsets(off, bt, kv0 + PF_BN, kv_begin, kv_end, kh, p);
      load_tile_async(Kin, p.k_cache, off);
    }
#endif
    // O += P V: P's accumulator layout is the A-fragment layout of k = 16 keys.
#pragma unroll
    for (int kk = 0; kk < PF_BN / 16; kk++) {
      u32 a[4];
      a[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      // ldmatrix.x4.trans: matrix i = lanes 8i..8i+7; keys kk*16 + (i&1)*8 + r, dims (nd + i/2)*8.
      const int mi = lane >> 3, r = lane & 7;
      const bf16* vrow = &Vs[(kk * 16 + (mi & 1) * 8 + r) * KP + (mi >> 1) * 8];
#pragma unroll
      for (int nd = 0; nd < HD / 8; nd += 2) {
        u32 b0, b1, b2, b3;
        const u32 addr = smem_addr(vrow + nd * 8);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                     : "r"(addr));
        mma_bf16(o[nd], a, b0, b1);
        mma_bf16(o[nd + 1], a, b2, b3);
      }
    }
  }

  pf_finish(p, o, m_a, m_b, l_a, l_b, tile, h, q0, qlen, row0, (float*)smem);
}

// CTAs an SM must fit (the register cap that follows): 3 up to head dim 128 (168 registers at
// 128, 60 bytes spilled, by NVRTC 12.9's ptxas -v) against the 2 that 220 registers left room
// for; the kernel is latency-bound, and a third CTA hides more of each tile's loads and
// barriers. Above 128 the cap would spill the O accumulators.
#define PF_MIN_CTAS (HD > 128 ? 1 : 3)
// grid: (num_tiles, num_heads, num_splits), block: 128
extern "C" __global__ void __launch_bounds__(128, PF_MIN_CTAS) prefill_attn(PrefillAttnParams p) {
  prefill_attn_impl(p);
}
