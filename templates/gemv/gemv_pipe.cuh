// The decode kernel of gemv.cuh with each warp's weight and x streamed through a cp.async ring in
// shared memory (schedule suffix `_p<stages>`): same layouts, converters, epilogue and split-K.
//
// Why. gemv.cuh's warp issues a step's loads, waits for all of them, then converts: while it
// converts it has no bytes in flight, and the registers holding a whole step's words keep 3-4 warps
// per scheduler. ncu on the H100 (docs/notes/gemv.md): 2-bit 57344x8192 at M=1 issued an
// instruction every 2 cycles per scheduler with 0.78 eligible warps, DRAM at 46% (1.54 TB/s), 123
// registers (25% occupancy). Here step i + S - 1 is copied (cp.async, 16-byte chunks, no registers)
// before step i is converted, so every warp keeps S - 1 steps in flight while it computes, and the
// converted words come from shared memory (one LDS per word, as many as the global loads were).
//
// The rings: each warp's kStages stages of [weights | group parameters], then each K-warp row's
// (the kWarpsN warps with one wk read the same x) kStages stages of x, copied by those warps
// together and published with a barrier of theirs (named barrier 1 + wk), so x is read from L2
// once per CTA and K slice, not once per warp (at 16 tokens a step's x slice is as large as the
// warp's weight).
//   weights: the step's kBlocks blocks, each the kStrips adjacent strips' bytes of that block
//     copied verbatim (in the layout they are contiguous: (block, strip, lane words)), so the
//     lane's word c of strip j of block bi lies at (bi * kStrips + j) * kStripBytes +
//     (lane * kLaneStride + c * kWordStride) * 4.
//   parameters: for each group the step touches (max(1, step k / group size): the step starts on a
//     multiple of it), the kStrips x 16 scales, then the zeros, of the warp's rows. Loaded at first
//     use from global memory they were an L2 round trip per group on the critical path (ncu: the
//     largest stall of the 2-bit kernel, "long scoreboard").
//   x: the step's slice of the rows < M only, as XStage lays it out (rows padded by 16 bytes:
//     conflict-free fragment reads). A lane whose B-fragment row (its token) is at or past M reads
//     the last row instead: an mma's output column depends on its own B column only, and the
//     columns of tokens past M are never written.
// The stages' sizes thus depend on M and the group size: the launch sizes the dynamic shared memory
// (GemvConfig.ring_smem_bytes).
#pragma once

#include "gemv/gemv.cuh"

