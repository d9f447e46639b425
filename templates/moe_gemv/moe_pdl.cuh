// Programmatic dependent launch (PDL, sm_90+) of the two-launch decode (docs/notes/moe.md, "PDL
// for the two-launch decode"). The down kernel is launched with programmatic stream serialization
// (kernels/moe_gemv/launch.py, when enabled): it may start while the gate|up kernel still runs.
//
//   - gate|up: griddepcontrol.launch_dependents at the start of every CTA. It only makes the
//     dependent grid eligible to launch once every CTA of this grid has executed it (or exited), so
//     it is correct anywhere; at the start is the earliest point, and nothing later would serve
//     better: a CTA's weight loads are issued all through its streaming main loop, not in one batch
//     to wait for, and by the time the last CTA has started every CTA of this grid holds its SM slot
//     (the dependents take only what is left or what retiring CTAs free, never a slot this grid
//     still needs).
//   - down: before griddepcontrol.wait only reads of what exists before the gate|up kernel starts
//     (the routing ids, which the router wrote before gate|up was launched -- gate|up itself is an
//     ordinary launch, so it began after them --, and the experts' weights), writes to the CTA's own
//     shared memory, and an L2 prefetch of the weight slices the CTA is about to stream (pair and
//     persistent mode; expert mode waits first: moe_gemv.cuh says why). Then the wait, in every
//     thread (it orders only the executing thread), which returns once the gate|up grid has
//     completed and its memory is visible. After it: h, and every global write -- the split-K /
//     top-k planes and arrival counters come from the same per-stream workspace and semaphore area
//     the gate|up kernel's split-K uses (both start at its base), and y is written after it too.
//
// Both instructions are no-ops when the kernel was not launched that way, so one binary serves
// both; sm_80 builds (moe_gemv also targets Ampere) compile them out.
#pragma once

#include <cstdint>

namespace mixed_gemm {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Prefetch [p, p + bytes) into L2 with one cp.async.bulk.prefetch (sm_90: the TMA unit walks the
// range; no registers, no completion to wait for). Chosen over per-line prefetch.global.L2: the byte
// count is explicit (a line prefetch's fill size is the hardware's choice, possibly one 32-byte
// sector), and a slice's contiguous run (one K atom of the CTA's strips) is one instruction. The
// range is widened to 16-byte granules (the instruction's alignment rule); a granule holding a
// byte of the tensor lies inside its allocation.
__device__ __forceinline__ void prefetch_l2(void const* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uintptr_t const lo = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15);
  uintptr_t const hi = (reinterpret_cast<uintptr_t>(p) + bytes + 15) & ~uintptr_t(15);
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(unsigned(hi - lo)) : "memory");
#endif
}

}  // namespace mixed_gemm
