// The row-parallel decode GEMM fused with its all-reduce: a gemv kernel (templates/gemv/) whose
// epilogue publishes this rank's rounded partial tile into slot `rank` of every rank's buffer, and
// whose grid carries one more row of CTAs that sum the slots once every rank's tile has arrived.
// Design: docs/notes/tensor-parallel-allreduce.md ("The all-reduce fused into the GEMM").
//
// Grid (row tiles, splits + 1). Rows 0..splits-1 are the gemv's CTAs (producers): they never
// wait on anything, so they finish whatever else runs. The CTA that writes a tile's outputs (the
// tile's only CTA, or the last K split to arrive) rounds them exactly as the unfused gemv rounds
// y, stages them in shared memory, stores them with 16-byte stores into slot `rank` of every
// rank's buffer (its own included), then, after a CTA barrier, stores the chunk's call number
// into flag [chunk][rank] of every rank with st.release.sys. The last row (reducers, `reducers`
// of them, dispatched after every producer of the grid) waits with ld.acquire.sys until every
// rank's flag of each of its chunks reached the call number, then sums the slots in rank order
// in fp32 from -0.0 and rounds once: the one-shot kernel's arithmetic on the same rounded
// partials, so the result is bit-identical to the gemv followed by the one-shot all-reduce, and
// identical on every rank. Reducers wait only on producers, which wait on nobody: no co-residency
// is assumed (the reducers take fewer CTA slots than one per SM; the host caps them).
//
// Call numbers (CUDA graphs replay the same arguments): per chunk of kArChunk output columns, a
// producer counter and a reducer counter in this rank's buffer, each incremented by the one CTA
// that handles the chunk in a launch, so both count the fused launches whose N covers the chunk:
// the same on every rank, which make the same calls. Chunks, not CTA tiles, so ranks that picked
// different gemv configurations (rows per CTA, splits) still pair up. 64-bit, as the one-shot's.
//
// Parities: chunk c of call number e uses the fused slots of parity e & 1. A rank writes chunk c
// of parity p again (number e + 2) only after its launch of number e + 1 completed, whose reducers
// saw every rank's chunk-c flag of e + 1, so every rank had started e + 1 and finished e (stream
// order). Separate slots from the one-shot's: their parities follow another sequence. The argument
// is per chunk, so a chunk's values must live where no other chunk's ever do: token t's output n
// sits at t * kArFusedRow + n of a slot, never at t * N + n (with N changing between calls, chunks
// of different counts, so different parities, would share places, and an early rank could
// overwrite a place a late rank still reads).
#pragma once

#include "allreduce/allreduce.cuh"

namespace mixed_gemm {

struct GemvAllReduceArgs {
  GemvArgs gemv;              // y: the sum (this rank's partial goes to the slots only)
  void* peers[kArMaxRanks];   // every rank's buffer, by rank
  long long slot_bytes;       // bytes of one slot, >= m * kArFusedRow * sizeof(element)
  int rank;
  int reducers;               // CTAs of the last grid row that reduce (<= gridDim.x)
  unsigned long long timeout_ns;  // a reducer that waits longer traps; 0: wait forever
};

__device__ __forceinline__ ArFlag* ar_chunk_flag(void* base, int chunk, int source) {
  return reinterpret_cast<ArFlag*>(static_cast<char*>(base) + kArChunkFlagsOffset) + chunk * kArMaxRanks + source;
}

// role 0: the producers' counter of `chunk`, 1: the reducers'.
__device__ __forceinline__ ArFlag* ar_chunk_counter(void* base, int role, int chunk) {
  return reinterpret_cast<ArFlag*>(static_cast<char*>(base) + kArChunkCountersOffset) + role * kArMaxChunks + chunk;
}

template <typename V>
__device__ __forceinline__ V* ar_fused_slot(void* base, long long slot_bytes, int parity, int world, int source) {
  return reinterpret_cast<V*>(static_cast<char*>(base) + kArDataOffset +
                              (static_cast<long long>(2 + parity) * world + source) * slot_bytes);
}

// The chunk's next call number, counted in this rank's buffer by the one CTA handling it.
__device__ __forceinline__ ArFlag ar_chunk_next(void* self, int role, int chunk) {
  ArFlag* counter = ar_chunk_counter(self, role, chunk);
  ArFlag const e = *counter + 1;  // the previous launch's store: ordered by the stream
  *counter = e;
  return e;
}

__device__ __forceinline__ void ar_wait_flag(ArFlag const* flag, ArFlag value, unsigned long long timeout_ns, int rank,
                                             int chunk, int source) {
  if (static_cast<long long>(ar_load_acquire_sys(flag) - value) >= 0) return;
  unsigned long long const start = ar_globaltimer();
  while (static_cast<long long>(ar_load_acquire_sys(flag) - value) < 0) {
    if (timeout_ns != 0 && ar_globaltimer() - start > timeout_ns) {
      printf("mixed_gemm gemv all-reduce: rank %d waited more than %llu ns for rank %d's chunk %d (call %llu): a "
             "peer did not make the same call\n", rank, timeout_ns, source, chunk, value);
      __trap();
    }
  }
}

template <typename K, int W, int kTokens>
struct GemvAllReduce {
  using raw = typename K::raw;
  static constexpr int kRows = K::kRows, kThreads = K::kThreads;
  static constexpr int kVec = kArVectorBytes / sizeof(raw);
  static constexpr int kTileChunks = kRows / kArChunk;
  static constexpr int kBatch = 32;  // chunks a reducer waits for at once
  static_assert(kRows % kArChunk == 0, "a CTA's rows are whole chunks");
  static_assert(kArChunk % kVec == 0, "a chunk's row is whole 16-byte vectors");

