// Mixed-input GEMM, CUTLASS 2.x style for sm80+ (runs on sm_80 and sm_90 via the fatbin):
//   C[M, N] = A[M, K] (fp16 or bf16, row-major) x dequant(B)[K, N] (+ bias[N]) (+ residual[M, N]),
//   dequant(B)[k, n] = (q[n, k] - z[g, n]) * s[g, n] (or q s + m, see dequant.cuh), g = k / group_size.
//
// Split-K (blockIdx.z = slice): "none" writes C; "serial" accumulates fp32 partials in a
// workspace, slices taking turns behind a per-tile semaphore (deterministic order; the last slice
// writes C and resets the semaphore to 0, so the workspace stays ready for the next call and for
// graph replays); "parallel" writes each slice's fp32 partial to its own workspace plane and a
// second kernel (reduce.cuh) sums them; "fused" writes the planes too, but the last slice of a tile
// to finish (a per-tile arrival counter) sums them in slice order and writes C: one launch, no
// waiting, deterministic (the order of the sum does not depend on which slice arrives last), and
// the counter is reset by that slice. Tiles map to blocks through CUTLASS's
// GemmIdentityThreadblockSwizzle with a run-time log2 tile-group size.
//
// Structure: a multistage cp.async pipeline (Stages deep) carries four operands per k-tile:
// A (swizzled rows), B (pre-permuted atoms, copied verbatim), scales and zeros (one smem row per
// group the k-tile touches). Each warp then loads A with ldmatrix, B with ldmatrix, converts B in
// registers (dequant.cuh) and issues mma.sync.m16n8k16 with fp32 accumulation.
//
// B layout contract (built by mixed_gemm/kernels/sm80/layout.py). B is cut into atoms of
// 16 (k) x 64 (n) elements; atom (na, ka) starts at byte (na * K16 + ka) * kAtomBytes, K16 = K_pad/16,
// so an n-block's atoms are contiguous along K and each stage copies BK/16 atoms per 64 columns
// as one run. Inside an atom: [chunk c < bits/4][register i < 4][lane t < 32][4 bytes]. With lane
// t pointing ldmatrix.x4 at chunk + 16 t, lane t receives register i from byte 128 i + 4 t, i.e.
// exactly the word prepack filled for it. int4 register i holds n8 tiles 2i, 2i+1; int8 chunk c
// register i holds n8 tile 4c + i (see dequant.cuh for the order inside a word).
//
// Scales/zeros contract: fp16 (num_groups, N_pad) row-major; inside each 64-column block column
// 8 t + g is stored at position 8 g + t, so lane (g = lane / 4) reads its 8 tiles' values as one
// 16-byte vector.
//
// kAtomLayout: the same kernel reading the one copy of A-fragment atoms: the sm90a layout
// (mixed_gemm/kernels/sm90a/layout.py, 4 and 8 bits) or the lowbit layout (1-3 bits,
// mixed_gemm/kernels/gemv/lowbit_layout.py; W::kAtoms atoms per block along K), so decode
// batches of 9-32 tokens get this multistage pipeline without a second weight copy. The sm90a case:
// an sm90a atom (16 n x 16 k) is the mma A fragment of W, i.e. the B fragments of W^T for two n8
// tiles (lane 4 g + t: registers 0, 2 are column g's k pairs, 1, 3 column g + 8's). The 4 atoms of
// one 64-column block at one k16 are 512 (int4) bytes in a row of global memory, so a stage copies
// BN/16 atoms per k16 verbatim and one ldmatrix.x4 (lane t at 16 t) hands lane l atom i's word as
// register i, exactly as the sm80 atom does. The codes are signed and the zero additive
// (w = q' s + z', every zero mode folded in at prepack), scales/zeros plain (G, N_pad) rows.
// Generally a stage holds block rows: one block (kAtoms atoms along K, W::kWords words per lane) of
// each of the CTA's BN/16 strips, contiguous in global memory; the 4 strips of a 64-column block are
// 4 kWords consecutive 128-byte chunks, so kWords ldmatrix.x4 hand lane l its words (chunk i as
// register i), and W::convert turns atom u of a strip's words into the lane's A-fragment pairs.
#pragma once

#include <cuda_fp16.h>
#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/array.h"
#include "cutlass/numeric_types.h"
#include "cutlass/arch/memory_sm75.h"
#include "cutlass/arch/memory_sm80.h"
#include "cutlass/arch/mma_sm80.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"

#include "atoms/lowbit.cuh"
#include "atoms/sm90a.cuh"
#include "common/dequant.cuh"
#include "sm80/reduce.cuh"

namespace mixed_gemm {

// Plain kernel arguments; the kernel derives everything else on the device.
struct GemmArgs {
  void const* a;        // (M, K) fp16, row stride lda elements
  void const* b;        // atoms, see the layout contract above
  void const* scales;   // (num_groups, n_pad) fp16, permuted
  void const* zeros;    // same shape as scales, or nullptr for symmetric weights
  void const* bias;     // (N,) fp16 or nullptr
  void const* residual;  // (M, N) like c (row stride ldc), or nullptr: added to the output
  void* c;              // (M, N) fp16/bf16, row stride ldc elements
  float* workspace;     // split-K partials: (M, N) serial, (splits, M, N) parallel and fused
  int* semaphores;      // serial / fused split-K: one per output tile, zero between calls
  int m, n, k;          // logical sizes
  int n_pad;            // N rounded up to 64: columns present in B, scales and zeros
  int k16;              // K rounded up to 16, divided by 16: atoms per 64-column strip
  int lda, ldc;
  int group_shift;      // log2(group_size); kPerChannelShift for one group per column
  int num_groups;       // rows of scales/zeros
  int split_mode;       // a SplitKMode
  int log_tile;         // threadblock swizzle: log2 of the tile-group size
};

// Where a tile's A rows come from (kGatherA kernels: the moe_sm80 family's fused gather): row r < M
// of the problem is row rows[first + r] / div of `a` (rows != nullptr), else row first + r. The
// index is read once per tile (the copy plan), the main loop only adds each row's offset.
struct RowIndex {
  int const* rows;
  int div;
  long long first;
  __device__ __forceinline__ long long source(int r) const { return rows ? rows[first + r] / div : first + r; }
};

template <typename Element_, int kBits_, int kZeroMode_, int BM_, int BN_, int BK_, int WarpsM_, int WarpsN_, int WarpsK_,
          int Stages_, typename InstructionShape_ = cutlass::gemm::GemmShape<16, 8, 16>, bool kAtomLayout_ = false,
          bool kGatherA_ = false>
struct MixedGemmSm80 {
  using Element = Element_;
  using P = Pair<Element>;
  using raw = typename P::raw;
  using raw2 = typename P::raw2;
  static constexpr int kBits = kBits_;
  static constexpr ZeroMode kZeroMode = static_cast<ZeroMode>(kZeroMode_);
  static constexpr int BM = BM_, BN = BN_, BK = BK_;
  static constexpr int WarpsM = WarpsM_, WarpsN = WarpsN_, WarpsK = WarpsK_;
  static constexpr int Stages = Stages_;
  static constexpr int kWarps = WarpsM * WarpsN * WarpsK;
  static constexpr int kThreads = 32 * kWarps;

