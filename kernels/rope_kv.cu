// RoPE (rotate-half layout, as in HF Llama) on q and k, fused with writing k and v into the paged
// KV cache through the slot mapping. The inverse frequencies come from the host, so llama3 (or
// any other) frequency scaling costs nothing here.
struct RopeKvParams {
  const bf16* qkv;          // [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
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

// grid: num_tokens, block: 128
extern "C" __global__ void rope_kv(RopeKvParams p) {
  const int t = blockIdx.x;
  const int half = p.head_dim / 2;
  const int width = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  const bf16* row = p.qkv + (size_t)t * width;
  const float pos = (float)p.positions[t];
  const u32 slot = p.slots[t];
  const bool write_kv = slot != 0xffffffffu;
  const int block = (int)(slot / p.block_size), off = (int)(slot % p.block_size);

  // Rotations: heads 0..num_heads-1 are q, the next num_kv_heads are k.
  const int n_rot = (p.num_heads + p.num_kv_heads) * half;
  for (int r = threadIdx.x; r < n_rot; r += blockDim.x) {
    const int h = r / half, i = r % half;
    float s, c;
    sincosf(pos * p.inv_freq[i], &s, &c);
    const bf16* x = row + h * p.head_dim;
    const float x1 = bf2f(x[i]), x2 = bf2f(x[i + half]);
    const bf16 o1 = f2bf(x1 * c - x2 * s), o2 = f2bf(x2 * c + x1 * s);
    if (h < p.num_heads) {
      bf16* q = p.q_out + ((size_t)t * p.num_heads + h) * p.head_dim;
      q[i] = o1;
      q[i + half] = o2;
    } else if (write_kv) {
      const int kh = h - p.num_heads;
      bf16* k = p.k_cache + kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim);
      k[i] = o1;
      k[i + half] = o2;
    }
  }
  if (!write_kv) return;
  const bf16* v = row + (p.num_heads + p.num_kv_heads) * p.head_dim;
  for (int r = threadIdx.x; r < p.num_kv_heads * p.head_dim; r += blockDim.x) {
    const int kh = r / p.head_dim, d = r % p.head_dim;
    p.v_cache[kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim) + d] = v[r];
  }
}
