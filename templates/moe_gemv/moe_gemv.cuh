// Grouped decode GEMMs of a mixture-of-experts layer in "pair mode" (issue #24, docs/moe-plan.md
// section 5.1): every (token t, slot j) pair p = t * top_k + j of a top-k router multiplies one
// row of activations by the weight of its expert e = topk_ids[t, j], read from a stack of sm90a
// layout weights (expert e at a fixed element stride). Two launches per layer, no host sync:
//
//   kGateUp: h[p, i] = silu(x[t] . Wg_e[i]) * (x[t] . Wu_e[i])   (w13[e] = (2I, H): gate rows [0, I),
//            up rows [I, 2I)); h is (T * top_k, I) in the activation dtype.
//   kDown:   y[t, n] = sum_j topk_weights[t, j] * (h[t * top_k + j] . W2_e[n])   (w2[e] = (H, I)).
//
// Why this shape. At decode every pair is one token: the kernel is gemv.cuh's FMA variant for one
// row of x (kFmaTokens = 1: no mma n8 tile that would be 7/8 padding), with the same atom loads
// straight from global memory, converters and group-parameter reuse (gemv_mainloop). A CTA reads
// its expert id first and offsets the weight, scale and zero bases by that expert's stride, so no
// alignment step (sorting pairs by expert) runs before it: at T = 1 each of the k pairs reads its
// own expert once, which is all the bytes there are. Repeated experts (T > 1) are re-read, mostly
// from L2; the host picks this path only while that stays cheap (kernels/moe_gemv/heuristics.py).
//
// Rounding points (the reference in tests/ops/test_moe_gemv_gpu.py rounds at the same places):
//   - the weight is q' s + z' in the activation dtype (one fma, as in gemv);
//   - dot products accumulate in fp32 (per lane, then the 4 lanes of a row, then the warps of the
//     CTA in warp order, then the split-K slices in slice order);
//   - kGateUp: silu(g) * u = g / (1 + exp(-g)) * u in fp32 from the fp32 sums g and u, rounded
//     once to the activation dtype when h is written;
//   - kDown: each slot's fp32 partial is multiplied by its fp32 top-k weight, the slots (and K
//     slices) are added in fp32 in a fixed order, and y is rounded once.
//
// Expert ids are not checked on the host (that needs a sync); the kernels never read out of bounds
// for them: a pair whose id is outside [0, E) contributes nothing (its h row is written as zeros and
// its down partial is zero), which is what mixed_gemm.ops.routing.align_tokens does with such ids.
#pragma once

#include "gemv/gemv.cuh"

namespace mixed_gemm {

struct MoeGemvArgs {
  void const* x;         // kGateUp: x (tokens, k); kDown: h (tokens * top_k, k); rows 16-byte aligned
  void const* b;         // expert 0's sm90a atoms, int32 (katoms, strips, 8 * bits); expert e at + e * expert_b
  void const* scales;    // expert 0's (num_groups, 16 * strips), activation dtype; expert e at + e * expert_s
  void const* zeros;     // the additive z', same shape and stride (never null in the sm90a layout)
  void const* ids;       // topk_ids (tokens, top_k), contiguous, int32 or int64 (ids_64)
  float const* weights;  // kDown: topk_weights (tokens, top_k) in fp32, contiguous; kGateUp: unused
  void* y;               // kGateUp: h (tokens * top_k, n / 2); kDown: y (tokens, n)
  float* workspace;      // split-K / slot planes (fp32); null when one slice writes the output
  int* counters;         // one arrival counter per (pair or token, row tile), zero between launches
  long long expert_b;    // int32 words between experts' atoms (b[0].numel())
  long long expert_s;    // elements between experts' scales (and zeros)
  int tokens, top_k, experts;
  int n;                 // the weight's rows: 2I (kGateUp) or H (kDown)
  int k, strips, katoms, group_shift, num_groups;
  int splits, chunk;     // K slices per pair or slot group (grid.y factor) and the atoms of each
  int slots;             // kDown: consecutive top-k slots one CTA adds up (1: one per CTA, planes; top_k: all)
  int z0;                // first pair (kGateUp) / token (kDown) of this launch: grid.z is at most 65535
  int ids_64;            // topk_ids are int64
};

enum class MoeStage : int { kGateUp = 0, kDown = 1 };

__device__ __forceinline__ float moe_silu(float g) { return g / (1.f + expf(-g)); }

template <typename Element, int kBits, MoeStage kStage, int kStrips, int kWarpsN, int kWarpsK, int kUnroll>
struct MoeGemv {
  static constexpr bool kGated = kStage == MoeStage::kGateUp;
  // The gate|up kernel's warps hold two runs of strips: kStrips gate strips and, I/16 strips
  // further, their up strips (templates/gemv/gemv.cuh, kRuns). The weight needs no repack.
  static constexpr int kRuns = kGated ? 2 : 1;
  using K = Gemv<Element, kBits, 1, kRuns * kStrips, kWarpsN, kWarpsK, kUnroll, false, 1, kRuns>;
  using raw = typename K::raw;
  static constexpr int kThreads = K::kThreads;
  static constexpr int kRows = 16 * kStrips * kWarpsN;  // outputs (h or y columns) of a CTA
  static constexpr int kSmemBytes = K::kSmemBytes;      // the cross-warp K reduction
  using Epilogue = GemvEpilogue<raw, K::kAcc, kWarpsN, kWarpsK, kRows, kThreads>;
  static_assert(kGated || K::kRows == kRows, "one run: the CTA's weight rows are its outputs");

