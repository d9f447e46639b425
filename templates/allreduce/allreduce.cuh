// Small-message all-reduce (sum) over the GPUs of one node, through peer-mapped buffers
// (torch.distributed._symmetric_memory) and plain NVLink/PCIe P2P loads and stores: no NVLink
// multicast, no multimem instructions. Design and measurements: docs/notes/tensor-parallel-allreduce.md.
//
// Every rank owns one buffer, mapped into every peer's address space:
//
//   [kArFlagsOffset]    flags[block][source rank]  u64, written by the peers (and itself)
//   [kArCountersOffset] counters[block]            u64, this rank's call counter per block
//   [kArChunkFlagsOffset], [kArChunkCountersOffset]: the same for the GEMM-fused all-reduce, per
//                       chunk of output columns (allreduce/gemv_allreduce.cuh)
//   [kArDataOffset]     slots[parity][source rank] slot_bytes each: what source rank pushed here
//   then                the GEMM-fused all-reduce's slots[parity][source rank], slot_bytes each,
//                       token t's output n at t * kArFusedRow + n whatever N (gemv_allreduce.cuh)
//
// A call pushes this rank's values into the peers' slots (remote stores travel one way; the
// reads that follow are local), then meets the peers at a per-block barrier, then reduces from
// its own slots. Barrier: each block stores a value into its flag of every peer with
// st.release.sys (after __syncthreads, so the whole block's pushes are ordered before it) and
// spins with ld.acquire.sys until every peer's flag for this block reached the same value.
//
// Why per-call counters on the device: a CUDA graph replays the same kernel arguments, so the
// value a call signals cannot come from the host. Every launch runs kArMaxBlocks blocks (blocks
// past the work only count the call and leave), so all counters of a rank stay equal, and equal
// across ranks, which make the same calls in the same order (a collective). Call e signals 2e
// (and 2e + 1 for a second barrier); flags only grow, and a wait passes once the flag reached the
// value, so a peer that is already one call ahead never stalls a slower rank. Flags and counters
// are 64-bit: a block past the work of many calls in a row (block 63 while only small messages
// come) leaves its flags that many calls behind, and with 32 bits a flag 2^31 behind would read
// as ahead after 2^30 such calls (days of decode) and let a later wait pass early.
//
// Why two parities: call e writes the slots of parity e & 1. A rank can start call e + 2 (and
// overwrite parity e & 1 in a peer) only after its call e + 1 passed a barrier, which every rank
// reaches only after finishing call e (kernels on one stream run in order): nobody still reads
// them. Call e + 1 reads the other parity. So one barrier per call suffices, none at the end.
//
// Sums are taken in fp32 over the ranks in rank order (rank 0 first) and rounded once, on every
// rank alike: all ranks hold bit-identical results (replicated layers stay in lockstep), and for
// two ranks the result is the correctly rounded a + b, what NCCL returns (fp32 carries 24 bits,
// >= 2p + 2 for fp16's and bf16's p, so rounding to fp32 first never changes the final rounding).
// Sums start from -0.0, the identity of IEEE addition: -0 + -0 stays -0, as in NCCL.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>

