// Causal softmax of the GEMM prefill path: fp32 scores S = Q·Kᵀ (unscaled, from cuBLAS) to bf16
// probabilities P for the P·V GEMM, fp32 math.
//
// Query i of a chunk of q_len queries sits at position ctx - q_len + i and sees keys 0..=that
// position; masked entries are written as 0 so the P·V GEMM can run over the whole row. Rows are
// `ld = scores_ld(ctx)` floats apart (a multiple of 8, so every row of S and of P starts 16-byte
// aligned for cuBLAS). P has S's byte layout: row r of P is the first half of row r of S (bf16,
// ld 2 * ld), so `probs` may be the scores buffer itself (the backend does this: no second
// buffer) or a separate one (tests).
struct CausalSoftmaxParams {
  const float* scores;      // per GEMM entry e, at gemm_s0[e]: [num_heads, q_len, ld] fp32
  bf16* probs;              // per entry, at 2 * gemm_s0[e]: [num_heads, q_len, 2 * ld] bf16, the
                            //   first ctx of each row written; may alias `scores`
  const int* gemm_seq;      // [num_gemm]  sequence of each GEMM-path entry
  const int* gemm_s0;       // [num_gemm]  its first score, in floats
  const int* q_len;         // [num_seqs]
  const int* context_lens;  // [num_seqs]
  int num_gemm;
  int num_heads;
  float scale;              // softmax scale, 1/sqrt(head_dim)
};

#define SOFTMAX_ROWS 4  // rows (warps) per CTA

__device__ __forceinline__ int scores_ld(int ctx) { return (ctx + 7) & ~7; }

// grid: (ceil(max q_len / SOFTMAX_ROWS), num_heads, num_gemm), block: 32 * SOFTMAX_ROWS.
// One warp per row: an online max/sum over the visible keys, then one pass writing P.
extern "C" __global__ void __launch_bounds__(32 * SOFTMAX_ROWS) causal_softmax(CausalSoftmaxParams p) {
  const int e = blockIdx.z, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int seq = p.gemm_seq[e];
  const int qlen = p.q_len[seq], ctx = p.context_lens[seq];
  const int i = blockIdx.x * SOFTMAX_ROWS + warp;
  if (i >= qlen) return;  // whole warps leave; nothing below synchronises the CTA
  const size_t row = (size_t)p.gemm_s0[e] + ((size_t)h * qlen + i) * scores_ld(ctx);
  const float* s = p.scores + row;
  bf16* out = p.probs + 2 * row;
  const int visible = ctx - qlen + i + 1;  // keys 0..visible-1
  const float sl2 = p.scale * LOG2E;

  float m = NEG_INF, l = 0.f;
  for (int j = lane; j < visible; j += 32) {
    const float x = s[j] * sl2;
    const float mn = fmaxf(m, x);
    l = l * exp2f(m - mn) + exp2f(x - mn);  // m = -inf on the first key: exp2f(-inf) = 0
    m = mn;
  }
  const float mx = warp_max(m);  // finite: key 0 is visible to every row
  const float total = warp_sum(m == NEG_INF ? 0.f : l * exp2f(m - mx));
  const float inv = 1.f / total;

  // In place, P's row is the first half of S's: the pieces written in a 32-key chunk overlay S
  // entries of this chunk or earlier ones, which are all read before the __syncwarp (earlier
  // chunks in earlier iterations), so no value is overwritten before it is read.
  for (int c0 = 0; c0 < ctx; c0 += 32) {
    const int j = c0 + lane;
    const float x = j < visible ? s[j] : 0.f;
    __syncwarp();
    if (j < ctx) out[j] = f2bf(j < visible ? exp2f(x * sl2 - mx) * inv : 0.f);
  }
}
