// The routing of the grouped tile families (moe_sm90a, moe_sm80) on the device: a stable counting
// sort of the (token, slot) pairs by expert in two launches, and the row gather of those that
// cannot read their operand by index (moe_sm90a's TMA).
//
// Key of pair p: its expert id when in [0, E), else E (a -1 of expert parallelism, or a bad id):
// those sort after every expert's rows, no expert owns them, and their `pos` is -1.
//
//   count:   CTA b counts the keys of its chunk of pairs (shared-memory atomics) into hist[b].
//   scatter: CTA b sums the histograms of the CTAs before it and of all (its keys' first rows),
//            then places its chunk pass by pass (kThreads pairs a pass, in pair order): a pair's row
//            is its key's next row + the same keys of earlier warps in the pass + its rank among its
//            warp's equal keys (__match_any_sync). Rows within an expert are in pair order (stable),
//            so the result is the torch stable sort's, deterministic. CTA 0 also writes the
//            per-expert counts, offsets and, for up to two tile heights, the inclusive prefix sums
//            of each expert's tile count (the moe_sm80 grid's tile -> expert map).
//
// The chunk (a multiple of kThreads, set by the launcher) keeps the grid at a few dozen CTAs: each
// scatter CTA reads every histogram once (blocks x (E + 1) ints from L2).
#pragma once

#include <cstdint>

