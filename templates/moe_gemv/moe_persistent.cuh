// Persistent mode of the grouped decode kernels (MoeGemvConfig.persistent, schedules
// "..._m<kTokens>_pe"; docs/notes/moe.md). Expert mode (MoeGemvExpert) gives a CTA one chunk of
// kTokens pairs of one expert: the expert's weight is streamed once per chunk, every CTA rescans
// the routing, and the grid is sized for the most chunks any expert could hold, so most CTAs exit
// after their scan. Here a work item is (touched expert, row tile, K slice) and its CTA serves ALL
// of that expert's pairs, kTokens rows per pass over the item's weight slice (a second pass, for an
// expert with more than kTokens pairs, re-reads the slice the same CTA just read: L2, not HBM), so
// HBM carries each touched expert's bytes once per layer whatever the token count:
//
//   1. Routing, in every CTA, from shapes alone (no host read, capturable): a counting sort of the
//      T * top_k pairs by expert in shared memory (counts by shared atomics, one block scan that
//      also numbers the touched experts in expert order, then a scatter). Pairs whose id lies
//      outside [0, E) (-1: expert parallelism) go to an extra bucket E. The order inside a bucket is
//      whatever the atomics give, and differs between CTAs: no output depends on it (a pair's row of
//      an mma tile is computed the same way in any column; split-K and top-k planes are summed in
//      slice and slot order), and no work is split across CTAs by a position in a bucket (4.).
//   2. Items: (touched expert a, row tile, K slice) for a < the touched count, walked grid-stride
//      by a grid the host sizes to the resident CTAs (SMs x occupancy, no more than the items the
//      routing could make): idle experts cost nothing but their (empty) bucket.
//   3. Per item, per chunk of kTokens of the expert's pairs: expert mode's main loop (the weight as
//      the mma A operand straight from the sm90a atoms, the chunk's rows of x gathered into each
//      warp's staged slice), the CTA's cross-warp K reduction, then the epilogue:
//      - gate|up: h[p] = silu(gate) * up (one slice), or fp32 gate and up planes per (pair, slice);
//        each pair arrives at its (pair, row tile) counter and the last of its slices adds the
//        planes in slice order, applies silu * up, writes h and resets the counter;
//      - down: each pair's fp32 partial times its fp32 top-k weight to a plane per (pair, slice);
//        each pair arrives at its (token, row tile) counter, which expects popc(valid slots) *
//        slices arrivals; the last adds the token's planes in slot order, then slice order, writes
//        y and resets the counter. top_k == 1 with one slice writes y directly.
//   4. When bucket E is not empty: gate|up writes the h rows of the pairs outside [0, E) as zeros;
//      down writes a zero y row for a token none of whose slots is valid (nobody else writes it).
//      Both walk pair / token indices grid-stride and test the ids again (L2 hits): a stride over
//      bucket E's list would hand some pairs to two CTAs and others to none, as each CTA's list has
//      its own order. Deterministic throughout.
//
// Shared memory is dynamic: expert mode's (reduction, staged slices) plus the chunk's rows, then
// the routing (route_bytes(E, pairs) in kernels/moe_gemv/config.py mirrors RouteWords).
#pragma once

#include "moe_gemv/moe_gemv.cuh"

namespace mixed_gemm {

// The routing sorted in shared memory (module comment, 1).
struct MoePersistentRoute {
  int* offsets;  // bucket b's pairs: list[offsets[b], offsets[b + 1]); bucket E: ids outside [0, E)
  int* cursor;
  int* active;   // touched experts, in expert order
  int* scratch;  // [0, 16): warps' pair counts, [16, 32): touched counts; then the touched count
  int* list;
};

// kFreshX: x (h, for the down stage) is written during the same launch (moe_fused.cuh).
template <typename Element, int kBits, MoeStage kStage, int kStrips, int kWarpsN, int kWarpsK, int kUnroll, int kTokens,
          bool kFreshX = false>
struct MoeGemvPersistent {
  using X = MoeGemvExpert<Element, kBits, kStage, kStrips, kWarpsN, kWarpsK, kUnroll, kTokens, kFreshX>;
  using PairMode = typename X::PairMode;
  using G = typename X::G;
  using raw = typename X::raw;
  using Acc = typename X::Acc;
  using Epilogue = typename X::Epilogue;
  static constexpr bool kGated = X::kGated;
  static constexpr int kAcc = X::kAcc;
  static constexpr int kThreads = X::kThreads;
  static constexpr int kWarps = X::kWarps;
  static constexpr int kRows = X::kRows;
  static constexpr int kMaxWarps = 16;  // the routing scan's per-warp partials (512 threads)
  static_assert(kWarps <= kMaxWarps, "at most 512 threads");
  // Shared memory before the routing: the reduction, each warp's staged x slice, then the chunk's
  // rows: src (x row, -1 for padding), pair, last (arrival result), valid-slot mask.
  static constexpr int kChunkBytes = 4 * 4 * kTokens;
  static constexpr int kSmemBytes = G::kReduceBytes + X::kXBytes + kChunkBytes;
  static_assert(kSmemBytes % 16 == 0, "the routing area is 16-byte aligned");
  // Routing words: offsets[E + 2], cursor[E + 1], active[E], scratch[2 kMaxWarps + 2], list[pairs].
  static __host__ __device__ constexpr int route_words(int experts, int pairs) {
    return (experts + 2) + (experts + 1) + experts + (2 * kMaxWarps + 2) + pairs;
  }

