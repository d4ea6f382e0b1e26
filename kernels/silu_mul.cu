// SwiGLU activation: out = silu(gate) * up, from the fused gate|up projection.
struct SiluMulParams {
  const bf16* gate_up;  // [num_tokens, 2 * inter]   gate in [:, :inter], up in [:, inter:]
  bf16* out;            // [num_tokens, inter]
  int num_tokens;
  int inter;
};

// grid: (ceil(inter / 256), num_tokens), block: 256
extern "C" __global__ void silu_mul(SiluMulParams p) {
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.inter) return;
  const bf16* row = p.gate_up + (size_t)t * 2 * p.inter;
  const float g = bf2f(row[i]);
  p.out[(size_t)t * p.inter + i] = f2bf(g / (1.f + expf(-g)) * bf2f(row[p.inter + i]));
}
