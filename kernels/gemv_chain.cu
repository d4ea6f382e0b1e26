// A chain of skinny GEMMs (m <= 4 rows) in ONE launch: op j computes y_j[m, n_j] = x_j[m, k_j] ·
// w_j[n_j, k_j]ᵀ, with a grid barrier between ops, so op j+1's x may be what op j wrote. x_j is
// staged into shared memory by one of three rules, which folds the small kernels between a
// decode layer's projections into the chain:
//   CHAIN_X_PLAIN  x = src (bf16 [m, k])
//   CHAIN_X_NORM   v = residual (fp32 [m, k]) + delta (bf16, or none); x = RMSNorm(v) · gamma;
//                  v is written to res_out (each CTA its slice): add_rmsnorm's math (rmsnorm.cu)
//   CHAIN_X_SILU   x = silu(gate) · up from gate_up (bf16 [m, 2k]): silu_mul_bf16's math
// Why: a decode step of Llama-2-7B at batch 1 launched ~290 kernels; their boundaries cost the
// weight stream 0.26 ms and the small kernels between the projections ~0.2 ms more (gpu-bench
// stream-floor, H100, session 33). Here the weight stream never stops at a boundary: the producer
// warp streams op j+1's slab into the ring (weights are read-only) while the consumers wait at
// the barrier and stage the next x.
//
// Measured (session 34): a grid barrier costs the stream more than the kernel boundary it
// replaces (H200: 129 matrices in one chain 3.73 ms against 3.30 in PDL launches; ~3.5 us an op
// and barrier), and the decode layers on it (two chains a layer, 615dd4f) ran 4.21-4.24 ms a
// token against 3.71. So the chain is gpu-bench's (stream-floor), not the executor's: the
// measure a persistent decode step's synchronisation has to beat.
//
// Compiled after gemv_bulk.cu (its ring constants, gb_consume, the bf16 helpers), with
// GB_STAGE_BYTES 4096 (rows of >= 2048 elements) or 512 (small models: rows >= 256). One CTA an
// SM, launched cooperatively (every CTA resident: the barrier spins).
//
// The ring's stages are numbered across ops (`g`): stage g goes to buffer g % GB_STAGES and
// consumer warp g % GB_WARPS (GB_STAGES is a multiple of GB_WARPS, so a buffer always belongs to
// the same warp), and its mbarrier phase is (g / GB_STAGES) & 1, as in gemv_bulk.
#define CHAIN_X_PLAIN 0
#define CHAIN_X_NORM 1
#define CHAIN_X_SILU 2

struct ChainOp {
  const bf16* w;        // [n, k]  rows >= GB_STAGE_BYTES, k % 8 == 0
  const void* src;      // PLAIN: bf16 [m, k]; NORM: fp32 residual [m, k]; SILU: bf16 [m, 2k]
  const bf16* delta;    // NORM: bf16 [m, k] added to the residual, or null
  const bf16* gamma;    // NORM: [k]
  float* res_out;       // NORM: [m, k] residual + delta (never src: other CTAs still read it)
  bf16* y;              // [m, n] bf16 output, or null when y32 is set
  float* y32;           // [m, n] fp32 output (what rope_kv reads), or null
  int n;                // CTA b owns rows [b n / grid, (b + 1) n / grid), at most GB_ACC_FLOATS / m
  int k;                // m * k * 2 <= GB_X_BYTES
  int x_mode;
  float eps;
};

struct GemvChainParams {
  const ChainOp* ops;  // [count]
  int count;
  int m;               // 1..4
  u32* barrier;        // [2]: arrivals, generation (chain_grid_barrier); zero when allocated
};

// All CTAs of the grid meet here (the consumer warps of each; the producer streams on): an
// arrival counter and a generation word; the last to arrive resets the count and opens the
// next generation, so the barrier needs no clearing between launches. (Polling with a 64 ns
// back-off, or a flag per CTA polled by as many threads, measured no faster: session 34.)
__device__ __forceinline__ void chain_grid_barrier(u32* bar, int consumers) {
  asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
  if (threadIdx.x == 0) {
    u32 gen, old;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
    if (old == gridDim.x - 1) {
      asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar + 1) : "memory");
    } else {
      u32 now;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(bar + 1) : "memory");
      } while (now == gen);
    }
  }
  asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
}

__device__ __forceinline__ void chain_slab(int n, int& r0, int& rows) {
  r0 = (int)((long long)blockIdx.x * n / gridDim.x);
  rows = (int)((long long)(blockIdx.x + 1) * n / gridDim.x) - r0;
}