  static constexpr int WM = BM / WarpsM;     // warp tile rows
  static constexpr int WN = BN / WarpsN;     // warp tile columns
  static constexpr int kMmaM = WM / 16;      // m16 tiles per warp
  static constexpr int kAtomsN = WN / 64;    // 64-column atoms per warp
  static constexpr int kTilesN = WN / 8;     // n8 tiles per warp
  static constexpr int kK16 = BK / 16;       // k16 steps per k-tile
  static constexpr int kK16PerWarp = kK16 / WarpsK;

  static_assert(kBits == 4 || kBits == 8 || (kAtomLayout_ && (kBits == 1 || kBits == 2 || kBits == 3)),
                "4- or 8-bit weights (1-3 bits: the lowbit layout; its 1:2-sparse fragments are mma.sp's A)");
  static_assert(BM % (16 * WarpsM) == 0, "warp tile rows must be a multiple of 16");
  static_assert(BN % (kAtomN * WarpsN) == 0, "warp tile columns must be a multiple of the 64-column atom");
  static_assert(BK == 64 || BK == 128, "BK is 64 or 128 (the A swizzle spans 8 16-byte chunks)");
  static_assert(kK16 % WarpsK == 0, "k16 steps must split evenly over the K warps");
  static_assert(Stages >= 2, "a pipeline needs at least two stages");
  using InstructionShape = InstructionShape_;
  // The B atom layout hands each lane exactly the fragments of mma.sync.m16n8k16 (k16 steps,
  // n8 tiles, m16 rows of A per ldmatrix.x4); other shapes would need another layout.
  static_assert(InstructionShape::kM == 16 && InstructionShape::kN == 8 && InstructionShape::kK == 16,
                "the B layout is built for mma.sync.m16n8k16");

  // Bytes of one atom (16 x 64 elements) and of one chunk that a single ldmatrix.x4 reads.
  static constexpr int kAtomBytes = 16 * 64 * kBits / 8;
  static constexpr int kChunks = kBits / 4;
  // The atom layouts (kFrag): a block of W::kAtoms atoms (one strip's block: kBlockBytes), and a
  // block row of the CTA's BN / 16 strips (kRowBytes), kRowsB rows per k-tile.
  static constexpr bool kFrag = kAtomLayout_;
  using W = WeightAtoms<Element, kBits>;
  static constexpr int kBlockK16 = kFrag ? W::kAtoms : 1;
  static constexpr int kBlockBytes = 128 * W::kWords;
  static constexpr int kRowBytes = (BN / 16) * kBlockBytes;
  static constexpr int kRowsB = kK16 / kBlockK16;
  static_assert(!kFrag || kK16 % kBlockK16 == 0, "a k-tile holds whole blocks");
  static_assert(!kFrag || kZeroMode_ == int(ZeroMode::kInteger),
                "the atom layouts always store the additive zero: compile them as the integer-zero kind");

  // Shared memory per stage. Group sizes are >= 32, so a k-tile touches at most BK/32 groups.
  static constexpr int kGroupRows = BK / 32;
  static constexpr int kSmemA = BM * BK * 2;
  static constexpr int kSmemB = kFrag ? kRowsB * kRowBytes : BK * BN * kBits / 8;  // 1:2-sparse: int4's bytes
  static constexpr int kSmemS = kGroupRows * BN * 2;
  static constexpr int kSmemZ = kZeroMode == ZeroMode::kSymmetric ? 0 : kSmemS;
  using Deq = Dequantizer<Element, kBits, kZeroMode>;
  static constexpr int kSmemStage = kSmemA + kSmemB + kSmemS + kSmemZ;
  static constexpr int kSmemMainloop = Stages * kSmemStage;
  // Cross-warp K reduction reuses the pipeline buffers: (WarpsK - 1) partial accumulators.
  static constexpr int kAccumPerThread = kMmaM * kTilesN * 4;
  static constexpr int kSmemReduce = (WarpsK - 1) * WarpsM * WarpsN * 32 * kAccumPerThread * 4;
  static constexpr int kSmemBytes = kSmemMainloop > kSmemReduce ? kSmemMainloop : kSmemReduce;

  using MmaOp = cutlass::arch::Mma<InstructionShape, 32, Element,
                                   cutlass::layout::RowMajor, Element, cutlass::layout::ColumnMajor,
                                   float, cutlass::layout::RowMajor, cutlass::arch::OpMultiplyAdd>;

  struct Tile {
    int m0, n0;  // first row / column of this threadblock's output tile
  };

  // ---------------------------------------------------------------------------------------------
  // Global -> shared (cp.async). Every copy is 16 bytes; rows/atoms outside the problem zero-fill,
  // so the math never sees garbage and needs no predicates.
  // ---------------------------------------------------------------------------------------------
  static __device__ __forceinline__ int a_swizzle(int row, int chunk) {
    // XOR the 16-byte chunk index with the row: the 8 rows an ldmatrix phase reads hit 8 different
    // bank groups instead of one (rows are 128 or 256 bytes apart).
    return row * (BK / 8) + (chunk ^ (row & 7));
  }

