// Paged decode attention with the K/V rows streamed by bulk copies (sm_90+): the same op,
// parameters, grid semantics, split rule and split merge as paged_decode.cu, to which this file is
// appended before NVRTC compiles it (compile::PAGED_DECODE), and the lane kernel's arithmetic
// (LaneSoftmax) on rows read from shared memory instead of from global memory.
//
// Why: the lane kernel's warps load U steps of keys, wait for them, then compute, so each CTA
// keeps at most 16 KB in flight and walks its split in dependent round trips; at batch 1 and 4k
// keys a Llama-2-7B layer's 64 MB was read at 47 % of the copy bandwidth on the H200 (gpu-bench
// attention, one launch) although the same kernel reads at 86-100 % at batch 16-64. Here one
// producer warp issues the split's rows as 1-D bulk copies (`cp.async.bulk`, as gemv_bulk.cu
// streams weights) into a ring of DB_STAGES stages of DB_KEYS keys (K rows, then V rows), as far
// ahead as the ring holds, and the DECODE_WARPS consumer warps each take every DECODE_WARPS-th
// stage, so loads never wait on arithmetic.
//
// Stages start at multiples of DB_KEYS keys and blocks hold a multiple of DB_KEYS keys, so a
// stage's keys are consecutive rows of one block: one copy for its K rows and one for its V rows
// (a split's first and last stage may be partial). The host runs the lane kernel instead for
// smaller blocks and below sm_90 (kernels::paged_decode).

#ifndef DB_KEYS
#define DB_KEYS 8  // keys a stage
#endif
#ifndef DB_STAGES
#define DB_STAGES 8  // stages in the ring: a multiple of DECODE_WARPS (each buffer one warp's)
#endif
#define DB_ROW (HD * (int)sizeof(kv_t))        // bytes of one key's row of one kv head
#define DB_STAGE_BYTES (2 * DB_KEYS * DB_ROW)  // K rows, then V rows
#if DB_STAGES % DECODE_WARPS != 0
#error "DB_STAGES must be a multiple of DECODE_WARPS"
#endif

// Lane 0 of the producer warp: stage i of the split into buffer i % DB_STAGES once its consumer
// has handed that buffer back (its empty barrier), keys placed at their offset in the stage.
__device__ __forceinline__ void db_produce(const PagedDecodeParams& p, const DecodeCta& c,
                                           int first_key, int stages, u32 ring, u32 full,
                                           u32 empty) {
  for (int i = 0; i < stages; i++) {
    const int s = i % DB_STAGES;
    if (i >= DB_STAGES) mbar_wait(empty + 8 * s, (i / DB_STAGES - 1) & 1);
    const int key0 = first_key + i * DB_KEYS;
    const int t0 = max(key0, c.begin), t1 = min(key0 + DB_KEYS, c.end);
    const u32 bytes = (u32)(t1 - t0) * DB_ROW;
    const size_t o = kv_offset(c.bt[t0 >> c.bshift], c.kh, t0 & c.bmask, p.num_kv_heads,
                               p.block_size, HD);
    const u32 dst = ring + s * DB_STAGE_BYTES + (t0 - key0) * DB_ROW;
    const u32 bar = full + 8 * s;
    mbar_expect_tx(bar, 2 * bytes);
    bulk_g2s(dst, p.k_cache + o, bytes, bar);
    bulk_g2s(dst + DB_KEYS * DB_ROW, p.v_cache + o, bytes, bar);
  }
}

template <int G>
__device__ __forceinline__ void paged_decode_bulk_impl(const PagedDecodeParams& p) {
#if __CUDA_ARCH__ >= 900
  using Lane = LaneSoftmax<G>;
  constexpr int TPW = Lane::TPW;
  constexpr int NS = DECODE_WARPS * TPW;
  constexpr int STEPS = (DB_KEYS + TPW - 1) / TPW;  // warp steps a stage
  extern __shared__ __align__(128) unsigned char db_ring[];  // [DB_STAGES][K, V][DB_KEYS][HD]
  __shared__ float s_acc[NS][G][HD];
  __shared__ float s_m[NS][G];
  __shared__ float s_l[NS][G];
  __shared__ __align__(8) u64 bars[2 * DB_STAGES];  // full[DB_STAGES], empty[DB_STAGES]

  pdl_trigger();  // the O projection may start streaming its weights
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const u32 full = smem_addr(&bars[0]), empty = smem_addr(&bars[DB_STAGES]);
  if (threadIdx.x == 0) {
    for (int s = 0; s < DB_STAGES; s++) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, 1);
    }
    mbar_fence_init();
  }
  __syncthreads();
  // Waits for the kernel before (rope_kv writes q and the step's new key).
  const DecodeCta cta = decode_cta<G>(p, DECODE_GROUP_CTAS);
  const int first_key = cta.begin & ~(DB_KEYS - 1);
  const int stages = cta.end > cta.begin ? (cta.end - first_key + DB_KEYS - 1) / DB_KEYS : 0;
  if (warp == DECODE_WARPS) {
    if (lane == 0) db_produce(p, cta, first_key, stages, smem_addr(db_ring), full, empty);
    __syncwarp();
  } else {
    Lane ln;
    ln.init(p, cta.row, cta.h0, cta.gn);
    // Stage i is warp i % DECODE_WARPS's, and so is its buffer (DB_STAGES is a multiple of
    // DECODE_WARPS): a warp never waits on a buffer another warp holds.
    for (int i = warp; i < stages; i += DECODE_WARPS) {
      const int s = i % DB_STAGES;
      mbar_wait(full + 8 * s, (i / DB_STAGES) & 1);
      const unsigned char* kb = db_ring + s * DB_STAGE_BYTES;
      const int key0 = first_key + i * DB_KEYS;
#pragma unroll
      for (int j = 0; j < STEPS; j++) {
        const int t = j * TPW + ln.sub, key = key0 + t;
        const bool valid = t < DB_KEYS && key >= cta.begin && key < cta.end;
        const int off = t * DB_ROW + ln.dl * 16;
        const bool load = valid && ln.active;
        const uint4 kv = load ? *(const uint4*)(kb + off) : make_uint4(0, 0, 0, 0);
        const uint4 vv = load ? *(const uint4*)(kb + DB_KEYS * DB_ROW + off) : make_uint4(0, 0, 0, 0);
        ln.key(kv, vv, valid);
      }
      // Every lane has read the stage: the buffer goes back to the producer.
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + 8 * s);
    }
    ln.store(warp * TPW + ln.sub, s_acc, s_m, s_l);
  }
  __syncthreads();
  finish_split<NS, G>(p, cta.item, cta.row, cta.split, cta.h0, cta.gn, s_acc, s_m, s_l);
#endif
}

// grid: (num_splits, num_kv_heads * DECODE_GROUP_CTAS, num_items), block: (DECODE_WARPS + 1) * 32
// (the consumers, then the producer warp), dynamic shared memory: DB_STAGES * DB_STAGE_BYTES
// (kernels::decode_bulk_smem). Empty below sm_90: the host never launches it there.
extern "C" __global__ void __launch_bounds__((DECODE_WARPS + 1) * 32) paged_decode_bulk(PagedDecodeParams p) {
  paged_decode_bulk_impl<DECODE_GC>(p);
}
