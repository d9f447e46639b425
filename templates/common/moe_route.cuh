// The memory-bound step after the down GEMM of the moe_sm90a and moe_sm80 families, the top-k
// weighted sum, in one pass over its rows (as torch operations it was several passes with fp32
// intermediates: at Mixtral's 4096 tokens GBs of traffic beside the GEMMs). SiLU(gate) * up is in
// the gate|up GEMMs' epilogues (common/gate_up.cuh).
//
// Rows are 16-byte vectors of 8 activations: N, I and H are multiples of 8 (the family's rule).
#pragma once

#include <cstdint>

#include "cutlass/numeric_types.h"
#include "cutlass/numeric_conversion.h"

namespace mixed_gemm {
namespace moe_route {

constexpr int kRouteThreads = 256;  // threads per CTA: 8 columns each
constexpr int kVec = 8;             // activations per 16-byte vector

template <class T>
struct alignas(16) Vec {
  T v[kVec];
};

// y[t, c] = sum over slots j in order of weights[t, j] * o[pos[t k + j], c] (fp32, one rounding);
// pos < 0 marks a pair no expert computed (adds nothing). grid (tokens, ceil(H / 8 / threads)).
template <class T>
__device__ void combine(T const* o, int const* pos, float const* weights, T* y, int hidden, int top_k) {
  int64_t t = blockIdx.x;
  int c = (blockIdx.y * kRouteThreads + threadIdx.x) * kVec;
  if (c >= hidden) return;
  float acc[kVec] = {};
  for (int j = 0; j < top_k; ++j) {
    int64_t const p = pos[t * top_k + j];
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