namespace mixed_gemm {

constexpr int kArMaxRanks = 8;           // flags per block: one per source rank
constexpr int kArMaxBlocks = 64;         // the grid of every launch
constexpr int kArFlagsOffset = 0;
constexpr int kArCountersOffset = kArMaxBlocks * kArMaxRanks * 8;   // 4096
// The GEMM-fused all-reduce (allreduce/gemv_allreduce.cuh) keeps its own flags and counters per
// chunk of kArChunk output columns, and its own two parities of slots after the ones above.
constexpr int kArChunk = 16;             // output columns per arrival flag: divides every gemv CTA's rows
constexpr int kArMaxChunks = 1024;       // N <= 16384
constexpr int kArFusedRow = kArMaxChunks * kArChunk;  // a token's row in a fused slot, for every N
constexpr int kArChunkFlagsOffset = 8192;                                                   // [chunk][source]
constexpr int kArChunkCountersOffset = kArChunkFlagsOffset + kArMaxChunks * kArMaxRanks * 8;  // [2][chunk]
constexpr int kArDataOffset = kArChunkCountersOffset + 2 * kArMaxChunks * 8;  // 90112: slots, 16-byte aligned
constexpr int kArVectorBytes = 16;       // every load and store of values moves 16 bytes

struct AllReduceArgs {
  void* peers[kArMaxRanks];   // every rank's buffer, by rank (peers[rank]: this rank's own)
  void const* in;             // this rank's values, numel (rows x cols) contiguous, 16-byte aligned
  void* out;                  // the sum, same shape; may be `in` (each element is read before written)
  void const* residual;       // rms_norm only: (rows, cols)
  void* residual_out;         // rms_norm only: residual + sum (may be `residual`)
  void const* weight;         // rms_norm only: (cols,)
  long long numel;
  long long slot_bytes;       // bytes of one slot, a multiple of 16, >= numel * sizeof(T)
  int rows, cols;             // rms_norm only
  int rank;
  int active_blocks;          // blocks with work (the host's choice from the size; <= kArMaxBlocks)
  float eps;                  // rms_norm only
  unsigned long long timeout_ns;  // a barrier that waits longer traps (a peer never came); 0: wait forever
};

template <typename T> struct ArElement;
template <> struct ArElement<__half> {
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <> struct ArElement<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <> struct ArElement<float> {
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};

// ---- memory operations -------------------------------------------------------------------------
typedef unsigned long long ArFlag;

__device__ __forceinline__ void ar_store_release_sys(ArFlag* p, ArFlag v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ ArFlag ar_load_acquire_sys(ArFlag const* p) {
  ArFlag v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long ar_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Peers' pushes land in this rank's slots: read them past L1 (the acquire orders them; .cg keeps
// the load from ever meeting a line cached before the barrier).
__device__ __forceinline__ uint4 ar_load_slot(uint4 const* p) { return __ldcg(p); }

// ---- the buffer --------------------------------------------------------------------------------
// peers[index] through a chain of selects: indexing the parameter array with a run-time value
// would copy the whole argument block to local memory first.
template <int W, typename Args>
__device__ __forceinline__ void* ar_peer(Args const& a, int index) {
  void* p = a.peers[0];
#pragma unroll
  for (int s = 1; s < W; ++s) {
    if (index == s) p = a.peers[s];
  }
  return p;
}

__device__ __forceinline__ ArFlag* ar_flag(void* base, int block, int source) {
  return reinterpret_cast<ArFlag*>(static_cast<char*>(base) + kArFlagsOffset) + block * kArMaxRanks + source;
}

__device__ __forceinline__ ArFlag* ar_counter(void* base, int block) {
  return reinterpret_cast<ArFlag*>(static_cast<char*>(base) + kArCountersOffset) + block;
}

template <typename V>
__device__ __forceinline__ V* ar_slot(void* base, long long slot_bytes, int parity, int world, int source) {
  return reinterpret_cast<V*>(static_cast<char*>(base) + kArDataOffset +
                              (static_cast<long long>(parity) * world + source) * slot_bytes);
}

// This call's number, counted per block in this rank's buffer (see the top of the file).
__device__ __forceinline__ ArFlag ar_next_call(void* self) {
  __shared__ ArFlag epoch;
  if (threadIdx.x == 0) {
    ArFlag* counter = ar_counter(self, blockIdx.x);
    epoch = *counter + 1;  // the previous launch's store: ordered by the stream
    *counter = epoch;
  }
  __syncthreads();
  return epoch;
}

// Block-wise barrier with every peer's block of the same index. Orders this block's earlier
// stores (pushes into peers' slots) before any peer's later loads, and the peers' alike.
template <int W>
__device__ __forceinline__ void ar_barrier(AllReduceArgs const& a, void* self, ArFlag value) {
  __syncthreads();
  int const t = threadIdx.x;
  if (t < W) {
    ar_store_release_sys(ar_flag(ar_peer<W>(a, t), blockIdx.x, a.rank), value);
    ArFlag const* mine = ar_flag(self, blockIdx.x, t);
    if (static_cast<long long>(ar_load_acquire_sys(mine) - value) < 0) {
      unsigned long long const start = ar_globaltimer();
      while (static_cast<long long>(ar_load_acquire_sys(mine) - value) < 0) {
        if (a.timeout_ns != 0 && ar_globaltimer() - start > a.timeout_ns) {
          printf("mixed_gemm all-reduce: rank %d, block %d waited more than %llu ns for rank %d (value %llu): a peer "
                 "did not make the same all-reduce call\n", a.rank, blockIdx.x, a.timeout_ns, t, value);
          __trap();
        }
      }
    }
  }
  __syncthreads();
}

template <typename T>
struct ArVector {
  static constexpr int kElements = kArVectorBytes / sizeof(T);
  float v[kElements];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int j = 0; j < kElements; ++j) v[j] = -0.f;  // -0 + x == x for every x, -0 included
  }
  __device__ __forceinline__ void add(uint4 const& raw) {
    T const* e = reinterpret_cast<T const*>(&raw);
#pragma unroll
    for (int j = 0; j < kElements; ++j) v[j] += ArElement<T>::load(e[j]);
  }
  __device__ __forceinline__ uint4 rounded() const {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kElements; ++j) e[j] = ArElement<T>::store(v[j]);
    return raw;
  }
};

// [begin, end) of `count` items split into `parts` contiguous pieces, piece `index`.
__device__ __forceinline__ void ar_piece(long long count, int parts, int index, long long& begin, long long& end) {
  long long const per = (count + parts - 1) / parts;
  begin = min(count, per * index);
  end = min(count, begin + per);
}

// The sum over ranks (rank order) of 16-byte vector i: this rank's from `in`, the others from the
// slots they pushed into this rank's buffer.
template <typename T, int W>
__device__ __forceinline__ uint4 ar_sum_vector(AllReduceArgs const& a, uint4 const* in, void* self, int parity,
                                               long long i) {
  ArVector<T> acc;
  acc.clear();
#pragma unroll
  for (int s = 0; s < W; ++s) {
    uint4 const v = s == a.rank ? in[i] : ar_load_slot(ar_slot<uint4>(self, a.slot_bytes, parity, W, s) + i);
    acc.add(v);
  }
  return acc.rounded();
}

// The elements past the last whole vector (fewer than 16 bytes): pushed and summed one by one,
// by the last active block.
template <typename T, int W>
__device__ __forceinline__ void ar_push_tail(AllReduceArgs const& a, int parity, long long first) {
  T const* in = static_cast<T const*>(a.in);
  for (long long e = first + threadIdx.x; e < a.numel; e += blockDim.x) {
    T const v = in[e];
#pragma unroll
    for (int s = 0; s < W; ++s) {
      if (s != a.rank) ar_slot<T>(a.peers[s], a.slot_bytes, parity, W, a.rank)[e] = v;
    }
  }
}

template <typename T, int W>
__device__ __forceinline__ void ar_sum_tail(AllReduceArgs const& a, void* self, int parity, long long first) {
  T const* in = static_cast<T const*>(a.in);
  T* out = static_cast<T*>(a.out);
  for (long long e = first + threadIdx.x; e < a.numel; e += blockDim.x) {
    float acc = -0.f;
#pragma unroll
    for (int s = 0; s < W; ++s) {
      T const v = s == a.rank ? in[e] : __ldcg(ar_slot<T>(self, a.slot_bytes, parity, W, s) + e);
      acc += ArElement<T>::load(v);
    }
    out[e] = ArElement<T>::store(acc);
  }
}

// ---- one-shot: every rank pushes all of its values to every peer, then sums all of them ----------
template <typename T, int W>
__device__ void all_reduce_one_shot(AllReduceArgs const& a) {
  void* self = ar_peer<W>(a, a.rank);
  ArFlag const epoch = ar_next_call(self);
  if (blockIdx.x >= a.active_blocks) return;  // every rank leaves the same blocks out
  int const parity = static_cast<int>(epoch & 1);
  constexpr int kVec = kArVectorBytes / sizeof(T);
  long long const vectors = a.numel / kVec;
  long long begin, end;
  ar_piece(vectors, a.active_blocks, blockIdx.x, begin, end);
  bool const tail = blockIdx.x == a.active_blocks - 1;
  uint4 const* in = static_cast<uint4 const*>(a.in);
  uint4* out = static_cast<uint4*>(a.out);

  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    uint4 const v = in[i];
#pragma unroll
    for (int s = 0; s < W; ++s) {
      if (s != a.rank) ar_slot<uint4>(a.peers[s], a.slot_bytes, parity, W, a.rank)[i] = v;
    }
  }
  if (tail) ar_push_tail<T, W>(a, parity, vectors * kVec);
  ar_barrier<W>(a, self, 2 * epoch);
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) out[i] = ar_sum_vector<T, W>(a, in, self, parity, i);
  if (tail) ar_sum_tail<T, W>(a, self, parity, vectors * kVec);
}

