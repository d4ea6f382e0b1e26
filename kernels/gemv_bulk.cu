// Skinny GEMM for decode, streamed by bulk copies: y[m, n] = x[m, k] · w[n, k]ᵀ with m <= 4,
// the same op as gemv.cu's gemv, bf16 weights (sm_90+; the host picks it, kernels::gemv). e4m3
// weights stay on gemv_fp8: an e4m3 build of this kernel was 6 % slower there (session 21).
//
// Why another schedule: gemv.cu's CTAs each take a few rows and leave, so every launch pays a
// ramp (CTAs start, first loads travel) and a tail (the last wave's rows), and only a few KB a
// warp are in flight before `pdl_wait`. Here one CTA an SM (the grid is the SM count) owns a
// contiguous slab of whole rows, which are contiguous bytes of w, and streams it through a
// ring of GB_STAGES shared-memory stages with 1-D bulk copies (`cp.async.bulk`, the copy engine
// of TMA), issued by one producer warp. Every CTA streams the same bytes (± one row), so there
// is no last wave; the ring alone streams at 4.0-4.5 TB/s on the H200 (gpu-bench gemv-sweep,
// GB_DIAG 1). The producer fills the ring (128 KB an SM; 192 KB in the one-row deep build,
// `gemv_bulk_deep_m1`) before the kernel waits on the previous one (weights are read-only);
// that alone gained nothing inside the decode graph (BENCHMARKS.md, session 21, call 5), the
// deeper ring 0.6-1.7 % (session 41). x [m, k] sits in shared memory after the ring (at most
// GB_X_BYTES), then the accumulator [rows][m]: the dynamic shared memory is those three, so a
// launch may ask for only what it uses (`GemvSmem::Tight`, ~140 KB for Llama-sized rows) and
// start on an SM beside the decode attention CTAs before it (BENCHMARKS.md, session 39).
//
// Stage i (GB_STAGE_BYTES) is consumer warp i % GB_WARPS's: the warp copies it from shared memory
// to registers, 16 bytes a lane (512 bytes a warp a step, conflict-free), hands the buffer back
// to the producer, and dots it with x, keeping two partial dots per lane: for the row the
// stage starts in and the next one (rows are at least a stage long, so at most one row ends
// inside it). Warp sums land in a shared fp32 accumulator per (row, m) by shared atomics; after
// the last stage the CTA writes its rows.
struct GemvBulkParams {
  const bf16* x;         // [m, k]   k % 8 == 0, m * k * 2 <= GB_X_BYTES
  const bf16* w;         // [n, k]   rows >= GB_STAGE_BYTES
  bf16* y;               // [m, n]   bf16 output, or null when y32 is set
  float* y32;            // [m, n]   fp32 output (logits), or null
  int m;
  int n;                 // rows; CTA b owns rows [b n / grid, (b + 1) n / grid): at most
  int k;                 // GB_ACC_FLOATS / m of them (the host sizes the grid)
};