  // The producing CTA (all its threads): `tile` holds this rank's rounded partial, kTokens rows of
  // kRows outputs starting at output row0; its chunks go to every rank, then their flags.
  static __device__ void publish(GemvAllReduceArgs const& a, raw const* tile, int row0) {
    GemvArgs const& p = a.gemv;
    __shared__ ArFlag epochs[kTileChunks];
    void* self = ar_peer<W>(a, a.rank);
    int const cols = min(row0 + kRows, p.n) - row0;  // N % kVec == 0 (the host's rule)
    int const c0 = row0 / kArChunk, chunks = (cols + kArChunk - 1) / kArChunk;
    if (threadIdx.x < chunks) epochs[threadIdx.x] = ar_chunk_next(self, 0, c0 + threadIdx.x);
    __syncthreads();  // the staged tile and the call numbers
    int const per_row = cols / kVec;
    for (int i = threadIdx.x; i < p.m * per_row; i += kThreads) {
      int const token = i / per_row, v = i % per_row;
      uint4 const value = *reinterpret_cast<uint4 const*>(tile + token * kRows + v * kVec);
      int const parity = static_cast<int>(epochs[v * kVec / kArChunk] & 1);
      long long const at = (static_cast<long long>(token) * kArFusedRow + row0) / kVec + v;  // in vectors
#pragma unroll
      for (int s = 0; s < W; ++s) ar_fused_slot<uint4>(a.peers[s], a.slot_bytes, parity, W, a.rank)[at] = value;
    }
    // The CTA barrier orders every thread's stores before the flags (release is cumulative
    // through bar.sync), as in the one-shot's barrier.
    __syncthreads();
    for (int i = threadIdx.x; i < chunks * W; i += kThreads) {
      int const c = i / W, s = i % W;
      ar_store_release_sys(ar_chunk_flag(ar_peer<W>(a, s), c0 + c, a.rank), epochs[c]);
    }
  }

