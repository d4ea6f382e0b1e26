// Embedding gather: the residual stream starts as the token's embedding row, in fp32.
struct EmbeddingParams {
  const bf16* table;   // [vocab, d]
  const u32* tokens;   // [num_tokens]
  float* out;          // [num_tokens, d]
  int num_tokens;
  int d;
};

// grid: num_tokens, block: 256
extern "C" __global__ void embedding(EmbeddingParams p) {
  const int t = blockIdx.x;
  const bf16* row = p.table + (size_t)p.tokens[t] * p.d;
  float* out = p.out + (size_t)t * p.d;
  for (int i = threadIdx.x; i < p.d; i += blockDim.x) out[i] = bf2f(row[i]);
}