  using Route = MoePersistentRoute;  // shared by both stages of the one-launch mode (moe_fused.cuh)

  struct Chunk {
    int* src;
    int* pair;
    int* last;
    unsigned* mask;
  };

  static __device__ __forceinline__ int bucket(MoeGemvArgs const& a, int p) {
    int const e = PairMode::expert_of(a, p);
    return e < 0 ? a.experts : e;
  }

  // f(p, bucket of p) for this thread's pairs p = threadIdx.x + i kThreads. The ids are loaded
  // kRouteBatch at a time before any is used: one L2 round trip per batch instead of one per pair
  // (every CTA routes before its first weight load, so this latency delays the whole kernel).
  static constexpr int kRouteBatch = 4;
  template <typename F>
  static __device__ __forceinline__ void for_each_bucket(MoeGemvArgs const& a, int pairs, F const& f) {
#pragma unroll 1
    for (int p0 = threadIdx.x; p0 < pairs; p0 += kRouteBatch * kThreads) {
      int b[kRouteBatch];
#pragma unroll
      for (int i = 0; i < kRouteBatch; ++i) {
        int const p = p0 + i * kThreads;
        b[i] = p < pairs ? bucket(a, p) : -1;
      }
#pragma unroll
      for (int i = 0; i < kRouteBatch; ++i)
        if (b[i] >= 0) f(p0 + i * kThreads, b[i]);
    }
  }

  // The counting sort (module comment, 1). Returns the touched experts' count; every thread sees
  // the whole routing afterwards.
  static __device__ int route(MoeGemvArgs const& a, char* area, Route& r) {
    int const experts = a.experts, pairs = a.tokens * a.top_k;
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int* base = reinterpret_cast<int*>(area);
    r.offsets = base;
    r.cursor = r.offsets + experts + 2;
    r.active = r.cursor + experts + 1;
    r.scratch = r.active + experts;
    r.list = r.scratch + 2 * kMaxWarps + 2;
    for (int b = threadIdx.x; b <= experts; b += kThreads) r.cursor[b] = 0;
    __syncthreads();
    for_each_bucket(a, pairs, [&](int p, int b) { atomicAdd(r.cursor + b, 1); });
    __syncthreads();
    // Exclusive prefix of the counts over buckets 0..E and of "touched" over experts 0..E-1: each
    // thread a run of consecutive buckets, warp scans, the warps' totals in warp order.
    int const per = (experts + 1 + kThreads - 1) / kThreads;
    int const b0 = min((int)threadIdx.x * per, experts + 1), b1 = min(b0 + per, experts + 1);
    int count = 0, touched = 0;
    for (int b = b0; b < b1; ++b) {
      int const c = r.cursor[b];
      count += c;
      touched += b < experts && c > 0;
    }
    int ic = count, it = touched;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      int const c = __shfl_up_sync(0xffffffffu, ic, d), t = __shfl_up_sync(0xffffffffu, it, d);
      if (lane >= d) {
        ic += c;
        it += t;
      }
    }
    if (lane == 31) {
      r.scratch[warp] = ic;
      r.scratch[kMaxWarps + warp] = it;
    }
    __syncthreads();
    int c0 = ic - count, t0 = it - touched;
    for (int w = 0; w < warp; ++w) {
      c0 += r.scratch[w];
      t0 += r.scratch[kMaxWarps + w];
    }
    for (int b = b0; b < b1; ++b) {
      int const c = r.cursor[b];
      r.offsets[b] = c0;
      if (b < experts && c > 0) r.active[t0++] = b;
      c0 += c;
    }
    if (b0 < b1 && b1 == experts + 1) {  // the thread of the last bucket
      r.offsets[experts + 1] = c0;
      r.scratch[2 * kMaxWarps] = t0;
    }
    __syncthreads();
    for (int b = threadIdx.x; b <= experts; b += kThreads) r.cursor[b] = r.offsets[b];
    __syncthreads();
    for_each_bucket(a, pairs, [&](int p, int b) { r.list[atomicAdd(r.cursor + b, 1)] = p; });
    __syncthreads();
    return r.scratch[2 * kMaxWarps];
  }

