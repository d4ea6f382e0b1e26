// Embedding gather: the residual stream starts as the token's embedding row, in fp32.
// Under tensor parallelism a rank holds the vocabulary rows [vocab_start, vocab_start +
// vocab_rows): tokens outside them give zero rows, and the all-reduce that follows adds the one
// rank's row that holds the token.
struct EmbeddingParams {
  const bf16* table;   // [vocab_rows, d]
  const u32* tokens;   // [num_tokens], ids in the whole vocabulary
  float* out;          // [num_tokens, d]
  int num_tokens;
  int d;
  u32 vocab_start;     // 0 without tensor parallelism
  u32 vocab_rows;      // the table's rows (the vocabulary without tensor parallelism)
};

// grid: num_tokens, block: 256
extern "C" __global__ void embedding(EmbeddingParams p) {
  const int t = blockIdx.x;
  const u32 local = p.tokens[t] - p.vocab_start;  // wraps past vocab_rows below the slice
  float* out = p.out + (size_t)t * p.d;
  if (local >= p.vocab_rows) {
    for (int i = threadIdx.x; i < p.d; i += blockDim.x) out[i] = 0.f;
    return;
  }
  const bf16* row = p.table + (size_t)local * p.d;
  for (int i = threadIdx.x; i < p.d; i += blockDim.x) out[i] = bf2f(row[i]);
}
