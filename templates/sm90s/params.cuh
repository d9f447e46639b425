// The sm90s family's launch parameters and shared-memory geometry, seen by both passes of the build
// (the device pass's kernel and the host pass's parameter builder, kernel.cu.j2). Design and cycle
// budget: docs/notes/serving-mainloop.md; the weight layout it reads: mixed_gemm/kernels/sm90a/layout.py.
#pragma once

#include <cstdint>
#include <cuda.h>

namespace mixed_gemm {
namespace sm90s {

constexpr int kAtomRows = 16;         // the sm90a layout's 16 x 16 atoms
constexpr int kMaxStages = 12;

// One stage of the ring holds, each where its reader wants it (no shared-to-shared copies):
//   x:      TK/64 panels of TN token rows x 128 bytes, TMA 128-byte swizzled (wgmma's K-major B);
//   w:      TM/16 x TK/16 atoms of the sm90a layout, atom (nb, kb) at byte kAtomBytes (nb + 8 kb);
//   scales, zeros: up to TK/32 rows of TM values (one per group the k-tile touches, groups >= 32).
// The x panels come first: each starts 1024-byte aligned, as the swizzle pattern requires.
//
// ClusterM = 2 or 4: the CTAs of a cluster take adjacent 128-row tiles of the same K slice and token
// tile, so their x stages are equal; each loads TN/ClusterM token rows of it with TMA multicast into
// all of them.
// Phased: the two consumer warpgroups take turns issuing their wgmmas (an ordered barrier).
// TM = 64: one consumer warpgroup, a whole 64-row tile each (no split of K to fill the SMs where
// 64-row tiles already do), as each CTA of CUTLASS's ping-pong tile runs one 64-row tile.
// TM = 192: three consumer warpgroups, for the shapes whose rows divide by 192 and not by 256 or
// into too few 128-row tiles (6144 rows: 32 tiles x 4 token tiles of 128 fill 132 SMs at M = 512,
// where 48 x 4 of 128 rows are 1.45 waves and 24 x 4 of 256 rows leave 36 SMs idle).
// TM = 256: four consumer warpgroups (64 rows each) behind one producer. Per x byte from L2 twice
// the weight of TM = 128, and as many converting warps a scheduler as two CTAs of 128 rows, without
// a second ring, a second CTA's barriers or the split-K slices that fill the SMs twice over.
// ClusterK = 2 or 4 (1xS cluster): the S CTAs of a cluster are the S K slices of one output tile
// (grid x); the slices' partials meet in the first one's shared memory (st.async into a region
// after the ring, counted by one transaction barrier) instead of a workspace in global memory, so
// a tile's sum waits for no store, fence and atomic round trip through L2.
// Grouped: the mixture-of-experts launch (templates/moe_sm90s/): the weight is E stacked experts,
// grid z walks the token tiles of every expert's block of sorted rows (the routing sort's tile
// prefix sums), and the gate|up stage stores SiLU(gate) * up.
// Gather (grouped only): the x stage's rows are read by index, sorted row r being row order[r] /
// a_div of the unsorted x, with 16-byte cp.async from the whole producer warpgroup into the same
// swizzled panels the TMA box fills, so no gathered copy of x is written first.
// InFlight (`_ov`, double-buffered kernels without the phase offset): a warpgroup issues k-tile i's
// wgmmas before it waits for k-tile i - 1's (wait_group 1, not 0), so the tensor pipe is handed the
// next batch before the last one drains, instead of idling from its end to the next issue.
template <int kBits, int TM, int TN, int TK, int Stages, int CtasPerSm, int ClusterM = 1, bool Phased = false,
          bool Grouped = false, bool HalfIssue = false, int ClusterK = 1, bool Gather = false, bool InFlight = false,
          bool Staged = false>
struct Geometry {
  static_assert(kBits == 4 || kBits == 8, "bits: the sm90a layout's converters take 4- and 8-bit codes");
  static_assert(TM == 128 || (TM == 256 && CtasPerSm == 1 && ClusterM == 1 && !Phased && TN / 2 + TK / 4 <= 80) ||
                    (TM == 192 && CtasPerSm == 1 && ClusterM <= 2 && !Phased && TN / 2 + TK / 4 <= 128) ||
                    (TM == 64 && ClusterM == 1 && !Phased),
                "TM: 128, 256 (one CTA per SM, no cluster, no phase offset; TN/2 accumulators + TK/4 "
                "fragment registers <= 80 of a consumer thread's 112), 192 (the same, <= 128 of 160, a 2x1 "
                "cluster allowed) or 64 "
                "(no row cluster, no phase offset: one consumer warpgroup)");
  static_assert(TN % 16 == 0 && TN >= 16 && TN <= 256, "TN: wgmma N, a multiple of 16 up to 256");
  static_assert(TK == 64 || TK == 128, "TK: one or two 64-element swizzle panels of x");
  static_assert(Stages >= 2 && Stages <= kMaxStages, "stages: 2..12");
  static_assert(CtasPerSm == 1 || (CtasPerSm == 2 && TN <= 64), "two CTAs per SM only with TN <= 64 (registers)");
  static_assert(ClusterM == 1 || ClusterM == 2 || ClusterM == 4, "cluster: 1, 2 or 4 row tiles share an x tile");
  static constexpr int kBitsW = kBits;
  static constexpr int kTileM = TM;                                 // weight rows per CTA: 64 per consumer warpgroup
  static constexpr int kConsumerThreads = 2 * TM;                   // TM / 64 consumer warpgroups
  static constexpr int kThreads = 128 + kConsumerThreads;           // + the producer warpgroup
  static constexpr int kConsumerWarps = kConsumerThreads / 32;      // split-K counters per output tile
  static constexpr int kTN = TN;
  static constexpr int kTK = TK;
  static constexpr int kStages = Stages;
  static constexpr int kCtasPerSm = CtasPerSm;
  static constexpr int kClusterM = ClusterM;
  static constexpr bool kPhased = Phased;
  static constexpr bool kGrouped = Grouped;
  static_assert(!Grouped || (ClusterM == 1 && !Phased), "grouped: no cluster, no phase offset");
  static_assert(ClusterK == 1 || ((ClusterK == 2 || ClusterK == 4) && ClusterM == 1 && !Phased && !Grouped),
                "cluster K: 2 or 4 K slices of one tile, without a row cluster, phase offset or grouping");
  static constexpr int kClusterK = ClusterK;
  static_assert(!Gather || Grouped, "gather: the grouped launch's rows by index");
  static constexpr bool kGather = Gather;
  // Gather: 16-byte chunks of a row of the stage (TK / 8, the producer lanes a row: 128 / that rows a
  // pass of the producer warpgroup) and the item's row offsets (TN long longs after the barriers).
  // Every producer thread arrives on a stage's barrier when its copies land.
  static constexpr int kRowChunks = TK / 8;
  static_assert(!Gather || (TN % (128 / kRowChunks) == 0), "gather: whole passes of rows");
  static constexpr int kGatherBytes = Gather ? TN * 8 : 0;
  static constexpr int kFullArrivals = Gather ? 1 + 128 : 1;  // the expect_tx arrive (+ each producer thread)
  static constexpr int kXBoxRows = TN / ClusterM;                  // token rows of x one CTA loads
  // CTA r's part of the box lands r * kXBoxRows 128-byte rows into each panel: whole 8-row
  // (1024-byte) swizzle atoms, so its 128-byte swizzle XOR pattern is the one a full-box write gives
  // them (hence TN >= 16 at ClusterM = 2, TN >= 32 at 4; Sm90sConfig checks the same).
  static_assert(kXBoxRows % 8 == 0, "cluster: each CTA's x rows must fill whole 128-byte swizzle atoms");
  static constexpr int kKBlocks = TK / 16;
  static constexpr int kPanels = TK / 64;
  static constexpr int kAtomBytes = 32 * kBits;                    // 16 x 16 codes
  static constexpr int kAtomWords = kAtomBytes / 4;
  static constexpr int kXBytes = TN * TK * 2;
  static constexpr int kWBytes = kTileM * TK * kBits / 8;
  static constexpr int kMaxScaleRows = TK / 32;
  static constexpr int kSBytes = kMaxScaleRows * kTileM * 2;
  static constexpr int kStageBytes = (kXBytes + kWBytes + 2 * kSBytes + 1023) / 1024 * 1024;
  // Cluster K: the other slices' fp32 partials, (ClusterK - 1) x consumer threads x TN/2 floats.
  static constexpr int kReduceBytes = (ClusterK - 1) * kConsumerThreads * (TN / 2) * 4;
  static constexpr int kBarrierBytes = 256;                        // full[], empty[], the reduce barrier
  static_assert((2 * kMaxStages + 1) * 8 <= kBarrierBytes, "barrier area");
  // + 1024: the dynamic shared memory base is only 16-byte aligned; the kernel aligns it up.
  // Staged (`_se`, grouped): each consumer warpgroup writes its 64 rows of the tile into shared
  // memory, token-major at a pitch of 64 * 2 + 16 bytes, and stores them back as whole row segments
  // (Mainloop::store_staged). Why: from registers a warp's store covers 8 tokens x 16 bytes, 8 L1
  // wavefronts an instruction (4096 for a 256 x 128 tile), the epilogue ncu found a fifth of the
  // 4096-token down GEMM's samples (docs/notes/moe.md). The 16-byte pad puts the 8 tokens of one
  // shared store on 32 different banks.
  static_assert(!Staged || (Grouped && ClusterM == 1 && ClusterK == 1), "staged epilogue: the grouped tiles");
  static constexpr bool kStaged = Staged;
  static constexpr int kStagedPitch = 64 * 2 + 16;
  static constexpr int kStagedBytes = Staged ? (TM / 64) * TN * kStagedPitch : 0;
  static constexpr int kStagedOffset = Stages * kStageBytes + kReduceBytes + kBarrierBytes + kGatherBytes;
  static constexpr int kSmemBytes = kStagedOffset + kStagedBytes + 1024;
  // setmaxnreg: the producer warpgroup gives registers to the consumers (multiples of 8; per CTA
  // at most 65536 / CtasPerSm, what __launch_bounds__(384, CtasPerSm) leaves each thread x 384).
  static constexpr int kLaunchRegs = (65536 / (kThreads * CtasPerSm)) / 8 * 8;
  // TM = 64 at one CTA per SM: 256 threads may each hold the 255 registers a thread can address, so
  // no warpgroup gives any away (setmaxnreg takes at most 256).
  static constexpr int kThreadRegs = 255 / 8 * 8;
  static constexpr bool kSetMaxNReg = kLaunchRegs <= kThreadRegs;
  static constexpr int kProducerRegs = CtasPerSm == 1 && TM == 128 ? 40 : 24;
  static constexpr int kConsumerRegs =
      kSetMaxNReg ? ((kLaunchRegs * kThreads - kProducerRegs * 128) / kConsumerThreads) / 8 * 8 : kThreadRegs;
  // The converted A fragments of the next k-tile are built while this one's wgmmas run, except at
  // TN = 256, where 128 accumulators leave no room for a second set (the other warpgroup overlaps),
  // and at two CTAs per SM from TN = 32 on (104 registers a consumer thread: the other CTA overlaps),
  // as at TM = 256 (112 registers; the other three warpgroups overlap). TM = 64 has room (248).
  // TM = 192 (160 registers) keeps two sets where TN/2 + 2 TK/4 <= 96 (t192x128x128 at 128 spilled 360 bytes).
  static constexpr bool kDoubleBuffer =
      TN <= 128 && ((CtasPerSm == 1 && (TM <= 128 || (TM == 192 && TN / 2 + TK / 2 <= 96))) || TN <= 16);
  // Half issue (`_hi`): where two whole fragment sets do not fit, a warpgroup issues a k-tile's
  // wgmmas in two halves, the second half converting while the first half's run. kHalfBuffer: where
  // three half sets fit (TK/4 registers a set; ptxas spilled and serialized the wgmmas with less
  // than 32 registers to spare: t128x64 at two CTAs per SM, t256x128x64), the first half of the next
  // k-tile converts too while both halves run (Mainloop::half_step); else one set, each k-tile's
  // halves in turn. The phase offset orders whole k-tiles between warpgroups instead.
  static constexpr bool kHalfIssue = HalfIssue;
  static_assert(!HalfIssue || (!kDoubleBuffer && !Phased && kKBlocks % 2 == 0),
                "half issue: only without the double buffer and the phase offset");
  static constexpr bool kHalfBuffer = HalfIssue && TN / 2 + 3 * TK / 8 + 32 <= kConsumerRegs;
  static constexpr bool kInFlight = InFlight;
  static_assert(!InFlight || (kDoubleBuffer && !Phased), "in flight: the double buffer, no phase offset");
};

// Everything the kernel reads, passed by value (__grid_constant__: the TMA descriptors must live
// in parameter, constant or global memory). x, y, bias, residual and the split-K scratch change
// per call: mg_run patches them (the x descriptor with cuTensorMapReplaceAddress).
struct Params {
  CUtensorMap w;   // int32 words (8*bits per atom, N_pad/16 atoms, K16/16 columns), box (all, 8, TK/16)
  CUtensorMap s;   // (G, N_pad) 16-bit, box (128, scale rows)
  CUtensorMap z;   // the additive zeros z', as s
  CUtensorMap x;   // (M, K) 16-bit, box (64, TN / cluster M), 128-byte swizzle
  void const* bias;
  void const* residual;
  void* y;
  float* workspace;   // split-K partials: tiles x splits x consumer threads x TN/2 floats
  int* counters;      // one per consumer warp of each output tile, zero between launches (the last split resets it)
  int m, n, k;
  int group;          // K rows per scale row (1 << 30 for one group per column)
  int k_tiles;        // TK-tiles covering K
  int split_tiles;    // k-tiles per split (every split gets at least one)
  int splits;
  int kb_shift;       // log2(k16 blocks per scale row inside a k-tile)
  int stage_tx;       // bytes the TMAs of one stage deliver to each CTA (boxes are whole, zero-filled out of
                      // bounds; with a cluster, the other CTAs' parts of x come from their multicasts)
  // Stream-K (dense; 0: off): G = sk_ctas streams, each one CTA or, under a Cx1 cluster, one
  // cluster whose C CTAs walk the same units, each its own row tile of the unit's cluster tile (C
  // adjacent row tiles of one token tile), so they still share every x stage by multicast. Where
  // the tiles exceed one wave, stream g first takes tile g whole (g < sk_dp_tiles = G: the first
  // wave, data-parallel); then units [g U / G, (g+1) U / G) of the sk_units = U = k-tiles of the
  // tiles after those (k inner). Tiles and units count cluster tiles. splits is the most K
  // segments any tile gets (the workspace's partials per tile), and row_tiles is set.
  int sk_ctas;
  int sk_units;
  int sk_dp_tiles;
  // Grouped launches only (w: (words, N_pad/16, K16/16, E); s, z: (N_pad, G, E); x: the sorted rows):
  long long const* offsets;  // each expert's first sorted row (the routing sort's, int64)
  long long const* counts;   // each expert's rows
  int const* tile_ends;      // inclusive prefix sums of ceil(counts / TN): grid z item -> expert
  int experts;
  int row_tiles;             // ceil(N / TM): a work item is (K slice, row tile, token tile of an expert);
                             // dense stream-K: row tiles rounded to whole clusters
  int gate_up;               // store SiLU(gate) * up: N/2 columns (rows interleaved in blocks of 8)
  // Gather (Geometry::kGather): x unsorted (tokens, K) 16-bit; sorted row r reads row order[r] / a_div.
  void const* xg;
  int const* order;
  int a_div;
  // Combine (grouped down stage, y32 != nullptr): sorted row r is pair order[r] of token
  // order[r] / top_k; its row times topk_w[order[r]] is added into that token's fp32 row of y32
  // (tokens, N) instead of being stored to y, so the top-k sum needs no pass of its own.
  float* y32;
  float const* topk_w;
  int top_k;
};

// Stream-K's division of U units (k-tiles, k inner) over G CTAs, one formula for the host's
// workspace sizing (host.cuh) and the kernel's walk (mainloop.cuh): CTA g holds units
// [g U / G, (g + 1) U / G); sk_owner is the CTA whose range holds unit u.
__host__ __device__ __forceinline__ int sk_begin(long long g, long long ctas, long long units) {
  return int(g * units / ctas);
}
__host__ __device__ __forceinline__ int sk_owner(long long u, long long ctas, long long units) {
  return int(((u + 1) * ctas - 1) / units);
}

}  // namespace sm90s
}  // namespace mixed_gemm
