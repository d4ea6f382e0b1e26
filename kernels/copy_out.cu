// A step's outputs to the host under pinned I/O (`CudaBackendOptions::pinned_io`, and lookahead,
// which implies it): the output buffer's first `words` words stored by a kernel straight into the
// stage's page-locked host memory, mapped into the device's address space, in stream order like
// any kernel. Why not the copy engine's device-to-host copy: with lookahead (the next step queued
// behind it) that made each batch-1 step ~15 µs longer and the GPU's idle gap between steps 17
// instead of 11 µs on an H100 (BENCHMARKS.md, session 30 call 9).
struct CopyOutParams {
  const u32* src;  // [words]  the step's output buffer (device)
  u32* dst;        // [words]  a pinned stage (host memory, its device address)
  int words;
};

// grid: ceil(words / 256), block: 256
extern "C" __global__ void copy_out(CopyOutParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.words) p.dst[i] = p.src[i];
}
