// Paged decode attention (one query token per sequence), GQA and split-K (flash-decoding).
//
// Compiled per model shape (Gpu::load_attention): HD (head dim, a multiple of 8 up to 256) and
// GROUP (query heads per kv head, any count) come in as NVRTC defines, so every loop below has
// compile-time bounds and a model's kernel is exactly as specialised as a hand-written one.
//
// One CTA per (split, kv head and group slice, item) handles GC of the GROUP query heads that
// share the kv head (all of them up to 8; larger groups are cut into ceil(GROUP / 8) equal slices,
// whose CTAs read the same K/V rows, from L2 after the first), so each K/V row is read once for
// all of its heads. HD/8 lanes share a token (16 B of K and of V per lane, coalesced), rounded up
// to a power of two (idle lanes for HD 80 or 96), a warp covers 32/LANES tokens per step, and
// every lane keeps U steps of loads in flight. With an e4m3 cache (-DKV_FP8=1) a lane's 16-byte
// load holds 16 elements, so HD/16 lanes share a token, a warp covers twice the tokens per step,
// and each lane keeps 16 dims of q and of the accumulator per head: twice the registers per head,
// so a CTA serves at most 4 query heads (DECODE_GC_MAX) instead of 8. Each split keeps an online softmax; when
// num_splits > 1 the partial results go to part_acc/part_ml and are merged either by
// `paged_decode_reduce` (a second launch) or, with `counters` set, inside this kernel: every CTA
// of an (item, kv-head slice) counts itself in on an atomic counter after its partials are
// visible (__threadfence), and the last to arrive merges all the splits and resets the counter
// for the next launch (the threadFenceReduction pattern), so a decode is one launch. On sm_90 the
// host may instead launch the splits of each (item, kv-head slice) as one thread-block cluster
// (at most DECODE_CLUSTER_MAX): they then merge through distributed shared memory
// (cluster_send, cluster_merge), with no partials in global memory, no fence and no counter.
// The split length is ceil(keys / num_splits), computed here from the context length, so one
// launch shape serves any context (what CUDA-graph replay needs). With a sliding window the keys
// are the last `window` positions; blocks before them may be freed (block id -1) and are never
// read.
struct PagedDecodeParams {
  const bf16* q;            // [num_tokens, num_heads, HD]
  const kv_t* k_cache;      // [num_blocks, num_kv_heads, block_size, HD]  bf16, or e4m3 (KV_FP8)
  const kv_t* v_cache;      // [num_blocks, num_kv_heads, block_size, HD]
  const int* item_row;      // [num_items]  token row of each decode query (row of q and out)
  const int* item_seq;      // [num_items]  its sequence: row of block_tables and context_lens
  const int* block_tables;  // [num_seqs, max_blocks]
  const int* context_lens;  // [num_seqs]   keys visible to the query (its position + 1)
  bf16* out;                // [num_tokens, num_heads, HD]
  float* part_acc;          // [num_items, num_heads, num_splits, HD]  unnormalised partial sums
  float* part_ml;           // [num_items, num_heads, num_splits, 2]   (max, sum), log2 domain
  u32* counters;            // [num_items, num_kv_heads * DECODE_GROUP_CTAS] arrivals, zero between
                            // launches; null: the splits are merged by paged_decode_reduce
  int num_items;
  int num_heads;
  int num_kv_heads;
  int block_size;
  int max_blocks;
  int num_splits;
  int window;               // sliding window in keys; 0: the whole context
  float scale;              // softmax scale, 1/sqrt(HD)
};

#ifndef HD
#error "paged_decode.cu is compiled with -DHD=<head dim> -DGROUP=<query heads per kv head>"
#endif
// Query heads per CTA and CTAs per kv head (DECODE_GROUP_CTAS mirrors this in kernels.rs).
#if KV_FP8
#define DECODE_GC_MAX 4
#else
#define DECODE_GC_MAX 8
#endif
#define DECODE_GROUP_CTAS ((GROUP + DECODE_GC_MAX - 1) / DECODE_GC_MAX)
#define DECODE_GC ((GROUP + DECODE_GROUP_CTAS - 1) / DECODE_GROUP_CTAS)

