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
  static_assert(PairMode::kThreads == kThreads && PairMode::kSmemBytes == kSmemBytes && K::kAcc == PairMode::K::kAcc,
                "pair mode's prefetch, reduction and epilogue serve this CTA as they are");

  // Warp wk's share of the CTA's sum (zero for an idle warp, a slot past top_k, an id outside
  // [0, E) or an empty piece). All of it is uniform across the warp.
  static __device__ __forceinline__ void warp_sum(MoeGemvArgs const& a, typename PairMode::DownCta const& c,
                                                  float (&sum)[K::kAcc]) {
    int const slots = a.slots, pieces = kWarpsK / slots;
    int const j = c.group * slots + c.wk % slots, piece = c.wk / slots;
    int const per = ((c.kend - c.kbeg + pieces - 1) / pieces + kUnroll - 1) / kUnroll * kUnroll;
    int const kb = c.kbeg + piece * per, ke = min(kb + per, c.kend);
    if (piece >= pieces || j >= a.top_k || kb >= ke) return;
    int const pair = c.token * a.top_k + j;
    int const e = PairMode::expert_of(a, pair);
    if (e < 0) return;
    GemvArgs const p = PairMode::expert_args(a, e, static_cast<raw const*>(a.x) + (size_t)pair * a.k);
    typename K::Acc acc;
    float (&flat)[K::kAcc] = reinterpret_cast<float(&)[K::kAcc]>(acc);
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) flat[i] = 0.f;
    gemv_mainloop<K>(p, c.strip0, kb, ke, 0, nullptr, acc);  // x is read from global memory (no staging)
    K::finish(flat);
    float const w = topk_weight(a, pair);
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) sum[i] = w * flat[i];
  }

  // Pair mode's down with warp_sum for the slot loop: the same CTA coordinates, PDL wait and epilogue.
  static __device__ void run(MoeGemvArgs const& a, char* smem) {
    typename PairMode::DownCta const c = PairMode::down_cta(a);
    PairMode::down_wait(a, c);
    float sum[K::kAcc];
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) sum[i] = 0.f;
    warp_sum(a, c, sum);
    PairMode::down_epilogue(a, c, smem, sum);
  }
};

}  // namespace mixed_gemm
