// (call 12's kernels/copy_in.cu, untracked then, so not in call12-build.diff)
// A step's metadata to the device under pinned I/O (`CudaBackendOptions::pinned_io`, and
// lookahead, which implies it): loaded by a kernel straight from the stage's page-locked,
// write-combined host memory, mapped into the device's address space, in stream order like any
// kernel. Why not the copy engine's host-to-device copy: with it, a host spinning on the last
// step's outputs made each batch-1 step ~35 µs (0.7 %) longer on an H100, and lookahead's steps
// too; loaded by this kernel, and with a host asleep while a step is queued, neither did
// (BENCHMARKS.md, session 31).
struct CopyInParams {
  const u32* src;  // [words]  a pinned stage (host memory, its device address)
  u32* dst;        // [words]  the step's metadata buffer (device)
  int words;
};

// grid: ceil(words / 256), block: 256
extern "C" __global__ void copy_in(CopyInParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.words) p.dst[i] = p.src[i];
}