#define DECODE_WARPS 4

// L1 is not coherent across SMs: partials other CTAs wrote are read from L2.
__device__ __forceinline__ float ld_cg(const float* ptr) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(ptr));
  return v;
}

// Most splits a decode may have: the in-kernel merge keeps one weight per split and head in
// shared memory (MAX_FILLED_SPLITS in step_io.rs; the host checks it).
#define DECODE_MAX_SPLITS 64

// A split partial's 4 dims (16 bytes) from L2.
__device__ __forceinline__ float4 ld_cg4(const float* ptr) {
  const uint4 u = ld_cg16(ptr);
  return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z),
                     __uint_as_float(u.w));
}

// Partial loads a thread of the merge keeps in flight (16 bytes each), and the threads of a
// decode CTA (both kernels run 4 warps: DMMA_WARPS in paged_decode_mma.cu).
#define MERGE_LOADS 8
#define MERGE_THREADS (DECODE_WARPS * 32)

// Merges the num_splits partials (log2-domain max and sum, unnormalised acc) of heads
// h0 .. h0 + gn - 1 of one item into its output row. Each warp takes whole heads: its lanes read
// the splits' (max, sum) at once and reduce them with shuffles into each split's weight
// exp2(m_s - max) / sum (w_s, shared). Then the weighted sum, in as few dependent L2 round trips
// as the block allows: a thread takes 4 dims of a head (16-byte loads) and, where the heads'
// dims number fewer than the threads, a share of the splits (the shares summed in shared
// memory), with MERGE_LOADS loads in flight. The merge is the tail of the launch, which no other
// CTA overlaps: summing a (head, dim) a thread with 4-byte loads took gn * HD / 128 * ns / 8
// round trips (Llama-3-8B's 4 heads at 32 splits: 16), now gn * HD / 512 * ns / 8 or fewer (4;
// Llama-2-7B's 1 head at 32 splits: 1 instead of 4). On an H100 that took a lone 4k x 1 launch
// of Llama-3-8B's heads from 16.8 to 13.9 us back to back (BENCHMARKS.md, session 36).
// w_s: [gn][DECODE_MAX_SPLITS] floats of shared memory.
__device__ __forceinline__ void merge_splits(const PagedDecodeParams& p, int item, int row, int h0,
                                             int gn, float* w_s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ns = p.num_splits;
  for (int g = warp; g < gn; g += blockDim.x >> 5) {
    const size_t base = ((size_t)item * p.num_heads + h0 + g) * ns;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    if (lane < ns) {
      m0 = ld_cg(p.part_ml + (base + lane) * 2);
      l0 = ld_cg(p.part_ml + (base + lane) * 2 + 1);
    }
    if (lane + 32 < ns) {
      m1 = ld_cg(p.part_ml + (base + lane + 32) * 2);
      l1 = ld_cg(p.part_ml + (base + lane + 32) * 2 + 1);
    }
    float mx = fmaxf(m0, m1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float w0 = m0 == NEG_INF ? 0.f : exp2f(m0 - mx);
    const float w1 = m1 == NEG_INF ? 0.f : exp2f(m1 - mx);
    float L = l0 * w0 + l1 * w1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    const float inv = 1.f / L;
    if (lane < ns) w_s[g * DECODE_MAX_SPLITS + lane] = w0 * inv;
    if (lane + 32 < ns) w_s[g * DECODE_MAX_SPLITS + lane + 32] = w1 * inv;
  }
  __syncthreads();
  __shared__ float4 red[MERGE_THREADS];  // [share][group]: the shares' sums
  constexpr int V4 = HD / 4;
  const int t = threadIdx.x, groups = gn * V4;  // a group: 4 dims of a head
  const int per = min(groups, MERGE_THREADS);  // groups a pass
  const int tpg = MERGE_THREADS / per;         // threads sharing a group's splits (1: passes)
  const int gl = t % per, share = t / per;
  for (int gb = 0; gb < groups; gb += per) {
    const int gi = gb + gl, g = gi / V4, d4 = gi % V4;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (share < tpg && gi < groups) {
      const float* acc = p.part_acc + ((size_t)item * p.num_heads + h0 + g) * ns * HD + 4 * d4;
      const float* w = w_s + g * DECODE_MAX_SPLITS;
      for (int s0 = share; s0 < ns; s0 += tpg * MERGE_LOADS) {
        float4 v[MERGE_LOADS];
#pragma unroll
        for (int u = 0; u < MERGE_LOADS; u++) {
          const int s = s0 + u * tpg;
          v[u] = s < ns ? ld_cg4(acc + (size_t)s * HD) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < MERGE_LOADS; u++) {
          const int s = s0 + u * tpg;
          const float ws = s < ns ? w[s] : 0.f;
          a.x += v[u].x * ws;
          a.y += v[u].y * ws;
          a.z += v[u].z * ws;
          a.w += v[u].w * ws;
        }
      }
    }
    if (tpg > 1) {  // one pass (groups < threads): the shares meet in shared memory
      red[t] = a;
      __syncthreads();
      if (share == 0)
        for (int k = 1; k < tpg; k++) {
          const float4 b = red[gl + k * per];
          a.x += b.x;
          a.y += b.y;
          a.z += b.z;
          a.w += b.w;
        }
    }
    if (share == 0 && gi < groups) {
      bf16* o = p.out + ((size_t)row * p.num_heads + h0 + g) * HD + 4 * d4;
      *(uint2*)o = make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w));
    }
  }
}

