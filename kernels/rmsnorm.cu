// Fused residual add + RMSNorm. The residual stream stays fp32 (it accumulates 2 x layers
// updates); the normalised output is bf16, the next GEMM's input.
struct AddRmsNormParams {
  float* residual;      // [num_tokens, d]   updated in place: residual += delta
  const bf16* delta;    // [num_tokens, d]   or null: normalise only
  const bf16* weight;   // [d]
  const int* rows;      // [num_rows] residual rows to process, or null: row i = i
  bf16* out;            // [num_rows, d]
  int num_rows;
  int d;
  float eps;
};

// grid: num_rows, block: 256. d <= 256 * 32.
// Launched with PDL: it waits for the kernel that wrote delta before touching the residual.
extern "C" __global__ void add_rmsnorm(AddRmsNormParams p) {
  __shared__ float scratch[32];
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x;
  const int row = p.rows ? p.rows[i] : i;
  float* res = p.residual + (size_t)row * p.d;
  const bf16* delta = p.delta ? p.delta + (size_t)row * p.d : nullptr;
  float local[32];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < 32; k++) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < p.d) {
      float v = res[j];
      if (delta) {
        v += bf2f(delta[j]);
        res[j] = v;
      }
      local[k] = v;
      ss += v * v;
    }
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / p.d + p.eps);
  bf16* out = p.out + (size_t)i * p.d;
#pragma unroll
  for (int k = 0; k < 32; k++) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < p.d) out[j] = f2bf(local[k] * inv * bf2f(p.weight[j]));
  }
}
