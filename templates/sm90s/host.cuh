// The sm90s family's host side: TMA descriptors encoded once per (weight, M) into a cached
// Params, re-targeted per call, and the launch. Host pass only (kernel.cu.j2); plain CUDA runtime
// and driver entry points, no CUTLASS host code.
#pragma once

#include <cstdint>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>

#include "sm90s/params.cuh"

namespace mixed_gemm {
namespace sm90s {

// Error codes of the C ABI (mixed_gemm/kernels/sm90s/abi.py mirrors them).
enum : int { kErrNoDriver = -1, kErrEncodeW = -2, kErrEncodeS = -3, kErrEncodeZ = -4, kErrEncodeX = -5,
             kErrReplaceX = -6, kErrSetup = -7, kErrLaunch = -8, kErrLoad = -9, kErrShape = -10 };

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, cuuint64_t const*,
                                   cuuint64_t const*, cuuint32_t const*, cuuint32_t const*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
using ReplaceAddressFn = CUresult (*)(CUtensorMap*, void*);

// Driver entry points through the runtime (no -lcuda link needed).
template <class Fn>
inline Fn driver_fn(char const* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    p = nullptr;
  }
  return reinterpret_cast<Fn>(p);
}
inline EncodeTiledFn encode_fn() {
  static EncodeTiledFn fn = driver_fn<EncodeTiledFn>("cuTensorMapEncodeTiled");
  return fn;
}
inline ReplaceAddressFn replace_fn() {
  static ReplaceAddressFn fn = driver_fn<ReplaceAddressFn>("cuTensorMapReplaceAddress");
  return fn;
}

// One cached launch: the parameters (descriptors encoded for one weight and M) and the grid.
struct Slot {
  alignas(64) Params params;
  dim3 grid;
  void const* x = nullptr;  // the address the x descriptor holds
  int m = -1;
  long long tiles = 0;      // output tiles a launch may write (split-K partials and counters are sized by it)
};

// x (M, K) 16-bit, row-major: box (64, TN / cluster M), 128-byte swizzle, zero fill beyond K and M
// (a cluster CTA whose token rows lie wholly past M loads a box of zeros, counted like any other).
template <class Geo>
int encode_x(Params& p, void const* x, int m, int k) {
  cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(m)};
  cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  cuuint32_t box[2] = {64, cuuint32_t(Geo::kXBoxRows)};
  cuuint32_t unit[2] = {1, 1};
  CUresult r = encode_fn()(&p.x, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(x), dims, strides, box, unit,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : kErrEncodeX;
}

// Scales or zeros, (groups, N_pad) 16-bit row-major: box (TM rows, the stage's scale rows).
template <class Geo>
int encode_params(CUtensorMap* map, void const* t, int n_pad, int groups, int rows) {
  cuuint64_t dims[2] = {cuuint64_t(n_pad), cuuint64_t(groups)};
  cuuint64_t strides[1] = {cuuint64_t(n_pad) * 2};
  cuuint32_t box[2] = {cuuint32_t(Geo::kTileM), cuuint32_t(rows)};
  cuuint32_t unit[2] = {1, 1};
  CUresult r = encode_fn()(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(t), dims, strides, box, unit,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : 1;
}

// A weight's scale groups as the k-tiles read them: K rows per scale row g (1 << 30 for one group
// per column: every k-tile reads scale row 0), the scale rows a stage holds, and log2 of the k16
// blocks per scale row inside a k-tile. False: a group size the k-tiles cannot take.
template <class Geo>
bool group_geometry(int group, int groups, int& g, int& rows, int& kb_shift) {
  constexpr int TK = Geo::kTK;
  g = groups == 1 ? (1 << 30) : group;
  if (groups > 1 && !(g % TK == 0 || (TK % g == 0 && g % 32 == 0))) return false;
  rows = g >= TK ? 1 : TK / g;
  kb_shift = 0;
  while ((16 << kb_shift) < (g < TK ? g : TK)) ++kb_shift;
  return true;
}

// The shape fields of the parameters (both inits, after the descriptors): splits, the K slices
// asked for (1: none), clamped so that every slice gets a k-tile.
template <class Geo>
void set_shape(Params& p, int m, int n, int k, int g, int rows, int kb_shift, int splits) {
  p.m = m;
  p.n = n;
  p.k = k;
  p.group = g;
  p.k_tiles = ((k + 15) / 16 * 16 + Geo::kTK - 1) / Geo::kTK;
  int const asked = splits < p.k_tiles ? splits : p.k_tiles;
  p.split_tiles = (p.k_tiles + asked - 1) / asked;
  p.splits = (p.k_tiles + p.split_tiles - 1) / p.split_tiles;
  p.kb_shift = kb_shift;
  p.stage_tx = Geo::kXBytes + Geo::kWBytes + 2 * Geo::kTileM * rows * 2;
}

// Stream-K over `ctas` CTAs (at most one per unit): the most K segments a tile gets (the CTA
// boundaries inside it, + 1; sk_owner: params.cuh).
inline int sk_most_segments(int tiles, int k_tiles, int ctas) {
  long long const units = (long long)tiles * k_tiles;
  int most = 1;
  for (int t = 0; t < tiles; ++t) {
    long long const u0 = (long long)t * k_tiles;
    int const segs = sk_owner(u0 + k_tiles - 1, ctas, units) - sk_owner(u0, ctas, units) + 1;
    most = segs > most ? segs : most;
  }
  return most;
}

// splits: K slices asked for (1: none); sk_ctas > 0: stream-K over that many CTAs instead, the
// grid one-dimensional, or under a Cx1 cluster over sk_ctas / C clusters, the grid (1, C x clusters).
template <class Geo>
int init(Slot* slot, void const* w, void const* s, void const* z, void const* x, int m, int n, int n_pad, int k,
         int group, int groups, int splits, int sk_ctas) {
  if (!encode_fn()) return kErrNoDriver;
  if (m < 1 || n < 1 || k < 1 || n_pad % 16 || n_pad < n || k % 8 || groups < 1 || splits < 1 || sk_ctas < 0 ||
      (sk_ctas > 0 && (sk_ctas < Geo::kClusterM || Geo::kClusterK > 1 || Geo::kPhased)))
    return kErrShape;
  int g, rows, kb_shift;
  if (!group_geometry<Geo>(group, groups, g, rows, kb_shift)) return kErrShape;

  Params& p = slot->params;
  std::memset(&p, 0, sizeof(Params));
  int const k16 = (k + 15) / 16 * 16;
  {
    cuuint64_t dims[3] = {cuuint64_t(Geo::kAtomWords), cuuint64_t(n_pad / kAtomRows), cuuint64_t(k16 / 16)};
    cuuint64_t strides[2] = {cuuint64_t(Geo::kAtomBytes), cuuint64_t(n_pad / kAtomRows) * Geo::kAtomBytes};
    cuuint32_t box[3] = {cuuint32_t(Geo::kAtomWords), cuuint32_t(Geo::kTileM / kAtomRows), cuuint32_t(Geo::kKBlocks)};
    cuuint32_t unit[3] = {1, 1, 1};
    CUresult r = encode_fn()(&p.w, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, const_cast<void*>(w), dims, strides, box, unit,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return kErrEncodeW;
  }
  if (encode_params<Geo>(&p.s, s, n_pad, groups, rows)) return kErrEncodeS;
  if (encode_params<Geo>(&p.z, z, n_pad, groups, rows)) return kErrEncodeZ;
  if (int rc = encode_x<Geo>(p, x, m, k)) return rc;
  set_shape<Geo>(p, m, n, k, g, rows, kb_shift, splits);
  slot->x = x;
  // Row tiles rounded up to whole clusters: a CTA past N still loads its part of x for its peers
  // (its weight boxes are out of bounds, zero-filled) and stores nothing.
  int const row_tiles = (n + Geo::kTileM * Geo::kClusterM - 1) / (Geo::kTileM * Geo::kClusterM) * Geo::kClusterM;
  int const token_tiles = (m + Geo::kTN - 1) / Geo::kTN;
  if (Geo::kClusterK > 1) {
    // A 1xS cluster is the S slices of one tile, whatever K: a slice past K gets no k-tile.
    p.split_tiles = (p.k_tiles + Geo::kClusterK - 1) / Geo::kClusterK;
    p.splits = Geo::kClusterK;
  }
  slot->grid = dim3(p.splits, row_tiles, token_tiles);
  slot->tiles = (long long)row_tiles * token_tiles;
  if (sk_ctas > 0) {
    // Streams: CTAs, or clusters of C CTAs walking cluster tiles (C adjacent row tiles).
    constexpr int C = Geo::kClusterM;
    long long const tiles = slot->tiles / C;
    int const streams = sk_ctas / C;
    // More tiles than one wave: the first wave's tiles whole (each stream its own, the wave reading
    // the same k-tiles together as data-parallel CTAs do), stream-K over the rest.
    int const dp = tiles > streams ? streams : 0;
    long long const units = (tiles - dp) * p.k_tiles;
    p.sk_ctas = int(units < streams ? units : streams);
    p.sk_units = int(units);
    p.sk_dp_tiles = dp;
    p.row_tiles = row_tiles;
    p.splits = sk_most_segments(int(tiles) - dp, p.k_tiles, p.sk_ctas);
    p.split_tiles = p.k_tiles;
    // At most one range a unit (so no range is empty and every segment counted arrives); the
    // data-parallel wave may still need more streams than the rest has units.
    int const grid = dp > p.sk_ctas ? dp : p.sk_ctas;
    slot->grid = C > 1 ? dim3(1, grid * C) : dim3(grid);
  }
  slot->m = m;
  return 0;
}

// Grouped (templates/moe_sm90s/): the stacked experts' weight (E x w_bytes apart), scales and zeros
// (E x s_bytes apart, (groups, N_pad) each) and the sorted rows x (pairs, K). Work items (K slice,
// row tile, token item) number at most splits x ceil(N / TM) x (ceil(pairs / TN) + E) whatever the
// routing (each expert's last token tile is partial at most), so no count is read on the host.
// ctas 0: that many CTAs, one item each (grid (splits, row tiles, token items)); else a persistent
// grid of `ctas` CTAs (one per SM), each walking the items with the grid's stride.
template <class Geo>
int init_grouped(Slot* slot, void const* w, void const* s, void const* z, void const* x, int pairs, int n, int n_pad,
                 int k, int group, int groups, int experts, long long w_bytes, long long s_bytes, int gate_up,
                 int splits, int ctas) {
  if (!encode_fn()) return kErrNoDriver;
  if (pairs < 1 || n < 1 || k < 1 || n_pad % 16 || n_pad < n || k % 8 || groups < 1 || splits < 1 || experts < 1 ||
      w_bytes % 16 || s_bytes % 16 || (gate_up && n % 16) || ctas < 0)
    return kErrShape;
  int g, rows, kb_shift;
  if (!group_geometry<Geo>(group, groups, g, rows, kb_shift)) return kErrShape;

  Params& p = slot->params;
  std::memset(&p, 0, sizeof(Params));
  int const k16 = (k + 15) / 16 * 16;
  cuuint32_t unit[4] = {1, 1, 1, 1};
  {
    cuuint64_t dims[4] = {cuuint64_t(Geo::kAtomWords), cuuint64_t(n_pad / kAtomRows), cuuint64_t(k16 / 16),
                          cuuint64_t(experts)};
    cuuint64_t strides[3] = {cuuint64_t(Geo::kAtomBytes), cuuint64_t(n_pad / kAtomRows) * Geo::kAtomBytes,
                             cuuint64_t(w_bytes)};
    cuuint32_t box[4] = {cuuint32_t(Geo::kAtomWords), cuuint32_t(Geo::kTileM / kAtomRows), cuuint32_t(Geo::kKBlocks), 1};
    if (encode_fn()(&p.w, CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, const_cast<void*>(w), dims, strides, box, unit,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return kErrEncodeW;
  }
  for (int which = 0; which < 2; ++which) {
    cuuint64_t dims[3] = {cuuint64_t(n_pad), cuuint64_t(groups), cuuint64_t(experts)};
    cuuint64_t strides[2] = {cuuint64_t(n_pad) * 2, cuuint64_t(s_bytes)};
    cuuint32_t box[3] = {cuuint32_t(Geo::kTileM), cuuint32_t(rows), 1};
    if (encode_fn()(which ? &p.z : &p.s, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(which ? z : s), dims,
                    strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return which ? kErrEncodeZ : kErrEncodeS;
  }
  if constexpr (!Geo::kGather) {
    if (int rc = encode_x<Geo>(p, x, pairs, k)) return rc;
  }
  set_shape<Geo>(p, pairs, n, k, g, rows, kb_shift, splits);
  if constexpr (Geo::kGather) p.stage_tx -= Geo::kXBytes;  // the TMAs bring the weight, scales, zeros; x: cp.async
  p.experts = experts;
  p.row_tiles = (n + Geo::kTileM - 1) / Geo::kTileM;
  p.gate_up = gate_up;
  slot->x = x;
  int const items = (pairs + Geo::kTN - 1) / Geo::kTN + experts;
  slot->grid = ctas ? dim3(ctas) : dim3(p.splits, p.row_tiles, items);
  slot->tiles = (long long)p.row_tiles * items;
  slot->m = pairs;
  return 0;
}

// Clusters of this kernel that run at once (cudaOccupancyMaxActiveClusters; 0 without a cluster).
// A cluster's CTAs share a GPC, so at one CTA per SM whole clusters of 4 may leave SMs of a GPC idle:
// the split factor of "auto" counts these slots, not the SMs (mixed_gemm/kernels/sm90s/launch.py);
// a 1xS cluster's wave is its tiles at once.
template <class Geo>
int max_active_clusters(void const* kernel) {
  if (Geo::kClusterM == 1 && Geo::kClusterK == 1) return 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(Geo::kClusterK, Geo::kClusterM, 1);
  cfg.blockDim = dim3(Geo::kThreads);
  cfg.dynamicSmemBytes = Geo::kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = Geo::kClusterK;
  attr[0].val.clusterDim.y = Geo::kClusterM;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  return cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0 ? clusters : kErrSetup;
}

// Split-K scratch of the slot's launch: fp32 partials (0 without split-K) and the arrival counters
// (one per consumer warp of each output tile).
template <class Geo>
long long workspace_floats(Slot const* slot) {
  if (slot->params.splits < 2 || Geo::kClusterK > 1) return 0;  // a 1xS cluster sums in shared memory
  return (long long)slot->params.splits * slot->tiles * Geo::kConsumerThreads * (Geo::kTN / 2);
}
template <class Geo>
long long counter_count(Slot const* slot) { return Geo::kClusterK > 1 ? 0 : slot->tiles * Geo::kConsumerWarps; }

// Grouped: the routing's device arrays of this call (offsets and counts int64, tile_ends int32 for
// tiles of TN rows), then run().
inline void set_routing(Slot* slot, void const* offsets, void const* counts, void const* tile_ends) {
  slot->params.offsets = static_cast<long long const*>(offsets);
  slot->params.counts = static_cast<long long const*>(counts);
  slot->params.tile_ends = static_cast<int const*>(tile_ends);
}
// Gather: sorted row r is row order[r] / a_div of x (the routing sort's pair order; a_div = top-k
// for the gate|up stage's token rows).
inline void set_gather(Slot* slot, void const* order, int a_div) {
  slot->params.order = static_cast<int const*>(order);
  slot->params.a_div = a_div;
}
// Combine (the down stage): y32 (tokens, N) fp32 receives each sorted row times its pair's top-k
// weight (fp32, pair order) in place of y; nullptr stores y.
inline void set_combine(Slot* slot, void* y32, void const* topk_w, int top_k) {
  slot->params.y32 = static_cast<float*>(y32);
  slot->params.topk_w = static_cast<float const*>(topk_w);
  slot->params.top_k = top_k;
}

template <class Geo>
int run(Slot* slot, void const* kernel, void const* x, void* y, void const* bias, void const* residual, void* workspace,
        void* counters, cudaStream_t stream) {
  Params& p = slot->params;
  // The descriptor holds x's address; bias, residual, y and the scratch are plain pointers (and x
  // too where the rows are gathered by index).
  if constexpr (Geo::kGather) {
    p.xg = x;
  } else if (x != slot->x) {
    ReplaceAddressFn replace = replace_fn();
    if (!replace) return kErrNoDriver;
    if (replace(&p.x, const_cast<void*>(x)) != CUDA_SUCCESS) return kErrReplaceX;
    slot->x = x;
  }
  p.y = y;
  p.bias = bias;
  p.residual = residual;
  p.workspace = static_cast<float*>(workspace);
  p.counters = static_cast<int*>(counters);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = slot->grid;
  cfg.blockDim = dim3(Geo::kThreads);
  cfg.dynamicSmemBytes = Geo::kSmemBytes;
  cfg.stream = stream;
  // A Cx1 cluster groups the C CTAs of adjacent row tiles (grid y) of one K slice and token tile
  // (grid y is a multiple of C, above); a 1xS cluster the S K slices (grid x) of one tile.
  constexpr bool kCluster = Geo::kClusterM > 1 || Geo::kClusterK > 1;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = Geo::kClusterK;
  attr[0].val.clusterDim.y = Geo::kClusterM;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = kCluster ? attr : nullptr;
  cfg.numAttrs = kCluster ? 1 : 0;
  void* args[] = {&p};
  // The Params are copied into the launch (a captured graph node owns its copy).
  return cudaLaunchKernelExC(&cfg, kernel, args) == cudaSuccess ? 0 : kErrLaunch;
}

}  // namespace sm90s
}  // namespace mixed_gemm
