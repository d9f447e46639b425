// The sm90s kernel: y^T = W x^T with W as wgmma's register operand A (64 weight rows per
// warpgroup instruction) and the tokens as wgmma N (16..256), for the serving regime. Device side
// only (the host pass never sees it). Design: docs/notes/serving-mainloop.md.
//
// CTA = one producer warpgroup (one thread issues the TMAs of a ring of stages) + TM/64 consumer
// warpgroups (two, three at TM = 192, four at TM = 256); consumer warpgroup c owns weight rows 64c..64c+63 of the
// CTA's TM, all read the same x stage. Per k-tile a consumer thread loads one 32-bit word (int4; 64-bit for int8) per
// k16 block from the stage's weight atoms, converts it with lop3 (atoms/sm90a.cuh) straight into
// its A-fragment registers, applies scale and additive zero with one fma per register pair
// (loaded once per group, not per k16 block), and issues TK/16 wgmmas. With kDoubleBuffer the
// next k-tile is converted while this one's wgmmas run: one wgmma wait per k-tile.
//
// Split-K: each split writes its fp32 partial to the workspace, and per consumer warp the last
// split of a tile to arrive (an atomic counter per warp and tile, reset by it) sums that warp's
// part of all partials in split order (deterministic) and runs its epilogue. No memset per launch:
// the counters are zero between launches.
//
// Stream-K (Params::sk_ctas > 0, dense): a persistent grid of G CTAs splits the U =
// tiles x k-tiles work units into G contiguous ranges of U/G units (k inner), so every SM streams the
// same number of k-tiles whatever the tile count: 224 tiles on 132 SMs run as 1.7 tiles a CTA, not
// two waves with 40% of the SMs idle in the second. Where the tiles exceed one wave, the first wave
// is data-parallel (CTA g takes tile g whole) and only the rest is split into ranges: CTAs at
// different k offsets read scattered 1-2 KB pieces of the weight, where a data-parallel wave reads
// whole k rows of it together. A range that starts or ends inside a tile makes a K segment of it;
// the segments of a tile are summed like split-K slices (the segment index is the CTA count between
// the tile's first unit and the segment's, so every CTA derives the same split). Under a Cx1
// cluster the stream is the cluster: a unit is a k-tile of C adjacent row tiles, the C CTAs walk
// the same ranges (their x stages stay equal, one multicast each) and each sums its own row tile's
// segments, so a tile of the cluster's is cut where the cluster's range is.
//
// Cx1 cluster (Geo::kClusterM = C, 2 or 4): the C CTAs take adjacent row tiles of one K slice and
// token tile, so their x stages are equal. Producer r loads token rows [r TN/C, (r+1) TN/C) of x with
// TMA multicast into all C CTAs' stage (same offset, and complete_tx on each CTA's full barrier,
// which expects the whole stage), its own weight, scales and zeros without. A stage may be refilled
// only when all C CTAs have read it: every consumer warp releases it on each CTA's empty barrier,
// lane j on CTA rank ^ j (8 C arrivals a phase). Before the producer exits it waits for the last
// releases, so no peer arrival targets an exited CTA's shared memory; the multicasts into a CTA are
// all awaited by its own consumers.
//
// 1xS cluster (Geo::kClusterK = S, 2 or 4): the S K slices of a tile are one cluster. Slices 1..S-1
// write their partials with st.async into slice 0's shared memory (a region after the ring), each
// completing its bytes on slice 0's reduce barrier, which slice 0 armed for all of them before the
// cluster's start barrier; slice 0 waits on it, sums in slice order and stores. Slices that get no
// k-tile (K shorter than S slices) send zeros.
//
// Phased (Geo::kPhased): the consumer warpgroups take turns issuing their k-tile's wgmmas (two
// named barriers, warpgroup 0 first), so one warpgroup's wgmmas run while the other converts and
// waits, instead of both batches landing on the tensor cores at once.
#pragma once

#include <cstdint>
#include <utility>

#include "atoms/sm90a.cuh"
#include "common/gate_up.cuh"
#include "sm90s/params.cuh"
#include "sm90s/ptx.cuh"

namespace mixed_gemm {
namespace sm90s {

template <class Element, class Geo>
struct Mainloop {
  static constexpr int TN = Geo::kTN;
  static constexpr int TK = Geo::kTK;
  static constexpr int KB = Geo::kKBlocks;
  static constexpr int kAcc = TN / 2;
  static constexpr int kBits = Geo::kBitsW;
  static constexpr int kTileM = Geo::kTileM;
  static constexpr int kConsumerThreads = Geo::kConsumerThreads;
  static constexpr int kConsumerWarps = Geo::kConsumerWarps;
  static constexpr int kWords = kBits / 4;  // 32-bit words of one lane's atom slice
  using Op = typename RsOp<Element, TN>::type;
  using Frag = uint32_t[KB][4];
  using Half = uint32_t[KB / 2][4];  // half a k-tile's fragments (half issue)

  // One k-tile's A fragments for this warp's 16 rows: LDS, lop3 conversion, q' s + z'. kOneGroup:
  // the whole k-tile lies in one scale group (group >= TK, per-channel included), so its scale row
  // is read once and the 8 k16 blocks are one branch-free block the compiler interleaves; else the
  // row is re-read at each group boundary (a runtime test per k16 block).
  // k16 blocks [kB0, kB1) only (half issue: into a half-size array, block kb at a[kb - kB0]): the
  // scale row is read again at kB0, where the range starts inside a group.
  template <bool kOneGroup, int kB0 = 0, int kB1 = KB>
  static __device__ __forceinline__ void convert(char const* stage, Params const& p, int atom_row, int lane,
                                                 uint32_t (&a)[kB1 - kB0][4]) {
    uint32_t const* w = reinterpret_cast<uint32_t const*>(stage + Geo::kXBytes);
    uint16_t const* sc = reinterpret_cast<uint16_t const*>(stage + Geo::kXBytes + Geo::kWBytes);
    uint16_t const* ze = sc + Geo::kMaxScaleRows * kTileM;
    int const row = kAtomRows * atom_row + (lane >> 2);  // rows g and g + 8 of the warp's 16
    uint32_t s[2], z[2];
    int const kpg_mask = (1 << p.kb_shift) - 1;
#pragma unroll
    for (int kb = kB0; kb < kB1; ++kb) {
      if (kb == kB0 || (!kOneGroup && (kb & kpg_mask) == 0)) {  // a new scale row: once per group inside the k-tile
        int const r = (kb >> p.kb_shift) * kTileM + row;
        s[0] = uint32_t(sc[r]) * 0x10001u;
        s[1] = uint32_t(sc[r + 8]) * 0x10001u;
        z[0] = uint32_t(ze[r]) * 0x10001u;
        z[1] = uint32_t(ze[r + 8]) * 0x10001u;
      }
      uint32_t codes[kWords];
      uint32_t const* src = w + (atom_row + (kTileM / kAtomRows) * kb) * Geo::kAtomWords + lane * kWords;
      if constexpr (kWords == 1) {
        codes[0] = *src;
      } else {
        uint2 const v = *reinterpret_cast<uint2 const*>(src);
        codes[0] = v.x;
        codes[1] = v.y;
      }
      AtomConvert<Element, kBits>::run(codes, a[kb - kB0]);
      atom_scale<Element>(a[kb - kB0], s, z);
    }
  }

