// Slot-warps mode of the down projection (MoeGemvConfig.slot_warps, schedules "w2_..._sw"):
// pair mode's down kernel (moe_gemv.cuh, MoeGemv::down) with the CTA's kWarpsK warps of a column
// spread over a group of top-k slots instead of over K.
//
//   grid (row tiles over H, ceil(top_k / slots) * splits, tokens), a.slots = min(top_k, kWarpsK)
//   (the launcher's choice): warp wk serves slot group * slots + wk % slots and the (wk / slots)-th
//   of that slot's kWarpsK / slots contiguous pieces of the CTA's K slice (each a whole number of
//   kUnroll-atom steps, so steps start where gemv_mainloop's group-parameter reuse expects). Its
//   fp32 partial times the slot's top-k weight goes into gemv's cross-warp reduction; one group and
//   one slice per token (top_k <= kWarpsK, splits == 1) writes y with no plane, fence or counter.
//
// Why. At one token a small expert's down weight is a few steps per warp (Qwen3-30B-A3B: 8 slots
// of K = 768, 48 atoms). Pair mode then either gives each slot its own CTA, whose fp32 planes reach
// the top-k sum through a fence, an arrival and a second pass over L2 after the last slot lands,
// or loops over the slots in one CTA (_kloop), one dependent round of loads after another. Here
// every slot's loads are in flight at once and the sum never leaves the CTA.
//
// Rounding: each piece's fp32 sum times its fp32 top-k weight, the pieces added in the reduction's
// warp order (slot-major within a piece), y rounded once: the reference's rounding points, in
// another fp32 order. Ids outside [0, E) and slots past top_k contribute nothing (warps idle).
#pragma once

#include "moe_gemv/moe_gemv.cuh"

namespace mixed_gemm {

template <typename Element, int kBits, MoeStage kStage, int kStrips, int kWarpsN, int kWarpsK, int kUnroll,
          bool kDeferred = false>
struct MoeGemvSlotWarps {
  static_assert(kStage == MoeStage::kDown, "slot_warps (_sw) is the down kernel's");
  static_assert(kWarpsK >= 2, "slot_warps (_sw): at least two warps to spread over slots");
  // expert_of, expert_args, prefetch_weight (its loop covers this CTA's kThreads threads too).
  using PairMode = MoeGemv<Element, kBits, kStage, kStrips, kWarpsN, kWarpsK, kUnroll, kDeferred>;
  // One warp per K piece: gemv's loop with one K warp (stride kUnroll) over the warp's own piece.
  using K = Gemv<Element, kBits, 1, kStrips, kWarpsN, 1, kUnroll, false, kDeferred ? 0 : 1, 1, kDeferred>;
  using raw = typename K::raw;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsK;
  static constexpr int kRows = 16 * kStrips * kWarpsN;  // y columns of a CTA
  static constexpr int kSmemBytes = (kWarpsK - 1) * kWarpsN * K::kAcc * 32 * 4;  // the cross-warp reduction
  using Epilogue = GemvEpilogue<raw, K::kAcc, kWarpsN, kWarpsK, kRows, kThreads>;
  static_assert(PairMode::kThreads == kThreads, "the prefetch loop strides by the CTA's threads");

  // Warp wk's share of the CTA's sum (zero for an idle warp, a slot past top_k, an id outside
  // [0, E) or an empty piece). All of it is uniform across the warp.
  static __device__ __forceinline__ void warp_sum(MoeGemvArgs const& a, int token, int group, int strip0, int kbeg,
                                                  int kend, int wk, float (&sum)[K::kAcc]) {
    int const slots = a.slots, pieces = kWarpsK / slots;
    int const j = group * slots + wk % slots, piece = wk / slots;
    int const per = ((kend - kbeg + pieces - 1) / pieces + kUnroll - 1) / kUnroll * kUnroll;
    int const kb = kbeg + piece * per, ke = min(kb + per, kend);
    if (piece >= pieces || j >= a.top_k || kb >= ke) return;
    int const pair = token * a.top_k + j;
    int const e = PairMode::expert_of(a, pair);
    if (e < 0) return;
    GemvArgs const p = PairMode::expert_args(a, e, static_cast<raw const*>(a.x) + (size_t)pair * a.k);
    typename K::Acc acc;
    float (&flat)[K::kAcc] = reinterpret_cast<float(&)[K::kAcc]>(acc);
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) flat[i] = 0.f;
    gemv_mainloop<K>(p, strip0, kb, ke, 0, nullptr, acc);  // x is read from global memory (no staging)
    K::finish(flat);
    float const w = topk_weight(a, pair);
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) sum[i] = w * flat[i];
  }

  static __device__ void run(MoeGemvArgs const& a, char* smem) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const token = a.z0 + blockIdx.z;
    int const group = blockIdx.y / a.splits, split = blockIdx.y % a.splits;
    int const strip0 = (blockIdx.x * kWarpsN + wn) * kStrips;
    int const kbeg = split * a.chunk, kend = min(kbeg + a.chunk, a.katoms);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (a.pdl)  // as MoeGemv::down: the ids are the router's, readable before the wait
      for (int j = group * a.slots; j < min((group + 1) * a.slots, a.top_k); ++j) {
        int const e = PairMode::expert_of(a, token * a.top_k + j);
        if (e >= 0) PairMode::prefetch_weight(a, e, blockIdx.x * kWarpsN * kStrips, kWarpsN * kStrips, kbeg, kend);
      }
    pdl_wait();
#endif
    float sum[K::kAcc];
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) sum[i] = 0.f;
    warp_sum(a, token, group, strip0, kbeg, kend, wk, sum);
    // gemv's epilogue over this token's output row (pair mode's down: planes only past one group
    // and one slice, added in (group, slice) order by the last arrival).
    GemvArgs out = PairMode::expert_args(a, 0, nullptr);
    bool const planes = gridDim.y > 1;
    out.y = static_cast<raw*>(a.y) + (size_t)token * a.n;
    out.workspace = planes ? a.workspace + (size_t)token * gridDim.y * a.n : nullptr;
    out.counters = planes ? a.counters + (size_t)token * gridDim.x : nullptr;
    out.splits = gridDim.y;
    typename K::Acc const& total = reinterpret_cast<typename K::Acc const&>(sum);
    Epilogue::run(out, smem, sum, wn, wk, lane, [&](auto&& f) { K::for_each_output(out, strip0, lane, total, f); });
  }
};

}  // namespace mixed_gemm
