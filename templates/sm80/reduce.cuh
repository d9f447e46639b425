// Parallel split-K: C[m, n] = sum over slices of workspace[slice, m, n] (+ bias[n]) (+ residual[m, n]),
// fp32 sums in slice order (deterministic), one rounding to the output type at the end.
#pragma once

#include "common/dequant.cuh"

namespace mixed_gemm {

struct ReduceArgs {
  float const* workspace;  // (splits, M, N) fp32
  void const* bias;        // (N,) or nullptr
  void const* residual;    // (M, N), row stride ldc, or nullptr
  void* c;                 // (M, N), row stride ldc
  int m, n, ldc, splits;
};

// v + bias[col, col + 1] + residual[at, at + 1], either term absent when its pointer is null: the
// terms every sm80 epilogue adds in fp32 before its one rounding (a decoder block's skip
// connection added here costs no add kernel and no second rounding).
template <typename Element>
__device__ __forceinline__ float2 add_terms(float2 v, void const* bias, void const* residual, int col, size_t at) {
  using P = Pair<Element>;
  using raw = typename P::raw;
  using raw2 = typename P::raw2;
  if (bias != nullptr) {
    float2 const b = P::to_floats(*reinterpret_cast<raw2 const*>(static_cast<raw const*>(bias) + col));
    v.x += b.x;
    v.y += b.y;
  }
  if (residual != nullptr) {
    float2 const r = P::to_floats(*reinterpret_cast<raw2 const*>(static_cast<raw const*>(residual) + at));
    v.x += r.x;
    v.y += r.y;
  }
  return v;
}

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
    size_t const at = (size_t)row * p.ldc + col;
    v = add_terms<Element>(v, p.bias, p.residual, col, at);
    *reinterpret_cast<raw2*>(static_cast<raw*>(p.c) + at) = P::from_floats(v.x, v.y);
  }
}

}  // namespace mixed_gemm