// Most splits merged through distributed shared memory: the largest thread-block cluster sm_90
// launches (16, with the non-portable size the host allows on the decode kernels;
// DECODE_CLUSTER_MAX in kernels.rs).
#define DECODE_CLUSTER_MAX 16

#if __CUDA_ARCH__ >= 900
// CTAs in this CTA's cluster (1 when the launch has no clusters) and its rank among them.
__device__ __forceinline__ u32 cluster_size() {
  u32 n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The cluster barrier in two halves (every thread of every CTA of the cluster calls both, in
// turn): writes before the arrive are visible to the cluster after the wait.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Stores v at `ptr` (an address in this CTA's shared memory) in the shared memory of CTA `rank`.
__device__ __forceinline__ void st_cluster(float* ptr, u32 rank, float v) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(ptr)), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}

// What the CTAs of a cluster launch send each other (shared memory of each): the cluster is the
// splits of one (item, kv-head slice), and CTA r merges the r-th share (`chunk` values) of the
// (head, dim) outputs.
template <int G>
struct ClusterInbox {
  float acc[G * HD + DECODE_CLUSTER_MAX];  // [split][chunk]: each split's unnormalised output
  float ml[DECODE_CLUSTER_MAX][G][2];      // each split's log2-domain (max, sum) per head
};

// The merge of a cluster launch. Each CTA sends its split's (max, sum) of every head to every CTA
// and each output value to the CTA whose share holds it (remote stores: nothing waits on them),
// arrives at the cluster barrier and waits for the others' values; then it merges its share from
// its own shared memory and exits. No partials in global memory, no fence, no counter, and no
// CTA waits for another to read its memory. Remote stores go only to running CTAs: every CTA
// arrives at a first barrier when it starts (decode_cta) and waits on it before sending
// (finish_split). `cluster_send` is called by each thread for each of its (head, dim) values,
// then every thread calls `cluster_merge`.
template <int G>
__device__ __forceinline__ void cluster_send(ClusterInbox<G>& box, int g, int d, int gn, float mx,
                                             float L, float A, u32 ns, u32 rank) {
  const int chunk = (gn * HD + ns - 1) / ns, idx = g * HD + d;
  st_cluster(&box.acc[rank * chunk + idx % chunk], idx / chunk, A);
  if (d == 0) {
    for (u32 r = 0; r < ns; r++) {
      st_cluster(&box.ml[rank][g][0], r, mx);
      st_cluster(&box.ml[rank][g][1], r, L);
    }
  }
}