  // Phased: warpgroup cw issues k-tile i's wgmmas after the other one issued its k-tile i - 1 + cw
  // (turn barrier 2 + cw), then hands the turn over (barrier 3 - cw). Warpgroup 1 opens with a hand-over
  // and skips its last, so every sync meets exactly one arrival.
  static __device__ __forceinline__ void turn_take(int cw) {
    if constexpr (Geo::kPhased) {
      if (cw == 0) {
        turn_sync<2, kConsumerThreads>();
      } else {
        turn_sync<3, kConsumerThreads>();
      }
    }
  }
  static __device__ __forceinline__ void turn_pass(int cw, bool last) {
    if constexpr (Geo::kPhased) {
      if (cw == 0) {
        turn_arrive<3, kConsumerThreads>();
      } else if (!last) {
        turn_arrive<2, kConsumerThreads>();
      }
    }
  }

  // Release stage s: to this CTA's producer (lane 0), and under a cluster to every peer's (their
  // multicasts write this CTA's x stage too): lane j in 1..C-1 arrives on CTA rank ^ j, so the C - 1
  // remote arrivals are one predicated instruction of the warp.
  static __device__ __forceinline__ void release(uint64_t* empty, int s, int lane) {
    if (lane == 0) mbar_arrive(&empty[s]);
    if constexpr (Geo::kClusterM > 1) {
      if (lane >= 1 && lane < Geo::kClusterM) mbar_arrive_cluster(&empty[s], cluster_rank() ^ uint32_t(lane));
    }
  }

  // A consumer's wait for a stage. Gather: its x rows were written by cp.async (the generic proxy)
  // and wgmma reads them through the async proxy, so a proxy fence follows the barrier's acquire.
  static __device__ __forceinline__ void wait_full(uint64_t* bar, uint32_t parity) {
    mbar_wait(bar, parity);
    if constexpr (Geo::kGather) fence_proxy_async();
  }

  static __device__ __forceinline__ void fence(float (&acc)[kAcc]) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) cute::warpgroup_fence_operand(acc[i]);
  }

  // The wgmmas of k16 blocks [kB0, kB1) as one batch, block kb's fragments at a[kb - kB0] (half
  // issue: two batches a k-tile, the second accumulating onto the first while it runs; each opens
  // with its own wgmma.fence, as its fragments were written after the previous batch's).
  template <int kB0 = 0, int kB1 = KB>
  static __device__ __forceinline__ void mma(char const* stage, uint32_t (&a)[kB1 - kB0][4], float (&acc)[kAcc]) {
    // One descriptor per k-tile; each k16 block adds its constant offset to the low word (one add,
    // not the mask-shift-or chain per wgmma that a descriptor built from each address costs).
    uint32_t const lo = desc_sw128_lo(smem_u32(stage));
    fence(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kb = kB0; kb < kB1; ++kb) {
      uint64_t const desc = desc_sw128(lo + uint32_t(((kb / 4) * TN * 128 + (kb % 4) * 32) >> 4));
      wgmma_rs<Op>(a[kb - kB0], desc, acc, std::make_index_sequence<kAcc>{});
    }
    cute::warpgroup_commit_batch();
    fence(acc);
  }

  // One output tile's work: its K slice (split of nsplit; k-tiles kt0 .. kt0 + nk), weight rows,
  // split-K tile index, expert and token rows.
  struct Work {
    int split, nsplit, row0, tile, expert, tok0, tok_end, kt0, nk;
  };

  // The k-tiles of a split-K slice (>= 1: the host drops empty slices).
  static __device__ __forceinline__ void slice_tiles(Params const& p, Work& wk) {
    wk.kt0 = wk.split * p.split_tiles;
    wk.nk = max(0, min(p.k_tiles, wk.kt0 + p.split_tiles) - wk.kt0);  // 0: a 1xS cluster's idle slice
  }

  // Dense: the CTA's one tile, from blockIdx (x: K slice, y: row tile, z: token tile).
  static __device__ __forceinline__ Work dense_work(Params const& p) {
    Work wk{int(blockIdx.x), p.splits, int(blockIdx.y) * kTileM, int(blockIdx.y + gridDim.y * blockIdx.z), 0,
            int(blockIdx.z) * TN, p.m, 0, 0};
    slice_tiles(p, wk);
    return wk;
  }

  // Stream-K, in units (k-tiles) counted from the first tile: the first unit of CTA g's stream-K
  // range (after the data-parallel tiles; CTAs from sk_ctas on, which the grid has where the
  // data-parallel wave is wider than the rest's units, get none), and the CTA whose stream-K range
  // holds unit u.
  static __device__ __forceinline__ int sk_begin(Params const& p, int g) {
    return p.sk_dp_tiles * p.k_tiles + sm90s::sk_begin(min(g, p.sk_ctas), p.sk_ctas, p.sk_units);
  }
  static __device__ __forceinline__ int sk_owner(Params const& p, int u) {
    return sm90s::sk_owner(u - p.sk_dp_tiles * p.k_tiles, p.sk_ctas, p.sk_units);
  }
  // The stream this CTA belongs to: its own index, or its cluster's (grid (1, C G): clusters along y).
  static __device__ __forceinline__ int sk_stream() {
    return Geo::kClusterM > 1 ? int(blockIdx.y) / Geo::kClusterM : int(blockIdx.x);
  }