// ---- two-shot: reduce-scatter (rank r sums segment r), then all-gather of the sums ---------------
// Each rank moves 2 (W - 1) / W of the message instead of W - 1 times it: for larger messages and
// more than two ranks. Block b handles piece b of every segment, so the per-block barriers order
// exactly the pushes each block reads. Rank r's slot in a peer holds, at segment t, what r pushed
// to peer t (phase 1) and, at segment r, r's sums (phase 2): disjoint.
template <typename T, int W>
__device__ void all_reduce_two_shot(AllReduceArgs const& a) {
  void* self = ar_peer<W>(a, a.rank);
  ArFlag const epoch = ar_next_call(self);
  if (blockIdx.x >= a.active_blocks) return;
  int const parity = static_cast<int>(epoch & 1);
  constexpr int kVec = kArVectorBytes / sizeof(T);
  long long const vectors = a.numel / kVec;
  long long const segment = (vectors + W - 1) / W;
  bool const tail = blockIdx.x == a.active_blocks - 1;
  uint4 const* in = static_cast<uint4 const*>(a.in);
  uint4* out = static_cast<uint4*>(a.out);

  // phase 1: segment s of this rank's values goes to rank s
#pragma unroll
  for (int s = 0; s < W; ++s) {
    if (s == a.rank) continue;
    long long const s0 = min(vectors, segment * s), s1 = min(vectors, s0 + segment);
    long long begin, end;
    ar_piece(s1 - s0, a.active_blocks, blockIdx.x, begin, end);
    uint4* dst = ar_slot<uint4>(a.peers[s], a.slot_bytes, parity, W, a.rank);
    for (long long i = s0 + begin + threadIdx.x; i < s0 + end; i += blockDim.x) dst[i] = in[i];
  }
  if (tail) ar_push_tail<T, W>(a, parity, vectors * kVec);
  ar_barrier<W>(a, self, 2 * epoch);

  // phase 2: sum segment `rank`, keep it, and push it to every peer
  {
    long long const s0 = min(vectors, segment * a.rank), s1 = min(vectors, s0 + segment);
    long long begin, end;
    ar_piece(s1 - s0, a.active_blocks, blockIdx.x, begin, end);
    for (long long i = s0 + begin + threadIdx.x; i < s0 + end; i += blockDim.x) {
      uint4 const sum = ar_sum_vector<T, W>(a, in, self, parity, i);
      out[i] = sum;
#pragma unroll
      for (int s = 0; s < W; ++s) {
        if (s != a.rank) ar_slot<uint4>(a.peers[s], a.slot_bytes, parity, W, a.rank)[i] = sum;
      }
    }
  }
  if (tail) ar_sum_tail<T, W>(a, self, parity, vectors * kVec);
  ar_barrier<W>(a, self, 2 * epoch + 1);

  // phase 3: the other ranks' sums
#pragma unroll
  for (int s = 0; s < W; ++s) {
    if (s == a.rank) continue;
    long long const s0 = min(vectors, segment * s), s1 = min(vectors, s0 + segment);
    long long begin, end;
    ar_piece(s1 - s0, a.active_blocks, blockIdx.x, begin, end);
    uint4 const* src = ar_slot<uint4>(self, a.slot_bytes, parity, W, s);
    for (long long i = s0 + begin + threadIdx.x; i < s0 + end; i += blockDim.x) out[i] = ar_load_slot(src + i);
  }
}

