// Grouped decode GEMMs of a mixture-of-experts layer (docs/notes/moe.md):
// every (token t, slot j) pair p = t * top_k + j of a top-k router multiplies one row of
// activations by the weight of its expert e = topk_ids[t, j], read from a stack of sm90a layout
// weights (expert e at a fixed element stride). Two launches per layer, no host sync, in one of two
// schedules: "pair mode" (MoeGemv: a CTA column per pair) and "expert mode" (MoeGemvExpert, at the
// end of this file: a CTA column per expert, serving up to kTokens of its pairs per weight pass).
//
//   kGateUp: h[p, i] = silu(x[t] . Wg_e[i]) * (x[t] . Wu_e[i])   (w13[e] = (2I, H): gate|up rows
//            interleaved in blocks of 8, common/gate_up.cuh, or, with gate_up == 0, gate rows [0, I)
//            then up rows [I, 2I): a dense gate|up weight); h is (T * top_k, I) in the activation dtype.
//   kDown:   y[t, n] = sum_j topk_weights[t, j] * (h[t * top_k + j] . W2_e[n])   (w2[e] = (H, I)).
//
// Why this shape. At decode every pair is one token: the kernel is gemv.cuh's FMA variant for one
// row of x (kFmaTokens = 1: no mma n8 tile that would be 7/8 padding; or, kDeferred, the mma on
// the raw codes with 7/8 padding but one instruction per atom: see MoeGemv), with the same atom loads
// straight from global memory, converters and group-parameter reuse (gemv_mainloop). A CTA reads
// its expert id first and offsets the weight, scale and zero bases by that expert's stride, so no
// alignment step (sorting pairs by expert) runs before it: at T = 1 each of the k pairs reads its
// own expert once, which is all the bytes there are. Repeated experts (T > 1) are re-read, mostly
// from L2; the host picks this path only while that stays cheap (kernels/moe_gemv/heuristics.py).
//
// Rounding points (the reference in tests/ops/test_moe_gemv_gpu.py rounds at the same places):
//   - the weight is q' s + z' in the activation dtype (one fma, as in gemv); kDeferred: the raw
//     codes' sums and x's sums per group in fp32, folded with s and z' in fp32 (never rounded);
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
#include "common/gate_up.cuh"
#include "moe_gemv/moe_pdl.cuh"