  // Stream-K: a data-parallel tile whole, or the segment of unit w's tile from w to the tile's end
  // or the CTA's range end.
  // Units count cluster tiles (C row tiles of one token tile); the CTA's own row tile is rank r of
  // them, and its output tile (partials, counters) the row tile's own index.
  static __device__ __forceinline__ Work stream_work(Params const& p, int w, int end) {
    constexpr int C = Geo::kClusterM;
    int const tile = w / p.k_tiles;
    int const u0 = tile * p.k_tiles;
    int const ctiles = p.row_tiles / C;  // cluster tiles along the rows
    int const rt = (tile % ctiles) * C + (C > 1 ? int(blockIdx.y) % C : 0), tt = tile / ctiles;
    int const out = rt + p.row_tiles * tt, tok0 = tt * TN;
    if (tile < p.sk_dp_tiles) return Work{0, 1, rt * kTileM, out, 0, tok0, p.m, 0, p.k_tiles};
    int const first = sk_owner(p, u0);
    return Work{sk_owner(p, w) - first, sk_owner(p, u0 + p.k_tiles - 1) - first + 1, rt * kTileM, out, 0, tok0,
                p.m, w - u0, min(u0 + p.k_tiles, end) - w};
  }

  // The expert of token item `it`: the first e with tile_ends[e] > it (the routing sort's tile
  // prefix sums, non-decreasing), i.e. the count of entries <= it. kWarp (a whole warp, converged):
  // each lane reads every 32nd entry, 128 entries a round with the loads issued together, and the
  // warp counts them with ballots: one round trip for up to 128 experts. Why: the binary search's
  // seven dependent loads an item (E = 128) were 9% of the warps' samples of Qwen3's 4096-token down
  // GEMM (ncu, H200; every consumer warp runs it at each item's start). One thread (the producer's,
  // which runs ahead of the consumers through the ring): the binary search.
  template <bool kWarp>
  static __device__ __forceinline__ int expert_of(Params const& p, int it) {
    if constexpr (kWarp) {
      int const lane = int(threadIdx.x) & 31;
      int count = 0;
      for (int e0 = 0; e0 < p.experts; e0 += 128) {
        int v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int const e = e0 + 32 * j + lane;
          v[j] = e < p.experts ? __ldg(p.tile_ends + e) : 0x7fffffff;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) count += __popc(__ballot_sync(0xffffffffu, v[j] <= it));
      }
      return count;
    } else {
      int lo = 0, hi = p.experts - 1;
      while (lo < hi) {
        int const mid = (lo + hi) >> 1;
        if (p.tile_ends[mid] > it) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      return lo;
    }
  }

  // Grouped: item w = split + splits (row tile + row_tiles token item), the token item mapped to
  // (expert, token tile) by the routing sort's tile prefix sums (expert_of). A grid sized from the
  // shapes (ceil(pairs / TN) + E token items) gives each CTA one item; a persistent grid (a CTA per
  // SM) walks them with the grid's stride.
  template <bool kWarp>
  static __device__ __forceinline__ Work grouped_work(Params const& p, int w) {
    int const split = w % p.splits;
    int const rest = w / p.splits;
    int const rt = rest % p.row_tiles;
    int const it = rest / p.row_tiles;
    int const lo = expert_of<kWarp>(p, it);
    long long const first = p.offsets[lo];
    Work wk{split, p.splits, rt * kTileM, rt + p.row_tiles * it, lo,
            int(first) + (it - (lo ? p.tile_ends[lo - 1] : 0)) * TN, int(first + p.counts[lo]), 0, 0};
    slice_tiles(p, wk);
    return wk;
  }

  // Work item w of the CTA's walk (`end`: the end of a stream-K range), and the item after it.
  // kWarp: called by whole converged warps (the consumers), else by one thread.
  template <bool kWarp>
  static __device__ __forceinline__ Work work_at(Params const& p, int w, int end) {
    if constexpr (Geo::kGrouped) {
      return grouped_work<kWarp>(p, w);
    } else {
      return p.sk_ctas ? stream_work(p, w, end) : dense_work(p);
    }
  }
  static __device__ __forceinline__ int next_item(Params const& p, int w, Work const& wk, int stride, int total) {
    if constexpr (!Geo::kGrouped) {
      if (p.sk_ctas) {  // after a data-parallel tile, the CTA's stream-K range
        return w < p.sk_dp_tiles * p.k_tiles ? sk_begin(p, sk_stream()) : w + wk.nk;
      }
    }
    return w + (stride ? stride : total);
  }

  // x's part of a stage: the TMA box of the token tile's rows (a gather kernel copies them by index
  // instead, gather_stage).
  static __device__ __forceinline__ void load_x(Params const& p, uint64_t* full, int s, char* stage, int kt,
                                                Work const& wk) {
    if constexpr (Geo::kClusterM > 1) {
      // This CTA's part of the token rows, into every CTA's stage (rows past M: zero fill, still
      // counted, so a CTA whose part lies wholly past M loads zeros for its peers).
      int const part = int(cluster_rank()) * Geo::kXBoxRows;
#pragma unroll
      for (int panel = 0; panel < Geo::kPanels; ++panel)
        tma_2d_multicast(&p.x, &full[s], stage + panel * TN * 128 + part * 128, kt * TK + 64 * panel, wk.tok0 + part,
                         uint16_t((1u << Geo::kClusterM) - 1), kEvictLast);
    } else {
#pragma unroll
      for (int panel = 0; panel < Geo::kPanels; ++panel)
        tma_2d(&p.x, &full[s], stage + panel * TN * 128, kt * TK + 64 * panel, wk.tok0, kEvictLast);
    }
  }

  // One stage's TMAs for k-tile kt of a work item, into ring slot s.
  static __device__ __forceinline__ void load_stage(Params const& p, char* smem, uint64_t* full, int s, int kt,
                                                    Work const& wk) {
    mbar_expect_tx(&full[s], p.stage_tx);
    char* stage = smem + s * Geo::kStageBytes;
    if constexpr (!Geo::kGather) load_x(p, full, s, stage, kt, wk);
    int const srow = (kt * TK) / p.group;
    char* const ws = stage + Geo::kXBytes;
    if constexpr (Geo::kGrouped) {  // one more coordinate: the expert
      tma_4d(&p.w, &full[s], ws, 0, wk.row0 / kAtomRows, kt * KB, wk.expert, kEvictFirst);
      tma_3d(&p.s, &full[s], ws + Geo::kWBytes, wk.row0, srow, wk.expert, kEvictFirst);
      tma_3d(&p.z, &full[s], ws + Geo::kWBytes + Geo::kSBytes, wk.row0, srow, wk.expert, kEvictFirst);
    } else {
      tma_3d(&p.w, &full[s], ws, 0, wk.row0 / kAtomRows, kt * KB, kEvictFirst);
      tma_2d(&p.s, &full[s], ws + Geo::kWBytes, wk.row0, srow, kEvictFirst);
      tma_2d(&p.z, &full[s], ws + Geo::kWBytes + Geo::kSBytes, wk.row0, srow, kEvictFirst);
    }
  }