// Sum over the consumer threads of one value per row (scratch: [4][GB_WARPS]).
template <int M>
__device__ __forceinline__ void chain_row_sums(float v[M], float* scratch, int consumers) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < M; r++) {
    const float s = warp_sum(v[r]);
    if (lane == 0) scratch[r * GB_WARPS + warp] = s;
  }
  asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
#pragma unroll
  for (int r = 0; r < M; r++) {
    float s = 0.f;
    for (int w = 0; w < GB_WARPS; w++) s += scratch[r * GB_WARPS + w];
    v[r] = s;
  }
  asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");  // scratch is reused
}

// Elements [8 c, 8 c + 8) of row r of residual + delta (CHAIN_X_NORM).
__device__ __forceinline__ void chain_norm_v(const ChainOp& op, int r, int c, float v[8]) {
  const float* rr = (const float*)op.src + (size_t)r * op.k + 8 * c;
  const uint4 a = ld_cg16(rr), b = ld_cg16(rr + 4);
  const uint4 dv = op.delta ? ld_cg16((const uint4*)(op.delta + (size_t)r * op.k) + c)
                            : make_uint4(0, 0, 0, 0);
  const u32 dd[4] = {dv.x, dv.y, dv.z, dv.w};
  const u32 aa[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int e = 0; e < 4; e++) {
    v[2 * e] = __uint_as_float(aa[2 * e]) + bf_lo(dd[e]);
    v[2 * e + 1] = __uint_as_float(aa[2 * e + 1]) + bf_hi(dd[e]);
  }
}

