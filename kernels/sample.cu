// Sampling on the GPU, one CTA per sampled sequence: logit bias, the min_tokens mask and
// penalties (presence, frequency, repetition), then greedy or temperature with top-k, top-p,
// min-p; the sampled token's log-probability and, when asked, the top-k log-probabilities.
// Also the upkeep of the per-request token counts the penalties read (sample_counts_*).
//
// Same order and arithmetic as sampling/sampler.rs: a row with logit edits (bias, or -inf for
// ids the min_tokens mask blocks) or penalties is first written to `work`,
//   work[i] = penalize(logit[i] + edit[i], counts[i])
// (`penalize` rounds step by step as the CPU's), and sampled from there; log-probabilities are
// always the model's own (raw logits, temperature 1), as vLLM reports them.
//
// The filters are probability thresholds, so nothing is sorted: with p_i = exp((l_i - max) / T)
// (the top token has p = 1), top-k keeps p >= the k-th largest p, min-p keeps p >= min_p, and
// top-p keeps p >= the largest t whose kept mass reaches top_p of the mass left by the first
// two. Thresholds are found bit by bit over the float's bit pattern (positive floats order like
// their bits): 31 passes of block reductions, no sort, no scratch memory. Ties at a threshold
// are all kept (the CPU sampler breaks them by token id). The draw u = hash(seed, output_index)
// is then placed on the kept mass in token-id order, so a token depends only on its own logits,
// counts, seed and output index, never on the batch. Only the first `vocab` logits of a row are
// read: the rest (ids a smaller tokenizer cannot decode) are masked out, the log-probability
// included; rows of logits, work and counts are `stride` (the model's vocabulary) apart.
//
// Token counts (`counts`, one row per persistent batch row, [rows, stride] u32): bit 31 says the
// prompt holds the id, bits 0..30 count it in the output. The host sends their changes (a new
// request's prompt and output, tokens it took back, rows moved); this kernel counts each token it
// samples for a row with penalties, so a step needs no host round trip.
struct SampleArgs {   // one per sampled sequence
  u64 seed;
  u64 output_index;
  float temperature;  // 0: greedy
  float top_p;        // 1: off
  float min_p;        // 0: off
  int top_k;          // 0: off
  float presence;     // 0: off
  float frequency;    // 0: off
  float repetition;   // 1: off
  int counts_row;     // row of `counts` (penalties), or -1: none
  int edit_start;     // this row's edits: edits[edit_start .. edit_start + num_edits]
  int num_edits;
  int num_logprobs;   // top log-probabilities to write, 0 .. SAMPLE_MAX_TOP
  int pad;
};

struct SampleEdit {   // added to one token's logit (-inf: masked); tokens distinct within a row
  int token;
  float value;
};

struct SampleParams {
  const float* logits;      // [num_rows, stride]; ids [0, vocab) are sampled
  const SampleArgs* args;   // [num_rows]
  int* tokens;              // [num_rows]
  float* logprobs;          // [num_rows]  log-probability under the unmodified distribution
  const SampleEdit* edits;  // [sum of num_edits]
  u32* counts;              // [count rows, stride]  see above
  float* work;              // [num_rows, stride]  processed logits (rows with edits or penalties)
  int* top_ids;             // [num_rows, SAMPLE_MAX_TOP]  most likely first
  float* top_logprobs;      // [num_rows, SAMPLE_MAX_TOP]
  int num_rows;
  int vocab;                // ids sampled: the model's vocabulary, or fewer (a tokenizer's)
  int stride;               // logits per row (the model's vocabulary), >= vocab
};

#define SAMPLE_THREADS 1024
#define SAMPLE_MAX_TOP 20
#define COUNT_PROMPT_BIT 0x80000000u
#define COUNT_MASK 0x7fffffffu

__device__ __forceinline__ float filtered_p(float logit, float mx, float inv_t) {
  return expf((logit - mx) * inv_t);
}

// sampler.rs `penalize`: rounded step by step (no fused multiply-add), as the CPU computes it.
__device__ __forceinline__ float penalize(float l, u32 c, const SampleArgs& a) {
  const u32 n = c & COUNT_MASK;
  if (c != 0u && a.repetition != 1.f) l = l > 0.f ? __fdiv_rn(l, a.repetition) : __fmul_rn(l, a.repetition);
  const float presence = n > 0u ? a.presence : 0.f;
  return __fsub_rn(l, __fadd_rn(__fmul_rn(a.frequency, (float)n), presence));
}