  // Gather: the item's x row offsets (element index of row order[tok0 + r] / a_div of x, or -1
  // past the expert's block), TN long longs after the barriers, written once per item by the
  // producer warpgroup between two of its own barriers (id 1): the first waits until all of it has
  // issued the previous item's copies, the second until the offsets are in.
  static __device__ __forceinline__ void gather_rows(Params const& p, long long* rows, int pt, Work const& wk) {
    turn_sync<1, 128>();
    if (pt < TN) {
      int const r = wk.tok0 + pt;
      rows[pt] = r < wk.tok_end ? (long long)(p.order[r] / p.a_div) * p.k : -1;
    }
    turn_sync<1, 128>();
  }

  // Gather: producer thread pt's part of stage s's x panels for k-tile kt, then its arrival on the
  // stage's barrier when they land. Lanes run along a row's 16-byte chunks (TK / 8 of them), so a
  // warp's copies are whole 128-byte lines of 2-4 rows: one thread a row made every lane's copy a
  // line of its own, and the layer ran 7-30% slower than the separate gather pass (H200). Rows past
  // the expert's block and columns past K read zeros (the TMA box's zero fill: a weight column past
  // K is not zero after its zero point). Chunk c of a row lands in 16-byte slot c ^ (row % 8) of the
  // row's 128 bytes in its panel: the 128-byte swizzle that wgmma's descriptor reads.
  static __device__ __forceinline__ void gather_stage(Params const& p, char* smem, uint64_t* full, int s, int kt,
                                                      int pt, long long const* rows) {
    constexpr int kRowsPerPass = 128 / Geo::kRowChunks;
    int const cc = pt % Geo::kRowChunks;
    int const col = kt * TK + 8 * cc;
    char* const panel = smem + s * Geo::kStageBytes + (cc / 8) * TN * 128;
    uint16_t const* x = static_cast<uint16_t const*>(p.xg);
#pragma unroll
    for (int pass = 0; pass < TN / kRowsPerPass; ++pass) {
      int const row = pt / Geo::kRowChunks + kRowsPerPass * pass;
      long long const at = rows[row];
      bool const in = at >= 0 && col < p.k;
      cp_async_16(panel + row * 128 + (((cc % 8) ^ (row & 7)) << 4), in ? x + at + col : x, in ? 16 : 0);
    }
    cp_async_arrive(&full[s]);
  }

  static __device__ void run(Params const& p, char* smem_raw) {
    // The CTA's first work item and the stride to its next (grouped; dense: one item, stride 0;
    // stream-K: the CTA's unit range, each item the rest of a tile's k-tiles within it).
    int first = 0, stride = 0, total = 1;
    if constexpr (Geo::kGrouped) {
      first = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
      stride = int(gridDim.x * gridDim.y * gridDim.z);
      total = p.tile_ends[p.experts - 1] * p.row_tiles * p.splits;
      if (first >= total) return;  // the whole CTA, before any barrier exists
    } else {
      if (p.sk_ctas) {
        int const g = sk_stream();
        first = g < p.sk_dp_tiles ? g * p.k_tiles : sk_begin(p, g);
        total = sk_begin(p, g + 1);
        if (first >= total) return;
      }
    }
    char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + Geo::kStages * Geo::kStageBytes + Geo::kReduceBytes);
    uint64_t* empty = full + Geo::kStages;
    int const warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
    if (threadIdx.x == 0) {
      for (int s = 0; s < Geo::kStages; ++s) {
        mbar_init(&full[s], Geo::kFullArrivals);
        mbar_init(&empty[s], Geo::kClusterM * kConsumerThreads / 32);  // one per consumer warp of the cluster
      }
      if constexpr (Geo::kClusterK > 1) {
        // Armed before the start barrier: every peer's bytes, whenever they land.
        uint64_t* const reduce = full + 2 * kMaxStages;
        mbar_init(reduce, 1);
        if (cluster_rank() == 0) mbar_expect_tx(reduce, Geo::kReduceBytes);
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (Geo::kClusterM > 1 || Geo::kClusterK > 1) {
      cluster_sync();  // the peers multicast to and arrive on this CTA's barriers, or write its partials
    } else {
      __syncthreads();
    }

    if (warpgroup == 0) {  // producer: one thread walks the items' k-tiles through the ring
      if constexpr (Geo::kSetMaxNReg) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Geo::kProducerRegs));
      // Thread 0 issues the TMAs; under gather every producer thread also copies its x rows.
      int const pt = int(threadIdx.x);
      if (Geo::kGather || pt == 0) {
        if (pt == 0) {
          prefetch_map(&p.w);
          if constexpr (!Geo::kGather) prefetch_map(&p.x);
          prefetch_map(&p.s);
          prefetch_map(&p.z);
        }
        long long* const rows = reinterpret_cast<long long*>(reinterpret_cast<char*>(full) + Geo::kBarrierBytes);
        int q = 0;  // k-tiles loaded so far: ring slot q % stages, phase q / stages
        for (int w = first; w < total;) {
          Work const wk = work_at<Geo::kGather>(p, w, total);  // gather: the whole producer warpgroup
          if constexpr (Geo::kGather) gather_rows(p, rows, pt, wk);
          for (int i = 0; i < wk.nk; ++i, ++q) {
            int const s = q % Geo::kStages;
            mbar_wait(&empty[s], ((q / Geo::kStages) & 1) ^ 1);  // a fresh barrier passes parity 1
            if (pt == 0) load_stage(p, smem, full, s, wk.kt0 + i, wk);
            if constexpr (Geo::kGather) gather_stage(p, smem, full, s, wk.kt0 + i, pt, rows);
          }
          w = next_item(p, w, wk, stride, total);
        }
        if constexpr (Geo::kGather) cp_async_wait_all();  // none in flight at exit
        if constexpr (Geo::kClusterM > 1) {
          // The releases of the last k-tiles (the peers' remote arrivals included) have landed.
          for (int i = q; i < q + Geo::kStages; ++i)
            mbar_wait(&empty[i % Geo::kStages], ((i / Geo::kStages) & 1) ^ 1);
        }
      }
      return;
    }