#ifndef GB_STAGE_BYTES
#define GB_STAGE_BYTES 4096
#endif
#ifndef GB_STAGES
#define GB_STAGES 32
#endif
// Stages of the deep ring (`gemv_bulk_deep_m1`, 192 KB): for one-row launches whose x and
// accumulator fit beside it (Llama-sized k). The ring is full before x is staged and no
// CTA consumes for 4-7 us at a kernel boundary (BENCHMARKS.md, session 40's stamps), so a
// deeper ring keeps the weights streaming through more of that gap.
#ifndef GB_DEEP_STAGES
#define GB_DEEP_STAGES 48
#endif
// 1: the dots on tensor cores (gb_mma_stage), 0: scalar FMAs (gb_dot), as before session 44.
#ifndef GB_MMA
#define GB_MMA 1
#endif
// L2 policy of the weight copies: 1 evict-first (weights are read once a step; keep L2 for the
// activations and the KV cache), 0 the default.
#ifndef GB_EVICT_FIRST
#define GB_EVICT_FIRST 1
#endif
// gpu-bench only: 1 consumers read each stage into registers and drop it (the ring's streaming
// rate alone; only a stage's first step of loads is live), 3 the same with every load live (the
// ring and the shared-memory reads, no arithmetic); the output is then garbage. 2 the full
// kernel, and thread 0 stamps %globaltimer (ns) at GB_STAMPS points of its CTA into y32, read as
// u64 [grid][GB_STAMPS] (y is written as bf16): where a kernel boundary's time goes (gpu-bench
// stream-floor's boundary stamps).
#ifndef GB_DIAG
#define GB_DIAG 0
#endif
// Entry, after pdl_wait, x staged, warp 0's first stage landed, every stage consumed, y written.
#define GB_STAMPS 6
#ifndef GB_WARPS
#define GB_WARPS 16  // consumer warps; warp GB_WARPS issues the copies
#endif
#define GB_THREADS (32 * (GB_WARPS + 1))
// CTAs an SM the launch bounds ask for: gpu-bench stream-floor builds 2 (16 stages, shared memory
// asked for by the launch's x) so that a launch's CTAs can share the SMs with the one before.
#ifndef GB_MIN_CTAS
#define GB_MIN_CTAS 1
#endif
#define GB_STEPS (GB_STAGE_BYTES / 512)  // 16-byte loads a lane a stage
// 16-byte loads of x a consumer thread issues before storing them (1: the loop that stored
// each load before the next load, as before session 40).
#ifndef GB_X_LOADS
#define GB_X_LOADS 4
#endif
#define GB_ACC_FLOATS 4096
#define GB_X_BYTES 81920
#if GB_STAGES % GB_WARPS != 0 || GB_DEEP_STAGES % GB_WARPS != 0 || GB_STAGE_BYTES % 512 != 0
#error "GB_STAGES and GB_DEEP_STAGES must be multiples of GB_WARPS, GB_STAGE_BYTES of 512"
#endif

// One 512-byte step of a warp: this lane's 16 bytes of w (`wv`, at byte `col` of its row) dotted
// with each x row.
template <int M>
__device__ __forceinline__ void gb_dot(uint4 wv, const bf16* __restrict__ x, int k, int col,
                                       float d[M]) {
  const u32 ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int m = 0; m < M; m++) {
    const uint4 xv = *(const uint4*)(x + (size_t)m * k + col / 2);
    const u32 xx[4] = {xv.x, xv.y, xv.z, xv.w};
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      s += bf_lo(ww[e]) * bf_lo(xx[e]);
      s += bf_hi(ww[e]) * bf_hi(xx[e]);
    }
    d[m] = s;
  }
}

// One bulk copy of `n` bytes from `src` into ring stage `dst` (a shared address), completing on
// mbarrier `bar`; `policy`: the L2 policy (GB_EVICT_FIRST).
__device__ __forceinline__ void gb_copy(u32 dst, const unsigned char* src, u32 n, u32 bar,
                                        u64 policy) {
#if __CUDA_ARCH__ >= 900
  mbar_expect_tx(bar, n);
#if GB_EVICT_FIRST
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(n), "r"(bar), "l"(policy)
      : "memory");
#else
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(n), "r"(bar)
      : "memory");
#endif
#endif
}

