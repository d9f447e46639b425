// Parallel split-K: C[m, n] = sum over slices of workspace[slice, m, n] (+ bias[n]), fp32 sums in
// slice order (deterministic), one rounding to the output type at the end.
#pragma once

#include "common/dequant.cuh"

namespace mixed_gemm {

struct ReduceArgs {
  float const* workspace;  // (splits, M, N) fp32
  void const* bias;        // (N,) or nullptr
  void* c;                 // (M, N), row stride ldc
  int m, n, ldc, splits;
};

template <typename Element>
__device__ void splitk_reduce(ReduceArgs const& p) {
  using P = Pair<Element>;
  using raw = typename P::raw;
  using raw2 = typename P::raw2;
  // Two columns per thread: N is even, so float2 / raw2 accesses stay in bounds and aligned.
  size_t const pairs = (size_t)p.m * p.n / 2;
  size_t const plane = (size_t)p.m * p.n;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < pairs; i += (size_t)gridDim.x * blockDim.x) {
    size_t const e = 2 * i;
    int const row = int(e / p.n), col = int(e % p.n);
    float2 v = *reinterpret_cast<float2 const*>(p.workspace + e);
    for (int s = 1; s < p.splits; ++s) {
      float2 w = *reinterpret_cast<float2 const*>(p.workspace + s * plane + e);
      v.x += w.x;
      v.y += w.y;
    }
    if (p.bias != nullptr) {
      float2 b = P::to_floats(*reinterpret_cast<raw2 const*>(static_cast<raw const*>(p.bias) + col));
      v.x += b.x;
      v.y += b.y;
    }
    *reinterpret_cast<raw2*>(static_cast<raw*>(p.c) + (size_t)row * p.ldc + col) = P::from_floats(v.x, v.y);
  }
}

}  // namespace mixed_gemm
