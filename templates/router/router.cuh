// A mixture-of-experts router in one launch: logits = x W^T, softmax over the experts, the top k,
// optionally renormalized and scaled. What transformers' routers run as four to six kernels (a
// cuBLAS GEMM of 1-16 rows, softmax, topk's two passes, the division, a cast): at one decode token
// each is a few microseconds of launch and latency for ~0.5 MB of router weight.
//
// Grid: x = expert blocks (kExperts experts a CTA, each over kSplit warps that divide H), y = token
// tiles (kTokens tokens a CTA, their x rows staged in dynamic shared memory; each weight vector is
// read once for the tile). Every CTA writes its
// experts' logits, rounded as the model's linear rounds them (type L), to the logits output; the
// last CTA of a token tile to finish (an arrival counter per tile) reads the tile's logits back and
// selects, one warp per token. The last CTA resets its counter, so counters are zero between
// launches: CUDA-graph replays need no memset. Launches that share counters must not overlap (one
// router layer runs on one stream at a time; the Python side keeps counters per router module).
//
// Numerics as transformers': fp32 dot products, logits rounded to L, softmax in fp32 over the
// rounded logits, top-k by probability (ties: the lower expert index), renormalization by the
// fp32 sum of the k probabilities, then the scale, rounded once to S. Summation orders differ from
// cuBLAS and torch's softmax, so a logit may differ in its last bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

namespace mixed_gemm {

constexpr int kRouterMaxExperts = 256;  // the selecting warp keeps E / 32 probabilities a lane
constexpr int kRouterMaxTopK = 32;      // one selected expert a lane
constexpr int kRouterVector = 8;        // x elements per load (16 bytes of fp16 / bf16)
constexpr int kRouterUnroll = 4;        // weight vectors a lane has in flight: H <= 1024 x kSplit in one round trip

struct RouterArgs {
  void const* x;        // (tokens, hidden) X, contiguous
  void const* weight;   // (experts, hidden) W, contiguous
  void* logits;         // (tokens, experts) L
  void* scores;         // (tokens, top_k) S
  long long* ids;       // (tokens, top_k)
  int* counters;        // one per token tile, zero between launches
  int tokens, experts, hidden, top_k;
  int renormalize;      // divide the k probabilities by their sum
  float scale;          // then multiply them by this
};

template <typename T> struct RouterElement;
template <> struct RouterElement<__half> {
  static __device__ float to_float(__half v) { return __half2float(v); }
  static __device__ __half from_float(float v) { return __float2half_rn(v); }
};
template <> struct RouterElement<__nv_bfloat16> {
  static __device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};
template <> struct RouterElement<float> {
  static __device__ float to_float(float v) { return v; }
  static __device__ float from_float(float v) { return v; }
};

// Eight consecutive elements as floats: one 16-byte load of 16-bit values, two of fp32.
template <typename T>
__device__ __forceinline__ void router_load8(T const* p, float (&out)[8]) {
  if constexpr (sizeof(T) == 4) {
    float4 a = __ldg(reinterpret_cast<float4 const*>(p)), b = __ldg(reinterpret_cast<float4 const*>(p) + 1);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
  } else {
    uint4 v = __ldg(reinterpret_cast<uint4 const*>(p));
    T const* e = reinterpret_cast<T const*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = RouterElement<T>::to_float(e[i]);
  }
}

// Eight consecutive 16-bit elements of the staged x tile (shared memory) as floats.
template <typename X>
__device__ __forceinline__ void router_smem8(X const* p, float (&out)[8]) {
  uint4 v = *reinterpret_cast<uint4 const*>(p);
  X const* e = reinterpret_cast<X const*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = RouterElement<X>::to_float(e[i]);
}

__device__ __forceinline__ float router_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float router_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One token's selection by one warp: probabilities from the rounded logits, then k rounds of a
// warp argmax; lane i keeps the i-th pick and writes it. A probability p >= 0 is ordered as its
// bit pattern, so a round is two redux.sync (the largest key, then the lowest expert id holding
// it) instead of ten dependent shuffles. Key = bits(p) + 1; 0 marks a taken or absent expert.
template <typename L, typename S>
__device__ void router_select(RouterArgs const& a, int token, int lane) {
  constexpr int kSlots = kRouterMaxExperts / 32;
  L const* logits = static_cast<L const*>(a.logits) + static_cast<size_t>(token) * a.experts;
  float p[kSlots];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    int e = lane + 32 * j;
    // ld.global.cg: other CTAs wrote these logits; L1 is not coherent with their stores.
    p[j] = e < a.experts ? RouterElement<L>::to_float(__ldcg(logits + e)) : -INFINITY;
    m = fmaxf(m, p[j]);
  }
  m = router_warp_max(m);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    p[j] = lane + 32 * j < a.experts ? expf(p[j] - m) : 0.f;
    sum += p[j];
  }
  sum = router_warp_sum(sum);
  unsigned key[kSlots];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) key[j] = lane + 32 * j < a.experts ? __float_as_uint(p[j] / sum) + 1u : 0u;

  unsigned mine = 0u, mine_id = 0u;
  for (int i = 0; i < a.top_k; ++i) {
    unsigned best = 0u, best_id = 0xffffffffu;
#pragma unroll
    for (int j = 0; j < kSlots; ++j)  // ascending expert ids: the first of equal keys wins
      if (key[j] > best) { best = key[j]; best_id = lane + 32 * j; }
    unsigned const top = __reduce_max_sync(0xffffffffu, best);
    unsigned const id = __reduce_min_sync(0xffffffffu, best == top ? best_id : 0xffffffffu);
    if (lane == i) { mine = top; mine_id = id; }
    if ((id & 31u) == static_cast<unsigned>(lane)) {
#pragma unroll
      for (int j = 0; j < kSlots; ++j)  // a register array indexed by a constant: no local memory
        if (j == static_cast<int>(id >> 5)) key[j] = 0u;
    }
  }
  float const value = lane < a.top_k ? __uint_as_float(mine - 1u) : 0.f;
  float const total = router_warp_sum(value);
  if (lane < a.top_k) {
    float w = a.renormalize ? value / total : value;
    size_t at = static_cast<size_t>(token) * a.top_k + lane;
    static_cast<S*>(a.scores)[at] = RouterElement<S>::from_float(w * a.scale);
    a.ids[at] = mine_id;
  }
}

