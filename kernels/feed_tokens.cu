// Lookahead decode (`CudaBackendOptions::lookahead`): the input tokens of a step launched before
// the host has read the previous step's samples are those samples, copied on the device. A
// sample outside the vocabulary (non-finite logits; the host fails that step) becomes token 0 so
// the embedding never reads past its table; the host compares what was fed with what it recorded
// before it keeps the step.
struct FeedTokensParams {
  const int* sampled;  // [n]  the previous step's sampled tokens, in its sampled-row order
  u32* tokens;         // [n]  this step's input tokens (one per decode sequence, same order)
  int n;
  int vocab;
};

// grid: ceil(n / 256), block: 256
extern "C" __global__ void feed_tokens(FeedTokensParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) {
    const int s = p.sampled[i];
    p.tokens[i] = s >= 0 && s < p.vocab ? (u32)s : 0u;
  }
}