  static __device__ __forceinline__ Chunk chunk_area(char* smem) {
    int* base = reinterpret_cast<int*>(smem + G::kReduceBytes + X::kXBytes);
    return {base, base + kTokens, base + 2 * kTokens, reinterpret_cast<unsigned*>(base + 3 * kTokens)};
  }

  // The chunk's rows [c0, c0 + kTokens) of bucket list `rows` (n of them): returns n.
  static __device__ __forceinline__ int load_chunk(MoeGemvArgs const& a, int const* rows, int count, int c0,
                                                   Chunk const& ch) {
    int const n = min(kTokens, count - c0);
    __syncthreads();  // the previous chunk's readers of the chunk rows and the reduction buffer are done
    if (threadIdx.x < kTokens) {
      int const pair = (int)threadIdx.x < n ? rows[c0 + threadIdx.x] : -1;
      ch.pair[threadIdx.x] = pair;
      ch.src[threadIdx.x] = pair < 0 ? -1 : (kGated ? pair / a.top_k : pair);
    }
    __syncthreads();
    return n;
  }

  // One chunk's main loop over K atoms [kbeg, kend) and the CTA's reduction: afterwards warps
  // wk == 0 hold the sums.
  static __device__ __forceinline__ void sums(GemvArgs const& p, char* smem, int strip0, int gap, int kbeg, int kend,
                                              Chunk const& ch, Acc& acc) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    float (&flat)[kAcc] = reinterpret_cast<float(&)[kAcc]>(acc);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) flat[i] = 0.f;
    char* xs = smem + G::kReduceBytes + warp * X::XS::kBytes;
    gemv_mainloop<X>(p, strip0, kbeg, kend, wk, xs, acc, gap, static_cast<int const*>(ch.src));
    Epilogue::reduce(smem, flat, wn, wk, lane);
  }

  // Valid top-k slots of token t as a bit mask (top_k <= 32: the family's rule).
  static __device__ __forceinline__ unsigned valid_slots(MoeGemvArgs const& a, int t) {
    unsigned m = 0;
    for (int j = 0; j < a.top_k; ++j) m |= unsigned(PairMode::expert_of(a, t * a.top_k + j) >= 0) << j;
    return m;
  }

  // Pairs outside [0, E): h rows of zeros, by pair index (module comment, 4). The one-launch mode
  // skips it: its h never leaves the launch, and no down item reads a dropped pair's row.
  static __device__ void zero_dropped_pairs(MoeGemvArgs const& a, Route const& r) {
    if (r.offsets[a.experts + 1] == r.offsets[a.experts]) return;
    raw* const h = static_cast<raw*>(a.y);
    int const inter = a.n / 2;
    for (int p = blockIdx.x; p < a.tokens * a.top_k; p += gridDim.x) {
      if (PairMode::expert_of(a, p) >= 0) continue;  // uniform across the CTA
      raw* row = h + (size_t)p * inter;
      for (int c = threadIdx.x; c < inter; c += kThreads) row[c] = raw(0.f);
    }
  }

  // A token none of whose slots is valid gets a zero y row, by token index (module comment, 4).
  static __device__ void zero_empty_tokens(MoeGemvArgs const& a, Route const& r) {
    if (r.offsets[a.experts + 1] == r.offsets[a.experts]) return;
    raw* const y = static_cast<raw*>(a.y);
    for (int t = blockIdx.x; t < a.tokens; t += gridDim.x) {
      if (valid_slots(a, t) != 0u) continue;  // uniform across the CTA
      for (int c = threadIdx.x; c < a.n; c += kThreads) y[(size_t)t * a.n + c] = raw(0.f);
    }
  }

  // Work items of one touched expert: row tiles x K slices.
  static __device__ __forceinline__ int items_per_expert(MoeGemvArgs const& a) {
    int const outputs = kGated ? a.n / 2 : a.n;
    return (outputs + kRows - 1) / kRows * a.splits;
  }

  // gate|up item `item` (touched expert item / items_per_expert, then row tile, then K slice).
  static __device__ void gate_up_item(MoeGemvArgs const& a, char* smem, Route const& r, int item) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const inter = a.n / 2, row_tiles = (inter + kRows - 1) / kRows, splits = a.splits;
    Chunk const ch = chunk_area(smem);
    raw* const h = static_cast<raw*>(a.y);
    int const per_expert = row_tiles * splits;
    int const e = r.active[item / per_expert], rest = item % per_expert;
    int const tile = rest / splits, split = rest % splits;
    int const strip0 = (tile * kWarpsN + wn) * kStrips, row0 = tile * kRows;
    int const kbeg = split * a.chunk, kend = min(kbeg + a.chunk, a.katoms);
    GemvArgs const p = PairMode::expert_args(a, e, static_cast<raw const*>(a.x));
    GateUpRuns const runs = gate_up_runs<kStrips>(a.gate_up, strip0, inter);
    int const* rows = r.list + r.offsets[e];
    int const count = r.offsets[e + 1] - r.offsets[e];