template <int G>
__device__ __forceinline__ void cluster_merge(const PagedDecodeParams& p, int row, int h0, int gn,
                                              const ClusterInbox<G>& box, u32 ns, u32 rank) {
  cluster_arrive();
  cluster_wait();
  const int chunk = (gn * HD + ns - 1) / ns;
  const int lo = rank * chunk, hi = min(gn * HD, lo + chunk);
  for (int idx = lo + threadIdx.x; idx < hi; idx += blockDim.x) {
    const int g = idx / HD, d = idx % HD;
    float mx = NEG_INF;
    for (u32 s = 0; s < ns; s++) mx = fmaxf(mx, box.ml[s][g][0]);
    float L = 0.f, A = 0.f;
    for (u32 s = 0; s < ns; s++) {
      const float m = box.ml[s][g][0];
      const float w = m == NEG_INF ? 0.f : exp2f(m - mx);
      L += box.ml[s][g][1] * w;
      A += box.acc[s * chunk + idx - lo] * w;
    }
    p.out[((size_t)row * p.num_heads + h0 + g) * HD + d] = f2bf(A / L);
  }
}
#endif

// Keys at the start of a CTA's split whose K/V rows the lane kernel prefetches into L2 before its
// pdl_wait (decode_cta): one batch of its loads (4 warps x 2 keys x 4 steps at HD 128).
#define DECODE_PREFETCH_KEYS 32

// What a decode CTA works on (both kernels): its split, item, kv head and heads h0 .. h0 + gn - 1
// (up to G of the kv head's GROUP, `group_ctas` CTAs a kv head), and the split's keys
// [begin, end). The split length is ceil(keys / num_splits) from the item's context, so one
// launch shape serves any context (graph replay); under a sliding window the keys are the last
// `window` positions.
struct DecodeCta {
  int split, item, kh, h0, gn, row, begin, end;
  const int* bt;  // the sequence's block table row
  // block_size is a power of two (config.rs): a key's block and offset are a shift and a mask,
  // not two integer divisions (about 20 instructions each, per key).
  int bshift, bmask;
};

// `prefetch`: the split's first keys into L2 before the wait (the lane kernel; on the tensor-core
// kernel it lost at long contexts: Llama-3-8B at 3,800 tokens +0.4 %, BENCHMARKS.md session 38).
template <int G>
__device__ __forceinline__ DecodeCta decode_cta(const PagedDecodeParams& p, int group_ctas,
                                                bool prefetch = false) {
  DecodeCta c;
  c.split = blockIdx.x;
  c.item = blockIdx.z;
  c.kh = blockIdx.y / group_ctas;
  c.h0 = c.kh * GROUP + (blockIdx.y % group_ctas) * G;
  c.gn = min(G, (c.kh + 1) * GROUP - c.h0);
  const int seq = p.item_seq[c.item];
  c.row = p.item_row[c.item];
  const int ctx = p.context_lens[seq];
  const int first = p.window > 0 ? max(0, ctx - p.window) : 0;
  const int per = (ctx - first + p.num_splits - 1) / p.num_splits;
  c.begin = first + c.split * per;
  c.end = min(ctx, c.begin + per);
  c.bt = p.block_tables + (size_t)seq * p.max_blocks;
  c.bshift = __ffs(p.block_size) - 1;
  c.bmask = p.block_size - 1;
#if __CUDA_ARCH__ >= 900
  // A cluster launch: this CTA is running (finish_split's cluster_send waits for all of them).
  if (cluster_size() > 1) cluster_arrive();
#endif
  // Launched with PDL (kernels::paged_decode): the metadata above was uploaded before the step,
  // but q and the step's new keys come from the kernel before (rope_kv). Meanwhile the split's
  // first keys' K and V rows go to L2, so the first loads after the wait find them there: all
  // but the newest key were written by earlier steps, and L2 is where rope_kv's write of that
  // one lands too.
  constexpr int LINE_ELEMS = 128 / sizeof(kv_t), ROW_LINES = (HD + LINE_ELEMS - 1) / LINE_ELEMS;
  const int lines = prefetch ? min(c.end - c.begin, DECODE_PREFETCH_KEYS) * ROW_LINES : 0;
  for (int i = threadIdx.x; i < lines; i += blockDim.x) {
    const int j = c.begin + i / ROW_LINES;
    const size_t o = kv_offset(c.bt[j >> c.bshift], c.kh, j & c.bmask, p.num_kv_heads,
                               p.block_size, HD) + (i % ROW_LINES) * LINE_ELEMS;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p.k_cache + o));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p.v_cache + o));
  }
  pdl_wait();
  return c;
}

