// KV block staging for the host tier's copies (src/executor/cuda/kv_tier.rs): the blocks of one
// batch of swaps gathered out of the paged pool into a contiguous device buffer, block-major
// like the host tier (one block's planes back to back), so that each direction is one large
// copy per run of host blocks instead of one small copy per (block, plane); and scattered back
// into the pool on the way in. One kernel, both ways (`to_staging`).
//
// Pool layout: `planes` planes (layer l's K is plane 2l, its V 2l + 1), plane p at
// pool + p * plane_stride, each [num_blocks, plane_bytes]. Block ids travel in the parameter
// struct (at most KV_STAGE_MAX_BLOCKS per launch), so a launch needs no upload before it.
#define KV_STAGE_MAX_BLOCKS 64

struct KvStageParams {
  unsigned char* pool;     // planes x [num_blocks, plane_bytes], plane p at pool + p * plane_stride
  unsigned char* staging;  // [n, planes, plane_bytes]
  long long plane_stride;  // bytes between planes, a multiple of 16
  long long plane_bytes;   // bytes of one block in one plane, a multiple of 16
  int planes;
  int n;                   // blocks, 1 .. KV_STAGE_MAX_BLOCKS
  int to_staging;          // 1: pool -> staging (gather); 0: staging -> pool (scatter)
  int blocks[KV_STAGE_MAX_BLOCKS];  // [n] pool block of staging slot i (distinct when scattering)
};

// grid: (x: any, planes, n), block: 256. Each thread moves 16-byte words of one (block, plane),
// grid-stride over the plane's words.
extern "C" __global__ void kv_stage(KvStageParams p) {
  const int i = blockIdx.z, plane = blockIdx.y;
  const long long words = p.plane_bytes / 16;
  uint4* pool = (uint4*)(p.pool + plane * p.plane_stride + (long long)p.blocks[i] * p.plane_bytes);
  uint4* st = (uint4*)(p.staging + ((long long)i * p.planes + plane) * p.plane_bytes);
  for (long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x; w < words;
       w += (long long)gridDim.x * blockDim.x) {
    if (p.to_staging) {
      st[w] = pool[w];
    } else {
      pool[w] = st[w];
    }
  }
}