#pragma unroll 1
    for (int c0 = 0; c0 < count; c0 += kTokens) {
      int const n = load_chunk(a, rows, count, c0, ch);
      Acc acc;
      sums(p, smem, runs.strip0, runs.gap, kbeg, kend, ch, acc);
      if (splits == 1) {
        if (wk == 0)
          X::for_each_output(a.gate_up, strip0, lane, inter, n, acc, [&](int i, int row, float gate, float up) {
            h[(size_t)ch.pair[row] * inter + i] = raw(silu_mul(gate, up));
          });
        continue;
      }
      if (wk == 0)
        X::for_each_output(a.gate_up, strip0, lane, inter, n, acc, [&](int i, int row, float gate, float up) {
          float* plane = a.workspace + ((size_t)ch.pair[row] * splits + split) * a.n;
          __stcg(plane + i, gate);
          __stcg(plane + inter + i, up);
        });
      __threadfence();  // the planes are visible GPU-wide before the arrivals that announce them
      __syncthreads();
      if ((int)threadIdx.x < n) {  // one arrival per pair at its (pair, row tile)
        int* counter = a.counters + (size_t)ch.pair[threadIdx.x] * row_tiles + tile;
        int const last = atomicAdd(counter, 1) == splits - 1;
        if (last) *counter = 0;  // every slice has arrived: nobody else touches it in this launch
        ch.last[threadIdx.x] = last;
      }
      __syncthreads();
      __threadfence();  // acquire side: the other slices' planes are not stale
      for (int idx = threadIdx.x; idx < n * kRows; idx += kThreads) {
        int const row = idx / kRows, i = row0 + idx % kRows;
        if (!ch.last[row] || i >= inter) continue;
        int const pair = ch.pair[row];
        float const* planes = a.workspace + (size_t)pair * splits * a.n;
        float gate = __ldcg(planes + i), up = __ldcg(planes + inter + i);
        for (int sl = 1; sl < splits; ++sl) {
          gate += __ldcg(planes + (size_t)sl * a.n + i);
          up += __ldcg(planes + (size_t)sl * a.n + inter + i);
        }
        h[(size_t)pair * inter + i] = raw(silu_mul(gate, up));
      }
    }
  }

  // down item `item` (touched expert item / items_per_expert, then row tile, then K slice).
  static __device__ void down_item(MoeGemvArgs const& a, char* smem, Route const& r, int item) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const hidden = a.n, row_tiles = (hidden + kRows - 1) / kRows, splits = a.splits, top_k = a.top_k;
    Chunk const ch = chunk_area(smem);
    raw* const y = static_cast<raw*>(a.y);
    bool const direct = top_k == 1 && splits == 1;  // pair p is token p and one slice writes it
    int const per_expert = row_tiles * splits;
    int const e = r.active[item / per_expert], rest = item % per_expert;
    int const tile = rest / splits, split = rest % splits;
    int const strip0 = (tile * kWarpsN + wn) * kStrips, row0 = tile * kRows;
    int const kbeg = split * a.chunk, kend = min(kbeg + a.chunk, a.katoms);
    GemvArgs const p = PairMode::expert_args(a, e, static_cast<raw const*>(a.x));
    int const* rows = r.list + r.offsets[e];
    int const count = r.offsets[e + 1] - r.offsets[e];
