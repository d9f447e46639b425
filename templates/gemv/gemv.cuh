// Decode GEMM for M <= 32 tokens, reading the sm90a weight layout straight from global memory:
//   y[M, N] = x[M, K] (fp16/bf16, row-major) x W^T (+ bias[N]) (+ residual[M, N]),
//   W[n, k] = q'[n, k] s[g, n] + z'[g, n]
// with q' the stored signed code and z' the additive zero the sm90a layout holds (every zero mode
// folds into it at prepack: mixed_gemm/kernels/sm90a/layout.py).
//
// Why this shape. At decode the only limit is HBM bandwidth, so the kernel keeps enough bytes in
// flight per SM (Little's law: ~3 TB/s x ~1 us / 132 SMs ~ 20 KB) and does nothing between the
// load and the math: no shared-memory staging, no cp.async pipeline, no prologue. The problem is
// transposed, y^T = W x^T, so the weight is the A operand of mma.sync.m16n8k16 and the activations
// (<= 8 tokens per n8 tile, zero-padded) are the B operand:
//   - an sm90a atom (16 n x 16 k, 32 words for int4) is exactly one A fragment: lane l = 4 g + t
//     owns the word with rows g, g + 8 and columns 2t, 2t+1, 2t+8, 2t+9, so one 32-bit load
//     (int4; 64-bit for int8) per lane per atom feeds one mma, and a warp's load is one fully
//     coalesced 128-byte (256-byte) request; the atoms of adjacent 16-row strips are adjacent.
//   - the B fragment of x (b0 = x[g][2t, 2t+1], b1 = x[g][2t+8, 2t+9]) is two 32-bit loads that hit
//     L1/L2 (x is a few KB and every CTA reads it).
// Each warp owns kStrips strips (16 rows each) and walks its share of K kUnroll atoms at a time:
// all kUnroll x kStrips weight loads of a step are issued before any is used. kWarpsK warps of a
// CTA split the CTA's K range (reduced through shared memory in warp order), and grid.y splits K
// across CTAs (split-K: fp32 partial planes in a workspace; the last CTA of a row tile to arrive
// sums the planes in slice order and writes y, so the result does not depend on arrival order,
// and resets its arrival counter, so a launch is a single kernel node).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include "atoms/deferred.cuh"
#include "atoms/lowbit.cuh"