// x [M, k] of `op` into shared memory, by its rule.
template <int M>
__device__ __forceinline__ void chain_stage_x(const ChainOp& op, bf16* x, float* scratch,
                                              int consumers) {
  const int tid = threadIdx.x, k8 = op.k / 8;
  if (op.x_mode == CHAIN_X_PLAIN) {
    for (int i = tid; i < M * k8; i += consumers) ((uint4*)x)[i] = ld_cg16((const uint4*)op.src + i);
  } else if (op.x_mode == CHAIN_X_SILU) {
    for (int i = tid; i < M * k8; i += consumers) {
      const int r = i / k8, c = i % k8;
      const uint4* row = (const uint4*)((const bf16*)op.src + (size_t)r * 2 * op.k);
      const uint4 gv = ld_cg16(row + c), uv = ld_cg16(row + k8 + c);
      const u32 gg[4] = {gv.x, gv.y, gv.z, gv.w}, uu[4] = {uv.x, uv.y, uv.z, uv.w};
      u32 o[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float g0 = bf_lo(gg[e]), g1 = bf_hi(gg[e]);
        o[e] = pack_bf16x2(g0 / (1.f + expf(-g0)) * bf_lo(uu[e]), g1 / (1.f + expf(-g1)) * bf_hi(uu[e]));
      }
      ((uint4*)x)[i] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  } else {
    // Two passes over L2 (v is not kept: [M, k] fp32 would not fit beside the ring): the sum of
    // squares, then the normalised x and this CTA's slice of the new residual.
    float ss[M];
#pragma unroll
    for (int r = 0; r < M; r++) ss[r] = 0.f;
    for (int c = tid; c < k8; c += consumers) {
#pragma unroll
      for (int r = 0; r < M; r++) {
        float v[8];
        chain_norm_v(op, r, c, v);
#pragma unroll
        for (int e = 0; e < 8; e++) ss[r] += v[e] * v[e];
      }
    }
    chain_row_sums<M>(ss, scratch, consumers);
    int c0, cn;  // this CTA's slice of the residual, in 8-element chunks
    chain_slab(k8, c0, cn);
    for (int c = tid; c < k8; c += consumers) {
      const uint4 wv = *((const uint4*)op.gamma + c);
      const u32 ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int r = 0; r < M; r++) {
        float v[8];
        chain_norm_v(op, r, c, v);
        const float inv = rsqrtf(ss[r] / op.k + op.eps);
        u32 o[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
          o[e] = pack_bf16x2(v[2 * e] * inv * bf_lo(ww[e]), v[2 * e + 1] * inv * bf_hi(ww[e]));
        ((uint4*)x)[r * k8 + c] = make_uint4(o[0], o[1], o[2], o[3]);
        if (c >= c0 && c < c0 + cn) {
          float4* out = (float4*)(op.res_out + (size_t)r * op.k + 8 * c);
          out[0] = make_float4(v[0], v[1], v[2], v[3]);
          out[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
      }
    }
  }
}

// Lane 0 of the producer warp: every op's slab into the ring, one stage after another.
__device__ __forceinline__ void chain_produce(const GemvChainParams& p, u32 ring, u32 full,
                                              u32 empty) {
  const u64 policy = gb_policy();
  u32 g = 0;
  for (int j = 0; j < p.count; j++) {
    const ChainOp& op = p.ops[j];
    const int k = op.k;
    int r0, rows;
    chain_slab(op.n, r0, rows);
    const int slab = rows * 2 * k;
    const unsigned char* src = (const unsigned char*)op.w + (size_t)r0 * 2 * k;
    for (int b = 0; b < slab; b += GB_STAGE_BYTES, g++) {
      const int s = g % GB_STAGES;
      if (g >= GB_STAGES) mbar_wait(empty + 8 * s, (g / GB_STAGES - 1) & 1);
      const u32 n = (u32)min(GB_STAGE_BYTES, slab - b);
      gb_copy(ring + s * GB_STAGE_BYTES, src + b, n, full + 8 * s, policy);
    }
  }
}

template <int M>
__device__ __forceinline__ void gemv_chain_impl(const GemvChainParams& p) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char gb_ring[];  // [GB_STAGES][GB_STAGE_BYTES], then x [M, k]
  __shared__ float acc[GB_ACC_FLOATS];                       // [this CTA's rows][M]
  __shared__ float scratch[4 * GB_WARPS];
  __shared__ __align__(8) u64 bars[2 * GB_STAGES];  // full[GB_STAGES], empty[GB_STAGES]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const u32 full = smem_addr(&bars[0]), empty = smem_addr(&bars[GB_STAGES]);
  if (threadIdx.x == 0) {
    for (int s = 0; s < GB_STAGES; s++) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (warp == GB_WARPS) {
    if (lane == 0) chain_produce(p, smem_addr(gb_ring), full, empty);
    return;
  }
  const int tid = threadIdx.x, consumers = 32 * GB_WARPS;
  bf16* x = (bf16*)(gb_ring + GB_STAGES * GB_STAGE_BYTES);
  u32 g0 = 0;  // the number of this op's first stage
  for (int j = 0; j < p.count; j++) {
    const ChainOp op = p.ops[j];
    int r0, rows;
    chain_slab(op.n, r0, rows);
    const int row_bytes = 2 * op.k, slab = rows * row_bytes;
    const int stages = (slab + GB_STAGE_BYTES - 1) / GB_STAGE_BYTES;
    for (int i = tid; i < rows * M; i += consumers) acc[i] = 0.f;
    chain_stage_x<M>(op, x, scratch, consumers);
    asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
    // This warp's first stage of the op: the first i with (g0 + i) % GB_WARPS == warp.
    const int first = (int)((warp + GB_WARPS - g0 % GB_WARPS) % GB_WARPS);
    for (int i = first; i < stages; i += GB_WARPS) {
      const u32 g = g0 + i;
      const int s = g % GB_STAGES;
      mbar_wait(full + 8 * s, (g / GB_STAGES) & 1);
      const int b = i * GB_STAGE_BYTES, e = min(b + GB_STAGE_BYTES, slab);
      gb_consume<M>(gb_ring + s * GB_STAGE_BYTES, b, e, b / row_bytes, row_bytes, x, op.k, acc,
                    empty + 8 * s);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(consumers) : "memory");
    for (int i = tid; i < rows * M; i += consumers) {
      const int r = i / M, mm = i % M;
      const size_t o = (size_t)mm * op.n + r0 + r;
      if (op.y32) op.y32[o] = acc[i];
      else op.y[o] = f2bf(acc[i]);
    }
    g0 += stages;
    // The next op's x may be this one's y (the barrier), and acc is reset for it.
    if (j + 1 < p.count) chain_grid_barrier(p.barrier, consumers);
  }
#endif
}

// grid: the SM count (cooperative), block: GB_THREADS, dynamic shared memory:
// GB_STAGES * GB_STAGE_BYTES + GB_X_BYTES.
extern "C" __global__ void __launch_bounds__(GB_THREADS) gemv_chain_m1(GemvChainParams p) { gemv_chain_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GB_THREADS) gemv_chain_m2(GemvChainParams p) { gemv_chain_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GB_THREADS) gemv_chain_m3(GemvChainParams p) { gemv_chain_impl<3>(p); }
extern "C" __global__ void __launch_bounds__(GB_THREADS) gemv_chain_m4(GemvChainParams p) { gemv_chain_impl<4>(p); }