namespace mixed_gemm {

__device__ __forceinline__ uint32_t smem_addr(void const* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1 (the weight is read once); ok == false zero-fills them
// (src is then not read, but is kept a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, void const* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// kDeferred (`_ds`): the group scale and zero applied once per group to the fp32 sums, as in
// gemv.cuh (atoms/deferred.cuh), with the parameters read from the stage.
template <typename Element, int kBits, int kTiles, int kStrips, int kWarpsN, int kWarpsK, int kUnroll, int kStages,
          int kFmaTokens = 0, bool kDeferred = false>
struct GemvPipe : Gemv<Element, kBits, kTiles, kStrips, kWarpsN, kWarpsK, kUnroll, true, kFmaTokens, 1, kDeferred> {
  using Base = Gemv<Element, kBits, kTiles, kStrips, kWarpsN, kWarpsK, kUnroll, true, kFmaTokens, 1, kDeferred>;
  using W = typename Base::W;
  using raw = typename Base::raw;
  using Acc = typename Base::Acc;
  static constexpr bool kFma = Base::kFma;
  static constexpr int kXRows = Base::kXRows, kPer = Base::kPer, kBlocks = Base::kBlocks;
  static constexpr int kRowsX = kFma ? kFmaTokens : kTiles * 8;  // x rows a stage holds
  using XS = XStage<raw, kRowsX, kUnroll>;
  // Words of a lane within a block: adjacent (sm90a layout) or 32 apart (word-major lowbit planes).
  static constexpr int kWordStride = W::kLaneStride == W::kWords ? 1 : 32;
  static constexpr int kStripBytes = 128 * W::kWords;              // one strip of one block
  static constexpr int kWBytes = kBlocks * kStrips * kStripBytes;  // a step's weight bytes
  static constexpr int kGroupBytes = 2 * kStrips * 16 * sizeof(raw);  // one group's scales and zeros
  // The rings start after the reduction buffer; their size depends on M, so the mainloop places
  // them itself (gemv_run's per-warp stride is 0). kSmemBytes: at M = kRowsX and group 32, the most.
  static constexpr int kXWarpBytes = 0;
  static constexpr int kMaxGroups = kUnroll / 2 > 0 ? kUnroll / 2 : 1;  // groups of 32 (the smallest) a step touches
  static constexpr int kSmemBytes = Base::kReduceBytes + kWarpsN * kWarpsK * kStages * (kWBytes + kMaxGroups * kGroupBytes) +
                                    kWarpsK * kStages * XS::kBytes;
  static_assert(kStages >= 2, "a ring needs at least two stages");
  static_assert(kWBytes % 16 == 0 && XS::kBytes % 16 == 0 && kGroupBytes % 16 == 0, "16-byte chunks");

  // Groups a step touches: the step (kUnroll x 16 k) over the group size, at least 1.
  static __device__ __forceinline__ int step_groups(GemvArgs const& p) {
    return max(1, (kUnroll * 16) >> min(p.group_shift, 30));
  }

  // Copies the step at atom kb0 into `stage` (one commit group is the caller's). Blocks past kend
  // and strips past N zero-fill; `inside`: all of the step's blocks and strips exist (no checks).
  static __device__ __forceinline__ void copy_step(GemvArgs const& p, int kb0, int kend, int strip0, bool inside,
                                                   int rows, int groups, char const* stage, char const* xstage,
                                                   int wn, int lane) {
    constexpr int kChunks = kWBytes / 16, kBlockChunks = kStrips * kStripBytes / 16;
    constexpr int kStripChunks = kStripBytes / 16;
    char const* const b = static_cast<char const*>(p.b);
    size_t const block_bytes = (size_t)p.strips * kStripBytes;
    char const* const src0 = b + ((size_t)(kb0 / W::kAtoms) * p.strips + strip0) * kStripBytes;
    uint32_t const dst0 = smem_addr(stage);
#pragma unroll
    for (int i = 0; i < (kChunks + 31) / 32; ++i) {
      int const c = i * 32 + lane;
      if (kChunks % 32 == 0 || c < kChunks) {
        int const bi = c / kBlockChunks, rem = c % kBlockChunks;
        bool const ok = inside || (kb0 + bi * W::kAtoms < kend && strip0 + rem / kStripChunks < p.strips);
        cp_async16(dst0 + c * 16, ok ? src0 + bi * block_bytes + rem * 16 : b, ok);
      }
    }
    // Group parameters: per group, the scales then the zeros of strips strip0.. (16 bytes = 8 rows);
    // strips past N zero-fill.
    constexpr int kHalfChunks = kStrips * 2;  // chunks of one group's scales (or zeros)
    int const gi0 = (kb0 * 16) >> p.group_shift;
    uint32_t const pdst = dst0 + kWBytes;
    for (int c = lane; c < groups * 2 * kHalfChunks; c += 32) {
      int const gr = c / (2 * kHalfChunks), which = c / kHalfChunks % 2, ch = c % kHalfChunks;
      int const gi = min(gi0 + gr, p.num_groups - 1);
      raw const* const base = static_cast<raw const*>(which ? p.zeros : p.scales);
      bool const ok = strip0 + ch / 2 < p.strips;
      cp_async16(pdst + c * 16, ok ? base + (size_t)gi * 16 * p.strips + 16 * strip0 + ch * 8 : base, ok);
    }
    // x (this warp's share of its K-warp row's copy): rows < M only; k past K zero-fills (K % 8 ==
    // 0: a chunk is in or out).
    constexpr int kRowChunks = kUnroll * 2;
    raw const* const x = static_cast<raw const*>(p.x);
    uint32_t const xdst = smem_addr(xstage);
    for (int c = wn * 32 + lane; c < rows * kRowChunks; c += 32 * kWarpsN) {
      int const row = c / kRowChunks, ch = c % kRowChunks, k = kb0 * 16 + ch * 8;
      bool const ok = k < p.k;
      cp_async16(xdst + row * XS::kRowBytes + ch * 16, ok ? x + (size_t)row * p.k + k : x, ok);
    }
  }

  // The kWarpsN warps of K-warp row wk (barrier 0 is __syncthreads').
  static __device__ __forceinline__ void row_sync(int wk) {
    if constexpr (kWarpsN == 1) {
      __syncwarp();
    } else {
      asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wk), "n"(32 * kWarpsN) : "memory");
    }
  }

  // s and z' of rows (g, g + 8) of every strip, as (s, s) / (z, z) pairs, from a group's staged parameters.
  static __device__ __forceinline__ void stage_params(char const* group, int g, uint32_t (&s)[kStrips][2],
                                                      uint32_t (&z)[kStrips][2]) {
    raw const* const sp = reinterpret_cast<raw const*>(group) + g;
#pragma unroll
    for (int j = 0; j < kStrips; ++j) {
      s[j][0] = Base::P::splat(sp[16 * j]);
      s[j][1] = Base::P::splat(sp[16 * j + 8]);
      z[j][0] = Base::P::splat(sp[16 * (kStrips + j)]);
      z[j][1] = Base::P::splat(sp[16 * (kStrips + j) + 8]);
    }
  }