namespace mixed_gemm {

struct MoeGemvArgs {
  void const* x;         // kGateUp: x (tokens, k); kDown: h (tokens * top_k, k); rows 16-byte aligned
  void const* b;         // expert 0's sm90a atoms, int32 (katoms, strips, 8 * bits); expert e at + e * expert_b
  void const* scales;    // expert 0's (num_groups, 16 * strips), activation dtype; expert e at + e * expert_s
  void const* zeros;     // the additive z', same shape and stride (never null in the sm90a layout)
  void const* ids;       // topk_ids (tokens, top_k), contiguous, int32 or int64 (ids_64)
  void const* weights;   // kDown: topk_weights (tokens, top_k), contiguous, of weights_dtype; kGateUp: unused
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
  int chunks;            // expert mode: grid.z = experts * chunks; CTA z serves chunks z % chunks, + chunks, ...
  int gate_up;           // kGateUp: rows interleaved in blocks of kGateUpBlock (else gate rows, then up rows)
  int pdl;               // kDown launched with PDL (moe_pdl.cuh): prefetch the CTA's weight slices to L2 first
  int weights_dtype;     // kMoeWeight*: the routers' fp16/bf16 scores are read as they are (no cast launch)
};

// MoeGemvArgs::weights_dtype (mirrored by mixed_gemm/kernels/moe_gemv/config.py WEIGHT_ELEMENTS).
constexpr int kMoeWeightF32 = 0;
constexpr int kMoeWeightF16 = 1;
constexpr int kMoeWeightBf16 = 2;

// Top-k weight `pair` as fp32: one 32-bit load (the weight, or for 16-bit weights the aligned word
// holding it: the launcher requires 4-byte alignment) and selects, no branch around the load, so
// pair and persistent modes keep their register counts.
__device__ __forceinline__ float topk_weight(MoeGemvArgs const& a, int pair) {
  int const dt = a.weights_dtype;
  unsigned const word = __ldg(static_cast<unsigned const*>(a.weights) + (dt == kMoeWeightF32 ? pair : pair >> 1));
  unsigned const half_bits = (pair & 1) ? word >> 16 : word & 0xffffu;
  float const f16 = __half2float(__ushort_as_half(static_cast<unsigned short>(half_bits)));
  float const wide = __uint_as_float(dt == kMoeWeightF32 ? word : half_bits << 16);  // bf16: fp32's upper half
  return dt == kMoeWeightF16 ? f16 : wide;
}

// Expert mode reads fp32 weights only (the launcher casts for it): its down kernel sits at the
// register bound where any extra test costs occupancy (see MoeGemvExpert::down).
__device__ __forceinline__ float topk_weight_f32(MoeGemvArgs const& a, int pair) {
  return __ldg(static_cast<float const*>(a.weights) + pair);
}

enum class MoeStage : int { kGateUp = 0, kDown = 1 };

// kGateUp: where a warp's runs of strips start and how far apart they lie. Its outputs are always
// the 16 kStrips columns of h from 16 strip0: interleaved, they are the gate and up rows of the 2
// kStrips strips from 2 strip0 (one run after the other, gap kStrips); otherwise kStrips gate strips
// from strip0 and their up strips I/16 further.
struct GateUpRuns {
  int strip0, gap;
};
template <int kStrips>
__device__ __forceinline__ GateUpRuns gate_up_runs(int gate_up, int strip0, int inter) {
  return gate_up ? GateUpRuns{2 * strip0, kStrips} : GateUpRuns{strip0, inter / 16};
}

// kDeferred (`_ds`): gemv's mma path on one n8 tile (the token in column 0, seven padding columns)
// with the group's scale and zero applied to the fp32 sums once per group (atoms/deferred.cuh), as
// the dense decode kernels' `_ds`. Per weight pair the FMA variant converts, scales (an fma) and
// widens to fp32 for four FMAs; the mma path issues one mma per 16x16 atom on the raw codes, which
// is what keeps a large expert's stream (Mixtral at 1 token: 117 MB of gate|up) at the copy rate.
// The weight is then never rounded to the activation dtype (q' s + z' stays fp32 in the fold).
//
// kTouchPages (`_tp`, gate|up only): before the main loop, thread i of the CTA prefetches into L2 the
// first line of 2 MB page i of the CTA's K slice of the expert (all strips of atoms [kbeg, kend):
// the sm90a layout is atom-major, so the slice is one contiguous range). At one token every gate|up
// CTA walks K at about the same pace, so without it all of them reach each of an expert's pages
// together and, if a first touch stalls for the address translation, wait for one page at a time
// (Mixtral: ~29 pages an expert); the prefetches start every translation of the slice at once.
// Only gate|up: in the down kernels the same code cost registers (w2_s1_w4x2_u8_ds 90 -> 104), and
// inside the shared main loop it cost 50 (a per-step prefetch) or 16 (a prologue in dense gemv).
template <typename Element, int kBits, MoeStage kStage, int kStrips, int kWarpsN, int kWarpsK, int kUnroll,
          bool kDeferred = false, bool kTouchPages = false>
struct MoeGemv {
  static constexpr bool kGated = kStage == MoeStage::kGateUp;
  static_assert(kGated || !kTouchPages, "touch_pages (_tp) is the gate|up kernel's");
  // The gate|up kernel's warps hold two runs of strips: kStrips gate strips and, I/16 strips
  // further, their up strips (templates/gemv/gemv.cuh, kRuns). The weight needs no repack.
  static constexpr int kRuns = kGated ? 2 : 1;
  using K = Gemv<Element, kBits, 1, kRuns * kStrips, kWarpsN, kWarpsK, kUnroll, false, kDeferred ? 0 : 1, kRuns,
                 kDeferred>;
  // Row half e (rows g, g + 8) of a strip's token-0 accumulators: FMA [e]; mma c0 / c2 ([2 e]).
  static constexpr int kHalf = kDeferred ? 2 : 1;
  using raw = typename K::raw;
  static constexpr int kThreads = K::kThreads;
  static constexpr int kRows = 16 * kStrips * kWarpsN;  // outputs (h or y columns) of a CTA
  static constexpr int kSmemBytes = K::kSmemBytes;      // the cross-warp K reduction
  using Epilogue = GemvEpilogue<raw, K::kAcc, kWarpsN, kWarpsK, kRows, kThreads>;
  static_assert(kGated || K::kRows == kRows, "one run: the CTA's weight rows are its outputs");
  static_assert(kGateUpBlock == 8, "the gated epilogues pair accumulator rows r and r + 8");

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
    p.residual = nullptr;
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

  // Before griddepcontrol.wait (moe_pdl.cuh): the CTA's slice of expert e into L2 -- K atoms [kbeg,
  // kend) of its strips [strip0, strip0 + strips) (clipped to the weight), one contiguous run per
  // atom, and the scale and zero rows of the groups those atoms span. Run i goes to lane i / kWarps
  // of warp i % kWarps: the bulk prefetch takes its operands in uniform registers, so a warp issues
  // its lanes' runs one after another, and spreading the runs over the warps keeps that loop short.
  static __device__ __forceinline__ void prefetch_weight(MoeGemvArgs const& a, int e, int strip0, int strips, int kbeg,
                                                         int kend) {
    using W = typename K::W;
    strips = min(strips, a.strips - strip0);
    if (strips <= 0 || kbeg >= kend) return;
    int const g0 = min((kbeg * 16) >> a.group_shift, a.num_groups - 1);
    int const g1 = min((kend * 16 - 1) >> a.group_shift, a.num_groups - 1);
    int const atoms = kend - kbeg, groups = g1 - g0 + 1;
    constexpr int kStripBytes = 128 * W::kWords;  // one strip of one atom: 32 lanes x kWords words
    char const* const b = static_cast<char const*>(a.b) + 4 * (size_t)e * a.expert_b +
                          ((size_t)kbeg * a.strips + strip0) * kStripBytes;
    size_t const params = ((size_t)e * a.expert_s + (size_t)g0 * 16 * a.strips + 16 * strip0) * sizeof(raw);
    size_t const param_stride = (size_t)16 * a.strips * sizeof(raw);
    constexpr int kWarps = kThreads / 32;
    for (int i = (threadIdx.x & 31) * kWarps + (threadIdx.x >> 5); i < atoms + 2 * groups; i += kThreads) {
      if (i < atoms) {
        prefetch_l2(b + (size_t)i * a.strips * kStripBytes, strips * kStripBytes);
      } else {
        int const r = i - atoms;
        char const* base = static_cast<char const*>(r < groups ? a.scales : a.zeros);
        prefetch_l2(base + params + (size_t)(r % groups) * param_stride, 16 * strips * sizeof(raw));
      }
    }
  }