// The L2 policy of the weight copies (GB_EVICT_FIRST 1: evict first; else unused).
__device__ __forceinline__ u64 gb_policy() {
  u64 policy = 0;
#if __CUDA_ARCH__ >= 900 && GB_EVICT_FIRST
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// Lane 0 of the producer warp: the CTA's slab (`bytes` from `src`) into a ring of STAGES
// buffers, stage i into buffer i % STAGES once the consumers have handed that buffer back (its
// empty barrier).
template <int STAGES = GB_STAGES>
__device__ __forceinline__ void gb_produce(const unsigned char* src, int bytes, u32 ring, u32 full,
                                           u32 empty) {
  const u64 policy = gb_policy();
  const int stages = (bytes + GB_STAGE_BYTES - 1) / GB_STAGE_BYTES;
  for (int i = 0; i < stages; i++) {
    const int s = i % STAGES;
    if (i >= STAGES) mbar_wait(empty + 8 * s, (i / STAGES - 1) & 1);
    const u32 n = (u32)min(GB_STAGE_BYTES, bytes - i * GB_STAGE_BYTES);
    gb_copy(ring + s * GB_STAGE_BYTES, src + (size_t)i * GB_STAGE_BYTES, n, full + 8 * s, policy);
  }
}

// d += A · B on one m16n8k16 bf16 tile, fp32 accumulation.
__device__ __forceinline__ void gb_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                       u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The dots of one stage on tensor cores (GB_MMA 1): slab bytes [b, e), in registers (`wv`, 16
// bytes a lane a step), dotted with x [M, k] and summed into acc [rows from ra][M]; row ra is
// slab bytes [a0, a1). Why: the scalar dot spent 16 bf16 unpacks and 8 FMAs on a lane's 16
// bytes, ~466 instructions a stage, about half the SM's issue slots at the ring's rate (SASS of
// gemv_bulk_deep_m1), and the gemv streamed ~8 % slower than the ring alone (stream-floor,
// session 43). A tile takes a step's 16 bytes a lane as they lie: lane 4g + t holds B's
// column g (4 weights: rows 2t, 2t + 1, 2t + 8, 2t + 9 of k) and the same four columns of A's
// rows g (x row 2p at the weights' columns) and g + 8 (x row 2p + 1), so the diagonal D[g][g]
// is x row 2p's dot with group g's weights and D[g + 8][g] row 2p + 1's; the rest of D is
// unused. The bf16 pairs go in without an unpack, 2 tiles a step for every 2 rows of x. SPLIT:
// the stage runs past row ra or the slab (each lane's 16 bytes lie in one row: rows are whole
// 16 bytes), lanes past e weigh 0 against x's first columns (finite), and row ra + 1's weights
// go to a second accumulator.
template <int M, bool SPLIT>
__device__ __forceinline__ void gb_mma_stage(const uint4 (&wv)[GB_STEPS], int b, int e, int a0,
                                             int a1, const bf16* __restrict__ x, int k,
                                             float* acc) {
  constexpr int P = (M + 1) / 2;
  const int lane = threadIdx.x & 31;
  float da[P][4], db[P][4];
#pragma unroll
  for (int p = 0; p < P; p++)
#pragma unroll
    for (int i = 0; i < 4; i++) da[p][i] = db[p][i] = 0.f;
#pragma unroll
  for (int j = 0; j < GB_STEPS; j++) {
    const int off = b + j * 512 + lane * 16;
    const bool in_a = !SPLIT || off < a1, valid = !SPLIT || off < e;
    const int col = !valid ? 0 : in_a ? off - a0 : off - a1;  // bytes into the row
    const u32 w[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
    u32 xs[2 * P][4];
#pragma unroll
    for (int m = 0; m < 2 * P; m++) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (m < M) v = *(const uint4*)((const unsigned char*)x + (size_t)m * 2 * k + col);
      xs[m][0] = v.x, xs[m][1] = v.y, xs[m][2] = v.z, xs[m][3] = v.w;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const u32 w0 = w[2 * h], w1 = w[2 * h + 1];
#pragma unroll
      for (int p = 0; p < P; p++) {
        const u32 x0 = xs[2 * p][2 * h], x1 = xs[2 * p + 1][2 * h];
        const u32 y0 = xs[2 * p][2 * h + 1], y1 = xs[2 * p + 1][2 * h + 1];
        if (!SPLIT) {
          gb_mma(da[p], x0, x1, y0, y1, w0, w1);
        } else {
          const bool wa = valid && in_a, wb = valid && !in_a;
          gb_mma(da[p], x0, x1, y0, y1, wa ? w0 : 0u, wa ? w1 : 0u);
          gb_mma(db[p], x0, x1, y0, y1, wb ? w0 : 0u, wb ? w1 : 0u);
        }
      }
    }
  }
  // D[g][g] is lane 4g + g / 2's register g % 2 (rows g + 8: 2 + g % 2).
  const int g = lane >> 2;
  const bool diag = (lane & 3) == (g >> 1);
  const bool odd = g & 1;
  float sa[M], sb[M];
#pragma unroll
  for (int m = 0; m < M; m++) {
    const int p = m / 2, i = 2 * (m % 2);  // constant indices: registers, not a stack frame
    sa[m] = warp_sum(diag ? (odd ? da[p][i + 1] : da[p][i]) : 0.f);
    sb[m] = SPLIT && e > a1 ? warp_sum(diag ? (odd ? db[p][i + 1] : db[p][i]) : 0.f) : 0.f;
  }
  if (lane == 0)
#pragma unroll
    for (int m = 0; m < M; m++) {
      atomicAdd(&acc[m], sa[m]);
      if (SPLIT && e > a1) atomicAdd(&acc[M + m], sb[m]);
    }
}

// A consumer warp's work on one full stage: slab bytes [b, e) in ring buffer `stage` (a generic
// pointer), copied to registers, the buffer handed back (`empty_bar`), then dotted with x [M, k]
// and summed into the CTA's accumulator acc [rows][M]. The stage starts in (local) row ra,
// which ends at a_end; rows are at least a stage long, so at most one row ends inside it.
template <int M>
__device__ __forceinline__ void gb_consume(const unsigned char* stage, int b, int e, int ra,
                                           int row_bytes, const bf16* x, int k, float* acc,
                                           u32 empty_bar) {
  const int lane = threadIdx.x & 31;
  const unsigned char* buf = stage - b;
  uint4 wv[GB_STEPS];
#pragma unroll
  for (int j = 0; j < GB_STEPS; j++) {
    const int off = b + j * 512 + lane * 16;
    wv[j] = off < e ? *(const uint4*)(buf + off) : make_uint4(0, 0, 0, 0);
  }
  // The stage is in registers: hand the buffer back before the arithmetic.
  __syncwarp();
  if (lane == 0) mbar_arrive(empty_bar);
#if GB_DIAG != 1 && GB_DIAG != 3
  const int a_end = (ra + 1) * row_bytes;
#if GB_MMA
  if (e - b == GB_STAGE_BYTES && e <= a_end)  // the whole stage inside row ra
    gb_mma_stage<M, false>(wv, b, e, a_end - row_bytes, a_end, x, k, acc + ra * M);
  else
    gb_mma_stage<M, true>(wv, b, e, a_end - row_bytes, a_end, x, k, acc + ra * M);
#else
  float da[M], db[M];
#pragma unroll
  for (int m = 0; m < M; m++) da[m] = db[m] = 0.f;
#pragma unroll
  for (int j = 0; j < GB_STEPS; j++) {
    const int off = b + j * 512 + lane * 16;
    if (off < e) {
      const bool in_a = off < a_end;
      float d[M];
      gb_dot<M>(wv[j], x, k, off - (in_a ? a_end - row_bytes : a_end), d);
#pragma unroll
      for (int m = 0; m < M; m++) {
        da[m] += in_a ? d[m] : 0.f;
        db[m] += in_a ? 0.f : d[m];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; m++) da[m] = warp_sum(da[m]);
  if (lane == 0)
#pragma unroll
    for (int m = 0; m < M; m++) atomicAdd(&acc[ra * M + m], da[m]);
  if (e > a_end) {  // row ra + 1 starts inside the stage (the same for the whole warp)
#pragma unroll
    for (int m = 0; m < M; m++) db[m] = warp_sum(db[m]);
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < M; m++) atomicAdd(&acc[(ra + 1) * M + m], db[m]);
  }
#endif
#else
  // Keep loads live: GB_DIAG 1 the first step's, GB_DIAG 3 every step's.
#if GB_DIAG == 3
  u32 all = 0;
#pragma unroll
  for (int j = 0; j < GB_STEPS; j++) all ^= wv[j].x ^ wv[j].y ^ wv[j].z ^ wv[j].w;
  if (lane == 0 && all == 0x7fffffffu) acc[0] = 1.f;
#else
  if (lane == 0 && wv[0].x == 0x7fffffffu) acc[0] = 1.f;
#endif
#endif
}

// GB_DIAG 2: thread 0 stamps point `i` of its CTA (consumer warp 0's lane 0, so every point is
// on one thread's path).
__device__ __forceinline__ void gb_stamp(const GemvBulkParams& p, int i) {
#if GB_DIAG == 2
  if (threadIdx.x == 0) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    ((u64*)p.y32)[blockIdx.x * GB_STAMPS + i] = t;
  }
#endif
}

template <int M, int STAGES>
__device__ __forceinline__ void gemv_bulk_impl(const GemvBulkParams& p) {
#if __CUDA_ARCH__ >= 900
  gb_stamp(p, 0);
  // [ring][GB_STAGE_BYTES], then x [M, k] (16-byte aligned), then acc [this CTA's rows][M]
  extern __shared__ __align__(128) unsigned char gb_ring[];
  __shared__ __align__(8) u64 bars[2 * STAGES];  // full[STAGES], empty[STAGES]
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = (int)((long long)blockIdx.x * p.n / gridDim.x);
  const int rows = (int)((long long)(blockIdx.x + 1) * p.n / gridDim.x) - r0;
  const int row_bytes = 2 * p.k;
  bf16* x = (bf16*)(gb_ring + STAGES * GB_STAGE_BYTES);
  float* acc = (float*)((unsigned char*)x + ((M * row_bytes + 15) & ~15));
  const int slab = rows * row_bytes;
  const u32 full = smem_addr(&bars[0]), empty = smem_addr(&bars[STAGES]);
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; s++) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (warp == GB_WARPS) {
    // Weights only: no pdl_wait, so the ring fills while the kernel before this one runs.
    if (lane == 0)
      gb_produce<STAGES>((const unsigned char*)p.w + (size_t)r0 * row_bytes, slab,
                         smem_addr(gb_ring), full, empty);
    return;
  }
  const int tid = threadIdx.x, consumers = 32 * GB_WARPS;
  for (int i = tid; i < rows * M; i += consumers) acc[i] = 0.f;
  asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
  pdl_wait();  // x is the previous kernel's output
  gb_stamp(p, 1);
  // x into shared memory past the ring: read from L1 it kept the consumers ~4 us a launch
  // behind the ring (gpu-bench gemv-sweep, session 21; L1 is what the ring leaves of it).
  // GB_X_LOADS loads a thread before any store, so x of up to GB_X_LOADS * 8 KB lands in one
  // L2 round trip: storing each load before the next load took a round trip a pass, 2.0-2.3 us
  // of the down projection's 22 KB x after its pdl_wait, now 1.0 (stream-floor's stamps; the
  // ring, full by then, hides most of it: decode steps moved within 0.2 %, BENCHMARKS.md
  // session 40).
  const int x16 = M * p.k / 8;
  for (int i0 = tid; i0 < x16; i0 += GB_X_LOADS * consumers) {
    uint4 v[GB_X_LOADS];
#pragma unroll
    for (int u = 0; u < GB_X_LOADS; u++)
      if (i0 + u * consumers < x16) v[u] = ((const uint4*)p.x)[i0 + u * consumers];
#pragma unroll
    for (int u = 0; u < GB_X_LOADS; u++)
      if (i0 + u * consumers < x16) ((uint4*)x)[i0 + u * consumers] = v[u];
  }
  asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
  gb_stamp(p, 2);
  const int stages = (slab + GB_STAGE_BYTES - 1) / GB_STAGE_BYTES;
  // Stage i is warp i % GB_WARPS's, and so is its buffer (STAGES is a multiple of GB_WARPS):
  // a warp never waits on a buffer another warp has not handed back.
  // The row a stage starts in, carried from stage to stage: a division a stage was ~20 of the
  // ~190 instructions the tensor-core dots leave (SASS of gemv_bulk_deep_m1).
  constexpr int lap = GB_WARPS * GB_STAGE_BYTES;  // bytes between a warp's stages
  const int lap_rows = lap / row_bytes, lap_rest = lap % row_bytes;
  int ra = warp * GB_STAGE_BYTES / row_bytes, into = warp * GB_STAGE_BYTES - ra * row_bytes;
  for (int i = warp; i < stages; i += GB_WARPS) {
    const int s = i % STAGES;
    mbar_wait(full + 8 * s, (i / STAGES) & 1);
    if (i == 0) gb_stamp(p, 3);
    const int b = i * GB_STAGE_BYTES, e = min(b + GB_STAGE_BYTES, slab);
    gb_consume<M>(gb_ring + s * GB_STAGE_BYTES, b, e, ra, row_bytes, x, p.k, acc, empty + 8 * s);
    ra += lap_rows, into += lap_rest;
    if (into >= row_bytes) ra++, into -= row_bytes;
  }
  asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
  gb_stamp(p, 4);
  for (int i = tid; i < rows * M; i += consumers) {
    const int r = i / M, m = i % M;
    const size_t o = (size_t)m * p.n + r0 + r;
#if GB_DIAG == 2
    p.y[o] = f2bf(acc[i]);
#else
    if (p.y32) p.y32[o] = acc[i];
    else p.y[o] = f2bf(acc[i]);
#endif
  }
  gb_stamp(p, 5);
#endif
}

// grid: the SM count (more when n / grid rows would pass GB_ACC_FLOATS / m), block: GB_THREADS,
// dynamic shared memory: at least GB_STAGES * GB_STAGE_BYTES + m * k * 2 (rounded up to 16) + a
// CTA's rows * m * 4 (roomy launches: GB_X_BYTES and GB_ACC_FLOATS * 4 for the last two). Empty below sm_90 (the host never launches
// them there).
extern "C" __global__ void __launch_bounds__(GB_THREADS, GB_MIN_CTAS) gemv_bulk_m1(GemvBulkParams p) { gemv_bulk_impl<1, GB_STAGES>(p); }
extern "C" __global__ void __launch_bounds__(GB_THREADS, GB_MIN_CTAS) gemv_bulk_m2(GemvBulkParams p) { gemv_bulk_impl<2, GB_STAGES>(p); }
extern "C" __global__ void __launch_bounds__(GB_THREADS, GB_MIN_CTAS) gemv_bulk_m3(GemvBulkParams p) { gemv_bulk_impl<3, GB_STAGES>(p); }
extern "C" __global__ void __launch_bounds__(GB_THREADS, GB_MIN_CTAS) gemv_bulk_m4(GemvBulkParams p) { gemv_bulk_impl<4, GB_STAGES>(p); }
// The deep ring (GB_DEEP_STAGES): dynamic shared memory GB_DEEP_STAGES * GB_STAGE_BYTES + x + acc
// as above (always asked for tight: the ring leaves ~34 KB of an SM's 227).
extern "C" __global__ void __launch_bounds__(GB_THREADS, 1) gemv_bulk_deep_m1(GemvBulkParams p) { gemv_bulk_impl<1, GB_DEEP_STAGES>(p); }
