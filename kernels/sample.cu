// Sampling on the GPU, one CTA per sampled sequence: greedy, temperature, top-k, top-p, min-p.
//
// Same filters as sampling/sampler.rs, expressed as probability thresholds so nothing is sorted:
// with p_i = exp((logit_i - max) / T) (the top token has p = 1), top-k keeps p >= the k-th
// largest p, min-p keeps p >= min_p, and top-p keeps p >= the largest t whose kept mass reaches
// top_p of the mass left by the first two. Thresholds are found bit by bit over the float's bit
// pattern (positive floats order like their bits): 31 passes of block reductions, no sort, no
// scratch memory. Ties at a threshold are all kept (the CPU sampler breaks them by token id).
// The draw u = hash(seed, output_index) is then placed on the kept mass in token-id order, so a
// token depends only on its own logits, seed and output index, never on the batch. Only the
// first `vocab` logits of a row are read: the rest (ids a smaller tokenizer cannot decode) are
// masked out, the log-probability included.
struct SampleArgs {   // one per sampled sequence
  u64 seed;
  u64 output_index;
  float temperature;  // 0: greedy
  float top_p;        // 1: off
  float min_p;        // 0: off
  int top_k;          // 0: off
};

struct SampleParams {
  const float* logits;      // [num_rows, stride]; ids [0, vocab) are sampled
  const SampleArgs* args;   // [num_rows]
  int* tokens;              // [num_rows]
  float* logprobs;          // [num_rows]  log-probability under the unmodified distribution
  int num_rows;
  int vocab;                // ids sampled: the model's vocabulary, or fewer (a tokenizer's)
  int stride;               // logits per row (the model's vocabulary), >= vocab
};

#define SAMPLE_THREADS 1024

__device__ __forceinline__ float filtered_p(float logit, float mx, float inv_t) {
  return expf((logit - mx) * inv_t);
}

// Largest threshold t (as float bits) with sum over kept i (p_i >= max(t, floor)) of
// (count ? 1 : p_i) >= target.
__device__ u32 search_threshold(const float* row, int vocab, float mx, float inv_t, float floor,
                                bool count, float target, float* scratch) {
  u32 prefix = 0;
  for (int bit = 30; bit >= 0; bit--) {
    const u32 cand = prefix | (1u << bit);
    const float t = fmaxf(__uint_as_float(cand), floor);
    float acc = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float pi = filtered_p(row[i], mx, inv_t);
      if (pi >= t) acc += count ? 1.f : pi;
    }
    if (block_sum(acc, scratch) >= target) prefix = cand;
  }
  return prefix;
}

// grid: num_rows, block: SAMPLE_THREADS
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample(SampleParams p) {
  __shared__ float scratch[32];
  __shared__ float s_val[32];
  __shared__ int s_idx[32];
  __shared__ float s_scan[SAMPLE_THREADS];
  __shared__ int s_pick;
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* row = p.logits + (size_t)r * p.stride;
  const SampleArgs a = p.args[r];

  // Max and argmax (lowest id among equal maxima, as the CPU sampler).
  float best = NEG_INF;
  int best_i = 0x7fffffff;
  for (int i = tid; i < p.vocab; i += blockDim.x) {
    if (row[i] > best) {
      best = row[i];
      best_i = i;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  if (lane == 0) {
    s_val[warp] = best;
    s_idx[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < (int)(blockDim.x >> 5) ? s_val[lane] : NEG_INF;
    best_i = lane < (int)(blockDim.x >> 5) ? s_idx[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (ov > best || (ov == best && oi < best_i)) {
        best = ov;
        best_i = oi;
      }
    }
    if (lane == 0) {
      s_val[0] = best;
      s_idx[0] = best_i;
    }
  }
  __syncthreads();
  const float mx = s_val[0];
  const int argmax = s_idx[0];
  float z = 0.f;
  for (int i = tid; i < p.vocab; i += blockDim.x) z += expf(row[i] - mx);
  const float log_z = mx + logf(block_sum(z, scratch));

  const bool greedy = a.temperature == 0.f || a.top_k == 1;
  if (greedy) {
    if (tid == 0) {
      p.tokens[r] = argmax;
      p.logprobs[r] = mx - log_z;
    }
    return;
  }
  const float inv_t = 1.f / fmaxf(a.temperature, 1e-5f);
  float floor = a.min_p;  // top token has p = 1, so min-p's cut is min_p itself
  if (a.top_k > 0 && a.top_k < p.vocab) {
    const u32 tk = search_threshold(row, p.vocab, mx, inv_t, 0.f, true, (float)a.top_k, scratch);
    floor = fmaxf(floor, __uint_as_float(tk));
  }
  if (a.top_p < 1.f) {
    float mass = 0.f;
    for (int i = tid; i < p.vocab; i += blockDim.x) {
      const float pi = filtered_p(row[i], mx, inv_t);
      if (pi >= floor) mass += pi;
    }
    mass = block_sum(mass, scratch);
    const u32 tp = search_threshold(row, p.vocab, mx, inv_t, floor, false, a.top_p * mass, scratch);
    floor = fmaxf(floor, __uint_as_float(tp));
  }

  // Kept mass per thread over a contiguous range of ids, then an exclusive scan across threads.
  const int per = (p.vocab + blockDim.x - 1) / blockDim.x;
  const int lo = min(p.vocab, tid * per), hi = min(p.vocab, lo + per);
  float local = 0.f;
  for (int i = lo; i < hi; i++) {
    const float pi = filtered_p(row[i], mx, inv_t);
    if (pi >= floor) local += pi;
  }
  s_scan[tid] = local;
  if (tid == 0) s_pick = -1;
  __syncthreads();
  // Hillis-Steele inclusive scan (1024 entries, 10 steps).
  for (int o = 1; o < (int)blockDim.x; o <<= 1) {
    const float add = tid >= o ? s_scan[tid - o] : 0.f;
    __syncthreads();
    s_scan[tid] += add;
    __syncthreads();
  }
  const float total = s_scan[blockDim.x - 1];
  const float target = uniform01(a.seed, a.output_index) * total;
  const float incl = s_scan[tid], excl = tid > 0 ? s_scan[tid - 1] : 0.f;
  if (local > 0.f && target >= excl && target < incl) {
    float acc = excl;
    int pick = -1;
    for (int i = lo; i < hi; i++) {
      const float pi = filtered_p(row[i], mx, inv_t);
      if (pi >= floor) {
        pick = i;
        acc += pi;
        if (target < acc) break;
      }
    }
    s_pick = pick;
  }
  __syncthreads();
  if (tid == 0) {
    // Rounding can leave the draw past every range; the top token is always kept.
    const int tok = s_pick >= 0 ? s_pick : argmax;
    p.tokens[r] = tok;
    p.logprobs[r] = row[tok] - log_z;
  }
}
