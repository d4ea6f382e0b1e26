// RoPE (rotate-half layout, as in HF Llama) on q and k, fused with writing k and v into the paged
// KV cache through the slot mapping (in the cache's dtype, kv_t: bf16, or e4m3 with -DKV_FP8=1). The inverse frequencies come from the host, so llama3,
// longrope (or any other) frequency scaling costs nothing here; longrope's attention factor
// scales cos and sin (`rope_scale`). q, k and v arrive as the QKV GEMM's fp32 output and are
// rounded to bf16 once, after the rotation (bf16 before it measurably moved the logits). Two
// per-model extras happen first, in fp32: the q/k/v bias (Qwen2), and an RMSNorm over each q and
// k head (Qwen3's q_norm / k_norm).
struct RopeKvParams {
  const float* qkv;         // [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
  const u32* positions;     // [num_tokens]
  const u32* slots;         // [num_tokens]  block_id * block_size + offset; 0xffffffff: don't write
  const float* inv_freq;    // [head_dim / 2]
  const bf16* qkv_bias;     // [(num_heads + 2 * num_kv_heads) * head_dim], or null
  const bf16* q_norm;       // [head_dim] RMSNorm weight of every q head, or null (then k_norm too)
  const bf16* k_norm;       // [head_dim]
  bf16* q_out;              // [num_tokens, num_heads, head_dim]
  kv_t* k_cache;            // [num_blocks, num_kv_heads, block_size, head_dim]  bf16, or e4m3
  kv_t* v_cache;            // same                                               (KV_FP8)
  int num_tokens;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int block_size;
  float eps;                // of the q/k RMSNorm
  float rope_scale;         // on cos and sin: longrope's attention factor, else 1
};

// grid: (num_tokens, num_heads + num_kv_heads): one CTA per token and q or k head (a k head's CTA
// also copies that kv head's v), so a decode step of one token still spreads over many SMs.
// block: head_dim / 2 threads rounded up to a multiple of 32 (the head norm's block_sum needs
// whole warps); thread i < head_dim / 2 owns the rotated pair (i, i + head_dim / 2).
extern "C" __global__ void rope_kv(RopeKvParams p) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  const int half = p.head_dim / 2;
  const int width = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  const float* row = p.qkv + (size_t)t * width;
  const u32 slot = p.slots[t];
  const bool is_q = h < p.num_heads;
  if (!is_q && slot == 0xffffffffu) return;  // padding token: nothing to write (whole CTA)
  const int block = (int)(slot / p.block_size), off = (int)(slot % p.block_size);
  const int kh = h - p.num_heads;
  const bool pair = i < half;
  float x1 = 0.f, x2 = 0.f;
  if (pair) {
    x1 = row[h * p.head_dim + i];
    x2 = row[h * p.head_dim + i + half];
    if (p.qkv_bias) {
      x1 += bf2f(p.qkv_bias[h * p.head_dim + i]);
      x2 += bf2f(p.qkv_bias[h * p.head_dim + i + half]);
    }
  }
  if (p.q_norm) {  // uniform over the CTA: every thread reaches block_sum
    const float inv = rsqrtf(block_sum(x1 * x1 + x2 * x2, scratch) / p.head_dim + p.eps);
    if (pair) {
      const bf16* w = is_q ? p.q_norm : p.k_norm;
      x1 *= inv * bf2f(w[i]);
      x2 *= inv * bf2f(w[i + half]);
    }
  }
  if (pair) {
    float s, c;
    sincosf((float)p.positions[t] * p.inv_freq[i], &s, &c);
    s *= p.rope_scale;
    c *= p.rope_scale;
#if KV_FP8
    // q stays bf16, k goes to the cache in its dtype.
    const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
    if (is_q) {
      bf16* dst = p.q_out + ((size_t)t * p.num_heads + h) * p.head_dim;
      dst[i] = f2bf(y1);
      dst[i + half] = f2bf(y2);
    } else {
      kv_t* dst =
          p.k_cache + kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim);
      dst[i] = f2kv(y1);
      dst[i + half] = f2kv(y2);
    }
#else
    bf16* dst = is_q ? p.q_out + ((size_t)t * p.num_heads + h) * p.head_dim
                     : p.k_cache + kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim);
    dst[i] = f2bf(x1 * c - x2 * s);
    dst[i + half] = f2bf(x2 * c + x1 * s);
#endif
  }
  if (!is_q) {
    const int vcol = (p.num_heads + p.num_kv_heads + kh) * p.head_dim;
    const float* v = row + vcol;
    kv_t* dst = p.v_cache + kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim);
    for (int d = i; d < p.head_dim; d += blockDim.x)
      dst[d] = f2kv(v[d] + (p.qkv_bias ? bf2f(p.qkv_bias[vcol + d]) : 0.f));
  }
}
