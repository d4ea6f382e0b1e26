// A step's outputs to the host under pinned I/O (`CudaBackendOptions::pinned_io`, and lookahead,
// which implies it): the output buffer's first `words` words stored by a kernel straight into the
// stage's page-locked host memory, mapped into the device's address space. Why not a
// device-to-host copy: an async copy enqueued behind the step cost ~45 µs a step of wall time on
// an H100 at batch 1 (BENCHMARKS.md, session 30 calls 6-8), against a pageable copy's ~0; a
// kernel's stores to mapped memory are posted PCIe writes, in stream order like any kernel.
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