    if constexpr (Geo::kSetMaxNReg) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Geo::kConsumerRegs));
    int const ct = int(threadIdx.x) - 128;  // 0 .. consumer threads - 1
    int const cw = warpgroup - 1;
    int const warp = (ct / 32) % 4;
    int const lane = ct % 32;
    int const atom_row = 4 * cw + warp;

    if constexpr (Geo::kPhased) {
      if (cw == 1) turn_arrive<2, kConsumerThreads>();  // warpgroup 0 issues first
    }
    int q = 0;  // k-tiles consumed so far, as the producer counts them
    for (int w = first; w < total;) {
      Work const wk = work_at<true>(p, w, total);
      int const nk = wk.nk;
      float acc[kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
      // The k-loop twice, one uniform branch per launch: the common groups (g >= TK, per-channel)
      // take the branch-free conversion.
      if (nk == 0) {
        // A 1xS cluster's slice past K: its partial is zeros.
      } else if ((1 << p.kb_shift) >= KB) {
        consume<true>(p, smem, full, empty, q, nk, cw, atom_row, lane, acc);
      } else {
        consume<false>(p, smem, full, empty, q, nk, cw, atom_row, lane, acc);
      }
      q += nk;
      if constexpr (Geo::kClusterK > 1) {
        if (!cluster_reduce(smem, full + 2 * kMaxStages, acc, ct)) return;
      }
      epilogue(p, acc, smem, ct, cw, warp, lane, wk);
      w = next_item(p, w, wk, stride, total);
    }
  }

  template <bool kOneGroup>
  // The nk k-tiles of one work item, the first in ring position q0 (slot q0 % stages).
  static __device__ __forceinline__ void consume(Params const& p, char* smem, uint64_t* full, uint64_t* empty, int q0,
                                                 int nk, int cw, int atom_row, int lane, float (&acc)[kAcc]) {
    if constexpr (Geo::kDoubleBuffer) {
      Frag a0, a1;
      int const s0 = q0 % Geo::kStages;
      wait_full(&full[s0], (q0 / Geo::kStages) & 1);
      convert<kOneGroup>(smem + s0 * Geo::kStageBytes, p, atom_row, lane, a0);
      for (int i = 0; i < nk; i += 2) {
        step<kOneGroup>(p, smem, full, empty, q0, i, nk, cw, atom_row, lane, a0, a1, acc);
        if (i + 1 < nk) step<kOneGroup>(p, smem, full, empty, q0, i + 1, nk, cw, atom_row, lane, a1, a0, acc);
      }
      if constexpr (Geo::kInFlight) {  // the last k-tile's wgmmas, still in flight
        cute::warpgroup_wait<0>();
        fence(acc);
        release(empty, (q0 + nk - 1) % Geo::kStages, lane);
      }
    } else if constexpr (Geo::kHalfBuffer) {
      Half lo0, lo1, hi;
      int const s0 = q0 % Geo::kStages;
      wait_full(&full[s0], (q0 / Geo::kStages) & 1);
      convert<kOneGroup, 0, KB / 2>(smem + s0 * Geo::kStageBytes, p, atom_row, lane, lo0);
      for (int i = 0; i < nk; i += 2) {
        half_step<kOneGroup>(p, smem, full, empty, q0, i, nk, atom_row, lane, lo0, lo1, hi, acc);
        if (i + 1 < nk) half_step<kOneGroup>(p, smem, full, empty, q0, i + 1, nk, atom_row, lane, lo1, lo0, hi, acc);
      }
    } else {
      Frag a;
      for (int i = 0; i < nk; ++i) {
        int const s = (q0 + i) % Geo::kStages;
        char const* stage = smem + s * Geo::kStageBytes;
        wait_full(&full[s], ((q0 + i) / Geo::kStages) & 1);
        if constexpr (Geo::kHalfIssue) {  // one set: the first half's wgmmas run while the second half converts
          convert<kOneGroup, 0, KB / 2>(stage, p, atom_row, lane, reinterpret_cast<Half&>(a[0]));
          mma<0, KB / 2>(stage, reinterpret_cast<Half&>(a[0]), acc);
          convert<kOneGroup, KB / 2, KB>(stage, p, atom_row, lane, reinterpret_cast<Half&>(a[KB / 2]));
          mma<KB / 2, KB>(stage, reinterpret_cast<Half&>(a[KB / 2]), acc);
        } else {
          convert<kOneGroup>(stage, p, atom_row, lane, a);
          turn_take(cw);
          mma(stage, a, acc);
          turn_pass(cw, i + 1 == nk);
        }
        cute::warpgroup_wait<0>();
        fence(acc);
        release(empty, s, lane);
      }
    }
  }

  // Half issue, k-tile i in two batches: the first half's wgmmas from `lo` (converted under the
  // previous k-tile's wgmmas), the second half converted into `hi` while they run and issued, then
  // the next k-tile's first half converted into `next_lo` while both batches run. Three half
  // fragment sets (1.5 of a k-tile's) where the double buffer needs two whole ones: the tensor
  // cores wait only for the conversion of the second half.
  template <bool kOneGroup>
  static __device__ __forceinline__ void half_step(Params const& p, char* smem, uint64_t* full, uint64_t* empty,
                                                   int q0, int i, int nk, int atom_row, int lane, Half& lo,
                                                   Half& next_lo, Half& hi, float (&acc)[kAcc]) {
    int const s = (q0 + i) % Geo::kStages;
    char const* stage = smem + s * Geo::kStageBytes;
    mma<0, KB / 2>(stage, lo, acc);
    convert<kOneGroup, KB / 2, KB>(stage, p, atom_row, lane, hi);
    mma<KB / 2, KB>(stage, hi, acc);
    if (i + 1 < nk) {
      int const s1 = (q0 + i + 1) % Geo::kStages;
      wait_full(&full[s1], ((q0 + i + 1) / Geo::kStages) & 1);
      convert<kOneGroup, 0, KB / 2>(smem + s1 * Geo::kStageBytes, p, atom_row, lane, next_lo);
    }
    cute::warpgroup_wait<0>();
    fence(acc);
    release(empty, s, lane);
  }

  // k-tile i: its wgmmas from `cur`, then (while they run) the next k-tile converted into `next`.
  // In flight: k-tile i - 1's wgmmas (from `next`) may still run when i's are issued; waiting for
  // them (all but the newest batch) frees `next` and their stage before the conversion refills it.
  template <bool kOneGroup>
  static __device__ __forceinline__ void step(Params const& p, char* smem, uint64_t* full, uint64_t* empty, int q0,
                                              int i, int nk, int cw, int atom_row, int lane, Frag& cur, Frag& next,
                                              float (&acc)[kAcc]) {
    int const s = (q0 + i) % Geo::kStages;
    turn_take(cw);
    mma(smem + s * Geo::kStageBytes, cur, acc);
    turn_pass(cw, i + 1 == nk);
    if constexpr (Geo::kInFlight) {
      if (i > 0) {
        cute::warpgroup_wait<1>();
        release(empty, (q0 + i - 1) % Geo::kStages, lane);
      }
    }
    if (i + 1 < nk) {
      int const s1 = (q0 + i + 1) % Geo::kStages;
      wait_full(&full[s1], ((q0 + i + 1) / Geo::kStages) & 1);
      convert<kOneGroup>(smem + s1 * Geo::kStageBytes, p, atom_row, lane, next);
    }
    if constexpr (!Geo::kInFlight) {
      cute::warpgroup_wait<0>();
      fence(acc);
      release(empty, s, lane);
    }
  }

  // 1xS cluster: slices 1..S-1 send their partials to slice 0 (false: this CTA is done); slice 0
  // waits for them and adds them to its own in slice order (true: it stores the tile).
  static __device__ __forceinline__ bool cluster_reduce(char* smem, uint64_t* reduce, float (&acc)[kAcc], int ct) {
    float* const red = reinterpret_cast<float*>(smem + Geo::kStages * Geo::kStageBytes);
    uint32_t const rank = cluster_rank();
    if (rank != 0) {
      // [slice - 1][TN/8 float4][consumer threads]: a warp's 16-byte writes cover 512 contiguous bytes.
      float* const mine = red + size_t(rank - 1) * kConsumerThreads * kAcc;
#pragma unroll
      for (int q = 0; q < kAcc / 4; ++q)
        st_async_f4(mine + (size_t(q) * kConsumerThreads + ct) * 4,
                    make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]), reduce, 0);
      return false;
    }
    mbar_wait(reduce, 0);
