// Synthetic weights straight on the GPU: value = offset + scale * (2u - 1), u uniform in [0, 1)
// from (seed, element index), so a model of any size appears without touching the host.
struct FillParams {
  bf16* out;     // [n]
  u64 n;
  u64 seed;
  float scale;
  float offset;
};

// grid-stride; any grid
extern "C" __global__ void fill_uniform(FillParams p) {
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < p.n; i += (u64)gridDim.x * blockDim.x) {
    p.out[i] = f2bf(p.offset + p.scale * (2.f * uniform01(p.seed, i) - 1.f));
  }
}
