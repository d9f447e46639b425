// Persistent mode in one launch (MoeGemvConfig.fused, schedules "..._m<kTokens>_pe1";
// docs/notes/moe.md). Persistent mode (moe_persistent.cuh) runs a layer as two launches, gate|up
// then down: at one token on many small experts each pays its own start, routing sort and split-K
// tail, while the bytes alone take a few µs. Here both projections are one grid of resident CTAs:
//
//   1. Every CTA sorts the routing once (MoeGemvPersistent::route; both projections share it) and
//      writes the zero y rows of tokens without a valid slot (nobody else writes them).
//   2. Work items come from one atomic queue (sync[0]): items [0, G) are gate|up items (touched
//      expert a, row tile, K slice; G = touched x gate|up items per expert), items [G, G + D) the
//      down items in the same order. A CTA claims the next item when it finishes one, until the
//      queue passes G + D.
//   3. A gate|up item ends with a release (every thread's __threadfence, a barrier, thread 0's
//      fence and atomicAdd) on sync[1 + a], its expert's count of finished gate|up items. A down
//      item of expert a first waits (thread 0: ld.acquire.gpu with __nanosleep backoff, then a
//      barrier) until that count reaches the expert's gate|up items, then reads h through L2
//      (MoeGemvExpert's kFreshX: the read-only path could hold stale lines). With split-K the h row
//      of a (pair, row tile) is written by its last slice inside that slice's item, so a finished
//      count means every h row of the expert is written.
//      No deadlock whatever the residency: a down item only waits on gate|up items, which precede it
//      in the queue and so were claimed by CTAs that are running; gate|up items never wait. The
//      wait is per expert, so the first experts' down items start while later experts' gate|up
//      items still stream.
//   4. Counters return to zero inside the launch (CUDA-graph replays find zeros, no memset node):
//      split-K and top-k counters by their last arrivals, as in two-launch persistent mode; the
//      queue and the per-expert counts by the CTA whose failing claim is the grid's last (every CTA
//      makes exactly one failing claim, after its last item: the claim that returns
//      G + D + gridDim.x - 1 comes after every other CTA's last item).
//
// Shared memory: the larger of the two stages' own areas, the claimed item (16 bytes), then the
// routing (route_bytes(E, pairs)).
#pragma once

#include "moe_gemv/moe_persistent.cuh"

namespace mixed_gemm {

struct MoeGemvFusedArgs {
  MoeGemvArgs up;    // gate|up: x, w13, h as its output; its planes and (pair, row tile) counters
  MoeGemvArgs down;  // down: h as its input, w2, y; its planes and (token, row tile) counters
  int* sync;         // [0]: the work queue; [1, 1 + E): finished gate|up items per touched expert; zero between launches
};

__device__ __forceinline__ int load_acquire_gpu(int const* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <typename Element, int kBits, int kStrips, int kWarpsN, int kWarpsK, int kUnroll, int kTokens>
struct MoeGemvFused {
  using Up = MoeGemvPersistent<Element, kBits, MoeStage::kGateUp, kStrips, kWarpsN, kWarpsK, kUnroll, kTokens>;
  using Down = MoeGemvPersistent<Element, kBits, MoeStage::kDown, kStrips, kWarpsN, kWarpsK, kUnroll, kTokens, true>;
  using Route = typename Up::Route;
  static constexpr int kThreads = Up::kThreads;
  static constexpr int kRows = Up::kRows;
  static_assert(Down::kThreads == kThreads && Down::kRows == kRows, "one CTA shape for both projections");
  static constexpr int kStageBytes = Up::kSmemBytes > Down::kSmemBytes ? Up::kSmemBytes : Down::kSmemBytes;
  static constexpr int kSmemBytes = kStageBytes + 16;  // + the claimed item
  static __host__ __device__ constexpr int route_words(int experts, int pairs) {
    return Up::route_words(experts, pairs);
  }

  // Thread 0 waits until *count reaches `expected` (acquire), then the CTA passes a barrier.
  static __device__ __forceinline__ void wait_for(int const* count, int expected) {
    if (threadIdx.x == 0) {
      unsigned ns = 32;
#pragma unroll 1
      while (load_acquire_gpu(count) < expected) {
        __nanosleep(ns);
        ns = ns < 1024 ? 2 * ns : ns;
      }
    }
    __syncthreads();
  }

  static __device__ void run(MoeGemvFusedArgs const& f, char* smem) {
    Route r;
    int const touched = Up::route(f.up, smem + kSmemBytes, r);
    Down::zero_empty_tokens(f.down, r);
    int const per_up = Up::items_per_expert(f.up), per_down = Down::items_per_expert(f.down);
    int const up_items = touched * per_up, items = up_items + touched * per_down;
    int* const claimed = reinterpret_cast<int*>(smem + kStageBytes);
    int* const done = f.sync + 1;
#pragma unroll 1
    for (;;) {
      __syncthreads();  // every thread has read the previous claim
      if (threadIdx.x == 0) {
        __threadfence();  // this CTA's earlier arrivals come before its claim (the last claimer resets them)
        *claimed = atomicAdd(f.sync, 1);
      }
      __syncthreads();
      int const item = *claimed;
      if (item >= items) {
        if (item == items + (int)gridDim.x - 1) {  // the grid's last claim: every other CTA is done
          __threadfence();
          for (int i = threadIdx.x; i < touched; i += kThreads) done[i] = 0;
          if (threadIdx.x == 0) f.sync[0] = 0;
        }
        return;
      }
      if (item < up_items) {
        Up::gate_up_item(f.up, smem, r, item);
        __threadfence();  // this thread's h (and plane) writes, GPU-wide, before the count announces them
        __syncthreads();
        if (threadIdx.x == 0) {
          __threadfence();
          atomicAdd(done + item / per_up, 1);
        }
      } else {
        int const down = item - up_items;
        wait_for(done + down / per_down, per_up);
        Down::down_item(f.down, smem, r, down);
      }
    }
  }
};

}  // namespace mixed_gemm
