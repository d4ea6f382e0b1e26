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

// 8-element chunks per thread: d <= 256 * 8 * RMS_CHUNKS.
#define RMS_CHUNKS 4

// grid: num_rows, block: 256. d % 8 == 0, d <= 8192.
// At batch 1 this is one CTA on the critical path between two GEMVs, so it is latency that
// counts: every load (16-byte vectors) is issued before any value is used or stored — one round
// trip to memory instead of one per element (the stores to `residual` kept the compiler from
// hoisting the loads of the scalar loop this replaces: 15.7 us under ncu, call 2026-12-02g).
// Launched with PDL: the norm weight (never written by a kernel) is fetched before it waits for
// the kernel that wrote delta.
extern "C" __global__ void add_rmsnorm(AddRmsNormParams p) {
  __shared__ float scratch[32];
  pdl_trigger();
  const int n8 = p.d / 8;
  uint4 wv[RMS_CHUNKS];
#pragma unroll
  for (int k = 0; k < RMS_CHUNKS; k++) {
    const int c = threadIdx.x + k * blockDim.x;
    wv[k] = c < n8 ? ((const uint4*)p.weight)[c] : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  const int i = blockIdx.x;
  const int row = p.rows ? p.rows[i] : i;
  float4* res = (float4*)(p.residual + (size_t)row * p.d);
  const uint4* delta = p.delta ? (const uint4*)(p.delta + (size_t)row * p.d) : nullptr;
  float4 r[RMS_CHUNKS][2];
  uint4 dv[RMS_CHUNKS];
#pragma unroll
  for (int k = 0; k < RMS_CHUNKS; k++) {
    const int c = threadIdx.x + k * blockDim.x;
    const bool in = c < n8;
    r[k][0] = in ? res[2 * c] : make_float4(0.f, 0.f, 0.f, 0.f);
    r[k][1] = in ? res[2 * c + 1] : make_float4(0.f, 0.f, 0.f, 0.f);
    dv[k] = in && delta ? delta[c] : make_uint4(0, 0, 0, 0);
  }
  float v[RMS_CHUNKS][8];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < RMS_CHUNKS; k++) {
    const u32 dd[4] = {dv[k].x, dv[k].y, dv[k].z, dv[k].w};
    const float rr[8] = {r[k][0].x, r[k][0].y, r[k][0].z, r[k][0].w,
                         r[k][1].x, r[k][1].y, r[k][1].z, r[k][1].w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      v[k][2 * e] = rr[2 * e] + bf_lo(dd[e]);
      v[k][2 * e + 1] = rr[2 * e + 1] + bf_hi(dd[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) ss += v[k][e] * v[k][e];
  }
  if (delta) {
#pragma unroll
    for (int k = 0; k < RMS_CHUNKS; k++) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < n8) {
        res[2 * c] = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
        res[2 * c + 1] = make_float4(v[k][4], v[k][5], v[k][6], v[k][7]);
      }
    }
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / p.d + p.eps);
  uint4* out = (uint4*)(p.out + (size_t)i * p.d);
#pragma unroll
  for (int k = 0; k < RMS_CHUNKS; k++) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= n8) continue;
    const u32 ww[4] = {wv[k].x, wv[k].y, wv[k].z, wv[k].w};
    u32 o[4];
#pragma unroll
    for (int e = 0; e < 4; e++)
      o[e] = pack_bf16x2(v[k][2 * e] * inv * bf_lo(ww[e]), v[k][2 * e + 1] * inv * bf_hi(ww[e]));
    out[c] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}