  // Expert of pair p, or -1 outside [0, experts) (compared in 64 bits: no id wraps into range).
  static __device__ __forceinline__ int expert_of(MoeGemvArgs const& a, int pair) {
    long long const e = a.ids_64 ? __ldg(static_cast<long long const*>(a.ids) + pair)
                                 : (long long)__ldg(static_cast<int const*>(a.ids) + pair);
    return e >= 0 && e < a.experts ? int(e) : -1;
  }

  // gemv's arguments for one row of x against expert e (only what the main loop reads).
  static __device__ __forceinline__ GemvArgs expert_args(MoeGemvArgs const& a, int e, raw const* xrow) {
    GemvArgs p;
    p.x = xrow;
    p.b = static_cast<uint32_t const*>(a.b) + (size_t)e * a.expert_b;
    p.scales = static_cast<raw const*>(a.scales) + (size_t)e * a.expert_s;
    p.zeros = static_cast<raw const*>(a.zeros) + (size_t)e * a.expert_s;
    p.bias = nullptr;
    p.y = nullptr;
    p.workspace = nullptr;
    p.counters = nullptr;
    p.m = 1;
    p.n = a.n;
    p.k = a.k;
    p.strips = a.strips;
    p.katoms = a.katoms;
    p.group_shift = a.group_shift;
    p.num_groups = a.num_groups;
    p.splits = a.splits;
    p.chunk = a.chunk;
    return p;
  }

  // f(i, gate, up) for each gate|up output i (a column of h) the lane holds after the reduction:
  // gate strip j's rows g, g + 8 (accumulators [j][0][0..1]) and the same rows of up strip j. After
  // the FMA variant's shuffles the 4 lanes of a row agree; lane t = 0 reports it.
  template <typename F>
  static __device__ __forceinline__ void for_each_gated(int strip0, int lane, int inter, typename K::Acc const& acc,
                                                        F&& f) {
    if ((lane & 3) != 0) return;
#pragma unroll
    for (int j = 0; j < kStrips; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        int const i = 16 * (strip0 + j) + (lane >> 2) + 8 * e;
        if (i < inter) f(i, acc[j][0][e], acc[kStrips + j][0][e]);
      }
  }

  // grid (row tiles over I, splits, pairs): CTA (x, y, z) computes h[pair, tile x] from K slice y.
  static __device__ void gate_up(MoeGemvArgs const& a, char* smem) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const pair = a.z0 + blockIdx.z, token = pair / a.top_k;
    int const inter = a.n / 2;
    int const row0 = blockIdx.x * kRows;
    raw* h = static_cast<raw*>(a.y) + (size_t)pair * inter;
    int const e = expert_of(a, pair);
    if (e < 0) {  // the same for every CTA of the pair: none of them touches a counter
      if (blockIdx.y == 0)
        for (int i = threadIdx.x; i < kRows; i += kThreads)
          if (row0 + i < inter) h[row0 + i] = raw(0.f);
      return;
    }
    GemvArgs const p = expert_args(a, e, static_cast<raw const*>(a.x) + (size_t)token * a.k);
    int const strip0 = (blockIdx.x * kWarpsN + wn) * kStrips;
    int const kbeg = blockIdx.y * a.chunk, kend = min(kbeg + a.chunk, a.katoms);
    typename K::Acc acc;
    float (&flat)[K::kAcc] = reinterpret_cast<float(&)[K::kAcc]>(acc);
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) flat[i] = 0.f;
    gemv_mainloop<K>(p, strip0, kbeg, kend, wk, smem + K::kReduceBytes, acc, inter / 16);
    K::finish(flat);
    Epilogue::reduce(smem, flat, wn, wk, lane);