  // kTouchPages: one prefetch.global.L2 per 2 MB page of the expert's atoms [kbeg, kend) (all strips),
  // thread i taking pages i, i + kThreads, ...; the first page's line is the slice's own first.
  static __device__ __forceinline__ void touch_pages(GemvArgs const& p, int kbeg, int kend) {
    constexpr uintptr_t kPage = uintptr_t(2) << 20;
    constexpr size_t kAtomRowBytes = 128 * K::W::kWords;  // one strip of one atom
    uintptr_t const base = reinterpret_cast<uintptr_t>(p.b);
    uintptr_t const lo = base + (size_t)kbeg * p.strips * kAtomRowBytes;
    uintptr_t const hi = base + (size_t)kend * p.strips * kAtomRowBytes;
    for (uintptr_t at = (lo & ~(kPage - 1)) + threadIdx.x * kPage; at < hi; at += kThreads * kPage)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(at < lo ? lo : at));
  }

  // f(i, gate, up) for each gate|up output i (a column of h) the lane holds after the reduction.
  // Interleaved: strip j (of 2 kStrips from 2 strip0) holds gate row 8 (2 strip0 + j) + g as its row
  // g (row half 0) and the up row as its row g + 8 (row half 1). Otherwise gate strip j's rows g,
  // g + 8 (halves 0, 1) and the same rows of up strip j. After the FMA variant's shuffles the 4
  // lanes of a row agree; in the mma's C fragment lane t = 0 holds token column 0. Lane t = 0
  // reports it.
  template <typename F>
  static __device__ __forceinline__ void for_each_gated(int gate_up, int strip0, int lane, int inter,
                                                        typename K::Acc const& acc, F&& f) {
    if ((lane & 3) != 0) return;
    if (gate_up) {
#pragma unroll
      for (int j = 0; j < 2 * kStrips; ++j) {
        int const i = kGateUpBlock * (2 * strip0 + j) + (lane >> 2);
        if (i < inter) f(i, acc[j][0][0], acc[j][0][kHalf]);
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < kStrips; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        int const i = 16 * (strip0 + j) + (lane >> 2) + 8 * e;
        if (i < inter) f(i, acc[j][0][kHalf * e], acc[kStrips + j][0][kHalf * e]);
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
    if constexpr (kTouchPages) touch_pages(p, kbeg, kend);
    typename K::Acc acc;
    float (&flat)[K::kAcc] = reinterpret_cast<float(&)[K::kAcc]>(acc);
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) flat[i] = 0.f;
    GateUpRuns const runs = gate_up_runs<kStrips>(a.gate_up, strip0, inter);
    gemv_mainloop<K>(p, runs.strip0, kbeg, kend, wk, smem + K::kReduceBytes, acc, runs.gap);
    K::finish(flat);
    Epilogue::reduce(smem, flat, wn, wk, lane);

    if (a.splits == 1) {
      if (wk != 0) return;
      for_each_gated(a.gate_up, strip0, lane, inter, acc, [&](int i, float gate, float up) { h[i] = raw(silu_mul(gate, up)); });
      return;
    }
    // Split-K, as gemv's epilogue: each slice publishes its fp32 gate and up sums (a plane of the
    // weight's 2I rows per (pair, slice)); the last slice of the (pair, row tile) to arrive adds the
    // planes in slice order, applies silu * up once, and resets the counter for the next launch.
    float* const planes = a.workspace + (size_t)pair * a.splits * a.n;
    if (wk == 0) {
      float* plane = planes + (size_t)blockIdx.y * a.n;
      for_each_gated(a.gate_up, strip0, lane, inter, acc, [&](int i, float gate, float up) {
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
      h[i] = raw(silu_mul(gate, up));
    }
  }

  // The down kernels' CTA (pair mode's and the slot-warps mode's grid: row tiles over H, slot groups
  // x splits, tokens): the thread's lane and warp place, the token, slot group and K slice.
  struct DownCta {
    int lane, wn, wk, token, group, strip0, kbeg, kend;
  };
  static __device__ __forceinline__ DownCta down_cta(MoeGemvArgs const& a) {
    int const warp = threadIdx.x >> 5, wn = warp % kWarpsN;
    int const kbeg = (blockIdx.y % a.splits) * a.chunk;
    return {int(threadIdx.x & 31), wn, warp / kWarpsN, a.z0 + int(blockIdx.z), int(blockIdx.y) / a.splits,
            (int(blockIdx.x) * kWarpsN + wn) * kStrips, kbeg, min(kbeg + a.chunk, a.katoms)};
  }

  // With PDL (moe_pdl.cuh), the slot group's weight slices into L2 first (the ids are the router's,
  // written before the gate|up kernel started: readable now), then the wait: h, the planes and
  // counters (the stream's, gate|up's too) and y come after the gate|up grid.
  static __device__ __forceinline__ void down_wait(MoeGemvArgs const& a, DownCta const& c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (a.pdl)
      for (int j = c.group * a.slots; j < min((c.group + 1) * a.slots, a.top_k); ++j) {
        int const e = expert_of(a, c.token * a.top_k + j);
        if (e >= 0) prefetch_weight(a, e, blockIdx.x * kWarpsN * kStrips, kWarpsN * kStrips, c.kbeg, c.kend);
      }
    pdl_wait();
#endif
  }

  // gemv's epilogue over the token's output row (planes, counters and y start at the token's): one
  // slot group and one slice write y; otherwise the last arrival adds the token's gridDim.y planes in
  // (slot group, slice) order.
  static __device__ __forceinline__ void down_epilogue(MoeGemvArgs const& a, DownCta const& c, char* smem,
                                                       float (&sum)[K::kAcc]) {
    GemvArgs out = expert_args(a, 0, nullptr);  // the sizes; no operand is read
    out.b = out.scales = out.zeros = nullptr;
    out.y = static_cast<raw*>(a.y) + (size_t)c.token * a.n;
    bool const planes = gridDim.y > 1;  // else one slice writes y: no workspace, no counters
    out.workspace = planes ? a.workspace + (size_t)c.token * gridDim.y * a.n : nullptr;
    out.counters = planes ? a.counters + (size_t)c.token * gridDim.x : nullptr;
    out.splits = gridDim.y;  // the planes the last arrival adds: every (slot group, slice) of the token
    typename K::Acc const& total = reinterpret_cast<typename K::Acc const&>(sum);
    Epilogue::run(out, smem, sum, c.wn, c.wk, c.lane,
                  [&](auto&& f) { K::for_each_output(out, c.strip0, c.lane, total, f); });
  }

  // grid (row tiles over H, (top_k / slots) * splits, tokens): CTA (x, y, z) adds slots
  // [y / splits * slots, + slots) of token z over K slice y % splits, each slot's fp32 partial times
  // its top-k weight, in slot order. One slice per token (slots == top_k, splits == 1) writes y;
  // otherwise gemv's epilogue sums the token's gridDim.y planes in plane (slot, then slice) order.
  static __device__ void down(MoeGemvArgs const& a, char* smem) {
    DownCta const c = down_cta(a);
    down_wait(a, c);
    float sum[K::kAcc];
#pragma unroll
    for (int i = 0; i < K::kAcc; ++i) sum[i] = 0.f;
#pragma unroll 1
    for (int j = c.group * a.slots; j < (c.group + 1) * a.slots; ++j) {
      int const pair = c.token * a.top_k + j;
      int const e = expert_of(a, pair);
      if (e < 0) continue;  // uniform across the CTA: contributes nothing
      GemvArgs const p = expert_args(a, e, static_cast<raw const*>(a.x) + (size_t)pair * a.k);
      typename K::Acc acc;
      float (&flat)[K::kAcc] = reinterpret_cast<float(&)[K::kAcc]>(acc);
#pragma unroll
      for (int i = 0; i < K::kAcc; ++i) flat[i] = 0.f;
      gemv_mainloop<K>(p, c.strip0, c.kbeg, c.kend, c.wk, smem + K::kReduceBytes, acc);
      K::finish(flat);
      float const w = topk_weight(a, pair);
#pragma unroll
      for (int i = 0; i < K::kAcc; ++i) sum[i] = fmaf(w, flat[i], sum[i]);
    }
    down_epilogue(a, c, smem, sum);
  }

  static __device__ void run(MoeGemvArgs const& a, char* smem) {
    if constexpr (kGated) {
      pdl_launch_dependents();  // the down kernel may launch now (moe_pdl.cuh: why at the start)
      gate_up(a, smem);
    } else {
      down(a, smem);
    }
  }
};

// ----------------------------------------------------------------------------------------------
// Expert mode (MoeGemvConfig.by_expert, schedules "..._m<kTokens>_xe"). Pair mode streams an
// expert's weight once per pair routed to it: with r pairs per active expert that is r passes over
// the same bytes (Mixtral, 16 tokens: ~4x the routed experts' bytes, measured 1280 us against a
// 308 us floor). Here grid.z indexes (expert e, chunk slot c), z = e * chunks + c:
//
//   1. Scan. Every thread of the CTA reads kScanPer of the T * top_k ids per round (all its loads
//      issued before any is used: at decode sizes one round of L2 hits), and the CTA ranks the
//      pairs routed to e in pair order: a ballot and popc inside each warp, the warps' counts
//      through shared memory (a prefix in warp order). The pairs ranked [c kTokens, (c+1) kTokens)
//      are the CTA's chunk; their entries go to shared memory. A chunk without pairs ends the CTA
//      before it touches a weight, a plane or a counter: an expert without tokens costs one scan.
//   2. One pass over e's weight for the whole chunk: gemv's mma path (m16n8k16, the weight as the
//      A operand straight from the sm90a atoms, kTokens / 8 n8 tiles of x as B), the chunk's rows
//      of x (x[p / top_k] for gate|up, h[p] for down) gathered into each warp's shared-memory slice
//      of the step in gemv's kStageX layout (at 8-16 rows, fragments read from global memory touch
//      one L1 line per row and bound the kernel: templates/gemv/gemv.cuh, XStage). gemv's own main
//      loop reads rows 0..m-1 of a contiguous x, so MoeGemvExpert::mainloop is that loop with the
//      gathering stage; the weight loads, converters and group parameters are
//      gemv's (Gemv's static helpers, gemv_mainloop's choice of parameter reuse).
//      With at most kTokens pairs per expert (decode) this is the floor: each routed expert's
//      bytes once.
//   3. Epilogues, per pair of the chunk (below), with pair mode's rounding points.
//
// Chunks. The host sizes grid.z from shapes alone (it reads no id, so the launch is
// graph-capturable): chunks = ceil(T / kTokens) slots per expert (the most pairs an expert holds
// when a token's top_k experts are distinct), capped so that experts * chunks <= 65535. A CTA
// serves chunk slots c, c + chunks, c + 2 chunks, ... until its expert runs out of pairs, so any
// routing is covered (an id repeated within a token, or a grid cap: the extra chunks run in the
// same CTAs, one more weight pass each).
//
// Ids outside [0, E) join expert 0's list marked invalid (entry ~p): gathered as zero rows, their
// outputs written as zeros, as pair mode does (h row zero, nothing added to y).
//
// gate|up: h[p] = silu(gate) * up for each pair of the chunk, in fp32 from the fp32 sums, rounded
// once. Split-K (grid.y): each slice writes fp32 gate and up planes per (pair, slice) (pair mode's
// layout); the last slice of the (chunk, row tile) to arrive, counted at the chunk's first pair
// (every pair is in exactly one chunk, so the key is unique), adds them in slice order, applies
// silu * up and resets the counter.
// down: each pair's fp32 partial times its fp32 top-k weight goes to a plane per (pair, slice),
// (T * top_k * splits) x H floats; a CTA arrives once per pair of its chunk at the counter of the
// pair's (token, row tile); the arrival that completes top_k * splits adds the token's planes in
// slot order, then slice order (pair mode's order and rounding points, whoever arrives last:
// deterministic, no float atomics), writes y and resets the counter (graph replays find zero).
// top_k == 1 with one slice writes y directly. A token's slots lie in different experts' CTAs, so
// there is no in-CTA slot loop (pair mode's _kloop) here.
// kFreshX: x is written during the same launch (the one-launch persistent mode's h, moe_fused.cuh):
// the gathered rows are loaded through L2 (ld.global.cg), never the non-coherent read-only path.
template <typename Element, int kBits, MoeStage kStage, int kStrips, int kWarpsN, int kWarpsK, int kUnroll, int kTokens,
          bool kFreshX = false>
struct MoeGemvExpert {
  static_assert(kTokens == 8 || kTokens == 16, "expert mode: 8 or 16 rows per CTA (one or two mma n8 tiles)");
  static constexpr bool kGated = kStage == MoeStage::kGateUp;
  static constexpr int kRuns = kGated ? 2 : 1;  // gate|up: gate strips, then their up strips I/16 further
  static constexpr int kTiles = kTokens / 8;
  static constexpr int kAllStrips = kRuns * kStrips;
  // gemv's kernel type for its helpers and sizes (never its run()): mma tiles, x staged, kRuns runs.
  using G = Gemv<Element, kBits, kTiles, kAllStrips, kWarpsN, kWarpsK, kUnroll, true, 0, kRuns>;
  using PairMode = MoeGemv<Element, kBits, kStage, kStrips, kWarpsN, kWarpsK, kUnroll>;  // expert_of, expert_args
  using raw = typename G::raw;
  using W = typename G::W;
  using XS = typename G::XS;  // XStage<raw, kTokens, kUnroll>: the staged slice's layout and reads
  using Acc = typename G::Acc;
  static constexpr int kU = kUnroll;          // for gemv_mainloop
  static constexpr bool kFineGroups = true;  // for gemv_mainloop
  static constexpr int kAcc = G::kAcc;
  static constexpr int kThreads = G::kThreads;
  static constexpr int kWarps = kWarpsN * kWarpsK;
  static constexpr int kRows = 16 * kStrips * kWarpsN;  // outputs (h or y columns) of a CTA
  static constexpr int kScanPer = 4;                    // ids a thread loads per scan round
  // Shared memory: gemv's cross-warp K reduction, each warp's staged x slice, then the scan's ints:
  // entries[kTokens] (pair p, or ~p for an invalid id), src[kTokens] (the gathered x row, -1 for
  // zeros), last[kTokens] (arrival results), counts[kScanPer * kWarps] (a round's per-warp counts).
  static constexpr int kXBytes = kWarps * XS::kBytes;
  static constexpr int kScanBytes = 4 * (3 * kTokens + kScanPer * kWarps);
  static constexpr int kSmemBytes = G::kReduceBytes + kXBytes + kScanBytes;
  using Epilogue = GemvEpilogue<raw, kAcc, kWarpsN, kWarpsK, kRows, kThreads>;
  static_assert(G::kReduceBytes % 16 == 0 && XS::kBytes % 16 == 0, "the staged slices are 16-byte aligned");
  static_assert(kThreads >= kTokens, "a thread per chunk row (scan, arrivals)");

  struct Scan {
    int* entries;
    int* src;
    int* last;
    int* counts;
  };

  static __device__ __forceinline__ Scan scan_area(char* smem) {
    int* base = reinterpret_cast<int*>(smem + G::kReduceBytes + kXBytes);
    return {base, base + kTokens, base + 2 * kTokens, base + 3 * kTokens};
  }

  // Ranks expert e's pairs in pair order and keeps those ranked [first, first + kTokens): returns
  // their count (<= 0: none), the same in every thread (all add the same counts). Fills entries,
  // src and clears last for the chunk's rows.
  static __device__ int scan(MoeGemvArgs const& a, int e, int first, Scan const& sc) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const pairs = a.tokens * a.top_k;
    unsigned const below = (1u << lane) - 1u;
    int ranked = 0;  // pairs of e before this round
    __syncthreads();  // the previous chunk's readers of the scan area (and of the reduction buffer) are done
#pragma unroll 1
    for (int p0 = 0; p0 < pairs; p0 += kScanPer * kThreads) {
      int entry[kScanPer];
      bool mine[kScanPer];
#pragma unroll
      for (int i = 0; i < kScanPer; ++i) {  // independent loads: one round trip per round
        int const p = p0 + i * kThreads + threadIdx.x;
        int const id = p < pairs ? PairMode::expert_of(a, p) : -2;  // -1: outside [0, E)
        mine[i] = id == e || (id == -1 && e == 0);
        entry[i] = id == -1 ? ~p : p;
      }
      int lane_rank[kScanPer];
#pragma unroll
      for (int i = 0; i < kScanPer; ++i) {
        unsigned const ballot = __ballot_sync(0xffffffffu, mine[i]);
        lane_rank[i] = __popc(ballot & below);
        if (lane == 0) sc.counts[i * kWarps + warp] = __popc(ballot);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kScanPer; ++i) {  // pair order: round, i, warp, lane
        int before = 0, total = 0;
#pragma unroll 1
        for (int w = 0; w < kWarps; ++w) {
          int const c = sc.counts[i * kWarps + w];
          before += w < warp ? c : 0;
          total += c;
        }
        int const slot = ranked + before + lane_rank[i] - first;
        if (mine[i] && slot >= 0 && slot < kTokens) sc.entries[slot] = entry[i];
        ranked += total;
      }
      __syncthreads();  // the counts are rewritten by the next round; the entries are complete
    }
    int const n = min(kTokens, ranked - first);
    if (threadIdx.x < kTokens) {
      int const r = threadIdx.x;
      int src = -1;
      if (r < n) {
        int const ent = sc.entries[r];
        src = ent < 0 ? -1 : (kGated ? ent / a.top_k : ent);
      }
      sc.src[r] = src;
      sc.last[r] = 0;
    }
    __syncthreads();
    return n;
  }

  static __device__ __forceinline__ int pair_of(int entry) { return entry < 0 ? ~entry : entry; }

  // XStage::load with the chunk's rows gathered: row r of the slice is x row src[r] (zeros for -1
  // and past K). K % 8 == 0 and 16-byte aligned rows: a 16-byte chunk is wholly in or out.
  static __device__ __forceinline__ void stage_x(GemvArgs const& p, int kb0, int lane, char* xs, int const* src) {
    constexpr int kRowChunks = kUnroll * 2;  // 16-byte chunks per row of the slice
    __syncwarp();                            // the previous step's fragment reads are done
#pragma unroll
    for (int c = lane; c < kTokens * kRowChunks; c += 32) {
      int const row = c / kRowChunks, ch = c % kRowChunks, k = kb0 * 16 + ch * 8;
      int const r = src[row];
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r >= 0 && k < p.k) {
        uint4 const* from = reinterpret_cast<uint4 const*>(static_cast<raw const*>(p.x) + (size_t)r * p.k + k);
        if constexpr (kFreshX) {
          v = __ldcg(from);
        } else {
          v = __ldg(from);
        }
      }
      *reinterpret_cast<uint4*>(xs + row * XS::kRowBytes + ch * 16) = v;
    }
    __syncwarp();
  }

  // Gemv::mainloop's mma path with stage_x for XS::load (gemv_mainloop calls it with the number of
  // atoms one group-parameter load serves). gap: the up strips' distance (gate|up), src: the chunk's rows.
  template <int kGroupAtoms>
  static __device__ __forceinline__ void mainloop(GemvArgs const& p, int strip0, int kbeg, int kend, int wk, char* xs,
                                                  Acc& acc, int gap, int const* src) {
    int const lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t const* bw = static_cast<uint32_t const*>(p.b);
    size_t const block_stride = (size_t)p.strips * (32 * W::kWords);
    uint32_t const* wbase = block_words<W>(bw, 0, strip0, p.strips, lane);
    bool const strips_inside = G::strip_of(strip0, kAllStrips - 1, gap) < p.strips;
    for (int kb0 = kbeg + wk * kUnroll; kb0 < kend; kb0 += kWarpsK * kUnroll) {
      // 1. Every weight load of the step first, unchecked at immediate offsets when the step is
      // inside the slice with all its strips (as gemv).
      uint32_t wq[G::kBlocks][kAllStrips][W::kWords];
      if (kb0 + kUnroll <= kend && strips_inside) {
        uint32_t const* from = wbase + (size_t)(kb0 / W::kAtoms) * block_stride;
#pragma unroll
        for (int bi = 0; bi < G::kBlocks; ++bi)
#pragma unroll
          for (int j = 0; j < kAllStrips; ++j)
            W::load_at(from + bi * block_stride + G::strip_of(0, j, gap) * (32 * W::kWords), wq[bi][j]);
      } else {
#pragma unroll
        for (int bi = 0; bi < G::kBlocks; ++bi)
#pragma unroll
          for (int j = 0; j < kAllStrips; ++j) {
            int const kb = kb0 + bi * W::kAtoms, nb = G::strip_of(strip0, j, gap);
            if (kb < kend && nb < p.strips) {
              W::load_at(block_words<W>(bw, kb / W::kAtoms, nb, p.strips, lane), wq[bi][j]);
            } else {
#pragma unroll
              for (int c = 0; c < W::kWords; ++c) wq[bi][j][c] = 0u;
            }
          }
      }
      // 2. The chunk's rows of x for the step, gathered into the warp's slice, then B fragments:
      // tile mt's fragment is chunk row mt * 8 + g.
      stage_x(p, kb0, lane, xs, src);
      uint32_t xf[kUnroll][kTiles][2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) {
          xf[u][mt][0] = XS::pair(xs, mt * 8 + g, u, t, 0);
          xf[u][mt][1] = XS::pair(xs, mt * 8 + g, u, t, 1);
        }
      // 3. Convert, scale, multiply (group parameters once per kGroupAtoms atoms, L1 hits).
      uint32_t s[kAllStrips][2], z[kAllStrips][2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (kb0 + u >= kend) break;
        if (u % kGroupAtoms == 0) G::load_params(p, kb0 + u, strip0, s, z, gap);
#pragma unroll
        for (int j = 0; j < kAllStrips; ++j) G::atom_math(wq[u / W::kAtoms][j], u, s[j], z[j], xf[u], acc[j]);
      }
    }
  }

  // f(column, chunk row, value) (down) or f(i, chunk row, gate, up) (gate|up) for each of the lane's
  // accumulators inside the output and the chunk. mma accumulator (j, mt, e): row g + 8 (e >> 1) of
  // strip j, token column mt * 8 + 2t + (e & 1) of the n8 tile: here the chunk row. Interleaved
  // gate|up (gate_up): strip j of 2 kStrips from 2 strip0 holds output 8 (2 strip0 + j) + g, its gate
  // in rows g (e = 0, 1) and its up in rows g + 8 (e = 2, 3).
  template <typename F>
  static __device__ __forceinline__ void for_each_output(int gate_up, int strip0, int lane, int outputs, int n,
                                                         Acc const& acc, F&& f) {
    if constexpr (kGated) {
      if (gate_up) {
#pragma unroll
        for (int j = 0; j < 2 * kStrips; ++j)
#pragma unroll
          for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              int const i = kGateUpBlock * (2 * strip0 + j) + (lane >> 2);
              int const r = mt * 8 + 2 * (lane & 3) + c;
              if (i < outputs && r < n) f(i, r, acc[j][mt][c], acc[j][mt][2 + c]);
            }
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < kStrips; ++j)
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const col = 16 * (strip0 + j) + (lane >> 2) + 8 * (e >> 1);
          int const r = mt * 8 + 2 * (lane & 3) + (e & 1);
          if (col < outputs && r < n) {
            if constexpr (kGated) {
              f(col, r, acc[j][mt][e], acc[kStrips + j][mt][e]);
            } else {
              f(col, r, acc[j][mt][e]);
            }
          }
        }
  }