// ---- one-shot fused with the residual add and RMSNorm that follow it in a decoder layer -----------
// Per row: t = round(sum); h = round(t + residual); residual_out = h;
// out = round(weight * round(h * rsqrt(mean(h^2) + eps))): the rounding steps of the unfused
// all-reduce, `residual + t` and transformers' LlamaRMSNorm (fp32 statistics). Rows go to blocks
// round-robin (a row is one block's: its sum of squares stays in the block).
template <typename T, int W, int kThreads>
__device__ void all_reduce_rms_norm(AllReduceArgs const& a) {
  void* self = ar_peer<W>(a, a.rank);
  ArFlag const epoch = ar_next_call(self);
  if (blockIdx.x >= a.active_blocks) return;
  int const parity = static_cast<int>(epoch & 1);
  constexpr int kVec = kArVectorBytes / sizeof(T);
  int const row_vectors = a.cols / kVec;
  uint4 const* in = static_cast<uint4 const*>(a.in);

  for (int r = blockIdx.x; r < a.rows; r += a.active_blocks) {
    long long const base = static_cast<long long>(r) * row_vectors;
    for (int c = threadIdx.x; c < row_vectors; c += kThreads) {
      uint4 const v = in[base + c];
#pragma unroll
      for (int s = 0; s < W; ++s) {
        if (s != a.rank) ar_slot<uint4>(a.peers[s], a.slot_bytes, parity, W, a.rank)[base + c] = v;
      }
    }
  }
  ar_barrier<W>(a, self, 2 * epoch);

  __shared__ float partial[kThreads / 32];
  __shared__ float inv_rms;
  uint4 const* residual = static_cast<uint4 const*>(a.residual);
  uint4* residual_out = static_cast<uint4*>(a.residual_out);
  uint4 const* weight = static_cast<uint4 const*>(a.weight);
  uint4* out = static_cast<uint4*>(a.out);
  for (int r = blockIdx.x; r < a.rows; r += a.active_blocks) {
    long long const base = static_cast<long long>(r) * row_vectors;
    float squares = 0.f;
    for (int c = threadIdx.x; c < row_vectors; c += kThreads) {
      uint4 const sum = ar_sum_vector<T, W>(a, in, self, parity, base + c);
      uint4 const res = residual[base + c];
      uint4 h;
      T const* t = reinterpret_cast<T const*>(&sum);
      T const* rv = reinterpret_cast<T const*>(&res);
      T* hv = reinterpret_cast<T*>(&h);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        hv[j] = ArElement<T>::store(ArElement<T>::load(t[j]) + ArElement<T>::load(rv[j]));
        float const f = ArElement<T>::load(hv[j]);
        squares += f * f;
      }
      residual_out[base + c] = h;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = squares;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
      inv_rms = rsqrtf(total / static_cast<float>(a.cols) + a.eps);
    }
    __syncthreads();
    float const scale = inv_rms;
    for (int c = threadIdx.x; c < row_vectors; c += kThreads) {
      uint4 const h = residual_out[base + c];  // this thread's own store above
      uint4 const w = weight[c];
      uint4 y;
      T const* hv = reinterpret_cast<T const*>(&h);
      T const* wv = reinterpret_cast<T const*>(&w);
      T* yv = reinterpret_cast<T*>(&y);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        T const normed = ArElement<T>::store(ArElement<T>::load(hv[j]) * scale);
        yv[j] = ArElement<T>::store(ArElement<T>::load(wv[j]) * ArElement<T>::load(normed));
      }
      out[base + c] = y;
    }
    __syncthreads();  // partial[] and inv_rms are rewritten for the next row
  }
}

}  // namespace mixed_gemm