// The end of a decode CTA (both kernels; its NS online-softmax states of heads h0 .. h0 + gn - 1
// are in shared memory, published by a barrier): the states merged into the output row (one
// split), into this split's share of a cluster merge (a cluster launch), or into this split's
// partials; with `counters` set, the last CTA of the (item, kv-head slice) to arrive then merges
// every split (the threadFenceReduction pattern) and resets the counter for the next launch
// (graph replay). Every thread of the CTA calls it.
template <int NS, int G>
__device__ __forceinline__ void finish_split(const PagedDecodeParams& p, int item, int row,
                                             int split, int h0, int gn, float (*s_acc)[G][HD],
                                             float (*s_m)[G], float (*s_l)[G]) {
#if __CUDA_ARCH__ >= 900
  const u32 cluster = cluster_size(), rank = cluster_rank();
  __shared__ ClusterInbox<G> s_box;
  if (cluster > 1) cluster_wait();  // every CTA of the cluster is running
#else
  const u32 cluster = 1;
#endif
  for (int idx = threadIdx.x; idx < gn * HD; idx += blockDim.x) {
    const int g = idx / HD, d = idx % HD;
    float mx = NEG_INF;
#pragma unroll
    for (int s = 0; s < NS; s++) mx = fmaxf(mx, s_m[s][g]);
    float L = 0.f, A = 0.f;
    if (mx != NEG_INF) {
#pragma unroll
      for (int s = 0; s < NS; s++) {
        const float w = s_m[s][g] == NEG_INF ? 0.f : exp2f(s_m[s][g] - mx);
        L += s_l[s][g] * w;
        A += s_acc[s][g][d] * w;
      }
    }
    const int h = h0 + g;
    if (p.num_splits == 1) {
      p.out[((size_t)row * p.num_heads + h) * HD + d] = f2bf(A / L);
    } else if (cluster > 1) {
#if __CUDA_ARCH__ >= 900
      cluster_send<G>(s_box, g, d, gn, mx, L, A, cluster, rank);
#endif
    } else {
      const size_t ps = ((size_t)item * p.num_heads + h) * p.num_splits + split;
      p.part_acc[ps * HD + d] = A;
      if (d == 0) {
        p.part_ml[ps * 2] = mx;
        p.part_ml[ps * 2 + 1] = L;
      }
    }
  }
  if (p.num_splits == 1) return;
#if __CUDA_ARCH__ >= 900
  if (cluster > 1) {
    cluster_merge<G>(p, row, h0, gn, s_box, cluster, rank);
    return;
  }
#endif
  if (p.counters == nullptr) return;

  __shared__ u32 s_last;
  __threadfence();  // this CTA's partials reach L2 before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    u32* c = p.counters + (size_t)item * gridDim.y + blockIdx.y;
    const u32 prev = atomicAdd(c, 1u);
    s_last = prev == (u32)(p.num_splits - 1);
    if (s_last) *c = 0;  // every split has arrived: ready for the next launch (graph replay)
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // s_acc is free again (every thread passed the barrier after reading it).
  static_assert(sizeof(float) * NS * HD >= sizeof(float) * DECODE_MAX_SPLITS, "merge weights");
  merge_splits(p, item, row, h0, gn, &s_acc[0][0][0]);
}