  template <int kGroupAtoms>  // atoms per parameter load (see gemv_mainloop)
  static __device__ __forceinline__ void mainloop(GemvArgs const& p, int strip0, int kbeg, int kend, int wk,
                                                  char* ring, Acc& acc) {
    int const lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    bool const strips_inside = strip0 + kStrips <= p.strips;
    int const rows = min(p.m, kRowsX), groups = step_groups(p);
    int const stage_bytes = kWBytes + groups * kGroupBytes, xstage_bytes = rows * XS::kRowBytes;
    int const wn = (threadIdx.x >> 5) % kWarpsN;
    char* const xring = ring + kWarpsN * kWarpsK * kStages * stage_bytes + wk * kStages * xstage_bytes;
    ring += (threadIdx.x >> 5) * kStages * stage_bytes;
    int xrow[kXRows];  // each x operand's staged row (clamped: see the top)
#pragma unroll
    for (int mt = 0; mt < kXRows; ++mt) xrow[mt] = min(kFma ? mt : mt * 8 + g, rows - 1);
    int const kstep = kWarpsK * kUnroll, first = kbeg + wk * kUnroll;
    int const steps = first < kend ? (kend - first + kstep - 1) / kstep : 0;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) {
        int const kb0 = first + s * kstep;
        copy_step(p, kb0, kend, strip0, strips_inside && kb0 + kUnroll <= kend, rows, groups, ring + s * stage_bytes,
                  xring + s * xstage_bytes, wn, lane);
      }
      cp_async_commit();
    }
#pragma unroll 1
    for (int i = 0; i < steps; ++i) {
      cp_async_wait<kStages - 2>();  // this lane's copies of step i have landed
      row_sync(wk);                  // and the row's; all of them are done reading step i - 1's stages
      {
        int const nx = i + kStages - 1;
        if (nx < steps) {
          int const kb0 = first + nx * kstep;
          copy_step(p, kb0, kend, strip0, strips_inside && kb0 + kUnroll <= kend, rows, groups,
                    ring + (nx % kStages) * stage_bytes, xring + (nx % kStages) * xstage_bytes, wn, lane);
        }
        cp_async_commit();
      }
      char const* const stage = ring + (i % kStages) * stage_bytes;
      int const kb0 = first + i * kstep;
      uint32_t wq[kBlocks][kStrips][W::kWords];
#pragma unroll
      for (int bi = 0; bi < kBlocks; ++bi)
#pragma unroll
        for (int j = 0; j < kStrips; ++j)
#pragma unroll
          for (int c = 0; c < W::kWords; ++c)
            wq[bi][j][c] = *reinterpret_cast<uint32_t const*>(
                stage + (bi * kStrips + j) * kStripBytes + (lane * W::kLaneStride + c * kWordStride) * 4);
      char const* const params = stage + kWBytes;
      char const* const xs = xring + (i % kStages) * xstage_bytes;
      uint32_t xf[kUnroll][kXRows][2];
      if constexpr (Base::kSparse && kUnroll % 2 == 0) {  // ldmatrix.x4 where it paid (gemv.cuh, step 2)
        XS::fragments_x4(xs, lane, [&](int r) { return min(r, rows - 1); }, xf);  // only rows < M are staged
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int mt = 0; mt < kXRows; ++mt) {
            xf[u][mt][0] = XS::pair(xs, xrow[mt], u, t, 0);
            xf[u][mt][1] = XS::pair(xs, xrow[mt], u, t, 1);
          }
      }
      if constexpr (kDeferred) {
        // The staged group's scale and zero of strip j, row g + 8 h.
        auto staged = [&](int u, int j, int h, float& sc, float& zc) {
          raw const* const gp = reinterpret_cast<raw const*>(params + ((u * 16) >> p.group_shift) * kGroupBytes) + g;
          sc = static_cast<float>(gp[16 * j + 8 * h]);
          zc = static_cast<float>(gp[16 * (kStrips + j) + 8 * h]);
        };
        if (kb0 + kUnroll <= kend) {
          Base::template deferred_step<kGroupAtoms, true, true>(kb0, kend, wq, xf, acc, staged);
        } else {
          Base::template deferred_step<kGroupAtoms, false, true>(kb0, kend, wq, xf, acc, staged);
        }
        continue;
      }
      uint32_t s[kStrips][2], z[kStrips][2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (kb0 + u >= kend) break;  // zero-filled atoms past the slice would still add z'
        if (u % kGroupAtoms == 0) stage_params(params + ((u * 16) >> p.group_shift) * kGroupBytes, g, s, z);
#pragma unroll
        for (int j = 0; j < kStrips; ++j) Base::unit_math(wq[u / W::kAtoms][j], u, s[j], z[j], xf, acc[j]);
      }
    }
    cp_async_wait<0>();  // no copy may land in shared memory after the CTA's epilogue reuses it
  }

  static __device__ void run(GemvArgs const& p, char* smem) { gemv_run<GemvPipe>(p, smem); }
};

}  // namespace mixed_gemm
