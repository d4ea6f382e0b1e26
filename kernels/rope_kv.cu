// RoPE (rotate-half layout, as in HF Llama) on q and k, fused with writing k and v into the paged
// KV cache through the slot mapping. The inverse frequencies come from the host, so llama3 (or
// any other) frequency scaling costs nothing here. q, k and v arrive as the QKV GEMM's fp32 output
// and are rounded to bf16 once, after the rotation (bf16 before it measurably moved the logits).
struct RopeKvParams {
  const float* qkv;         // [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
  const u32* positions;     // [num_tokens]
  const u32* slots;         // [num_tokens]  block_id * block_size + offset; 0xffffffff: don't write
  const float* inv_freq;    // [head_dim / 2]
  bf16* q_out;              // [num_tokens, num_heads, head_dim]
  bf16* k_cache;            // [num_blocks, num_kv_heads, block_size, head_dim]
  bf16* v_cache;            // same
  int num_tokens;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int block_size;
};

// grid: (num_tokens, num_heads + num_kv_heads): one CTA per token and q or k head (a k head's CTA
// also copies that kv head's v), so a decode step of one token still spreads over many SMs.
// block: head_dim / 2 threads, at least 32.
extern "C" __global__ void rope_kv(RopeKvParams p) {
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  const int half = p.head_dim / 2;
  const int width = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  const float* row = p.qkv + (size_t)t * width;
  const u32 slot = p.slots[t];
  const bool is_q = h < p.num_heads;
  if (!is_q && slot == 0xffffffffu) return;  // padding token: nothing to write
  const int block = (int)(slot / p.block_size), off = (int)(slot % p.block_size);
  const int kh = h - p.num_heads;
  if (i < half) {
    float s, c;
    sincosf((float)p.positions[t] * p.inv_freq[i], &s, &c);
    const float* x = row + h * p.head_dim;
    const float x1 = x[i], x2 = x[i + half];
    bf16* dst = is_q ? p.q_out + ((size_t)t * p.num_heads + h) * p.head_dim
                     : p.k_cache + kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim);
    dst[i] = f2bf(x1 * c - x2 * s);
    dst[i + half] = f2bf(x2 * c + x1 * s);
  }
  if (!is_q) {
    const float* v = row + (p.num_heads + p.num_kv_heads + kh) * p.head_dim;
    bf16* dst = p.v_cache + kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim);
    for (int d = i; d < p.head_dim; d += blockDim.x) dst[d] = f2bf(v[d]);
  }
}
