// Step timing (gpu-bench, `CudaBackendOptions::step_timing`): the GPU's global nanosecond timer
// into one slot. Launched as the first and the last kernel of a step's forward (inside its CUDA
// graph), so the host can measure the idle gap between one step's last kernel and the next
// step's first: the host's share of a step.
struct StampParams {
  u64* stamps;  // [2]  (first kernel's start, last kernel's end) of the step, in ns
  int slot;
};

// grid: 1, block: 1
extern "C" __global__ void stamp(StampParams p) {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  p.stamps[p.slot] = t;
}