  // The copy plan of A and (atom layouts) B, built once per CTA. A thread's chunks of a stage are
  // then a pointer advanced by the k-tile plus a fixed stride per pass, predicated by row / strip
  // bits fixed per CTA; only a tile reaching K's end checks k. Recomputed per k-tile (load_stage's
  // general form), the 64-bit addressing and zero-fill predicates were a third of the 16-token
  // main loop's instructions (docs/notes/sm80.md). Valid when a pass of the CTA covers
  // whole A rows, and the A swizzle's row & 7 is the same in every pass; B is planned too when a
  // pass covers whole block rows (3-bit rows of 96 chunks are not: they take load_b_rows).
  static constexpr int kRowChunksA = BK / 8;
  static constexpr int kPassesA = BM * kRowChunksA / kThreads;
  static constexpr int kRowChunksB = kRowBytes / 16;
  static constexpr int kPassesB = kRowsB * kRowChunksB / kThreads;
  static constexpr bool kPlanned = kFrag && kThreads % kRowChunksA == 0 && (kThreads / kRowChunksA) % 8 == 0 &&
                                   (BM * kRowChunksA) % kThreads == 0;
  static constexpr bool kPlannedB = kPlanned && kThreads % kRowChunksB == 0 && (kRowsB * kRowChunksB) % kThreads == 0;
  // Rows of A read through a RowIndex (each pass's row its own offset): the planned copies only.
  static constexpr bool kGatherA = kGatherA_;
  static_assert(!kGatherA || kPlanned, "a gathered A needs the planned copies (whole A rows per pass)");

  struct CopyPlan {
    char const* a;  // the thread's A chunk of pass 0 at k-tile 0
    char const* b;  // its B chunk of pass 0 at k-tile 0
    int a_pass;     // bytes between A passes (kThreads / kRowChunksA rows)
    int b_pass;     // bytes between B passes (kThreads / kRowChunksB k16 rows)
    int b_tile;     // bytes of B per k-tile (kRowsB rows of N_pad / 16 blocks)
    int a_k;        // the chunk's first k inside a k-tile
    int b_kk;       // the block row of pass 0 inside a k-tile
    unsigned a_rows;  // bit i: pass i's A row is < M
    bool b_strip;   // the chunk's block is in a strip < N_pad / 16
    int a_dst, b_dst;  // stage offsets of pass 0
    // The thread's scale and zero chunk (one pass): row p_row of the k-tile's groups, at group 0.
    char const* s;
    char const* z;
    int p_row, p_dst;
    bool p_copy;    // the thread has a chunk, and its row is one the k-tile touches
    bool p_col;     // its columns are < N_pad
    int a_row[kGatherA ? kPassesA : 1];  // kGatherA: each pass's source row of A
  };

