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

// Most threads a rope_kv CTA has (kernels::ROPE_MAX_THREADS mirrors it).
#define ROPE_MAX_THREADS 128

// Four consecutive values to dst (8-byte aligned for bf16, 4-byte for e4m3).
__device__ __forceinline__ void store4_bf16(bf16* dst, const float* v) {
  *(uint2*)dst = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
}
#if KV_FP8
__device__ __forceinline__ void store4_kv(kv_t* dst, const float* v) {
  *(u32*)dst = (u32)f2kv(v[0]) | (u32)f2kv(v[1]) << 8 | (u32)f2kv(v[2]) << 16 |
               (u32)f2kv(v[3]) << 24;
}
#else
__device__ __forceinline__ void store4_kv(kv_t* dst, const float* v) { store4_bf16(dst, v); }
#endif

// Each thread owns 4 consecutive rotated pairs (i..i+3 with i+half..i+half+3; float4 loads),
// so head_dim / 8 threads cover a head, and a CTA takes several heads of one token: a thread
// keeps 32-48 bytes of loads in flight. (One CTA of head_dim / 2 threads per (token, head), with
// scalar loads, had too few bytes in flight to pass ~1.8 TB/s: 83 us a layer for a 2048-token
// prefill of Llama-2-7B under ncu.)
// grid: (num_tokens, ceil((num_heads + num_kv_heads) / hpc)), block: hpc * (head_dim / 8) threads
// (kernels::rope_kv picks hpc); head_dim % 8 == 0.
extern "C" __global__ void rope_kv(RopeKvParams p) {
  __shared__ float s_part[ROPE_MAX_THREADS];  // the head norm's per-thread partial sums
  // q, k, v are the QKV projection's output (the wait matters where Gpu::pdl_small launches this
  // kernel with PDL; off by default). Decode attention may launch (it waits for this kernel
  // before reading q, K, V) only once that projection has ended: launched while its CTAs still
  // held the SMs, attention's CTAs packed onto the few SMs freed first (a batch-1 step 2.5 %
  // slower at 3.8k tokens, BENCHMARKS.md session 37).
  pdl_wait();
  pdl_trigger();
  const int half = p.head_dim / 2, tph = p.head_dim / 8;
  const int t = blockIdx.x, hpc = blockDim.x / tph;
  const int hs = threadIdx.x / tph, i = (threadIdx.x % tph) * 4;
  const int h = blockIdx.y * hpc + hs;
  const int width = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  const float* row = p.qkv + (size_t)t * width;
  const u32 slot = p.slots[t];
  const bool is_q = h < p.num_heads;
  // A padding token writes nothing (its k head); a thread past the last head idles. Neither
  // returns before the head norm's barrier.
  const bool live = h < p.num_heads + p.num_kv_heads && (is_q || slot != 0xffffffffu);
  const int block = (int)(slot / p.block_size), off = (int)(slot % p.block_size);
  const int kh = h - p.num_heads;
  float x1[4] = {0.f, 0.f, 0.f, 0.f}, x2[4] = {0.f, 0.f, 0.f, 0.f};
  if (live) {
    const float4 a = *(const float4*)(row + h * p.head_dim + i);
    const float4 b = *(const float4*)(row + h * p.head_dim + i + half);
    x1[0] = a.x, x1[1] = a.y, x1[2] = a.z, x1[3] = a.w;
    x2[0] = b.x, x2[1] = b.y, x2[2] = b.z, x2[3] = b.w;
    if (p.qkv_bias) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        x1[e] += bf2f(p.qkv_bias[h * p.head_dim + i + e]);
        x2[e] += bf2f(p.qkv_bias[h * p.head_dim + i + half + e]);
      }
    }
  }
  if (p.q_norm) {  // uniform over the CTA: every thread reaches the barrier
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < 4; e++) ss += x1[e] * x1[e] + x2[e] * x2[e];
    s_part[threadIdx.x] = ss;
    __syncthreads();
    float tot = 0.f;
    for (int k = 0; k < tph; k++) tot += s_part[hs * tph + k];
    const float inv = rsqrtf(tot / p.head_dim + p.eps);
    if (live) {
      const bf16* w = is_q ? p.q_norm : p.k_norm;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        x1[e] *= inv * bf2f(w[i + e]);
        x2[e] *= inv * bf2f(w[i + half + e]);
      }
    }
  }
  if (!live) return;
  float y1[4], y2[4];
#pragma unroll
  for (int e = 0; e < 4; e++) {
    float sn, cs;
    sincosf((float)p.positions[t] * p.inv_freq[i + e], &sn, &cs);
    sn *= p.rope_scale;
    cs *= p.rope_scale;
    y1[e] = x1[e] * cs - x2[e] * sn;
    y2[e] = x2[e] * cs + x1[e] * sn;
  }
  if (is_q) {
    // q stays bf16 whatever the cache's dtype.
    bf16* dst = p.q_out + ((size_t)t * p.num_heads + h) * p.head_dim;
    store4_bf16(dst + i, y1);
    store4_bf16(dst + i + half, y2);
    return;
  }
  const size_t o = kv_offset(block, kh, off, p.num_kv_heads, p.block_size, p.head_dim);
  store4_kv(p.k_cache + o + i, y1);
  store4_kv(p.k_cache + o + i + half, y2);
  // This thread's share of v: dims i..i+3 and i+half..i+half+3.
  const int vcol = (p.num_heads + p.num_kv_heads + kh) * p.head_dim;
  const float4 va = *(const float4*)(row + vcol + i);
  const float4 vb = *(const float4*)(row + vcol + i + half);
  float v1[4] = {va.x, va.y, va.z, va.w}, v2[4] = {vb.x, vb.y, vb.z, vb.w};
  if (p.qkv_bias) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      v1[e] += bf2f(p.qkv_bias[vcol + i + e]);
      v2[e] += bf2f(p.qkv_bias[vcol + i + half + e]);
    }
  }
  store4_kv(p.v_cache + o + i, v1);
  store4_kv(p.v_cache + o + i + half, v2);
}