  // The gemv epilogue (gemv.cuh's GemvEpilogue::run) with the outputs going to `tile` instead of y.
  template <typename Outputs>
  static __device__ void epilogue(GemvAllReduceArgs const& a, char* smem, float (&acc)[K::kAcc], int wn, int wk,
                                  int lane, Outputs const& outputs) {
    GemvArgs const& p = a.gemv;
    GemvEpilogue<raw, K::kAcc, K::kWN, K::kWK, kRows, kThreads>::reduce(smem, acc, wn, wk, lane);
    __shared__ __align__(16) raw tile[kTokens * kRows];
    raw const* bias = static_cast<raw const*>(p.bias);
    raw const* residual = static_cast<raw const*>(p.residual);
    int const row0 = blockIdx.x * kRows;
    auto stage = [&](int n, int token, float v) {
      size_t const at = (size_t)token * p.n + n;
      if (bias != nullptr) v += static_cast<float>(bias[n]);
      if (residual != nullptr) v += static_cast<float>(residual[at]);
      tile[token * kRows + (n - row0)] = raw(v);  // gemv's rounding of y
    };
    if (p.splits == 1) {
      if (wk == 0) outputs(stage);
      publish(a, tile, row0);
      return;
    }
    // Split K: the same planes, arrival counter and slice-order sum as GemvEpilogue::run.
    if (wk == 0) {
      float* plane = p.workspace + (size_t)blockIdx.y * p.m * p.n;
      outputs([&](int n, int token, float v) { __stcg(plane + (size_t)token * p.n + n, v); });
    }
    __threadfence();
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
      int* counter = p.counters + blockIdx.x;
      last = atomicAdd(counter, 1) == p.splits - 1;
      if (last) *counter = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    size_t const plane = (size_t)p.m * p.n;
    for (int i = threadIdx.x; i < p.m * kRows; i += kThreads) {
      int const token = i / kRows, n = row0 + i % kRows;
      if (n >= p.n) continue;
      float const* src = p.workspace + (size_t)token * p.n + n;
      float v = __ldcg(src);
      for (int sl = 1; sl < p.splits; ++sl) v += __ldcg(src + sl * plane);
      stage(n, token, v);
    }
    publish(a, tile, row0);
  }

  // A CTA of the last grid row: chunks blockIdx.x, + reducers, ... of y, kBatch at a time.
  static __device__ void reduce(GemvAllReduceArgs const& a) {
    GemvArgs const& p = a.gemv;
    if (static_cast<int>(blockIdx.x) >= a.reducers) return;
    void* self = ar_peer<W>(a, a.rank);
    __shared__ ArFlag epochs[kBatch];
    int const chunks = (p.n + kArChunk - 1) / kArChunk, stride = a.reducers;
    constexpr int kChunkVecs = kArChunk / kVec;
    uint4* y = static_cast<uint4*>(p.y);
    for (int first = blockIdx.x; first < chunks; first += stride * kBatch) {
      int const count = min(kBatch, (chunks - first + stride - 1) / stride);
      if (threadIdx.x < count) epochs[threadIdx.x] = ar_chunk_next(self, 1, first + threadIdx.x * stride);
      __syncthreads();
      for (int i = threadIdx.x; i < count * W; i += kThreads) {
        int const c = i / W, s = i % W, chunk = first + c * stride;
        ar_wait_flag(ar_chunk_flag(self, chunk, s), epochs[c], a.timeout_ns, a.rank, chunk, s);
      }
      __syncthreads();  // the acquires above order every rank's stores before the reads below
      for (int i = threadIdx.x; i < count * p.m * kChunkVecs; i += kThreads) {
        int const c = i / (p.m * kChunkVecs), r = i % (p.m * kChunkVecs);
        int const token = r / kChunkVecs, col = (first + c * stride) * kArChunk + (r % kChunkVecs) * kVec;
        if (col >= p.n) continue;
        int const parity = static_cast<int>(epochs[c] & 1);
        long long const at = (static_cast<long long>(token) * kArFusedRow + col) / kVec;
        ArVector<raw> sum;
        sum.clear();
#pragma unroll
        for (int s = 0; s < W; ++s) sum.add(ar_load_slot(ar_fused_slot<uint4>(self, a.slot_bytes, parity, W, s) + at));
        y[(static_cast<long long>(token) * p.n + col) / kVec] = sum.rounded();
      }
      __syncthreads();  // epochs[] is rewritten by the next batch
    }
  }

  // gemv.cuh's gemv_run with the fused epilogue; the last grid row reduces.
  static __device__ void run(GemvAllReduceArgs const& a, char* smem) {
    if (blockIdx.y == gridDim.y - 1) {
      reduce(a);
      return;
    }
    GemvArgs const& p = a.gemv;
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
    epilogue(a, smem, flat, wn, wk, lane, [&](auto&& f) { K::for_each_output(p, strip0, lane, acc, f); });
  }
};

}  // namespace mixed_gemm