// Whether (v, i) comes before (bv, bi) in the order "larger value, then smaller id".
__device__ __forceinline__ bool before(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// The first of the warp's (best, best_i) in that order; every lane gets it.
__device__ __forceinline__ void warp_first(float& best, int& best_i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (before(ov, oi, best, best_i)) {
      best = ov;
      best_i = oi;
    }
  }
}

// The first element of `row` in that order among those after (after_v, after_i) (pass +inf, -1
// for all), over the block; every thread gets it. The id is 0x7fffffff when there is none.
__device__ void block_first(const float* row, int vocab, float after_v, int after_i,
                            float* s_val, int* s_idx, float* out_v, int* out_i) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float best = NEG_INF;
  int best_i = 0x7fffffff;
  for (int i = tid; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (before(after_v, after_i, v, i) && before(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  warp_first(best, best_i);
  if (lane == 0) {
    s_val[warp] = best;
    s_idx[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < (int)(blockDim.x >> 5) ? s_val[lane] : NEG_INF;
    best_i = lane < (int)(blockDim.x >> 5) ? s_idx[lane] : 0x7fffffff;
    warp_first(best, best_i);
    if (lane == 0) {
      s_val[0] = best;
      s_idx[0] = best_i;
    }
  }
  __syncthreads();
  *out_v = s_val[0];
  *out_i = s_idx[0];
  __syncthreads();  // s_val and s_idx may be reused at once
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

// A draw over the filtered `row` (mx its max, argmax its first maximum).
__device__ int draw(const float* row, int vocab, float mx, int argmax, const SampleArgs& a,
                    float* scratch, float* s_scan, int* s_pick) {
  const int tid = threadIdx.x;
  const float inv_t = 1.f / fmaxf(a.temperature, 1e-5f);
  float floor = a.min_p;  // top token has p = 1, so min-p's cut is min_p itself
  if (a.top_k > 0 && a.top_k < vocab) {
    const u32 tk = search_threshold(row, vocab, mx, inv_t, 0.f, true, (float)a.top_k, scratch);
    floor = fmaxf(floor, __uint_as_float(tk));
  }
  if (a.top_p < 1.f) {
    float mass = 0.f;
    for (int i = tid; i < vocab; i += blockDim.x) {
      const float pi = filtered_p(row[i], mx, inv_t);
      if (pi >= floor) mass += pi;
    }
    mass = block_sum(mass, scratch);
    const u32 tp = search_threshold(row, vocab, mx, inv_t, floor, false, a.top_p * mass, scratch);
    floor = fmaxf(floor, __uint_as_float(tp));
  }

  // Kept mass per thread over a contiguous range of ids, then an exclusive scan across threads.
  const int per = (vocab + blockDim.x - 1) / blockDim.x;
  const int lo = min(vocab, tid * per), hi = min(vocab, lo + per);
  float local = 0.f;
  for (int i = lo; i < hi; i++) {
    const float pi = filtered_p(row[i], mx, inv_t);
    if (pi >= floor) local += pi;
  }
  s_scan[tid] = local;
  if (tid == 0) *s_pick = -1;
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
    *s_pick = pick;
  }
  __syncthreads();
  // Rounding can leave the draw past every range; the top token is always kept.
  return *s_pick >= 0 ? *s_pick : argmax;
}

// grid: num_rows, block: SAMPLE_THREADS
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample(SampleParams p) {
  __shared__ float scratch[32];
  __shared__ float s_val[32];
  __shared__ int s_idx[32];
  __shared__ float s_scan[SAMPLE_THREADS];
  __shared__ int s_pick;
  const int r = blockIdx.x, tid = threadIdx.x;
  const int vocab = p.vocab;
  const float* raw = p.logits + (size_t)r * p.stride;
  const SampleArgs a = p.args[r];  // uploaded before the step
  pdl_wait();  // the logits are the LM head's output (where Gpu::pdl_small launches it with PDL)

  // The model's distribution: max, first argmax, log-partition.
  float raw_max;
  int raw_argmax;
  block_first(raw, vocab, __int_as_float(0x7f800000), -1, s_val, s_idx, &raw_max, &raw_argmax);
  float z = 0.f;
  for (int i = tid; i < vocab; i += blockDim.x) z += expf(raw[i] - raw_max);
  const float log_z = raw_max + logf(block_sum(z, scratch));

  // Its most likely tokens, one block pass each (k <= 20), in the CPU's order.
  float prev_v = __int_as_float(0x7f800000);
  int prev_i = -1;
  for (int j = 0; j < min(a.num_logprobs, SAMPLE_MAX_TOP); j++) {
    block_first(raw, vocab, prev_v, prev_i, s_val, s_idx, &prev_v, &prev_i);
    if (tid == 0) {
      const bool some = prev_i < vocab;
      p.top_ids[r * SAMPLE_MAX_TOP + j] = some ? prev_i : -1;
      p.top_logprobs[r * SAMPLE_MAX_TOP + j] = some ? prev_v - log_z : NEG_INF;
    }
  }

  // Edits and penalties into `work`.
  const float* row = raw;
  float mx = raw_max;
  int argmax = raw_argmax;
  u32* counts = a.counts_row >= 0 ? p.counts + (size_t)a.counts_row * p.stride : nullptr;
  if (a.num_edits > 0 || counts != nullptr) {
    float* w = p.work + (size_t)r * p.stride;
    for (int i = tid; i < vocab; i += blockDim.x) w[i] = penalize(raw[i], counts ? counts[i] : 0u, a);
    __syncthreads();
    for (int e = tid; e < a.num_edits; e += blockDim.x) {
      const SampleEdit ed = p.edits[a.edit_start + e];
      w[ed.token] = penalize(raw[ed.token] + ed.value, counts ? counts[ed.token] : 0u, a);
    }
    __syncthreads();
    float wmax;
    int warg;
    block_first(w, vocab, __int_as_float(0x7f800000), -1, s_val, s_idx, &wmax, &warg);
    // Everything masked cannot happen with valid params; sample the model's own then.
    if (wmax > NEG_INF) {
      row = w;
      mx = wmax;
      argmax = warg;
    }
  }

  const bool greedy = a.temperature == 0.f || a.top_k == 1;
  const int tok = greedy ? argmax : draw(row, vocab, mx, argmax, a, scratch, s_scan, &s_pick);
  if (tid == 0) {
    // NaN logits leave no maximum: the id is out of range and the host refuses it.
    const bool ok = tok >= 0 && tok < vocab;
    p.tokens[r] = tok;
    p.logprobs[r] = ok ? raw[tok] - log_z : __int_as_float(0x7fc00000);
    if (ok && counts != nullptr) counts[tok] += 1u;
  }
}

struct CountUpdate {  // counts[index] += delta, or, with delta == COUNT_PROMPT, the prompt bit set
  u32 index;          // row * vocab + token
  int delta;
};

#define COUNT_PROMPT ((int)0x80000000)

struct SampleCountsUpdateParams {
  u32* counts;                 // [count rows, vocab]
  const CountUpdate* updates;  // [num_updates]  an index may repeat (atomics)
  int num_updates;
};

// grid: enough 256-thread blocks for num_updates (grid-stride)
// Updates apply in any order, so a negative delta may only take back counts present before the
// launch (the executor's take-backs are of tokens the sampler counted in an earlier step): a
// count that went below zero mid-launch would borrow into the prompt bit.
extern "C" __global__ void sample_counts_update(SampleCountsUpdateParams p) {
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < p.num_updates; k += gridDim.x * blockDim.x) {
    const CountUpdate u = p.updates[k];
    if (u.delta == COUNT_PROMPT) atomicOr(p.counts + u.index, COUNT_PROMPT_BIT);
    else atomicAdd(p.counts + u.index, (u32)u.delta);
  }
}

struct SampleCountsMoveParams {
  u32* counts;  // [count rows, vocab]
  int from;     // row whose counts row `to` takes
  int to;
  int vocab;
};

// grid: enough 256-thread blocks for vocab (grid-stride)
extern "C" __global__ void sample_counts_move(SampleCountsMoveParams p) {
  const u32* src = p.counts + (size_t)p.from * p.vocab;
  u32* dst = p.counts + (size_t)p.to * p.vocab;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.vocab; i += gridDim.x * blockDim.x) {
    dst[i] = src[i];
  }
}