namespace mixed_gemm {
namespace moe_sort {

constexpr int kThreads = 512;  // threads per CTA: one pair each per pass
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExperts = 511;  // keys 0..E fit a CTA's two-per-thread scan (E + 1 <= 2 kThreads)
constexpr int kMaxKeys = kMaxExperts + 1;
constexpr int kMaxTileRows = 2;  // tile heights whose prefix sums a call writes

struct SortArgs {
  void const* ids;     // (pairs,) expert ids, int32 or int64 (ids_64)
  int* hist;           // (blocks, E + 1) workspace: each CTA's key counts (count writes, scatter reads)
  int* order;          // (pairs,) sorted row -> pair
  int* pos;            // (pairs,) pair -> sorted row; -1 where the id is outside [0, E)
  int64_t* counts;     // (E,) rows of each expert
  int64_t* offsets;    // (E,) first sorted row of each expert
  int* tile_ends;      // (tile_heights, E) inclusive prefix sums of ceil(counts / tile_rows[i]); or nullptr
  int pairs;
  int experts;
  int ids_64;          // ids are int64
  int chunk;           // pairs per CTA, a multiple of kThreads
  int tile_heights;    // 0..kMaxTileRows
  int tile_rows[kMaxTileRows];
};

__device__ __forceinline__ int key_of(SortArgs const& a, int p) {
  long long const id = a.ids_64 ? static_cast<long long const*>(a.ids)[p] : static_cast<int const*>(a.ids)[p];
  return id >= 0 && id < a.experts ? int(id) : a.experts;
}

__device__ void count(SortArgs const& a) {
  __shared__ int hist[kMaxKeys];
  int const keys = a.experts + 1;
  for (int k = threadIdx.x; k < keys; k += kThreads) hist[k] = 0;
  __syncthreads();
  int const begin = blockIdx.x * a.chunk, end = min(begin + a.chunk, a.pairs);
  for (int p = begin + threadIdx.x; p < end; p += kThreads) atomicAdd(&hist[key_of(a, p)], 1);
  __syncthreads();
  for (int k = threadIdx.x; k < keys; k += kThreads) a.hist[blockIdx.x * keys + k] = hist[k];
}

// Exclusive prefix sums of v[0, n) in shared memory, in place (n <= 2 kThreads); returns the total.
// Every thread of the CTA calls it.
__device__ int exclusive_scan(int* v, int n) {
  __shared__ int warp_sums[kWarps];
  __shared__ int total;
  int const t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int const a = 2 * t < n ? v[2 * t] : 0, b = 2 * t + 1 < n ? v[2 * t + 1] : 0;
  int incl = a + b;
  for (int o = 1; o < 32; o <<= 1) {
    int const y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int const w = lane < kWarps ? warp_sums[lane] : 0;
    int wi = w;
    for (int o = 1; o < 32; o <<= 1) {
      int const y = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += y;
    }
    if (lane < kWarps) warp_sums[lane] = wi - w;
    if (lane == 31) total = wi;
  }
  __syncthreads();
  int const before = warp_sums[warp] + incl - (a + b);
  if (2 * t < n) v[2 * t] = before;
  if (2 * t + 1 < n) v[2 * t + 1] = before + a;
  __syncthreads();
  return total;
}

__device__ void scatter(SortArgs const& a) {
  __shared__ int start[kMaxKeys];                // each key's next sorted row for this CTA
  __shared__ int totals[kMaxKeys];               // each key's pairs over all CTAs, then scratch
  __shared__ int warp_keys[kWarps][kMaxKeys];    // a pass's pairs per (warp, key)
  int const keys = a.experts + 1, t = threadIdx.x;
  for (int i = t; i < kWarps * keys; i += kThreads) warp_keys[i / keys][i % keys] = 0;
  for (int k = t; k < keys; k += kThreads) start[k] = totals[k] = 0;
  __syncthreads();
  // The histograms: slices of the CTAs per key, so that a few threads share a key's loads.
  int const blocks = gridDim.x;
  int const slices = max(1, kThreads / keys);
  for (int i = t; i < keys * slices; i += kThreads) {
    int const k = i % keys, s = i / keys;
    int before = 0, after = 0;
#pragma unroll 4
    for (int b = s; b < blocks; b += slices) {
      int const c = a.hist[b * keys + k];
      if (b < int(blockIdx.x)) before += c; else after += c;
    }
    if (before) atomicAdd(&start[k], before);
    if (before + after) atomicAdd(&totals[k], before + after);
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int k = t; k < a.experts; k += kThreads) a.counts[k] = totals[k];
  }
  // totals[k] becomes key k's first row (an exclusive scan over the keys).
  exclusive_scan(totals, keys);
  for (int k = t; k < keys; k += kThreads) start[k] += totals[k];
  if (blockIdx.x == 0) {
    for (int k = t; k < a.experts; k += kThreads) a.offsets[k] = totals[k];
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    // Tile prefix sums: the scratch is totals[] again (its offsets are in start[] already for this
    // CTA; CTA 0 has nothing before it, so start[k] is the offset and totals[k + 1] - totals[k] the
    // count: recomputed from start[]).
    for (int h = 0; h < a.tile_heights; ++h) {
      int const rows = h == 0 ? a.tile_rows[0] : a.tile_rows[1];  // (a constant index: no stack copy)
      for (int k = t; k < a.experts; k += kThreads) totals[k] = (start[k + 1] - start[k] + rows - 1) / rows;
      __syncthreads();
      exclusive_scan(totals, a.experts);
      for (int k = t; k < a.experts; k += kThreads)
        a.tile_ends[h * a.experts + k] = totals[k] + (start[k + 1] - start[k] + rows - 1) / rows;
      __syncthreads();
    }
  }
  int const lane = t & 31, warp = t >> 5;
  unsigned const lower = (1u << lane) - 1u;
  int const begin = blockIdx.x * a.chunk, end = min(begin + a.chunk, a.pairs);
  for (int base = begin; base < end; base += kThreads) {
    int const p = base + t;
    bool const live = p < end;
    int const key = live ? key_of(a, p) : -1;
    unsigned const peers = __match_any_sync(0xffffffffu, key);
    int const rank = __popc(peers & lower);
    if (live && rank == 0) warp_keys[warp][key] = __popc(peers);
    __syncthreads();
    if (live) {
      int row = start[key] + rank;
      for (int w = 0; w < warp; ++w) row += warp_keys[w][key];
      a.order[row] = p;
      a.pos[p] = key < a.experts ? row : -1;
    }
    __syncthreads();
    for (int k = t; k < keys; k += kThreads) {
      int s = 0;
      for (int w = 0; w < kWarps; ++w) {
        s += warp_keys[w][k];
        warp_keys[w][k] = 0;
      }
      start[k] += s;
    }
    __syncthreads();
  }
}

// The row gather: out[r] = x[order[r] / div] for r < rows, 16-byte vectors (`cols` 16-bit
// activations a row, a multiple of 8). A CTA copies `rows_per_cta` rows x `span` vectors of a row
// (grid (ceil(rows / rows_per_cta), ceil(cols / 8 / span))), kGatherUnroll vectors a thread, all
// loaded before any is stored. Why: one row a CTA (4 KB at H = 2048) left a thread one 16-byte
// load in flight, ~16 KB an SM where HBM needs ~35 KB (Little's law at ~1 us), and the gather of
// Qwen3-30B-A3B's 4096 tokens ran at half the copy rate.
constexpr int kGatherUnroll = 4;
struct GatherGrid {
  int span, rows_per_cta;
};
__host__ __device__ constexpr int gather_span(int cols) {
  return cols / 8 < kThreads * kGatherUnroll ? cols / 8 : kThreads * kGatherUnroll;
}
__host__ __device__ constexpr GatherGrid gather_grid(int cols) {
  return {gather_span(cols), kThreads * kGatherUnroll / gather_span(cols)};
}

__device__ void gather_rows(void const* x, int const* order, int div, void* out, int cols, int rows) {
  GatherGrid const g = gather_grid(cols);
  int const vpr = cols / 8;
  uint4 v[kGatherUnroll];
  long long dst[kGatherUnroll];
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u) {
    int const i = u * kThreads + threadIdx.x, c = blockIdx.y * g.span + i % g.span;
    int const r = blockIdx.x * g.rows_per_cta + i / g.span;
    dst[u] = -1;
    if (i < g.rows_per_cta * g.span && r < rows && c < vpr) {
      long long const src = order[r] / div;
      v[u] = *reinterpret_cast<uint4 const*>(static_cast<uint16_t const*>(x) + src * cols + c * 8);
      dst[u] = (long long)r * cols + c * 8;
    }
  }
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u)
    if (dst[u] >= 0) *reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + dst[u]) = v[u];
}

}  // namespace moe_sort
}  // namespace mixed_gemm