namespace mixed_gemm {

struct GemvArgs {
  void const* x;       // (m, k) row-major, already in the weight's (act-order) K order
  void const* b;       // sm90a atoms: int32 (katoms, strips, 8 * bits)
  void const* scales;  // (num_groups, 16 * strips), activation dtype
  void const* zeros;   // additive z', same shape (never null: symmetric weights store 0)
  void const* bias;    // (n,) or nullptr
  void const* residual;  // (m, n) row-major like y, or nullptr: added before the one rounding to y
  void* y;             // (m, n) row-major
  float* workspace;    // split-K: splits x m x n fp32 partial planes
  int* counters;       // split-K: one arrival counter per row tile, zero between launches
  int m, n, k, strips, katoms, group_shift, num_groups, splits, chunk;  // chunk: atoms per split
};

template <typename Element>
struct GemvMath;

template <>
struct GemvMath<cutlass::half_t> {
  static __device__ __forceinline__ void mma(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // 1:2-sparse: the compressed A (16 x 16 of a 16 x 32 tile), b[j] = x at k 8 j + 2t, + 1, e the
  // metadata of the lanes that kSel picks (t >> 1 == kSel).
  template <int kSel>
  static __device__ __forceinline__ void mma_sp(float (&d)[4], uint32_t const (&a)[4], uint32_t const (&b)[4], uint32_t e) {
    asm volatile(
        "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, %13;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e), "n"(kSel));
  }
};

template <>
struct GemvMath<cutlass::bfloat16_t> {
  static __device__ __forceinline__ void mma(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // 1:2-sparse: the compressed A (16 x 16 of a 16 x 32 tile), b[j] = x at k 8 j + 2t, + 1, e the
  // metadata of the lanes that kSel picks (t >> 1 == kSel).
  template <int kSel>
  static __device__ __forceinline__ void mma_sp(float (&d)[4], uint32_t const (&a)[4], uint32_t const (&b)[4], uint32_t e) {
    asm volatile(
        "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, %13;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e), "n"(kSel));
  }
};

// The end of every gemv kernel. The K partials of a CTA's warps are summed in warp order through
// shared memory (deterministic); then one slice writes y (+ bias) directly, or, split across CTAs
// (grid.y), each slice publishes an fp32 plane, the last slice of the row tile to arrive sums the
// planes in slice order (the result does not depend on the arrival order), writes y and resets
// the tile's arrival counter, so the next launch (or graph replay) finds it at zero: one kernel
// node, no memset. The residual (a decoder block's skip connection, (m, n) like y) is added in fp32
// where y is written, so the sum is rounded once and no add kernel follows. `outputs(f)` calls f(n, token, value) for each of the lane's kAcc accumulators
// that lies inside y. reduce() alone is the first step (moe_gemv's epilogues run it, then their own).
template <typename raw, int kAcc, int kWarpsN, int kWarpsK, int kRows, int kThreads>
struct GemvEpilogue {
  // Afterwards the warps with wk == 0 hold their column's CTA sums, added in warp order.
  static __device__ __forceinline__ void reduce(char* smem, float (&acc)[kAcc], int wn, int wk, int lane) {
    if (kWarpsK > 1) {
      float* red = reinterpret_cast<float*>(smem);
      if (wk > 0) {
        float* dst = red + ((size_t)((wk - 1) * kWarpsN + wn) * kAcc) * 32 + lane;
#pragma unroll
        for (int i = 0; i < kAcc; ++i) dst[i * 32] = acc[i];
      }
      __syncthreads();
      if (wk == 0) {
#pragma unroll 1
        for (int w = 1; w < kWarpsK; ++w) {
          float const* src = red + ((size_t)((w - 1) * kWarpsN + wn) * kAcc) * 32 + lane;
#pragma unroll
          for (int i = 0; i < kAcc; ++i) acc[i] += src[i * 32];
        }
      }
    }
  }

  template <typename Outputs>
  static __device__ void run(GemvArgs const& p, char* smem, float (&acc)[kAcc], int wn, int wk, int lane,
                             Outputs const& outputs) {
    reduce(smem, acc, wn, wk, lane);
    raw const* bias = static_cast<raw const*>(p.bias);
    raw const* residual = static_cast<raw const*>(p.residual);
    raw* y = static_cast<raw*>(p.y);
    if (p.splits == 1) {
      if (wk != 0) return;
      outputs([&](int n, int token, float v) {
        size_t const at = (size_t)token * p.n + n;
        if (bias != nullptr) v += static_cast<float>(bias[n]);
        if (residual != nullptr) v += static_cast<float>(residual[at]);
        y[at] = raw(v);
      });
      return;
    }
    if (wk == 0) {
      float* plane = p.workspace + (size_t)blockIdx.y * p.m * p.n;
      outputs([&](int n, int token, float v) { __stcg(plane + (size_t)token * p.n + n, v); });
    }
    __threadfence();  // the plane is visible GPU-wide before the arrival that announces it
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
      int* counter = p.counters + blockIdx.x;
      last = atomicAdd(counter, 1) == p.splits - 1;
      if (last) *counter = 0;  // every slice has arrived: nobody else touches it in this launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // acquire side: the other slices' planes are not stale
    int const row0 = blockIdx.x * kRows;
    size_t const plane = (size_t)p.m * p.n;
    for (int i = threadIdx.x; i < p.m * kRows; i += kThreads) {
      int const token = i / kRows, n = row0 + i % kRows;
      if (n >= p.n) continue;
      float const* src = p.workspace + (size_t)token * p.n + n;
      float v = __ldcg(src);
      for (int sl = 1; sl < p.splits; ++sl) v += __ldcg(src + sl * plane);
      size_t const at = (size_t)token * p.n + n;
      if (bias != nullptr) v += static_cast<float>(bias[n]);
      if (residual != nullptr) v += static_cast<float>(residual[at]);
      y[at] = raw(v);
    }
  }
};

// kStageX (both kernels): a warp copies its step's slice of x, `rows` token rows x kUnroll x 16 k,
// into shared memory with 16-byte loads before reading its fragments there. Read from global
// memory, a fragment load (x[g][2t, 2t+1] for 8 rows g) touches one L1 line per token row: at
// M = 8..16 that, not the weight, bounds the kernel. Rows are padded by 16 bytes, so the 16-byte
// stores (8 lanes per 128 bytes of a row) and the fragment reads (bank 4g + 8u + t) are conflict-free.
template <typename raw, int kRowsX, int kUnroll>
struct XStage {
  static constexpr int kRowBytes = kUnroll * 32 + 16;
  static constexpr int kBytes = kRowsX * kRowBytes;

  static __device__ __forceinline__ void load(GemvArgs const& p, int kb0, int lane, char* xs) {
    constexpr int kRowChunks = kUnroll * 2;  // 16-byte chunks per row of the slice
    __syncwarp();                            // the previous step's fragment reads are done
#pragma unroll
    for (int c = lane; c < kRowsX * kRowChunks; c += 32) {
      int const row = c / kRowChunks, ch = c % kRowChunks, k = kb0 * 16 + ch * 8;
      // K % 8 == 0 and 16-byte aligned rows (matmul's rules): a chunk is wholly in or out.
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (row < p.m && k < p.k)
        v = __ldg(reinterpret_cast<uint4 const*>(static_cast<raw const*>(p.x) + (size_t)row * p.k + k));
      *reinterpret_cast<uint4*>(xs + row * kRowBytes + ch * 16) = v;
    }
    __syncwarp();
  }

  // The pair x[row][k, k + 1] straight from global memory (without kStageX), 0 outside x. K % 8 == 0
  // (prepack's rule), so a pair with k even is wholly inside or outside.
  static __device__ __forceinline__ uint32_t global_pair(GemvArgs const& p, int row, int k) {
    if (row >= p.m || k >= p.k) return 0u;
    return __ldg(reinterpret_cast<uint32_t const*>(static_cast<raw const*>(p.x) + (size_t)row * p.k + k));
  }

  // The pair x[row][16 u + 2t + 8 hi, +1] of the staged slice.
  static __device__ __forceinline__ uint32_t pair(char const* xs, int row, int u, int t, int hi) {
    return *reinterpret_cast<uint32_t const*>(xs + row * kRowBytes + (u * 16 + 2 * t + 8 * hi) * 2);
  }

  // Atoms u, u + 1's B fragments of one n8 tile in one ldmatrix.x4 instead of four 32-bit loads:
  // matrix q is k 16 u + 8 q .. + 7 of the tile's 8 token rows, so lane (g, t) receives x[g][16 u +
  // 8 q + 2t, + 1] as register q: b[0], b[1] are atom u's fragment, b[2], b[3] atom u + 1's. Lane l
  // names row l & 7 of matrix l >> 3 (`row`: that token's staged row). Rows start on 16 bytes and lie
  // an odd number of 16-byte chunks apart, so a matrix's 8 rows hit distinct bank quads.
  static __device__ __forceinline__ void pairs_x4(char const* xs, int row, int u, int lane, uint32_t (&b)[4]) {
    uint32_t const addr =
        static_cast<uint32_t>(__cvta_generic_to_shared(xs + row * kRowBytes + (u * 16 + 8 * (lane >> 3)) * 2));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(addr)
                 : "memory");
  }

  // A step's B fragments from the staged slice: xf[u][mt] for kTiles n8 tiles (ldmatrix.x4 per two
  // atoms), `row_of(r)` the staged row of the tile's token row r.
  template <int kUnroll_, int kTiles_, typename RowOf>
  static __device__ __forceinline__ void fragments_x4(char const* xs, int lane, RowOf const& row_of,
                                                      uint32_t (&xf)[kUnroll_][kTiles_][2]) {
    static_assert(kUnroll_ % 2 == 0, "ldmatrix.x4 takes two atoms");
#pragma unroll
    for (int u = 0; u < kUnroll_; u += 2)
#pragma unroll
      for (int mt = 0; mt < kTiles_; ++mt) {
        uint32_t b[4];
        pairs_x4(xs, row_of(mt * 8 + (lane & 7)), u, lane, b);
        xf[u][mt][0] = b[0];
        xf[u][mt][1] = b[1];
        xf[u + 1][mt][0] = b[2];
        xf[u + 1][mt][1] = b[3];
      }
  }
};

// Every gemv kernel's run(): zeroed accumulators, the main loop, then the epilogue. The main loop's
// argument is how many atoms one load of the group parameters serves: the step (kUnroll atoms) when
// the group spans a multiple of it (both powers of two, steps start at multiples of kUnroll), else
// the group's atoms where the kernel has that variant (K::kFineGroups: 4 for group 64, 2 for 32),
// else 1 (a load per atom: L1 hits, but at 2 bits a third of the loop's instructions).
// gemv_mainloop is that choice; `extra` goes on to the main loop (moe_gemv: the strip gap).
template <typename K, typename... Extra>
__device__ __forceinline__ void gemv_mainloop(GemvArgs const& p, int strip0, int kbeg, int kend, int wk, char* xs,
                                              typename K::Acc& acc, Extra... extra) {
  int const group_atoms_log2 = p.group_shift - 4;
  constexpr int kU4 = K::kU < 4 ? K::kU : 4, kU2 = K::kU < 2 ? K::kU : 2;
  if (group_atoms_log2 >= __ffs(K::kU) - 1) {
    K::template mainloop<K::kU>(p, strip0, kbeg, kend, wk, xs, acc, extra...);
  } else if constexpr (K::kFineGroups) {
    if (group_atoms_log2 >= 2) {
      K::template mainloop<kU4>(p, strip0, kbeg, kend, wk, xs, acc, extra...);
    } else if (group_atoms_log2 == 1) {
      K::template mainloop<kU2>(p, strip0, kbeg, kend, wk, xs, acc, extra...);
    } else {
      K::template mainloop<1>(p, strip0, kbeg, kend, wk, xs, acc, extra...);
    }
  } else {
    K::template mainloop<1>(p, strip0, kbeg, kend, wk, xs, acc, extra...);
  }
}

template <typename K>
__device__ __forceinline__ void gemv_run(GemvArgs const& p, char* smem) {
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int const wn = warp % K::kWN, wk = warp / K::kWN;
  int const strip0 = (blockIdx.x * K::kWN + wn) * K::kSN;
  int const kbeg = blockIdx.y * p.chunk, kend = min(kbeg + p.chunk, p.katoms);
  typename K::Acc acc;
  float (&flat)[K::kAcc] = reinterpret_cast<float(&)[K::kAcc]>(acc);
#pragma unroll
  for (int i = 0; i < K::kAcc; ++i) flat[i] = 0.f;
  char* xs = smem + K::kReduceBytes + warp * K::kXWarpBytes;
  gemv_mainloop<K>(p, strip0, kbeg, kend, wk, xs, acc);
  K::finish(flat);
  GemvEpilogue<typename K::raw, K::kAcc, K::kWN, K::kWK, K::kRows, K::kThreads>::run(
      p, smem, flat, wn, wk, lane, [&](auto&& f) { K::for_each_output(p, strip0, lane, acc, f); });
}

// kFmaTokens > 0: CUDA-core variant for 1-4 tokens. The same loads and converters, then fp32 FMAs
// instead of an mma whose n8 tile would be 7/8 (M=1) padding: lane (g, t) multiplies its 8 weights
// (rows g, g + 8; k 2t, 2t+1, 2t+8, 2t+9) by x[m] at those k for each token m and, after the loop,
// the 4 lanes t of a row sum their partials with two shuffles. kTiles is then unused.
// kRuns > 1 (moe_gemv's gate|up kernel): a warp's kStrips strips are kRuns runs of kStrips / kRuns
// adjacent strips, run r starting r * gap strips after strip0 (gate strip s and up strip s + I/16
// of one weight), so one lane holds both operands of an output; gemv's strips are one run.
// kDeferred (`_ds`, mma and the sm90a layout only): the group scale and zero are applied to the
// fp32 sums once per group (atoms/deferred.cuh), not to every weight pair. kCapped: compiled with
// a register cap (`_o<N>`): no separate path for whole steps (see mainloop, step 3).
template <typename Element, int kBits, int kTiles, int kStrips, int kWarpsN, int kWarpsK, int kUnroll, bool kStageX,
          int kFmaTokens = 0, int kRuns = 1, bool kDeferred = false, bool kCapped = false>
struct Gemv {
  static constexpr int kWN = kWarpsN, kWK = kWarpsK, kSN = kStrips, kU = kUnroll;  // for gemv_run
  static constexpr bool kFineGroups = true;
  using P = Pair<Element>;
  using raw = typename P::raw;
  using raw2 = typename P::raw2;
  static constexpr bool kFma = kFmaTokens > 0;
  static constexpr int kXRows = kFma ? kFmaTokens : kTiles;  // x operands per step: tokens, or n8 tiles
  static constexpr int kPer = kFma ? 2 : 4;                  // accumulators per (strip, x operand)
  using W = WeightAtoms<Element, kBits>;                // how the stored width is read (atoms/lowbit.cuh)
  static constexpr int kBlocks = kUnroll / W::kAtoms;    // weight blocks per warp step
  static constexpr int kThreads = 32 * kWarpsN * kWarpsK;
  static constexpr int kRows = 16 * kStrips * kWarpsN;  // weight rows (outputs) of a CTA
  static constexpr int kAcc = kStrips * kXRows * kPer;  // fp32 accumulators per lane
  // Cross-warp K reduction: warps 1.. of each column write their accumulators here.
  static constexpr int kReduceBytes = (kWarpsK - 1) * kWarpsN * kAcc * 32 * 4;
  using XS = XStage<raw, kFma ? kFmaTokens : kTiles * 8, kUnroll>;
  static constexpr int kXWarpBytes = kStageX ? XS::kBytes : 0;
  static constexpr int kSmemBytes = kReduceBytes + kWarpsN * kWarpsK * kXWarpBytes;
  static_assert(kUnroll >= 1 && (kUnroll & (kUnroll - 1)) == 0, "kUnroll: a power of two (group alignment)");
  static_assert(kUnroll % W::kAtoms == 0, "kUnroll: whole blocks of the layout (4 atoms for 1-3 bits)");
  static_assert(kRuns >= 1 && kStrips % kRuns == 0, "kRuns: equal runs of strips");
  static_assert(!kDeferred || (!kFma && kBits != 7),
                "kDeferred: the mma kernels, not 1:2-sparse (a dropped element's zero would enter the sums of x)");
  // 1:2-sparse weights run on mma.sp (atoms u, u + 1 as one m16n8k32 tile: unit_math).
  static constexpr bool kSparse = kBits == 7;
  static_assert(!kSparse || !kFma, "1:2-sparse: mma.sp kernels only (tokens 8, 16, 32), not the FMA variant");
  static constexpr int kRun = kStrips / kRuns;

  // The weight strip of the warp's strip j (strip0 + j with one run: gemv's code is unchanged).
  static __device__ __forceinline__ int strip_of(int strip0, int j, int gap) {
    if constexpr (kRuns == 1) {
      return strip0 + j;
    } else {
      return strip0 + j % kRun + (j / kRun) * gap;
    }
  }

  // s and z' of rows (g, g + 8) of strip nb in group gi, as (s, s) / (z, z) pairs.
  static __device__ __forceinline__ void group_params(GemvArgs const& p, int gi, int nb, int g, uint32_t (&s)[2],
                                                      uint32_t (&z)[2]) {
    size_t const base = (size_t)gi * (16 * p.strips) + 16 * nb + g;
    raw const* sp = static_cast<raw const*>(p.scales) + base;
    raw const* zp = static_cast<raw const*>(p.zeros) + base;
    s[0] = P::splat(__ldg(sp));
    s[1] = P::splat(__ldg(sp + 8));
    z[0] = P::splat(__ldg(zp));
    z[1] = P::splat(__ldg(zp + 8));
  }

  // The row of `params` (scales or zeros, (num_groups, 16 strips)) of atom kb's group; a lane adds
  // its offset (poff in mainloop: row g of its strip; + 8 for row g + 8).
  static __device__ __forceinline__ raw const* group_row(void const* params, GemvArgs const& p, int kb) {
    return static_cast<raw const*>(params) + (size_t)min((kb * 16) >> p.group_shift, p.num_groups - 1) * (16 * p.strips);
  }

  static __device__ __forceinline__ void load_params(GemvArgs const& p, int kb, int strip0, uint32_t (&s)[kStrips][2],
                                                     uint32_t (&z)[kStrips][2], int gap = 0) {
    int const gi = min((kb * 16) >> p.group_shift, p.num_groups - 1);
#pragma unroll
    for (int j = 0; j < kStrips; ++j)
      group_params(p, gi, min(strip_of(strip0, j, gap), p.strips - 1), (threadIdx.x & 31) >> 2, s[j], z[j]);
  }

  template <int kGroupAtoms>  // atoms per parameter load (see gemv_run)
  static __device__ __forceinline__ void mainloop(GemvArgs const& p, int strip0, int kbeg, int kend, int wk,
                                                  char* xs, float (&acc)[kStrips][kXRows][kPer], int gap = 0) {
    int const lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t const* bw = static_cast<uint32_t const*>(p.b);
    // Loop invariants: the lane's word of the warp's first strip in block 0 and the stride between
    // blocks; whether all the warp's strips exist; each x operand's row (row 0 past M, not read).
    size_t const block_stride = (size_t)p.strips * (32 * W::kWords);
    uint32_t const* wbase = block_words<W>(bw, 0, strip0, p.strips, lane);
    bool const strips_inside = kRuns == 1 ? strip0 + kStrips <= p.strips : strip_of(strip0, kStrips - 1, gap) < p.strips;
    // An x operand's row past M reads row M - 1 instead of zeros: its outputs (an mma's column, an
    // FMA token) are never written, and the loads need no predicate (a branch per load pair in SASS).
    raw const* xrow[kXRows];
#pragma unroll
    for (int mt = 0; mt < kXRows; ++mt)
      xrow[mt] = static_cast<raw const*>(p.x) + (size_t)min(kFma ? mt : mt * 8 + g, p.m - 1) * p.k + 2 * t;
    // The lane's parameter offsets (rows g of each strip; a strip past N reads the last one, unused),
    // so a group's loads are one multiply and immediate offsets.
    int poff[kStrips];
#pragma unroll
    for (int j = 0; j < kStrips; ++j) poff[j] = 16 * min(strip_of(strip0, j, gap), p.strips - 1) + g;
    for (int kb0 = kbeg + wk * kUnroll; kb0 < kend; kb0 += kWarpsK * kUnroll) {
      // 1. Every weight load of the step first (they are what the SM waits for). Steps start on
      // multiples of kUnroll atoms and K is padded to whole blocks, so a block is in or out whole.
      // A step wholly inside the slice, with all its strips (all but a slice's last step and a
      // ragged N's last warps), loads at immediate offsets from one pointer, unchecked: at 2 bits
      // the per-block checks and 64-bit address arithmetic were a fifth of the loop.
      uint32_t wq[kBlocks][kStrips][W::kWords];
      if (kb0 + kUnroll <= kend && strips_inside) {
        uint32_t const* src = wbase + (size_t)(kb0 / W::kAtoms) * block_stride;
#pragma unroll
        for (int bi = 0; bi < kBlocks; ++bi)
#pragma unroll
          for (int j = 0; j < kStrips; ++j)
            W::load_at(src + bi * block_stride + strip_of(0, j, gap) * (32 * W::kWords), wq[bi][j]);
      } else {
#pragma unroll
        for (int bi = 0; bi < kBlocks; ++bi)
#pragma unroll
          for (int j = 0; j < kStrips; ++j) {
            int const kb = kb0 + bi * W::kAtoms, nb = strip_of(strip0, j, gap);
            if (kb < kend && nb < p.strips) {
              W::load_at(block_words<W>(bw, kb / W::kAtoms, nb, p.strips, lane), wq[bi][j]);
            } else {
#pragma unroll
              for (int c = 0; c < W::kWords; ++c) wq[bi][j][c] = 0u;
            }
          }
      }
      // 2. The activations' B fragments (L1/L2 hits) and the group parameters.
      // The mma's B fragment of tile mt is token row mt * 8 + g; the FMA variant's operand m is token m.
      uint32_t xf[kUnroll][kXRows][2];
      if (kStageX) {
        XS::load(p, kb0, lane, xs);
        // ldmatrix.x4 (two atoms per instruction) for the 1:2-sparse kernels only, where it measured
        // 2-4% faster at M=16. Elsewhere its asm fixes the whole step's fragments in registers at
        // once: the u8 _xs_ds kernel went from 80 to 92 registers (3 -> 2 CTAs per SM) and _xs_o4
        // spilled 280 bytes, so those read two 32-bit pairs per atom as they were profiled.
        if constexpr (kSparse && kUnroll % 2 == 0) {
          XS::fragments_x4(xs, lane, [](int r) { return r; }, xf);  // rows past M: staged zeros
        } else {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u)
#pragma unroll
            for (int mt = 0; mt < kXRows; ++mt) {
              xf[u][mt][0] = XS::pair(xs, kFma ? mt : mt * 8 + g, u, t, 0);
              xf[u][mt][1] = XS::pair(xs, kFma ? mt : mt * 8 + g, u, t, 1);
            }
        }
      } else if ((kb0 + kUnroll) * 16 <= p.k) {  // the step inside K: one row check, immediate offsets
#pragma unroll
        for (int mt = 0; mt < kXRows; ++mt) {
          uint32_t const* const src = reinterpret_cast<uint32_t const*>(xrow[mt] + kb0 * 16);  // immediate offsets
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            xf[u][mt][0] = __ldg(src + u * 8);
            xf[u][mt][1] = __ldg(src + u * 8 + 4);
          }
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int mt = 0; mt < kXRows; ++mt) {
            int const k = (kb0 + u) * 16 + 2 * t;
            xf[u][mt][0] = XS::global_pair(p, kFma ? mt : mt * 8 + g, k);
            xf[u][mt][1] = XS::global_pair(p, kFma ? mt : mt * 8 + g, k + 8);
          }
      }
      // The group parameters once per kGroupAtoms atoms, right before their first use (they hit
      // L1; holding a step's worth would double the registers).
      uint32_t s[kStrips][2], z[kStrips][2];
      // 3. Convert, scale, multiply. A whole step (all but a slice's last) runs without a check per
      // atom: the check's branch also cost a WARPSYNC before every mma. Not under a register cap:
      // there ptxas, free to interleave a whole step's atoms, spilled (64 registers: 0.5 KB).
      auto compute = [&](auto whole) {
        if constexpr (kDeferred) {
          // The group's parameters straight from global memory (L1 hits), rows g + 8 h of strip j.
          auto params = [&](int u, int j, int h, float& sc, float& zc) {
            sc = static_cast<float>(__ldg(group_row(p.scales, p, kb0 + u) + poff[j] + 8 * h));
            zc = static_cast<float>(__ldg(group_row(p.zeros, p, kb0 + u) + poff[j] + 8 * h));
          };
          deferred_step<kGroupAtoms, decltype(whole)::value>(kb0, kend, wq, xf, acc, params);
          return;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if constexpr (!decltype(whole)::value) {
            if (kb0 + u >= kend) break;
          }
          if (u % kGroupAtoms == 0) {
            raw const* const sp = group_row(p.scales, p, kb0 + u);
            raw const* const zp = group_row(p.zeros, p, kb0 + u);
#pragma unroll
            for (int j = 0; j < kStrips; ++j) {
              s[j][0] = P::splat(__ldg(sp + poff[j]));
              s[j][1] = P::splat(__ldg(sp + poff[j] + 8));
              z[j][0] = P::splat(__ldg(zp + poff[j]));
              z[j][1] = P::splat(__ldg(zp + poff[j] + 8));
            }
          }
#pragma unroll
          for (int j = 0; j < kStrips; ++j) unit_math(wq[u / W::kAtoms][j], u, s[j], z[j], xf, acc[j]);
        }
      };
      if (!kCapped && kb0 + kUnroll <= kend) {
        compute(std::true_type{});
      } else {
        compute(std::false_type{});
      }
    }
  }

  // One step of the kDeferred kernel: per segment of kGroupAtoms atoms (one group's parameters),
  // the raw codes' mma sums into `part` and the activations' sums (an mma of RawAtom::sums)
  // into `xsum`, then acc += (s mul) part + (z' - off s) X [- lam s Y] per row half (rows g, g + 8:
  // their encodings differ).
  // params(u, j, h, s, z'): the parameters of atom u's group, strip j, row g + 8 h (global memory
  // here, the ring's stage in gemv_pipe.cuh).
  template <int kGroupAtoms, bool kWhole, bool kLateParams = false, typename Params>
  static __device__ __forceinline__ void deferred_step(int kb0, int kend, uint32_t const (&wq)[kBlocks][kStrips][W::kWords],
                                                       uint32_t const (&xf)[kUnroll][kXRows][2],
                                                       float (&acc)[kStrips][kXRows][kPer], Params const& params) {
    if constexpr (kDeferred) {
      using R = RawAtom<Element, kBits>;
      // xsum: the sums mma's output. R::kRowSums (lowbit): rows g (c0, c1) hold the offsets' Y and
      // rows g + 8 (c2, c3) X; else X in every row.
      float part[kStrips][kTiles][4], xsum[kTiles][4], c1[kStrips][2], c2[kStrips][2], c3[kStrips][2];
      uint32_t sums[4];
      R::sums(sums);
      auto coeffs = [&](int u0, int j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float sc, zc;
          params(u0, j, h, sc, zc);
          c1[j][h] = sc * R::mul(h);
          c2[j][h] = fmaf(-R::off(h), sc, zc);
          c3[j][h] = -R::lam(h) * sc;
        }
      };
      // kLateParams (the ring: parameters in shared memory): read at the fold, a strip at a time,
      // so they hold no registers across the segment; else at the segment's start (an L1 round
      // trip there overlaps the segment's mma's).
      auto fold = [&](int u0) {
#pragma unroll
        for (int j = 0; j < kStrips; ++j) {
          if constexpr (kLateParams) coeffs(u0, j);
#pragma unroll
          for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // c0 c1: rows g, tokens 2t, 2t+1; c2 c3: rows g + 8
              int const h = e >> 1;
              if constexpr (R::kRowSums) {
                acc[j][mt][e] = fmaf(c1[j][h], part[j][mt][e],
                                     fmaf(c3[j][h], xsum[mt][e & 1], fmaf(c2[j][h], xsum[mt][2 + (e & 1)], acc[j][mt][e])));
              } else {
                acc[j][mt][e] = fmaf(c1[j][h], part[j][mt][e], fmaf(c2[j][h], xsum[mt][e & 1], acc[j][mt][e]));
              }
            }
        }
      };
      int open = -1;  // the open segment's first atom: a segment cut short by the slice's end still folds
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if constexpr (!kWhole) {
          if (kb0 + u >= kend) break;
        }
        if (u % kGroupAtoms == 0) {
          if constexpr (!kLateParams) {
#pragma unroll
            for (int j = 0; j < kStrips; ++j) coeffs(u, j);
          }
#pragma unroll
          for (int mt = 0; mt < kTiles; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              xsum[mt][e] = 0.f;
#pragma unroll
              for (int j = 0; j < kStrips; ++j) part[j][mt][e] = 0.f;
            }
          open = u;
        }
#pragma unroll
        for (int j = 0; j < kStrips; ++j) {
          uint32_t a[4];
          R::run(wq[u / W::kAtoms][j], u % W::kAtoms, a);
#pragma unroll
          for (int mt = 0; mt < kTiles; ++mt) GemvMath<Element>::mma(part[j][mt], a, xf[u][mt][0], xf[u][mt][1]);
        }
#pragma unroll
        for (int mt = 0; mt < kTiles; ++mt) GemvMath<Element>::mma(xsum[mt], sums, xf[u][mt][0], xf[u][mt][1]);
        if ((u + 1) % kGroupAtoms == 0) {
          fold(u + 1 - kGroupAtoms);
          open = -1;
        }
      }
      if (!kWhole && open >= 0) fold(open);
    }
  }

  // Atom u of a strip, the main loops' unit: atom_math; 1:2-sparse: atoms u, u + 1 as one mma.sp tile
  // when u is even (kUnroll is whole 4-atom blocks), nothing when it is odd.
  static __device__ __forceinline__ void unit_math(uint32_t const (&w)[W::kWords], int u, uint32_t const (&s)[2],
                                                   uint32_t const (&z)[2], uint32_t const (&xf)[kUnroll][kXRows][2],
                                                   float (&acc)[kXRows][kPer]) {
    if constexpr (kSparse) {
      if (u % 2 == 0) sparse_math(w, u, s, z, xf[u], xf[u + 1], acc);
    } else {
      atom_math(w, u, s, z, xf[u], acc);
    }
  }

  // 1:2-sparse atoms u, u + 1 (u even) of a strip: mma (u % 4) / 2 of the block, its compressed A
  // as exact q', scaled like a dense atom (a group spans >= 2 atoms), one mma.sp per n8 tile of x
  // (B: the two atoms' fragments, k 8 j + 2t for register j) with the lane's metadata word.
  static __device__ __forceinline__ void sparse_math(uint32_t const (&w)[W::kWords], int u, uint32_t const (&s)[2],
                                                     uint32_t const (&z)[2], uint32_t const (&xa)[kXRows][2],
                                                     uint32_t const (&xb)[kXRows][2], float (&acc)[kXRows][kPer]) {
    int const h = (u % W::kAtoms) / 2;
    uint32_t a[4];
    W::convert_sp(w, h, a);
    atom_scale<Element>(a, s, z);
    uint32_t const e = W::meta(w);
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt) {
      uint32_t const b[4] = {xa[mt][0], xa[mt][1], xb[mt][0], xb[mt][1]};
      if (h == 0) {
        GemvMath<Element>::template mma_sp<0>(acc[mt], a, b, e);
      } else {
        GemvMath<Element>::template mma_sp<1>(acc[mt], a, b, e);
      }
    }
  }

  // Atom u of a strip: its words converted, scaled (s, z': rows g, g + 8) and multiplied into the
  // strip's accumulators (an mma per n8 tile of x, or the FMA variant's fp32 FMAs).
  static __device__ __forceinline__ void atom_math(uint32_t const (&w)[W::kWords], int u, uint32_t const (&s)[2],
                                                   uint32_t const (&z)[2], uint32_t const (&xf)[kXRows][2],
                                                   float (&acc)[kXRows][kPer]) {
    uint32_t a[4];
    W::convert(w, u % W::kAtoms, a);
    atom_scale<Element>(a, s, z);
    if constexpr (kFma) {
      fma_atom(a, xf, acc);
    } else {
#pragma unroll
      for (int mt = 0; mt < kTiles; ++mt) GemvMath<Element>::mma(acc[mt], a, xf[mt][0], xf[mt][1]);
    }
  }

  // The FMA variant's math for one atom: acc[m][0] (row g) and acc[m][1] (row g + 8) gain the dot
  // product of the lane's weights with x[m] at their k, in fp32 (weights and x widened once each).
  static __device__ __forceinline__ void fma_atom(uint32_t const (&a)[4], uint32_t const (&xf)[kXRows][2],
                                                  float (&acc)[kXRows][kPer]) {
    float2 w[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) w[r] = P::to_floats(P::val(a[r]));
#pragma unroll
    for (int m = 0; m < kXRows; ++m) {
      float2 const lo = P::to_floats(P::val(xf[m][0])), hi = P::to_floats(P::val(xf[m][1]));
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // register e: rows g / g + 8 at k 2t, 2t+1; register e + 2: at + 8
        float v = acc[m][e];
        v = fmaf(w[e].x, lo.x, v);
        v = fmaf(w[e].y, lo.y, v);
        v = fmaf(w[e + 2].x, hi.x, v);
        acc[m][e] = fmaf(w[e + 2].y, hi.y, v);
      }
    }
  }

  // After the main loop: the FMA variant's 4 lanes of a row (t = 0..3, each a quarter of every
  // atom's k) sum their partials; every lane then holds the row's sum. The mma's are complete.
  static __device__ __forceinline__ void finish(float (&flat)[kAcc]) {
    if constexpr (kFma) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        flat[i] += __shfl_xor_sync(0xffffffffu, flat[i], 1);
        flat[i] += __shfl_xor_sync(0xffffffffu, flat[i], 2);
      }
    }
  }

  // Calls f(n, token, value) for every accumulator inside the output (one run). mma accumulator (j, mt, e):
  // c0 c1 are rows g, tokens 2t, 2t+1 of strip j and n8 tile mt; c2 c3 rows g + 8. FMA accumulator
  // (j, m, e): row g + 8 e, token m, written by lane t = m % 4 (all four hold it).
  template <typename F>
  static __device__ __forceinline__ void for_each_output(GemvArgs const& p, int strip0, int lane,
                                                         float const (&acc)[kStrips][kXRows][kPer], F&& f) {
#pragma unroll
    for (int j = 0; j < kStrips; ++j)
#pragma unroll
      for (int mt = 0; mt < kXRows; ++mt)
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          if constexpr (kFma) {
            int const n = 16 * (strip0 + j) + (lane >> 2) + 8 * e;
            if (n < p.n && mt < p.m && (lane & 3) == (mt & 3)) f(n, mt, acc[j][mt][e]);
          } else {
            int const n = 16 * (strip0 + j) + (lane >> 2) + 8 * (e >> 1);
            int const token = mt * 8 + 2 * (lane & 3) + (e & 1);
            if (n < p.n && token < p.m) f(n, token, acc[j][mt][e]);
          }
        }
  }

  using Acc = float[kStrips][kXRows][kPer];
  static __device__ void run(GemvArgs const& p, char* smem) { gemv_run<Gemv>(p, smem); }
};

}  // namespace mixed_gemm