// HD is the -DHD define; G the query heads per CTA (DECODE_GC).
template <int G>
__device__ __forceinline__ void paged_decode_impl(const PagedDecodeParams& p) {
  constexpr int USED = HD / KV_VEC;  // lanes that hold a slice of the head
  constexpr int LANES = USED <= 2 ? 2 : USED <= 4 ? 4 : USED <= 8 ? 8 : USED <= 16 ? 16 : 32;
  static_assert(HD % KV_VEC == 0 && USED <= 32,
                "HD must be a multiple of 8 (16 with KV_FP8), at most 256");
  constexpr int TPW = 32 / LANES; // tokens per warp step
  constexpr int NS = DECODE_WARPS * TPW;  // independent softmax states per CTA
  constexpr int U = 4;            // steps in flight per lane
  __shared__ float s_acc[NS][G][HD];
  __shared__ float s_m[NS][G];
  __shared__ float s_l[NS][G];

  pdl_trigger();  // the O projection may start streaming its weights
  const DecodeCta cta = decode_cta<G>(p, DECODE_GROUP_CTAS, true);
  const int split = cta.split, item = cta.item, kh = cta.kh, h0 = cta.h0, gn = cta.gn;
  const int row = cta.row, begin = cta.begin, end = cta.end;
  const int bshift = cta.bshift, bmask = cta.bmask;
  const int* bt = cta.bt;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int sub = lane / LANES, dl = lane % LANES;
  const bool active = dl < USED;

  float q[G][KV_VEC];
  const float qs = p.scale * LOG2E;
#pragma unroll
  for (int g = 0; g < G; g++) {
#if KV_FP8
    // q is bf16: this lane's 16 dims are two 16-byte loads.
    const bf16* qrow = p.q + ((size_t)row * p.num_heads + h0 + g) * HD + dl * KV_VEC;
    const bool load = active && g < gn;
    const uint4 v0 = load ? *(const uint4*)qrow : make_uint4(0, 0, 0, 0);
    const uint4 v1 = load ? *(const uint4*)(qrow + 8) : make_uint4(0, 0, 0, 0);
    const u32 w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int e = 0; e < 8; e++) {
      q[g][2 * e] = bf_lo(w[e]) * qs;
      q[g][2 * e + 1] = bf_hi(w[e]) * qs;
    }
#else
    const uint4 v = active && g < gn
                        ? *(const uint4*)(p.q + ((size_t)row * p.num_heads + h0 + g) * HD + dl * 8)
                        : make_uint4(0, 0, 0, 0);
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      q[g][2 * e] = bf_lo(w[e]) * qs;
      q[g][2 * e + 1] = bf_hi(w[e]) * qs;
    }