#pragma unroll
    for (int r = 1; r < Geo::kClusterK; ++r) {
      float4 const* src = reinterpret_cast<float4 const*>(red + size_t(r - 1) * kConsumerThreads * kAcc);
#pragma unroll
      for (int q = 0; q < kAcc / 4; ++q) {
        float4 const v = src[q * kConsumerThreads + ct];
        acc[4 * q] += v.x;
        acc[4 * q + 1] += v.y;
        acc[4 * q + 2] += v.z;
        acc[4 * q + 3] += v.w;
      }
    }
    return true;
  }

  static __device__ __forceinline__ void epilogue(Params const& p, float (&acc)[kAcc], char* smem, int ct, int cw,
                                                  int warp, int lane, Work const& wk) {
    int const row0 = wk.row0, tok0 = wk.tok0, tok_end = wk.tok_end;
    if (Geo::kClusterK == 1 && wk.nsplit > 1) {
      int const tile = wk.tile;
      // Partials as [TN/8 float4][256 threads]: each warp's float4 stores cover 512 contiguous bytes.
      float4* base = reinterpret_cast<float4*>(p.workspace) + size_t(tile) * p.splits * (kConsumerThreads * kAcc / 4);
      float4* mine = base + size_t(wk.split) * (kConsumerThreads * kAcc / 4);
#pragma unroll
      for (int q = 0; q < kAcc / 4; ++q)
        mine[q * kConsumerThreads + ct] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
      // Each warp arrives on its own counter: a warp's sum reads only the partials its own lanes'
      // peers wrote (the same ct in every slice), so no warp waits for the CTA's slowest (two
      // named barriers per tile were the largest stall but one at two CTAs per SM, ncu).
      __threadfence();
      __syncwarp();
      int last = 0;
      if (lane == 0) {
        int* const counter = &p.counters[tile * kConsumerWarps + (ct >> 5)];
        last = atomicAdd(counter, 1) == wk.nsplit - 1;
        if (last) *counter = 0;  // every split has arrived: ready for the next launch
      }
      if (!__shfl_sync(0xffffffffu, last, 0)) return;
      __threadfence();
      // The sum in slice order, the same bits whichever slice arrived last.
      if constexpr (2 * kAcc + 32 <= Geo::kConsumerRegs) {
        // This slice's own partial comes from its registers (one read fewer) where a second set
        // of sums fits beside the accumulators (up to 64 of them at 232 registers, 32 at 104-112).
        float sum[kAcc];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) sum[i] = 0.f;
        int const me = wk.split;
        for (int sp = 0; sp < wk.nsplit; ++sp) {
          float4 const* src = base + size_t(sp) * (kConsumerThreads * kAcc / 4);
#pragma unroll
          for (int q = 0; q < kAcc / 4; ++q) {
            float4 const v = sp == me ? make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3])
                                      : __ldcg(src + q * kConsumerThreads + ct);
            sum[4 * q] += v.x;
            sum[4 * q + 1] += v.y;
            sum[4 * q + 2] += v.z;
            sum[4 * q + 3] += v.w;
          }
        }
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = sum[i];
      } else {
        // No room for a second set (128 accumulators, or 64 at TM = 256): every partial is read back.
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
        for (int sp = 0; sp < wk.nsplit; ++sp) {
          float4 const* src = base + size_t(sp) * (kConsumerThreads * kAcc / 4);
#pragma unroll
          for (int q = 0; q < kAcc / 4; ++q) {
            float4 const v = __ldcg(src + q * kConsumerThreads + ct);
            acc[4 * q] += v.x;
            acc[4 * q + 1] += v.y;
            acc[4 * q + 2] += v.z;
            acc[4 * q + 3] += v.w;
          }
        }
      }
    }
    using Raw = typename Pair<Element>::raw;
    if constexpr (Geo::kGrouped) {
      if constexpr (Geo::kStaged) {
        if (p.y32 == nullptr) {
          store_staged(p, acc, smem + Geo::kStagedOffset, cw, warp, lane, row0, tok0, tok_end);
          return;
        }
      }
      store_grouped(p, acc, cw, warp, lane, row0, tok0, tok_end);
      return;
    }
    Raw const* bias = static_cast<Raw const*>(p.bias);
    Raw const* residual = static_cast<Raw const*>(p.residual);
    Raw* y = static_cast<Raw*>(p.y);
    int const rbase = row0 + 64 * cw + kAtomRows * warp + (lane >> 2);
    // Uniform branches: the store loop itself tests neither bias nor residual.
    if (residual != nullptr) {
      if (bias != nullptr) {
        store_pairs<true, true>(y, residual, bias, p.n, rbase, tok0, tok_end, lane, acc);
      } else {
        store_pairs<false, true>(y, residual, bias, p.n, rbase, tok0, tok_end, lane, acc);
      }
    } else if (bias != nullptr) {
      store_pairs<true, false>(y, residual, bias, p.n, rbase, tok0, tok_end, lane, acc);
    } else {
      store_pairs<false, false>(y, residual, bias, p.n, rbase, tok0, tok_end, lane, acc);
    }
  }

  // A lane's share of the pairing below (store_pairs, and the combine's reductions): after the
  // swap with lane ^ 4 it holds rows (rp, rp + 1) (+ 8 h) of token tok_l + 8 b, block b live where
  // 8 b < left.
  struct PairLane {
    int odd, rp, tok_l, left;
    __device__ __forceinline__ PairLane(int rbase, int tok0, int tok_end, int lane)
        : odd((lane >> 2) & 1), rp(rbase - odd), tok_l(tok0 + 2 * (lane & 3) + odd), left(tok_end - tok_l) {}
  };

  // y (tokens, n) from the accumulators, two adjacent rows of one token per 32-bit store: N is even
  // (prepack's rule) and y and the residual are 16-byte aligned (matmul's rule; the grouped buffers
  // are allocated so). A thread holds rows g and g + 8 of its warp's 16 for two adjacent tokens, and
  // y is token-major, so the rows of a token are the contiguous ones. Lanes g and g ^ 1 (lane ^ 4,
  // same token pair) swap one value per pair of accumulators: the even lane then holds rows
  // (g, g + 1) of the first token, the odd lane rows (g - 1, g) of the second. fp32 sums (bias, then
  // residual) and one rounding per value. Why: one 16-bit store per value behind a bounds branch
  // cost ~1400 instructions a warp at TN = 128, about a fifth of the kernel's time at M = 256 on
  // 4096 x 4096 (ncu, one consumer warpgroup); this loop has no branch and half the stores.
  template <bool kBias, bool kResidual, class Raw>
  static __device__ __forceinline__ void store_pairs(Raw* y, Raw const* residual, Raw const* bias, int n, int rbase,
                                                     int tok0, int tok_end, int lane, float const (&acc)[kAcc]) {
    using Raw2 = typename Pair<Element>::raw2;
    PairLane const pl(rbase, tok0, tok_end, lane);
    int const rp = pl.rp;  // this lane's even row (of rows g and g + 8: + 8 h)
    bool const live0 = rp < n, live1 = rp + 8 < n;
    float bias_v[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    if constexpr (kBias) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (rp + 8 * h < n) {
          float2 const b = Pair<Element>::to_floats(*reinterpret_cast<Raw2 const*>(bias + rp + 8 * h));
          bias_v[h][0] = b.x;
          bias_v[h][1] = b.y;
        }
      }
    }
    // One address a lane, stepped by 8 tokens a block (one 64-bit add); the row half h is +8
    // elements, an immediate offset of the store. Why: an address computed per store (64-bit
    // multiply, shift and add) was ~8 of the 22-27 instructions a value pair took (SASS).
    size_t const at0 = size_t(pl.tok_l) * n + rp;
    Raw2* yb = reinterpret_cast<Raw2*>(y + at0);
    Raw2 const* rb = reinterpret_cast<Raw2 const*>(residual + (kResidual ? at0 : 0));
    size_t const step = size_t(4) * n;  // 8 tokens, in pairs