#pragma unroll 1
    for (int c0 = 0; c0 < count; c0 += kTokens) {
      int const n = load_chunk(a, rows, count, c0, ch);
      Acc acc;
      sums(p, smem, strip0, 0, kbeg, kend, ch, acc);
      if (direct) {
        if (wk == 0)
          X::for_each_output(0, strip0, lane, hidden, n, acc, [&](int col, int row, float v) {
            int const pair = ch.pair[row];
            y[(size_t)pair * hidden + col] = raw(topk_weight(a, pair) * v);
          });
        continue;
      }
      if (wk == 0)
        X::for_each_output(0, strip0, lane, hidden, n, acc, [&](int col, int row, float v) {
          int const pair = ch.pair[row];
          __stcg(a.workspace + ((size_t)pair * splits + split) * hidden + col, topk_weight(a, pair) * v);
        });
      __threadfence();  // the planes are visible GPU-wide before the arrivals that announce them
      __syncthreads();
      if ((int)threadIdx.x < n) {  // one arrival per pair at its (token, row tile)
        int const t = ch.pair[threadIdx.x] / top_k;
        unsigned const mask = valid_slots(a, t);
        int* counter = a.counters + (size_t)t * row_tiles + tile;
        int const last = atomicAdd(counter, 1) == __popc(mask) * splits - 1;
        if (last) *counter = 0;  // all of the token's planes have arrived: nobody else touches it
        ch.last[threadIdx.x] = last;
        ch.mask[threadIdx.x] = mask;
      }
      __syncthreads();
      __threadfence();  // acquire side: the other CTAs' planes are not stale
      for (int idx = threadIdx.x; idx < n * kRows; idx += kThreads) {
        int const row = idx / kRows, col = row0 + idx % kRows;
        if (!ch.last[row] || col >= hidden) continue;
        int const t = ch.pair[row] / top_k;
        unsigned const mask = ch.mask[row];
        float v = 0.f;  // slot order, then slice order: (t k + j) splits + slice
        for (int j = 0; j < top_k; ++j) {
          if (!((mask >> j) & 1u)) continue;
          float const* src = a.workspace + ((size_t)(t * top_k + j) * splits) * hidden + col;
          for (int sl = 0; sl < splits; ++sl) v += __ldcg(src + (size_t)sl * hidden);
        }
        y[(size_t)t * hidden + col] = raw(v);
      }
    }
  }

  // Before griddepcontrol.wait (moe_pdl.cuh): the weight slices of this CTA's down items into L2
  // (the items' slices partition the touched experts' weights: each byte is prefetched once).
  static __device__ void prefetch_items(MoeGemvArgs const& a, Route const& r, int items) {
    int const row_tiles = (a.n + kRows - 1) / kRows, per_expert = row_tiles * a.splits;
#pragma unroll 1
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      int const e = r.active[item / per_expert], rest = item % per_expert;
      int const tile = rest / a.splits, split = rest % a.splits;
      int const kbeg = split * a.chunk;
      PairMode::prefetch_weight(a, e, tile * kWarpsN * kStrips, kWarpsN * kStrips, kbeg, min(kbeg + a.chunk, a.katoms));
    }
  }

  // One projection per launch: route, the rows nobody else writes, then the items grid-stride.
  static __device__ void run(MoeGemvArgs const& a, char* smem) {
    if constexpr (kGated) pdl_launch_dependents();  // the down kernel may launch now (moe_pdl.cuh: why at the start)
    Route r;
    int const touched = route(a, smem + kSmemBytes, r);  // ids and shared memory only: before the wait too
    if constexpr (kGated) {
      zero_dropped_pairs(a, r);
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (a.pdl) prefetch_items(a, r, touched * items_per_expert(a));
      pdl_wait();  // h, the planes and counters (the stream's, gate|up's too) and y: after the gate|up grid
#endif
      zero_empty_tokens(a, r);
    }
    int const items = touched * items_per_expert(a);
#pragma unroll 1
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      if constexpr (kGated) {
        gate_up_item(a, smem, r, item);
      } else {
        down_item(a, smem, r, item);
      }
    }
  }
};

}  // namespace mixed_gemm