  // One chunk's main loop and in-CTA reduction: afterwards warps wk == 0 hold the CTA's sums.
  static __device__ __forceinline__ void chunk_sums(GemvArgs const& p, char* smem, int strip0, int gap,
                                                    Scan const& sc, Acc& acc) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const kbeg = blockIdx.y * p.chunk, kend = min(kbeg + p.chunk, p.katoms);
    float (&flat)[kAcc] = reinterpret_cast<float(&)[kAcc]>(acc);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) flat[i] = 0.f;
    char* xs = smem + G::kReduceBytes + warp * XS::kBytes;
    gemv_mainloop<MoeGemvExpert>(p, strip0, kbeg, kend, wk, xs, acc, gap, static_cast<int const*>(sc.src));
    Epilogue::reduce(smem, flat, wn, wk, lane);
  }

  // grid (row tiles over I, splits, experts * chunks).
  static __device__ void gate_up(MoeGemvArgs const& a, char* smem) {
    int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const e = blockIdx.z / a.chunks, inter = a.n / 2, row0 = blockIdx.x * kRows;
    int const strip0 = (blockIdx.x * kWarpsN + wn) * kStrips;
    Scan const sc = scan_area(smem);
    GemvArgs const p = PairMode::expert_args(a, e, static_cast<raw const*>(a.x));
    raw* const h = static_cast<raw*>(a.y);
#pragma unroll 1
    for (int c = blockIdx.z % a.chunks;; c += a.chunks) {
      int const n = scan(a, e, c * kTokens, sc);
      if (n <= 0) return;  // uniform: the expert has no pair from here on
      Acc acc;
      GateUpRuns const runs = gate_up_runs<kStrips>(a.gate_up, strip0, inter);
      chunk_sums(p, smem, runs.strip0, runs.gap, sc, acc);
      if (a.splits == 1) {
        if (wk == 0)
          for_each_output(a.gate_up, strip0, lane, inter, n, acc, [&](int i, int r, float gate, float up) {
            int const ent = sc.entries[r];
            h[(size_t)pair_of(ent) * inter + i] = raw(ent < 0 ? 0.f : silu_mul(gate, up));
          });
        continue;
      }
      if (wk == 0)
        for_each_output(a.gate_up, strip0, lane, inter, n, acc, [&](int i, int r, float gate, float up) {
          float* plane = a.workspace + ((size_t)pair_of(sc.entries[r]) * a.splits + blockIdx.y) * a.n;
          __stcg(plane + i, gate);
          __stcg(plane + inter + i, up);
        });
      __threadfence();  // the planes are visible GPU-wide before the arrival that announces them
      __syncthreads();
      if (threadIdx.x == 0) {
        int* counter = a.counters + (size_t)pair_of(sc.entries[0]) * gridDim.x + blockIdx.x;
        int const last = atomicAdd(counter, 1) == a.splits - 1;
        if (last) *counter = 0;  // every slice has arrived: nobody else touches it in this launch
        sc.last[0] = last;
      }
      __syncthreads();
      if (!sc.last[0]) continue;
      __threadfence();  // acquire side: the other slices' planes are not stale
      for (int idx = threadIdx.x; idx < n * kRows; idx += kThreads) {
        int const r = idx / kRows, i = row0 + idx % kRows;
        if (i >= inter) continue;
        int const ent = sc.entries[r];
        float const* planes = a.workspace + (size_t)pair_of(ent) * a.splits * a.n;
        float gate = __ldcg(planes + i), up = __ldcg(planes + inter + i);
        for (int sl = 1; sl < a.splits; ++sl) {
          gate += __ldcg(planes + (size_t)sl * a.n + i);
          up += __ldcg(planes + (size_t)sl * a.n + inter + i);
        }
        h[(size_t)pair_of(ent) * inter + i] = raw(ent < 0 ? 0.f : silu_mul(gate, up));
      }
    }
  }

  // grid (row tiles over H, splits, experts * chunks).
  static __device__ void down(MoeGemvArgs const& a, char* smem) {
    int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const e = blockIdx.z / a.chunks, row0 = blockIdx.x * kRows;
    int const strip0 = (blockIdx.x * kWarpsN + wn) * kStrips;
    int const planes_per_token = a.top_k * a.splits;
    Scan const sc = scan_area(smem);
    GemvArgs const p = PairMode::expert_args(a, e, static_cast<raw const*>(a.x));
    raw* const y = static_cast<raw*>(a.y);
    // PDL (moe_pdl.cuh): the wait comes first, without a prefetch. Which CTAs have pairs is known only
    // after a scan of the routing, and any scan or test ahead of this loop (even a warp ballot over
    // the ids) moves ptxas from 64 to 96-109 registers on sm_90 (m16: 4 -> 2 CTAs per SM), where
    // pair and persistent mode keep theirs; this mode keeps only the launch overlap.
    pdl_wait();
#pragma unroll 1
    for (int c = blockIdx.z % a.chunks;; c += a.chunks) {
      int const n = scan(a, e, c * kTokens, sc);
      if (n <= 0) return;  // uniform: the expert has no pair from here on
      Acc acc;
      chunk_sums(p, smem, strip0, 0, sc, acc);
      if (planes_per_token == 1) {  // top_k == 1, one slice: pair p is token p
        if (wk == 0)
          for_each_output(0, strip0, lane, a.n, n, acc, [&](int col, int r, float v) {
            int const ent = sc.entries[r], pair = pair_of(ent);
            y[(size_t)pair * a.n + col] = raw(ent < 0 ? 0.f : topk_weight_f32(a, pair) * v);
          });
        continue;
      }
      if (wk == 0)
        for_each_output(0, strip0, lane, a.n, n, acc, [&](int col, int r, float v) {
          int const ent = sc.entries[r], pair = pair_of(ent);
          float* plane = a.workspace + ((size_t)pair * a.splits + blockIdx.y) * a.n;
          __stcg(plane + col, ent < 0 ? 0.f : topk_weight_f32(a, pair) * v);
        });
      __threadfence();  // the planes are visible GPU-wide before the arrivals that announce them
      __syncthreads();
      if (threadIdx.x < n) {  // one arrival per pair of the chunk at its (token, row tile)
        int const token = pair_of(sc.entries[threadIdx.x]) / a.top_k;
        int* counter = a.counters + (size_t)token * gridDim.x + blockIdx.x;
        int const last = atomicAdd(counter, 1) == planes_per_token - 1;
        if (last) *counter = 0;  // all of the token's planes have arrived: nobody else touches it
        sc.last[threadIdx.x] = last;
      }
      __syncthreads();
      __threadfence();  // acquire side: the other CTAs' planes are not stale
      for (int idx = threadIdx.x; idx < n * kRows; idx += kThreads) {
        int const r = idx / kRows, col = row0 + idx % kRows;
        if (!sc.last[r] || col >= a.n) continue;
        int const token = pair_of(sc.entries[r]) / a.top_k;
        float const* src = a.workspace + (size_t)token * planes_per_token * a.n + col;
        float v = __ldcg(src);  // slot 0 slice 0, then slot-major, slice-minor: (t k + j) splits + slice
        for (int q = 1; q < planes_per_token; ++q) v += __ldcg(src + (size_t)q * a.n);
        y[(size_t)token * a.n + col] = raw(v);
      }
    }
  }

  static __device__ void run(MoeGemvArgs const& a, char* smem) {
    if constexpr (kGated) {
      pdl_launch_dependents();  // the down kernel may launch now (moe_pdl.cuh: why at the start)
      gate_up(a, smem);
    } else {
      down(a, smem);
    }
  }
};

}  // namespace mixed_gemm