#endif
  }
  float m[G], l[G], acc[G][KV_VEC];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = NEG_INF;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < KV_VEC; e++) acc[g][e] = 0.f;
  }

  constexpr int STEP = DECODE_WARPS * TPW;
  // The loop bound is uniform across the warp (shuffles below need every lane).
  for (int base = begin + warp * TPW; base < end; base += STEP * U) {
    uint4 kv[U], vv[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int j = base + sub + u * STEP;
      valid[u] = j < end;
      if (valid[u] && active) {
        const size_t o = kv_offset(bt[j >> bshift], kh, j & bmask, p.num_kv_heads,
                                   p.block_size, HD) + dl * KV_VEC;
        kv[u] = *(const uint4*)(p.k_cache + o);
        vv[u] = *(const uint4*)(p.v_cache + o);
      } else {
        kv[u] = make_uint4(0, 0, 0, 0);
        vv[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
#if KV_FP8
      float kf[KV_VEC], vf[KV_VEC];
      e4m3x16_to_f(kv[u], kf);
      e4m3x16_to_f(vv[u], vf);
#pragma unroll
      for (int g = 0; g < G; g++) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < KV_VEC; e++) dot += q[g][e] * kf[e];
#else
      const u32 kw[4] = {kv[u].x, kv[u].y, kv[u].z, kv[u].w};
      const u32 vw[4] = {vv[u].x, vv[u].y, vv[u].z, vv[u].w};
      float vf[8];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        vf[2 * e] = bf_lo(vw[e]);
        vf[2 * e + 1] = bf_hi(vw[e]);
      }
#pragma unroll
      for (int g = 0; g < G; g++) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
          dot += q[g][2 * e] * bf_lo(kw[e]);
          dot += q[g][2 * e + 1] * bf_hi(kw[e]);
        }
#endif
#pragma unroll
        for (int o = LANES / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (!valid[u]) dot = NEG_INF;
        const float mn = fmaxf(m[g], dot);
        const float corr = mn == NEG_INF ? 1.f : exp2f(m[g] - mn);
        const float pr = dot == NEG_INF ? 0.f : exp2f(dot - mn);
        l[g] = l[g] * corr + pr;
#pragma unroll
        for (int e = 0; e < KV_VEC; e++) acc[g][e] = acc[g][e] * corr + pr * vf[e];
        m[g] = mn;
      }
    }
  }

  const int state = warp * TPW + sub;
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (active) {
#pragma unroll
      for (int e = 0; e < KV_VEC; e++) s_acc[state][g][dl * KV_VEC + e] = acc[g][e];
    }
    if (dl == 0) {
      s_m[state][g] = m[g];
      s_l[state][g] = l[g];
    }
  }
  __syncthreads();
  finish_split<NS, G>(p, item, row, split, h0, gn, s_acc, s_m, s_l);
}

// One query head a CTA over a bf16 cache (MHA) runs in 64 registers, 8 CTAs an SM: the fill the
// batch-1 split rule aims at (forward::decode_fill). The bound keeps the split merge from
// raising that (unbounded, its loads in flight took 71 registers: 7 CTAs an SM).
#if DECODE_GC == 1 && !KV_FP8
#define DECODE_MIN_CTAS 8
#else
#define DECODE_MIN_CTAS 1
#endif

// grid: (num_splits, num_kv_heads * DECODE_GROUP_CTAS, num_items), block: DECODE_WARPS * 32
extern "C" __global__ void __launch_bounds__(DECODE_WARPS * 32, DECODE_MIN_CTAS) paged_decode(PagedDecodeParams p) {
  paged_decode_impl<DECODE_GC>(p);
}

// Merges the splits of each (item, head). grid: (num_heads, num_items), block: HD.
extern "C" __global__ void paged_decode_reduce(PagedDecodeParams p) {
  pdl_trigger();
  const int h = blockIdx.x, item = blockIdx.y, d = threadIdx.x, hd = HD;
  const size_t base = ((size_t)item * p.num_heads + h) * p.num_splits;
  float mx = NEG_INF;
  for (int s = 0; s < p.num_splits; s++) mx = fmaxf(mx, p.part_ml[(base + s) * 2]);
  float L = 0.f, A = 0.f;
  for (int s = 0; s < p.num_splits; s++) {
    const float ms = p.part_ml[(base + s) * 2];
    const float w = ms == NEG_INF ? 0.f : exp2f(ms - mx);
    L += p.part_ml[(base + s) * 2 + 1] * w;
    A += p.part_acc[(base + s) * hd + d] * w;
  }
  const int row = p.item_row[item];
  p.out[((size_t)row * p.num_heads + h) * hd + d] = f2bf(A / L);
}