    if (a.splits == 1) {
      if (wk != 0) return;
      for_each_gated(strip0, lane, inter, acc, [&](int i, float gate, float up) { h[i] = raw(moe_silu(gate) * up); });
      return;
    }
    // Split-K, as gemv's epilogue: each slice publishes its fp32 gate and up sums (a plane of the
    // weight's 2I rows per (pair, slice)); the last slice of the (pair, row tile) to arrive adds the
    // planes in slice order, applies silu * up once, and resets the counter for the next launch.
    float* const planes = a.workspace + (size_t)pair * a.splits * a.n;
    if (wk == 0) {
      float* plane = planes + (size_t)blockIdx.y * a.n;
      for_each_gated(strip0, lane, inter, acc, [&](int i, float gate, float up) {
        __stcg(plane + i, gate);
        __stcg(plane + inter + i, up);
      });
    }
    __threadfence();  // the plane is visible GPU-wide before the arrival that announces it
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
      int* counter = a.counters + (size_t)pair * gridDim.x + blockIdx.x;
      last = atomicAdd(counter, 1) == a.splits - 1;
      if (last) *counter = 0;  // every slice has arrived: nobody else touches it in this launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // acquire side: the other slices' planes are not stale
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
      int const i = row0 + r;
      if (i >= inter) break;
      float gate = __ldcg(planes + i), up = __ldcg(planes + inter + i);
      for (int sl = 1; sl < a.splits; ++sl) {
        gate += __ldcg(planes + (size_t)sl * a.n + i);
        up += __ldcg(planes + (size_t)sl * a.n + inter + i);
      }
      h[i] = raw(moe_silu(gate) * up);
    }
  }

  // grid (row tiles over H, (top_k / slots) * splits, tokens): CTA (x, y, z) adds slots
  // [y / splits * slots, + slots) of token z over K slice y % splits, each slot's fp32 partial times
  // its top-k weight, in slot order. One slice per token (slots == top_k, splits == 1) writes y;
  // otherwise gemv's epilogue sums the token's gridDim.y planes in plane (slot, then slice) order.
  static __device__ void down(MoeGemvArgs const& a, char* smem) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const token = a.z0 + blockIdx.z;
    int const group = blockIdx.y / a.splits, split = blockIdx.y % a.splits;
    int const strip0 = (blockIdx.x * kWarpsN + wn) * kStrips;
    int const kbeg = split * a.chunk, kend = min(kbeg + a.chunk, a.katoms);
    float sum[K::kAcc];
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) sum[i] = 0.f;
#pragma unroll 1
    for (int j = group * a.slots; j < (group + 1) * a.slots; ++j) {
      int const pair = token * a.top_k + j;
      int const e = expert_of(a, pair);
      if (e < 0) continue;  // uniform across the CTA: contributes nothing
      GemvArgs const p = expert_args(a, e, static_cast<raw const*>(a.x) + (size_t)pair * a.k);
      typename K::Acc acc;
      float (&flat)[K::kAcc] = reinterpret_cast<float(&)[K::kAcc]>(acc);
#pragma unroll
      for (int i = 0; i < K::kAcc; ++i) flat[i] = 0.f;
      gemv_mainloop<K>(p, strip0, kbeg, kend, wk, smem + K::kReduceBytes, acc);
      K::finish(flat);
      float const w = __ldg(a.weights + pair);
#pragma unroll
      for (int i = 0; i < K::kAcc; ++i) sum[i] = fmaf(w, flat[i], sum[i]);
    }
    // gemv's epilogue over this token's output row: planes, counters and y start at the token's.
    GemvArgs out;
    out.x = nullptr;
    out.b = out.scales = out.zeros = out.bias = nullptr;
    out.y = static_cast<raw*>(a.y) + (size_t)token * a.n;
    bool const planes = gridDim.y > 1;  // else one slice writes y: no workspace, no counters
    out.workspace = planes ? a.workspace + (size_t)token * gridDim.y * a.n : nullptr;
    out.counters = planes ? a.counters + (size_t)token * gridDim.x : nullptr;
    out.m = 1;
    out.n = a.n;
    out.k = a.k;
    out.strips = a.strips;
    out.katoms = a.katoms;
    out.group_shift = a.group_shift;
    out.num_groups = a.num_groups;
    out.splits = gridDim.y;  // the planes the last arrival adds: every (slot group, slice) of the token
    out.chunk = a.chunk;
    typename K::Acc const& total = reinterpret_cast<typename K::Acc const&>(sum);
    Epilogue::run(out, smem, sum, wn, wk, lane,
                  [&](auto&& f) { K::for_each_output(out, strip0, lane, total, f); });
  }

  static __device__ void run(MoeGemvArgs const& a, char* smem) {
    if constexpr (kGated) {
      gate_up(a, smem);
    } else {
      down(a, smem);
    }
  }
};

}  // namespace mixed_gemm
