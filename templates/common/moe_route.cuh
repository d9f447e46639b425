// The two memory-bound steps around the grouped GEMMs of the moe_sm90a and moe_sm80 families, one pass each over
// their rows (as torch operations they were eight passes with fp32 intermediates: at Mixtral's
// 4096 tokens several GB of traffic beside a 6 ms GEMM).
//
// Rows are 16-byte vectors of 8 activations: N, I and H are multiples of 8 (the family's rule).
#pragma once

#include <cstdint>

#include "cutlass/numeric_types.h"
#include "cutlass/numeric_conversion.h"

namespace mixed_gemm {
namespace moe_route {

constexpr int kRouteThreads = 256;  // threads per CTA of both kernels: 8 columns each
constexpr int kVec = 8;             // activations per 16-byte vector

template <class T>
struct alignas(16) Vec {
  T v[kVec];
};

// h[order[r], c] = silu(g[r, c]) * g[r, I + c] for the sorted rows r < *used (fp32, one rounding);
// 0 for the rows of pairs no expert computed (out-of-range ids sort last). grid (rows, ceil(I / 8 /
// threads)): rows on grid.x, whose limit (2^31 - 1) no row count reaches.
template <class T>
__device__ void silu_mul_scatter(T const* g, int64_t const* order, int64_t const* used, T* h, int inter) {
  int64_t r = blockIdx.x;
  int c = (blockIdx.y * kRouteThreads + threadIdx.x) * kVec;
  if (c >= inter) return;
  Vec<T> out;
  if (r < *used) {
    Vec<T> gate = *reinterpret_cast<Vec<T> const*>(g + r * 2 * inter + c);
    Vec<T> up = *reinterpret_cast<Vec<T> const*>(g + r * 2 * inter + inter + c);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float a = float(gate.v[i]);
      out.v[i] = T(a / (1.0f + __expf(-a)) * float(up.v[i]));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) out.v[i] = T(0.0f);
  }
  *reinterpret_cast<Vec<T>*>(h + order[r] * inter + c) = out;
}

// y[t, c] = sum over slots j in order of weights[t, j] * o[pos[t k + j], c] (fp32, one rounding);
// pos < 0 marks a pair no expert computed (adds nothing). grid (tokens, ceil(H / 8 / threads)).
template <class T>
__device__ void combine(T const* o, int64_t const* pos, float const* weights, T* y, int hidden, int top_k) {
  int64_t t = blockIdx.x;
  int c = (blockIdx.y * kRouteThreads + threadIdx.x) * kVec;
  if (c >= hidden) return;
  float acc[kVec] = {};
  for (int j = 0; j < top_k; ++j) {
    int64_t p = pos[t * top_k + j];
    if (p < 0) continue;
    float w = weights[t * top_k + j];
    Vec<T> row = *reinterpret_cast<Vec<T> const*>(o + p * hidden + c);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] += w * float(row.v[i]);
  }
  Vec<T> out;
#pragma unroll
  for (int i = 0; i < kVec; ++i) out.v[i] = T(acc[i]);
  *reinterpret_cast<Vec<T>*>(y + t * hidden + c) = out;
}

}  // namespace moe_route
}  // namespace mixed_gemm
