// SwiGLU activation: out = silu(gate) * up, from the fused gate|up projection. `silu_mul` reads
// the GEMM's fp32 output (gate and up rounded to bf16 only in the product); `silu_mul_bf16` reads
// a bf16 output (CudaBackendOptions::gate_up_bf16, as HF transformers and vLLM compute it): half
// the bytes of a prefill's largest activation, written by the GEMM and read back here.
struct SiluMulParams {
  const void* gate_up;  // [num_tokens, 2 * inter]   f32 or bf16; gate in [:, :inter], up after
  bf16* out;            // [num_tokens, inter]
  int num_tokens;
  int inter;
};

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.f + expf(-g)) * u; }

__device__ __forceinline__ float4 load4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float4 load4(const bf16* p) {
  const uint2 v = *(const uint2*)p;
  return make_float4(bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y));
}
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const bf16* p) { return bf2f(*p); }

// Four outputs a thread: 16-byte (fp32) or 8-byte (bf16) loads of gate and up and one 8-byte
// store when inter % 4 == 0 (the scalar kernel this replaces moved ~2 TB/s: 109 us a layer for a
// 2048-token prefill of Llama-2-7B under ncu); element by element otherwise.
// grid: (ceil(inter / 1024), num_tokens), block: 256
template <typename T>
__device__ __forceinline__ void silu_mul_impl(const SiluMulParams& p) {
  // The down projection may launch now, while gate|up drains, and fill its ring on the SMs that
  // projection leaves: triggered after the wait instead, batch-1 decode lost most of the 1.3 %
  // that launching this kernel with PDL gained on an H100 (BENCHMARKS.md, session 37).
  pdl_trigger();
  pdl_wait();  // gate|up is the projection's output (a PDL launch: Gpu::pdl_small)
  const int t = blockIdx.y;
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i >= p.inter) return;
  const T* row = (const T*)p.gate_up + (size_t)t * 2 * p.inter;
  bf16* out = p.out + (size_t)t * p.inter;
  if ((p.inter & 3) == 0) {
    const float4 g = load4(row + i);
    const float4 u = load4(row + p.inter + i);
    *(uint2*)(out + i) = make_uint2(pack_bf16x2(silu_times(g.x, u.x), silu_times(g.y, u.y)),
                                    pack_bf16x2(silu_times(g.z, u.z), silu_times(g.w, u.w)));
    return;
  }
  for (int e = i; e < min(i + 4, p.inter); e++)
    out[e] = f2bf(silu_times(load1(row + e), load1(row + p.inter + e)));
}

extern "C" __global__ void silu_mul(SiluMulParams p) { silu_mul_impl<float>(p); }
extern "C" __global__ void silu_mul_bf16(SiluMulParams p) { silu_mul_impl<bf16>(p); }