template <typename X, typename W, typename L, typename S, int kWarps, int kSplit, int kTokens>
__device__ void topk_router(RouterArgs const& a) {
  static_assert(kWarps % kSplit == 0, "a CTA's warps cover whole experts");
  constexpr int kExperts = kWarps / kSplit;
  __shared__ float partial[kWarps][kTokens];
  __shared__ int last;
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const tile = blockIdx.y, t0 = tile * kTokens;
  int const nt = min(kTokens, a.tokens - t0);
  int const e = blockIdx.x * kExperts + warp / kSplit, part = warp % kSplit;

  // A multi-token tile stages its x rows in shared memory once (dynamic, nt x hidden elements):
  // read from global inside the dot loop, each token's x vector was an L1/L2 round trip per weight
  // vector (measured: the 8-token tile at 16 tokens 18.7 us against 14.6 for one token a CTA).
  extern __shared__ uint4 router_x_tile[];
  X const* x = static_cast<X const*>(a.x) + static_cast<size_t>(t0) * a.hidden;
  if constexpr (kTokens > 1) {
    uint4 const* src = reinterpret_cast<uint4 const*>(x);
    int const vecs = nt * a.hidden / kRouterVector;
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) router_x_tile[i] = __ldg(src + i);
    __syncthreads();
    x = reinterpret_cast<X const*>(router_x_tile);
  }

  float acc[kTokens];
#pragma unroll
  for (int t = 0; t < kTokens; ++t) acc[t] = 0.f;
  if (e < a.experts) {
    W const* w = static_cast<W const*>(a.weight) + static_cast<size_t>(e) * a.hidden;
    int const vectors = a.hidden / kRouterVector, stride = kSplit * 32;
    // kRouterUnroll weight vectors issued before any is used: the weight comes from HBM once per
    // call, so a lane's loads must overlap; x is a few KB every warp reads (L1/L2 hits).
    for (int base = part * 32 + lane; base < vectors; base += kRouterUnroll * stride) {
      float wv[kRouterUnroll][8];
#pragma unroll
      for (int u = 0; u < kRouterUnroll; ++u) {
        int v = base + u * stride;
        if (v < vectors) router_load8(w + static_cast<size_t>(v) * kRouterVector, wv[u]);
      }
#pragma unroll
      for (int u = 0; u < kRouterUnroll; ++u) {
        int v = base + u * stride;
        if (v >= vectors) break;
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          if (t < nt) {
            float xv[8];
            X const* xp = x + static_cast<size_t>(t) * a.hidden + static_cast<size_t>(v) * kRouterVector;
            if constexpr (kTokens > 1) router_smem8(xp, xv); else router_load8(xp, xv);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[t] = fmaf(xv[i], wv[u][i], acc[t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float s = router_warp_sum(acc[t]);
    if (lane == 0) partial[warp][t] = s;
  }
  __syncthreads();
  if (e < a.experts && part == 0 && lane < nt) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kSplit; ++k) s += partial[warp + k][lane];
    static_cast<L*>(a.logits)[static_cast<size_t>(t0 + lane) * a.experts + e] = RouterElement<L>::from_float(s);
  }
  // The barrier orders the CTA's logit stores before thread 0's fence (fences are cumulative),
  // which orders them before its arrival ticket; the CTA that draws the last ticket fences again
  // before its threads read the others' logits (cooperative groups' grid sync, the same way).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    bool const is_last = atomicAdd(a.counters + tile, 1) == static_cast<int>(gridDim.x) - 1;
    if (is_last) __threadfence();
    last = is_last;
  }
  __syncthreads();
  if (!last) return;
  for (int t = warp; t < nt; t += kWarps) router_select<L, S>(a, t0 + t, lane);
  if (threadIdx.x == 0) a.counters[tile] = 0;  // ready for the next launch (kernels on a stream run in order)
}

}  // namespace mixed_gemm
