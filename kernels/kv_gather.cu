// K and V of the GEMM-path prefill sequences, copied out of the paged cache into contiguous
// per-sequence scratch that cuBLAS strided-batched GEMMs can read (src/executor/cuda/prefill_gemm.rs).
//
// rope_kv has already written the chunk's own keys, so a cached prefix and the chunk are gathered
// alike, through the block table. The output is per query head: each kv head's rows are written
// G = num_heads / num_kv_heads times, so one strided-batched GEMM per sequence (batch = num_heads,
// a constant stride between heads) covers all heads. The extra writes are ctx * num_heads * HD * 4
// bytes, microseconds at the context lengths this path serves; the alternative (pointer-array
// batched GEMMs, or one call per group member) costs more launches or per-step pointer tables.
// The output is bf16 whatever the cache's dtype: an e4m3 cache (-DKV_FP8=1) is widened here, so
// the GEMMs are the same either way.
struct KvGatherParams {
  const kv_t* k_cache;      // [num_blocks, num_kv_heads, block_size, head_dim]  bf16, or e4m3
  const kv_t* v_cache;      // [num_blocks, num_kv_heads, block_size, head_dim]  (KV_FP8)
  const int* gemm_seq;      // [num_gemm]  sequence of each GEMM-path entry (row of the tables below)
  const int* gemm_key0;     // [num_gemm]  its first key row in k_out/v_out (prefix sum of contexts)
  const int* context_lens;  // [num_seqs]
  const int* block_tables;  // [num_seqs, max_blocks]
  bf16* k_out;              // per entry, at gemm_key0 * num_heads * head_dim: [num_heads, ctx, head_dim]
  bf16* v_out;              // same layout as k_out
  int num_gemm;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int block_size;
  int max_blocks;
};

#define GATHER_KEYS 32  // keys per CTA

// grid: (ceil(max context / GATHER_KEYS), num_kv_heads, num_gemm), block: 128.
// Each thread moves 16-byte pieces (8 bf16, or 16 e4m3) of one key row: one read from the cache,
// G writes.
extern "C" __global__ void kv_gather(KvGatherParams p) {
  const int e = blockIdx.z, kh = blockIdx.y;
  const int seq = p.gemm_seq[e], ctx = p.context_lens[seq];
  const int j0 = blockIdx.x * GATHER_KEYS;
  if (j0 >= ctx) return;
  const int group = p.num_heads / p.num_kv_heads;
  const int pieces = p.head_dim / KV_VEC;  // 16-byte pieces per row
  const int n = min(GATHER_KEYS, ctx - j0) * pieces;
  const int* bt = p.block_tables + (size_t)seq * p.max_blocks;
  const size_t base = (size_t)p.gemm_key0[e] * p.num_heads * p.head_dim;
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const int j = j0 + c / pieces, d = (c % pieces) * KV_VEC;
    const size_t src = kv_offset(bt[j / p.block_size], kh, j % p.block_size, p.num_kv_heads,
                                 p.block_size, p.head_dim) + d;
    uint4 kw[KV_VEC / 8], vw[KV_VEC / 8];  // the piece as bf16 (widened from e4m3: 2 words)
    kv_widen16(*(const uint4*)(p.k_cache + src), kw);
    kv_widen16(*(const uint4*)(p.v_cache + src), vw);
    for (int g = 0; g < group; g++) {
      const size_t dst = base + ((size_t)(kh * group + g) * ctx + j) * p.head_dim + d;
#pragma unroll
      for (int w = 0; w < KV_VEC / 8; w++) {
        *(uint4*)(p.k_out + dst + 8 * w) = kw[w];
        *(uint4*)(p.v_out + dst + 8 * w) = vw[w];
      }
    }
  }
}
