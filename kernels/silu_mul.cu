// SwiGLU activation: out = silu(gate) * up, from the fused gate|up projection. Its input is the
// GEMM's fp32 output: rounding gate and up to bf16 before the product costs accuracy for nothing.
struct SiluMulParams {
  const float* gate_up;  // [num_tokens, 2 * inter]   gate in [:, :inter], up in [:, inter:]
  bf16* out;            // [num_tokens, inter]
  int num_tokens;
  int inter;
};

// grid: (ceil(inter / 256), num_tokens), block: 256
extern "C" __global__ void silu_mul(SiluMulParams p) {
  pdl_trigger();  // the down projection may start streaming its weights
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.inter) return;
  const float* row = p.gate_up + (size_t)t * 2 * p.inter;
  const float g = row[i];
  p.out[(size_t)t * p.inter + i] = f2bf(g / (1.f + expf(-g)) * row[p.inter + i]);
}