#pragma unroll
    for (int b = 0; b < kAcc / 4; ++b) {
      bool const tok_live = 8 * b < pl.left;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // accumulator 4b + 2h + j: row g + 8h of the warp's 16, token 8b + 2 (lane % 4) + j
        float const a0 = acc[4 * b + 2 * h], a1 = acc[4 * b + 2 * h + 1];
        float const got = __shfl_xor_sync(0xffffffffu, pl.odd ? a0 : a1, 4);
        if ((h == 0 ? live0 : live1) && tok_live) {
          float lo = pl.odd ? got : a0, hi = pl.odd ? a1 : got;
          if constexpr (kBias) {
            lo += bias_v[h][0];
            hi += bias_v[h][1];
          }
          if constexpr (kResidual) {
            float2 const r = Pair<Element>::to_floats(rb[4 * h]);
            lo += r.x;
            hi += r.y;
          }
          yb[4 * h] = Pair<Element>::from_floats(lo, hi);
        }
      }
      yb += step;
      if constexpr (kResidual) rb += step;
    }
  }

  // Grouped stores: sorted row tok of this expert's block (tok < tok_end), y (pairs, N), or for the
  // gate|up stage h (pairs, N/2) = SiLU(gate) * up: rows 16j + g (gate) and 16j + 8 + g (up) of a
  // warp's 16 are one thread's accumulators i and i + 2 (the stack's blocks of 8), one rounding.
  static __device__ __forceinline__ void store_grouped(Params const& p, float (&acc)[kAcc], int cw, int warp, int lane,
                                                       int row0, int tok0, int tok_end) {
    using Raw = typename Pair<Element>::raw;
    Raw* y = static_cast<Raw*>(p.y);
    static_assert(kGateUpBlock == 8 && kAtomRows == 16, "a thread's rows g and g + 8 are a gate row and its up row");
    int const g = lane >> 2;
    int const block = row0 + 64 * cw + kAtomRows * warp;  // the warp's 16 rows
    if (p.gate_up) {
      // Paired as store_pairs: h's columns g and g + 1 of one token per 32-bit store (I is a
      // multiple of 8, prepack_experts' rule, so h's rows are 4-byte aligned).
      using Raw2 = typename Pair<Element>::raw2;
      int const half = p.n / 2;
      int const odd = g & 1;
      int const col = gate_up_output(block + g) - odd;
      bool const live = block + g < p.n;
      int const tok_l = tok0 + 2 * (lane & 3) + odd;
      int const left = tok_end - tok_l;
      // One address a lane, stepped by 8 tokens a block, as store_pairs.
      Raw2* hb = reinterpret_cast<Raw2*>(y + size_t(tok_l) * half + col);
      size_t const step = size_t(4) * half;
#pragma unroll
      for (int b = 0; b < kAcc / 4; ++b) {
        // accumulators 4b, 4b + 1: gate rows (tokens t, t + 1); 4b + 2, 4b + 3: their up rows
        float const h0 = silu_mul(acc[4 * b], acc[4 * b + 2]), h1 = silu_mul(acc[4 * b + 1], acc[4 * b + 3]);
        float const got = __shfl_xor_sync(0xffffffffu, odd ? h0 : h1, 4);
        if (live && 8 * b < left) *hb = Pair<Element>::from_floats(odd ? got : h0, odd ? h1 : got);
        hb += step;
      }
      return;
    }
    if (p.y32 != nullptr) {
      add_weighted(p, acc, block + g, tok0, tok_end, lane);
      return;
    }
    Raw const* const none = nullptr;
    store_pairs<false, false>(y, none, none, p.n, block + g, tok0, tok_end, lane, acc);
  }

  // Staged (Geometry::kStaged): store_grouped's rows (h's for the gate|up stage, else y's) through
  // shared memory, each consumer warpgroup on its own: its 64 weight rows of token t at
  // buf + (cw * TN + t) * kStagedPitch, then read back 16 bytes a lane and stored as whole 128-byte
  // (y) or 64-byte (h) row segments, 4 or 8 tokens a warp instruction: one L1 wavefront a token
  // where the register-order store takes 8 for 16 bytes each. Not bulk copies: the TMA unit takes
  // ~25-30 cycles an instruction (the one-row gather, moe.md), and 128-512 row copies an item queued
  // the ring's loads behind them (measured 5-11% slower). Per warpgroup, not per CTA: the
  // warpgroups of the cooperative tile run staggered, and a CTA-wide barrier lined them up. The
  // values are store_grouped's, paired the same way (lane g holds columns (g, g + 1) of one token
  // after the swap with lane ^ 4). N and I are multiples of 8 (the family's rules), so a row
  // segment is whole 16-byte chunks.
  static __device__ __forceinline__ void store_staged(Params const& p, float (&acc)[kAcc], char* buf, int cw, int warp,
                                                      int lane, int row0, int tok0, int tok_end) {
    using Raw = typename Pair<Element>::raw;
    using Raw2 = typename Pair<Element>::raw2;
    constexpr int kPitch = Geo::kStagedPitch;
    char* const mine = buf + cw * TN * kPitch;
    wg_sync(cw);  // every warp of the warpgroup has read the previous item's rows
    int const g = lane >> 2, odd = g & 1;
    bool const gate_up = p.gate_up;
    // This lane's token (of block 0) and even column, relative to the warpgroup's first.
    char* const at = mine + (2 * (lane & 3) + odd) * kPitch +
                     2 * ((gate_up ? warp * kGateUpBlock : kAtomRows * warp) + g - odd);
    if (gate_up) {
#pragma unroll
      for (int b = 0; b < kAcc / 4; ++b) {
        float const h0 = silu_mul(acc[4 * b], acc[4 * b + 2]), h1 = silu_mul(acc[4 * b + 1], acc[4 * b + 3]);
        float const got = __shfl_xor_sync(0xffffffffu, odd ? h0 : h1, 4);
        *reinterpret_cast<Raw2*>(at + 8 * b * kPitch) = Pair<Element>::from_floats(odd ? got : h0, odd ? h1 : got);
      }
    } else {
#pragma unroll
      for (int b = 0; b < kAcc / 4; ++b) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float const a0 = acc[4 * b + 2 * h], a1 = acc[4 * b + 2 * h + 1];
          float const got = __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 4);
          *reinterpret_cast<Raw2*>(at + 8 * b * kPitch + 16 * h) =
              Pair<Element>::from_floats(odd ? got : a0, odd ? a1 : got);
        }
      }
    }
    wg_sync(cw);  // the warpgroup's rows are in shared memory
    int const ncols = gate_up ? p.n / 2 : p.n;
    int const col0 = gate_up ? gate_up_output(row0) + kGateUpBlock * 4 * cw : row0 + 64 * cw;
    int const chunks = min(gate_up ? 4 : 8, (ncols - col0) / 8);  // 16-byte chunks a row (fewer at ragged N)
    int const rows = min(TN, tok_end - tok0);
    Raw* const y = static_cast<Raw*>(p.y) + size_t(tok0) * ncols + col0;
    if (gate_up) {
      copy_rows<4>(y, ncols, mine, rows, chunks, 32 * warp + lane);
    } else {
      copy_rows<8>(y, ncols, mine, rows, chunks, 32 * warp + lane);
    }
  }

  // The warpgroup's staged rows to y: thread i of 128 copies chunk i % kChunks of row i / kChunks,
  // then the rows 128 / kChunks further on; chunks past `chunks` (ragged N) are skipped.
  template <int kChunks, class Raw>
  static __device__ __forceinline__ void copy_rows(Raw* y, int ncols, char const* rows_smem, int rows, int chunks,
                                                   int i) {
    int const c = i % kChunks;
    if (c >= chunks) return;
    for (int t = i / kChunks; t < rows; t += 128 / kChunks) {
      uint4 const v = *reinterpret_cast<uint4 const*>(rows_smem + t * Geo::kStagedPitch + 16 * c);
      *reinterpret_cast<uint4*>(y + size_t(t) * ncols + 8 * c) = v;
    }
  }

  // Warpgroup cw's named barrier (ids 4 .. 7: the staged epilogue's).
  static __device__ __forceinline__ void wg_sync(int cw) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(4 + cw) : "memory");
  }

  // The down stage's combine: sorted row tok is pair order[tok], of token order[tok] / top_k; the
  // row times the pair's fp32 weight is added into the token's fp32 row of y32, two adjacent
  // columns per 64-bit vector reduction (paired as store_pairs: a warp's reductions fill 32-byte
  // sectors). Why: the stored rows and the combine pass that read them back were 2 x 2 bytes per
  // pair and column, against one fp32 read-modify-write in L2 per pair and column here. The k
  // slots of a token arrive in any order: for top-k > 2 the fp32 sum's last bits may differ between
  // runs (0 + a + b is exact in either order).
  static __device__ __forceinline__ void add_weighted(Params const& p, float const (&acc)[kAcc], int rbase, int tok0,
                                                      int tok_end, int lane) {
    PairLane const pl(rbase, tok0, tok_end, lane);
    bool const live0 = pl.rp < p.n, live1 = pl.rp + 8 < p.n;
#pragma unroll
    for (int b = 0; b < kAcc / 4; ++b) {
      bool const tok_live = 8 * b < pl.left;
      int pair = 0;
      float wt = 0.f;
      if (tok_live) {
        pair = __ldg(p.order + pl.tok_l + 8 * b);
        wt = __ldg(p.topk_w + pair);
      }
      float* const dst = p.y32 + size_t(pair / p.top_k) * p.n + pl.rp;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float const a0 = acc[4 * b + 2 * h], a1 = acc[4 * b + 2 * h + 1];
        float const got = __shfl_xor_sync(0xffffffffu, pl.odd ? a0 : a1, 4);
        if ((h == 0 ? live0 : live1) && tok_live) {
          float const lo = wt * (pl.odd ? got : a0), hi = wt * (pl.odd ? a1 : got);
          asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst + 8 * h), "f"(lo), "f"(hi) : "memory");
        }
      }
    }
  }
};

}  // namespace sm90s
}  // namespace mixed_gemm