  static __device__ __forceinline__ CopyPlan copy_plan(GemmArgs const& p, Tile const& t, int tid,
                                                       RowIndex const& index) {
    CopyPlan c;
    int const row = tid / kRowChunksA, chunk = tid % kRowChunksA;
    c.a_pass = (kThreads / kRowChunksA) * p.lda * 2;
    c.a_k = chunk * 8;
    if constexpr (kGatherA) {
      // Rows past M read row M - 1's source (in bounds; the zero-fill predicate drops them).
      c.a = static_cast<char const*>(p.a) + c.a_k * 2;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kPassesA; ++i)
        c.a_row[i] = int(index.source(min(t.m0 + row + i * (kThreads / kRowChunksA), p.m - 1)));
    } else {
      c.a = static_cast<char const*>(p.a) + ((size_t)min(t.m0 + row, p.m - 1) * p.lda + c.a_k) * 2;
    }
    c.a_rows = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kPassesA; ++i) c.a_rows |= unsigned(t.m0 + row + i * (kThreads / kRowChunksA) < p.m) << i;
    c.a_dst = a_swizzle(row, chunk) * 16;
    int const strips = p.n_pad / 16, off = (tid % kRowChunksB) * 16;
    c.b_kk = tid / kRowChunksB;
    c.b_pass = (kThreads / kRowChunksB) * strips * kBlockBytes;
    c.b_tile = kRowsB * strips * kBlockBytes;
    c.b_strip = t.n0 / 16 + off / kBlockBytes < strips;
    c.b = static_cast<char const*>(p.b) + ((size_t)c.b_kk * strips + t.n0 / 16) * kBlockBytes + off;
    c.b_dst = kSmemA + c.b_kk * kRowBytes + off;
    constexpr int kChunksRow = BN / 8;
    int const col = (tid % kChunksRow) * 8;
    c.p_row = tid / kChunksRow;
    c.p_dst = kSmemA + kSmemB + (c.p_row * BN + col) * 2;
    c.p_copy = tid < kGroupRows * kChunksRow &&
               c.p_row < (p.group_shift >= kPerChannelShift ? 1 : max(1, BK >> p.group_shift));
    c.p_col = t.n0 + col < p.n_pad;
    c.s = static_cast<char const*>(p.scales) + (size_t)(t.n0 + col) * 2;
    c.z = static_cast<char const*>(p.zeros) + (size_t)(t.n0 + col) * 2;
    return c;
  }

  // The zero-fill predicate alone guards a copy: with a source size of 0, cp.async reads nothing,
  // so the address may lie outside the tensor (selecting a safe one cost 4 instructions a copy).
  static __device__ __forceinline__ void load_stage_planned(GemmArgs const& p, Tile const& t, CopyPlan const& c,
                                                            int ktile, char* stage, int tid) {
    using cutlass::arch::CacheOperation;
    bool const k_ok = ktile * BK + c.a_k < p.k;
    char const* a = c.a + (size_t)ktile * (BK * 2);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kPassesA; ++i) {
      bool const ok = k_ok && (c.a_rows >> i & 1u);
      // Consecutive passes are kThreads / kRowChunksA rows apart, a multiple of 8: same swizzle.
      char const* src = a + i * c.a_pass;
      if constexpr (kGatherA) src = a + (size_t)c.a_row[i] * (p.lda * 2);
      cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(stage + c.a_dst + i * (kThreads / kRowChunksA) * BK * 2,
                                                                 src, ok);
    }
    if constexpr (kPlannedB) {
      int const rows = p.k16 / kBlockK16;
      int const kb0 = ktile * kRowsB + c.b_kk;
      bool const b_whole = (ktile + 1) * kRowsB <= rows;
      char const* b = c.b + (size_t)ktile * c.b_tile;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kPassesB; ++i) {
        bool const ok = c.b_strip && (b_whole || kb0 + i * (kThreads / kRowChunksB) < rows);
        cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(stage + c.b_dst + i * (kThreads / kRowChunksB) * kRowBytes,
                                                                   b + i * c.b_pass, ok);
      }
    } else {
      load_b_rows(p, t, ktile, stage, tid);
    }
    // Scales and zeros: the k-tile's group rows (past the last group, the last again).
    static_assert(kGroupRows * (BN / 8) <= kThreads, "one pass of parameter chunks");
    if (c.p_copy) {
      int const g = min(((ktile * BK) >> p.group_shift) + c.p_row, p.num_groups - 1);
      size_t const off = (size_t)g * p.n_pad * 2;
      cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(stage + c.p_dst, c.s + off, c.p_col);
      cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(stage + c.p_dst + kSmemS, c.z + off, c.p_col);
    }
  }

  static __device__ __forceinline__ void load_stage(GemmArgs const& p, Tile const& t, int ktile, char* stage,
                                                    int tid) {
    using cutlass::arch::CacheOperation;
    // A: BM x BK halves = BM * BK / 8 chunks.
    {
      constexpr int kChunksA = BM * BK / 8;
      raw const* a = static_cast<raw const*>(p.a);
      CUTLASS_PRAGMA_UNROLL
      for (int it = 0; it < (kChunksA + kThreads - 1) / kThreads; ++it) {
        int const i = tid + it * kThreads;
        if (kChunksA % kThreads != 0 && i >= kChunksA) break;
        int row = i / (BK / 8), chunk = i % (BK / 8);
        int gm = t.m0 + row, gk = ktile * BK + chunk * 8;
        bool ok = gm < p.m && gk < p.k;
        raw const* src = ok ? a + (size_t)gm * p.lda + gk : a;
        cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(stage + a_swizzle(row, chunk) * 16, src, ok);
      }
    }
    // B: BN / 64 strips, each BK / 16 consecutive atoms (sm80), or kRowsB block rows (atom layouts).
    if constexpr (kFrag) {
      load_b_rows(p, t, ktile, stage, tid);
    } else {
      constexpr int kStripBytes = (BK / 16) * kAtomBytes;
      constexpr int kChunksB = (BN / 64) * kStripBytes / 16;
      char const* b = static_cast<char const*>(p.b);
      char* sb = stage + kSmemA;
      int const n_atoms = p.n_pad / 64;
      CUTLASS_PRAGMA_UNROLL
      for (int it = 0; it < (kChunksB + kThreads - 1) / kThreads; ++it) {
        int const i = tid + it * kThreads;
        if (kChunksB % kThreads != 0 && i >= kChunksB) break;
        int strip = i / (kStripBytes / 16), off = (i % (kStripBytes / 16)) * 16;
        int na = t.n0 / 64 + strip;
        int ka = ktile * (BK / 16) + off / kAtomBytes;
        bool ok = na < n_atoms && ka < p.k16;
        char const* src = ok ? b + ((size_t)na * p.k16 + ka) * kAtomBytes + off % kAtomBytes : b;
        cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(sb + strip * kStripBytes + off, src, ok);
      }
    }
    load_params_stage(p, t, ktile, stage, tid);
  }

  // B of the atom layouts, each chunk's place computed: kRowsB block rows of BN / 16 blocks.
  static __device__ __forceinline__ void load_b_rows(GemmArgs const& p, Tile const& t, int ktile, char* stage, int tid) {
    using cutlass::arch::CacheOperation;
    constexpr int kChunksB = kRowsB * kRowChunksB;
    char const* b = static_cast<char const*>(p.b);
    char* sb = stage + kSmemA;
    int const strips = p.n_pad / 16, rows = p.k16 / kBlockK16;
    CUTLASS_PRAGMA_UNROLL
    for (int it = 0; it < (kChunksB + kThreads - 1) / kThreads; ++it) {
      int const i = tid + it * kThreads;
      if (kChunksB % kThreads != 0 && i >= kChunksB) break;
      int const r = i / kRowChunksB, off = (i % kRowChunksB) * 16;
      int const kb = ktile * kRowsB + r;
      bool const ok = kb < rows && t.n0 / 16 + off / kBlockBytes < strips;
      char const* src = ok ? b + ((size_t)kb * strips + t.n0 / 16) * kBlockBytes + off : b;
      cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(sb + r * kRowBytes + off, src, ok);
    }
  }

  // Scales and zeros: the groups this k-tile touches. Rows past the last group repeat it (they
  // only meet the zero-filled tail of A).
  static __device__ __forceinline__ void load_params_stage(GemmArgs const& p, Tile const& t, int ktile, char* stage,
                                                           int tid) {
    using cutlass::arch::CacheOperation;
    constexpr int kChunksRow = BN / 8;
    char* ss = stage + kSmemA + kSmemB;
    int const first = (ktile * BK) >> p.group_shift;
    int const rows = p.group_shift >= kPerChannelShift ? 1 : max(1, BK >> p.group_shift);
    constexpr int kChunksS = kGroupRows * kChunksRow;
    CUTLASS_PRAGMA_UNROLL
    for (int it = 0; it < (kChunksS + kThreads - 1) / kThreads; ++it) {
      int const i = tid + it * kThreads;
      if (kChunksS % kThreads != 0 && i >= kChunksS) break;
      int r = i / kChunksRow, col = (i % kChunksRow) * 8;
      if (r < rows) {
        int g = min(first + r, p.num_groups - 1);
        int gn = t.n0 + col;
        bool ok = gn < p.n_pad;
        size_t idx = ok ? (size_t)g * p.n_pad + gn : 0;
        cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(
            ss + (r * BN + col) * 2, static_cast<raw const*>(p.scales) + idx, ok);
        if (kZeroMode != ZeroMode::kSymmetric) {
          cutlass::arch::cp_async_zfill<16, CacheOperation::Global>(
              ss + kSmemS + (r * BN + col) * 2, static_cast<raw const*>(p.zeros) + idx, ok);
        }
      }
    }
  }

  // ---------------------------------------------------------------------------------------------
  // One k16 step of one warp: ldmatrix A and B, dequantize B, mma.
  // ---------------------------------------------------------------------------------------------
  static __device__ __forceinline__ void load_a(char const* stage, int kk, int warp_m, int lane,
                                                cutlass::Array<unsigned, 4> (&a_frag)[kMmaM]) {
    // A fragments: lane supplies row (lane % 16), chunk 2 kk + lane / 16.
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kMmaM; ++mi) {
      int row = warp_m * WM + mi * 16 + (lane & 15);
      int chunk = kk * 2 + (lane >> 4);
      cutlass::arch::ldsm<cutlass::layout::RowMajor, 4>(a_frag[mi], stage + a_swizzle(row, chunk) * 16);
    }
  }

  // The mma's of one warp's 64-column block at one k16 step: kMmaM x 8 n8 tiles.
  static __device__ __forceinline__ void mma_block(cutlass::Array<unsigned, 4> const (&a_frag)[kMmaM],
                                                   uint32_t const (&bfrag)[8][2], int a,
                                                   float (&acc)[kMmaM][kTilesN][4]) {
    MmaOp mma;
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kMmaM; ++mi) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 8; ++j) {
        auto& d = *reinterpret_cast<cutlass::Array<float, 4>*>(acc[mi][a * 8 + j]);
        mma(d, *reinterpret_cast<typename MmaOp::FragmentA const*>(&a_frag[mi]),
            *reinterpret_cast<typename MmaOp::FragmentB const*>(bfrag[j]), d);
      }
    }
  }

  static __device__ __forceinline__ void mma_k16(GemmArgs const& p, char const* stage, int kk, int warp_m,
                                                 int warp_n, int lane, float (&acc)[kMmaM][kTilesN][4]) {
    cutlass::Array<unsigned, 4> a_frag[kMmaM];
    load_a(stage, kk, warp_m, lane, a_frag);

    // Scales / zeros of this lane's columns for the group of this k16 step.
    int const grow = (kk * 16) >> p.group_shift;  // 0 unless groups are smaller than BK
    char const* ss = stage + kSmemA + kSmemB + grow * BN * 2;
    char const* sb = stage + kSmemA;

    CUTLASS_PRAGMA_UNROLL
    for (int a = 0; a < kAtomsN; ++a) {
      int const atom_col = warp_n * kAtomsN + a;  // atom index within the block
      int const lane_cols = atom_col * 64 + (lane >> 2) * 8;
      uint4 const s8 = *reinterpret_cast<uint4 const*>(ss + lane_cols * 2);
      uint4 z8 = s8;  // symmetric: unused
      if (kZeroMode != ZeroMode::kSymmetric) z8 = *reinterpret_cast<uint4 const*>(ss + kSmemS + lane_cols * 2);
      raw const* s_h = reinterpret_cast<raw const*>(&s8);
      raw const* z_h = reinterpret_cast<raw const*>(&z8);
      ColumnDequant cd[8];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 8; ++j) cd[j] = Deq::column(s_h[j], z_h[j]);

      char const* atom = sb + (atom_col * kK16 + kk) * kAtomBytes;
      uint32_t bfrag[8][2];  // B fragments of the atom's 8 n8 tiles
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kChunks; ++c) {
        cutlass::Array<unsigned, 4> w;
        cutlass::arch::ldsm<cutlass::layout::RowMajor, 4>(w, atom + c * 512 + lane * 16);
        Deq::chunk(reinterpret_cast<uint32_t const*>(&w), c, cd, bfrag);
      }
      mma_block(a_frag, bfrag, a, acc);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // The atom layouts (kFrag): a warp's scales/zeros, its strips' block words, then one k16 step.
  // ---------------------------------------------------------------------------------------------
  static __device__ __forceinline__ uint32_t splat_bits(uint32_t h) {
    return P::splat(reinterpret_cast<raw const&>(reinterpret_cast<uint16_t const&>(h)));
  }

  // s and z' of the lane's 8 columns in each of the warp's 64-column blocks (raw halves, splatted at
  // their use), n8 tile j = 2 i + n1 being column 64 a + 16 i + 8 n1 + g: held in registers across
  // the k16 steps of a group (at group 128 one read serves a whole k-tile; the sm80 path re-reads
  // its 16-byte vectors).
  static __device__ __forceinline__ void load_params90(char const* stage, int kk, int group_shift, int warp_n,
                                                       int lane, uint32_t (&s)[kAtomsN][8], uint32_t (&z)[kAtomsN][8]) {
    int const grow = (kk * 16) >> group_shift;  // 0 unless groups are smaller than BK
    raw const* ss = reinterpret_cast<raw const*>(stage + kSmemA + kSmemB) + grow * BN;
    raw const* zs = reinterpret_cast<raw const*>(stage + kSmemA + kSmemB + kSmemS) + grow * BN;
    CUTLASS_PRAGMA_UNROLL
    for (int a = 0; a < kAtomsN; ++a)
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 8; ++j) {
        int const col = (warp_n * kAtomsN + a) * 64 + 8 * j + (lane >> 2);
        s[a][j] = reinterpret_cast<uint16_t const&>(ss[col]);
        z[a][j] = reinterpret_cast<uint16_t const&>(zs[col]);
      }
  }

  // The lane's words of block row `row` for the 4 strips of each of the warp's 64-column blocks:
  // w[a][i * kWords + c] is strip i's word c.
  static constexpr int kStripWords = 4 * W::kWords;
  static __device__ __forceinline__ void load_words(char const* stage, int row, int warp_n, int lane,
                                                    uint32_t (&w)[kAtomsN][kStripWords]) {
    CUTLASS_PRAGMA_UNROLL
    for (int a = 0; a < kAtomsN; ++a) {
      char const* blk = stage + kSmemA + row * kRowBytes + (warp_n * kAtomsN + a) * 4 * kBlockBytes;
      if constexpr (W::kLaneStride == 1) {
        // Word c of every lane is one 128-byte chunk: the 4 kWords chunks in a row, one ldmatrix.x4
        // (lane t at 16 t) per 4 of them, each handing lane l the word at 4 l of its chunk.
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < W::kWords; ++v) {
          cutlass::Array<unsigned, 4> q;
          cutlass::arch::ldsm<cutlass::layout::RowMajor, 4>(q, blk + v * 512 + lane * 16);
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < 4; ++i) w[a][4 * v + i] = q[i];
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) {  // int8: 8 bytes per lane per atom, a warp reads 256 contiguous bytes
          uint2 const v = *reinterpret_cast<uint2 const*>(blk + i * kBlockBytes + lane * 8);
          w[a][i * W::kWords] = v.x;
          w[a][i * W::kWords + W::kWords - 1] = v.y;
        }
      }
    }
  }

  // One k16 step: atom u of each strip's block (u is a constant after unrolling).
  // kOwnWords (16-row tiles on blocks of one atom: 4 and 8 bits): the step loads its words itself,
  // after A's fragments. Loaded before them (the general order), ptxas kept more in flight: the
  // 8-warp fp16 int4 tile went from 80 to 90 registers, 3 -> 2 CTAs per SM, M=16 11-16% slower
  // (docs/notes/sm80.md). The 32-row tiles keep the general order (bf16 int4: 128 against
  // 136 registers).
  template <bool kOwnWords>
  static __device__ __forceinline__ void mma_k16_frag(char const* stage, int kk, int u, int warp_m, int warp_n, int lane,
                                                      uint32_t (&w)[kAtomsN][kStripWords],
                                                      uint32_t const (&s)[kAtomsN][8], uint32_t const (&z)[kAtomsN][8],
                                                      float (&acc)[kMmaM][kTilesN][4]) {
    cutlass::Array<unsigned, 4> a_frag[kMmaM];
    load_a(stage, kk, warp_m, lane, a_frag);
    if constexpr (kOwnWords) load_words(stage, kk, warp_n, lane, w);
    CUTLASS_PRAGMA_UNROLL
    for (int a = 0; a < kAtomsN; ++a) {
      uint32_t bfrag[8][2];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        uint32_t const(&words)[W::kWords] = *reinterpret_cast<uint32_t const(*)[W::kWords]>(&w[a][i * W::kWords]);
        uint32_t q[4];
        W::convert(words, u, q);
        // Splatted at the use, not the load: ptxas then reads the half through the HFMA2's .H0_H0
        // operand selector instead of a PRMT per value (16 per k-tile and warp).
        uint32_t const si[2] = {splat_bits(s[a][2 * i]), splat_bits(s[a][2 * i + 1])};
        uint32_t const zi[2] = {splat_bits(z[a][2 * i]), splat_bits(z[a][2 * i + 1])};
        atom_scale<Element>(q, si, zi);
        // A-fragment registers 0, 2 (rows g) are column g's B fragment, 1, 3 (rows g + 8) column g + 8's.
        bfrag[2 * i][0] = q[0];
        bfrag[2 * i][1] = q[2];
        bfrag[2 * i + 1][0] = q[1];
        bfrag[2 * i + 1][1] = q[3];
      }
      mma_block(a_frag, bfrag, a, acc);
    }
  }

  // A warp's k16 steps of a stage on an atom layout, its first step being atom kFirst of its block.
  // The converters take the atom as a compile-time constant (its fields' shifts and words), so when
  // K warps split a block (kK16PerWarp < kBlockK16), mma_stage dispatches on the warp's first atom.
  template <int kFirst>
  static __device__ __forceinline__ void mma_stage_frag(GemmArgs const& p, char const* stage, int warp_m, int warp_n,
                                                        int warp_k, int lane, float (&acc)[kMmaM][kTilesN][4]) {
    uint32_t s[kAtomsN][8], z[kAtomsN][8];
    uint32_t w[kAtomsN][kStripWords];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kK16PerWarp; ++j) {
      int const kk = warp_k * kK16PerWarp + j;
      int const u = (kFirst + j) % kBlockK16;
      // A new group row starts here (uniform across the warp: no divergence).
      if (j == 0 || ((kk * 16) >> p.group_shift) != (((kk - 1) * 16) >> p.group_shift))
        load_params90(stage, kk, p.group_shift, warp_n, lane, s, z);
      if constexpr (kBlockK16 == 1 && kMmaM == 1) {
        mma_k16_frag<true>(stage, kk, u, warp_m, warp_n, lane, w, s, z, acc);
      } else {
        if (j == 0 || u == 0) load_words(stage, kk / kBlockK16, warp_n, lane, w);
        mma_k16_frag<false>(stage, kk, u, warp_m, warp_n, lane, w, s, z, acc);
      }
    }
  }

  template <int kFirst>
  static __device__ __forceinline__ void dispatch_first(GemmArgs const& p, char const* stage, int first, int warp_m,
                                                        int warp_n, int warp_k, int lane, float (&acc)[kMmaM][kTilesN][4]) {
    if constexpr (kFirst + kK16PerWarp >= kBlockK16) {
      mma_stage_frag<kFirst>(p, stage, warp_m, warp_n, warp_k, lane, acc);
    } else if (first == kFirst) {
      mma_stage_frag<kFirst>(p, stage, warp_m, warp_n, warp_k, lane, acc);
    } else {
      dispatch_first<kFirst + kK16PerWarp>(p, stage, first, warp_m, warp_n, warp_k, lane, acc);
    }
  }

  // One warp's k16 steps of a stage.
  static __device__ __forceinline__ void mma_stage(GemmArgs const& p, char const* stage, int warp_m, int warp_n,
                                                   int warp_k, int lane, float (&acc)[kMmaM][kTilesN][4]) {
    if constexpr (kFrag) {
      // Powers of two: a warp's steps lie in one block, or cover whole blocks from a block's start.
      static_assert(kK16PerWarp % kBlockK16 == 0 || kBlockK16 % kK16PerWarp == 0, "warps split blocks evenly");
      dispatch_first<0>(p, stage, (warp_k * kK16PerWarp) % kBlockK16, warp_m, warp_n, warp_k, lane, acc);
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kK16PerWarp; ++j) mma_k16(p, stage, warp_k * kK16PerWarp + j, warp_m, warp_n, lane, acc);
    }
  }

  // Offset row * N + col of this lane's accumulator pair acc[mi][ni][2h], [2h+1] (mma layout: row
  // g + 8h, columns 2tq, 2tq + 1 of the warp's n8 tile); false when outside the problem.
  static __device__ __forceinline__ bool output_offset(GemmArgs const& p, Tile const& t, int warp_m, int warp_n,
                                                       int lane, int mi, int ni, int h, size_t& offset) {
    int const col = t.n0 + warp_n * WN + ni * 8 + 2 * (lane & 3);
    int const row = t.m0 + warp_m * WM + mi * 16 + (lane >> 2) + 8 * h;
    offset = (size_t)row * p.n + col;
    return row < p.m && col < p.n;  // N is even, so col + 1 < N too
  }

  static __device__ __forceinline__ int ld_acquire(int const* ptr) {
    int v;
    asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
    return v;
  }
  static __device__ __forceinline__ void st_release(int* ptr, int v) {
    asm volatile("st.global.release.gpu.b32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
  }

  static __device__ void run(GemmArgs const& p, char* smem) {
    // Tile of this block: CUTLASS's identity swizzle (M in blockIdx.x, groups of 2^log_tile N tiles).
    int const tiles_m = (p.m + BM - 1) / BM;
    int const tiles_n = (p.n_pad + BN - 1) / BN;
    cutlass::gemm::GemmCoord const tc =
        cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>::get_tile_offset(p.log_tile);
    if (tc.m() >= tiles_m || tc.n() >= tiles_n) return;  // padding blocks of the swizzled grid
    run_tile(p, smem, tc.m(), tc.n(), tc.k(), gridDim.z);
  }

  // Warp roles: K-warps outermost so each K slice is a whole group of M x N warps.
  struct WarpRole {
    int lane, warp_k, warp_mn, warp_m, warp_n;
  };
  static __device__ __forceinline__ WarpRole warp_role() {
    int const tid = threadIdx.x;
    int const warp = tid >> 5;
    int const warp_mn = warp % (WarpsM * WarpsN);
    return {tid & 31, warp / (WarpsM * WarpsN), warp_mn, warp_mn / WarpsN, warp_mn % WarpsN};
  }

  // The fp32 sums of tile t over K slice `slice` of `splits` (main loop, then the cross-warp K
  // reduction): afterwards the K-warp 0 of each M x N warp holds them in acc (mma accumulator
  // layout: c0 c1 at row g, columns 2 tq, 2 tq + 1 of each n8 tile, c2 c3 at row g + 8). The grouped
  // kernels of the moe_sm80 family call it with an expert's rows and weight in `p` and store the
  // sums their own way.
  static __device__ __forceinline__ void tile_sums(GemmArgs const& p, char* smem, Tile const& t, WarpRole const& role,
                                                   int slice, int splits, float (&acc)[kMmaM][kTilesN][4],
                                                   RowIndex const& index = RowIndex{nullptr, 1, 0}) {
    int const tid = threadIdx.x;
    int const lane = role.lane, warp_k = role.warp_k, warp_mn = role.warp_mn;
    int const warp_m = role.warp_m, warp_n = role.warp_n;
    // K range of this split-K slice (whole k-tiles; a slice may be empty).
    int const k_tiles_total = (p.k16 * 16 + BK - 1) / BK;
    int const per_slice = (k_tiles_total + splits - 1) / splits;
    int const kt_begin = min(slice * per_slice, k_tiles_total);
    int const kt_end = min(kt_begin + per_slice, k_tiles_total);
    int const k_tiles = kt_end - kt_begin;

    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kMmaM; ++mi)
      CUTLASS_PRAGMA_UNROLL
      for (int ni = 0; ni < kTilesN; ++ni)
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    // Prologue: fill Stages - 1 stages. A group is committed even when empty so the
    // wait_group count below stays in step with the k-tile index.
    CopyPlan plan{};
    if constexpr (kPlanned) plan = copy_plan(p, t, tid, index);
    auto load = [&](int ktile, char* stage) {
      if constexpr (kPlanned) {
        load_stage_planned(p, t, plan, ktile, stage, tid);
      } else {
        load_stage(p, t, ktile, stage, tid);
      }
    };
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < Stages - 1; ++s) {
      if (s < k_tiles) load(kt_begin + s, smem + s * kSmemStage);
      cutlass::arch::cp_async_fence();
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
      cutlass::arch::cp_async_wait<Stages - 2>();
      // Also guarantees every warp is done with the stage the next load overwrites.
      __syncthreads();
      int const next = kt + Stages - 1;
      if (next < k_tiles) load(kt_begin + next, smem + (next % Stages) * kSmemStage);
      cutlass::arch::cp_async_fence();

      mma_stage(p, smem + (kt % Stages) * kSmemStage, warp_m, warp_n, warp_k, lane, acc);
    }
    cutlass::arch::cp_async_wait<0>();

    // Cross-warp K reduction through shared memory; K-warps > 0 stay for the barriers below.
    if (WarpsK > 1) {
      __syncthreads();
      float* red = reinterpret_cast<float*>(smem);
      if (warp_k > 0) {
        float* dst = red + ((warp_k - 1) * WarpsM * WarpsN + warp_mn) * 32 * kAccumPerThread;
        int e = 0;
        CUTLASS_PRAGMA_UNROLL
        for (int mi = 0; mi < kMmaM; ++mi)
          CUTLASS_PRAGMA_UNROLL
          for (int ni = 0; ni < kTilesN; ++ni)
            CUTLASS_PRAGMA_UNROLL
            for (int q = 0; q < 4; ++q, ++e) dst[e * 32 + lane] = acc[mi][ni][q];  // lane-minor: no conflicts
      }
      __syncthreads();
      if (warp_k == 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < WarpsK - 1; ++s) {
          float const* src = red + (s * WarpsM * WarpsN + warp_mn) * 32 * kAccumPerThread;
          int e = 0;
          CUTLASS_PRAGMA_UNROLL
          for (int mi = 0; mi < kMmaM; ++mi)
            CUTLASS_PRAGMA_UNROLL
            for (int ni = 0; ni < kTilesN; ++ni)
              CUTLASS_PRAGMA_UNROLL
              for (int q = 0; q < 4; ++q, ++e) acc[mi][ni][q] += src[e * 32 + lane];
        }
      }
    }
  }

  // One output tile (tile_m, tile_n) of K slice `slice` of `splits`; the grouped kernels of the
  // moe_sm80 family call it with an expert's rows and weight in `p` (unsplit).
  static __device__ void run_tile(GemmArgs const& p, char* smem, int tile_m, int tile_n, int slice, int splits) {
    int const tid = threadIdx.x;
    WarpRole const role = warp_role();
    int const lane = role.lane, warp_k = role.warp_k;
    int const warp_m = role.warp_m, warp_n = role.warp_n;
    int const tiles_n = (p.n_pad + BN - 1) / BN;
    Tile t;
    t.m0 = tile_m * BM;
    t.n0 = tile_n * BN;
    float acc[kMmaM][kTilesN][4];
    tile_sums(p, smem, t, role, slice, splits, acc);
    bool const writer = warp_k == 0;

    // Serial split-K: wait for this tile's turn.
    int* sem = p.semaphores + tile_m * tiles_n + tile_n;
    bool const serial = p.split_mode == int(SplitKMode::kSerial) && splits > 1;
    if (serial) {
      if (tid == 0) {
        while (ld_acquire(sem) != slice) {
        }
      }
      __syncthreads();
    }

    // Fused split-K: publish this slice's plane, then count arrivals; the last slice to arrive
    // sums every plane (its own included) in slice order, so the result does not depend on which
    // slice came last, and resets the counter for the next call.
    if (p.split_mode == int(SplitKMode::kFused) && splits > 1) {
      if (writer) {
        float* plane = p.workspace + (size_t)slice * p.m * p.n;
        CUTLASS_PRAGMA_UNROLL
        for (int mi = 0; mi < kMmaM; ++mi)
          CUTLASS_PRAGMA_UNROLL
          for (int ni = 0; ni < kTilesN; ++ni)
            CUTLASS_PRAGMA_UNROLL
            for (int h = 0; h < 2; ++h) {
              size_t wi;
              if (output_offset(p, t, warp_m, warp_n, lane, mi, ni, h, wi))
                __stcg(reinterpret_cast<float2*>(plane + wi), make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]));
            }
      }
      __threadfence();  // the plane is visible GPU-wide before the arrival that announces it
      int last = 0;
      if (tid == 0) {
        last = atomicAdd(sem, 1) == splits - 1;
        if (last) *sem = 0;  // every slice has arrived: nobody else touches it in this launch
      }
      if (!__syncthreads_or(last)) return;
      __threadfence();  // acquire side: the other slices' planes, read below, are not stale
      // The whole block sums the tile's planes in slice order and writes C: coalesced pairs, and no
      // registers beyond a few per thread (summing into the accumulators would spill the big tiles).
      raw* c = static_cast<raw*>(p.c);
      size_t const plane = (size_t)p.m * p.n;
      for (int i = tid; i < BM * BN / 2; i += kThreads) {
        int const row = t.m0 + i / (BN / 2), col = t.n0 + 2 * (i % (BN / 2));
        if (row >= p.m || col >= p.n) continue;
        float const* src = p.workspace + (size_t)row * p.n + col;
        float2 v = __ldcg(reinterpret_cast<float2 const*>(src));
#pragma unroll 4
        for (int s = 1; s < splits; ++s) {
          float2 const part = __ldcg(reinterpret_cast<float2 const*>(src + s * plane));
          v.x += part.x;
          v.y += part.y;
        }
        size_t const at = (size_t)row * p.ldc + col;
        v = add_terms<Element>(v, p.bias, p.residual, col, at);
        *reinterpret_cast<raw2*>(c + at) = P::from_floats(v.x, v.y);
      }
      return;
    }

    // Epilogue: mma accumulator layout, c0 c1 at (row g, cols 2 tq, 2 tq + 1), c2 c3 at row g + 8.
    if (writer) {
      bool const to_workspace = (p.split_mode == int(SplitKMode::kParallel) && splits > 1) || (serial && slice + 1 < splits);
      bool const add_workspace = serial && slice > 0;
      float* ws = p.workspace + (p.split_mode == int(SplitKMode::kParallel) ? (size_t)slice * p.m * p.n : 0);
      raw const* bias = static_cast<raw const*>(p.bias);
      raw* c = static_cast<raw*>(p.c);
      int const g = lane >> 2, tq = lane & 3;
      CUTLASS_PRAGMA_UNROLL
      for (int ni = 0; ni < kTilesN; ++ni) {
        int const col = t.n0 + warp_n * WN + ni * 8 + 2 * tq;
        if (col >= p.n) continue;  // N is even, so col + 1 < N too
        float2 b = make_float2(0.f, 0.f);
        if (bias != nullptr && !to_workspace) b = P::to_floats(*reinterpret_cast<raw2 const*>(bias + col));
        CUTLASS_PRAGMA_UNROLL
        for (int mi = 0; mi < kMmaM; ++mi) {
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < 2; ++h) {
            int const row = t.m0 + warp_m * WM + mi * 16 + g + 8 * h;
            if (row >= p.m) continue;
            float2 v = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            size_t const wi = (size_t)row * p.n + col;
            if (add_workspace) {
              float2 prev = *reinterpret_cast<float2 const*>(ws + wi);
              v.x += prev.x;
              v.y += prev.y;
            }
            if (to_workspace) {
              *reinterpret_cast<float2*>(ws + wi) = v;
            } else {
              size_t const at = (size_t)row * p.ldc + col;
              if (p.residual != nullptr) v = add_terms<Element>(v, nullptr, p.residual, col, at);
              *reinterpret_cast<raw2*>(c + at) = P::from_floats(v.x + b.x, v.y + b.y);
            }
          }
        }
      }
    }

    if (serial) {
      __threadfence();  // this slice's partials are visible before the next slice is let in
      __syncthreads();
      if (tid == 0) st_release(sem, slice + 1 < splits ? slice + 1 : 0);
    }
  }
};

}  // namespace mixed_gemm
