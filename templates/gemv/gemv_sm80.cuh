// The decode kernel for weights in the sm80 layout (mixed_gemm/kernels/sm80/layout.py), the one
// copy Ampere/Ada GPUs hold: the same streaming design as gemv.cuh, with the operands in the sm80
// family's roles. An sm80 atom (16 k x 64 n) is the mma.sync.m16n8k16 B fragment of eight n8
// tiles: lane t reads register i of chunk c at byte 512 c + 128 i + 4 t (32 lanes: one coalesced
// 128-byte request per register) and the converters of common/dequant.cuh (every zero mode,
// compiled in) turn it into the eight B fragments. The activations (<= 16 tokens, zero-padded) are
// the A operand: a0 = x[g][2t, 2t+1], a1 = x[g + 8][...], a2 = x[g][2t + 8, 2t + 9], a3 = x[g + 8][...].
// Eight mma per atom and k16 step, fp32 accumulators (token, column) per lane.
#pragma once

#include "gemv/gemv.cuh"

namespace mixed_gemm {

template <typename Element, int kBits, int kZeroMode, int kStrips, int kWarpsN, int kWarpsK, int kUnroll,
          bool kStageX>
struct GemvSm80 {
  static constexpr int kWN = kWarpsN, kWK = kWarpsK, kSN = kStrips, kU = kUnroll;  // for gemv_run
  static constexpr bool kFineGroups = false;  // a step in one group, or columns per atom
  using P = Pair<Element>;
  using raw = typename P::raw;
  using Deq = Dequantizer<Element, kBits, static_cast<ZeroMode>(kZeroMode)>;
  static constexpr int kTiles = 2;                      // 16 tokens: one m16 tile of x
  static constexpr int kChunks = kBits / 4;             // 512-byte chunks per atom
  static constexpr int kAtomBytes = 512 * kChunks;
  static constexpr int kThreads = 32 * kWarpsN * kWarpsK;
  static constexpr int kRows = 64 * kStrips * kWarpsN;  // weight columns (outputs) of a CTA
  static constexpr int kAcc = kStrips * 8 * 4;
  static constexpr int kReduceBytes = (kWarpsK - 1) * kWarpsN * kAcc * 32 * 4;
  using XS = XStage<raw, kTiles * 8, kUnroll>;
  static constexpr int kXWarpBytes = kStageX ? XS::kBytes : 0;
  static constexpr int kSmemBytes = kReduceBytes + kWarpsN * kWarpsK * kXWarpBytes;
  static_assert(kBits == 4 || kBits == 8, "int4 or int8 weights");
  static_assert(kUnroll >= 1 && (kUnroll & (kUnroll - 1)) == 0, "kUnroll: a power of two (group alignment)");

  // Column constants of the lane's 8 columns (8 j + g) of 64-column strip na in group gi: one
  // 16-byte vector each of scales and zeros (the layout stores them 8x8-transposed for this).
  static __device__ __forceinline__ void columns(GemvArgs const& p, int gi, int na, int g, ColumnDequant (&cd)[8]) {
    size_t const idx = (size_t)gi * (64 * p.strips) + na * 64 + g * 8;
    uint4 const s8 = __ldg(reinterpret_cast<uint4 const*>(static_cast<raw const*>(p.scales) + idx));
    uint4 z8 = s8;
    if (p.zeros != nullptr) z8 = __ldg(reinterpret_cast<uint4 const*>(static_cast<raw const*>(p.zeros) + idx));
    raw const* sh = reinterpret_cast<raw const*>(&s8);
    raw const* zh = reinterpret_cast<raw const*>(&z8);
#pragma unroll
    for (int j = 0; j < 8; ++j) cd[j] = Deq::column(sh[j], zh[j]);
  }

  template <int kGroupAtoms>  // kUnroll: the step lies in one group; else 1
  static __device__ __forceinline__ void mainloop(GemvArgs const& p, int strip0, int kbeg, int kend, int wk,
                                                  char* xs, float (&acc)[kStrips][8][4]) {
    int const lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    char const* bb = static_cast<char const*>(p.b);
    constexpr bool kChunkGroup = kGroupAtoms == kUnroll;
    for (int kb0 = kbeg + wk * kUnroll; kb0 < kend; kb0 += kWarpsK * kUnroll) {
      // 1. Every weight load of the step first.
      uint32_t wq[kUnroll][kStrips][4 * kChunks];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int j = 0; j < kStrips; ++j) {
          int const ka = kb0 + u, na = strip0 + j;
          char const* atom = bb + ((size_t)na * p.katoms + ka) * kAtomBytes + 4 * lane;
          bool const in = ka < kend && na < p.strips;
#pragma unroll
          for (int c = 0; c < kChunks; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              wq[u][j][4 * c + i] = in ? ld_stream(reinterpret_cast<uint32_t const*>(atom + 512 * c + 128 * i)) : 0u;
        }
      // 2. The activations' A fragments.
      uint32_t xa[kUnroll][4];
      if (kStageX) {
        XS::load(p, kb0, lane, xs);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          xa[u][0] = XS::pair(xs, g, u, t, 0);
          xa[u][1] = XS::pair(xs, g + 8, u, t, 0);
          xa[u][2] = XS::pair(xs, g, u, t, 1);
          xa[u][3] = XS::pair(xs, g + 8, u, t, 1);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          int const k = (kb0 + u) * 16 + 2 * t;
          xa[u][0] = XS::global_pair(p, g, k);
          xa[u][1] = XS::global_pair(p, g + 8, k);
          xa[u][2] = XS::global_pair(p, g, k + 8);
          xa[u][3] = XS::global_pair(p, g + 8, k + 8);
        }
      }
      // 3. Per strip: column constants (per step when it lies in one group, else per atom),
      // convert, multiply.
#pragma unroll
      for (int j = 0; j < kStrips; ++j) {
        int const na = min(strip0 + j, p.strips - 1);
        ColumnDequant cd[8];
        if (kChunkGroup) columns(p, min((kb0 * 16) >> p.group_shift, p.num_groups - 1), na, g, cd);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (kb0 + u >= kend) break;
          if (!kChunkGroup) columns(p, min(((kb0 + u) * 16) >> p.group_shift, p.num_groups - 1), na, g, cd);
          uint32_t frag[8][2];
#pragma unroll
          for (int c = 0; c < kChunks; ++c) Deq::chunk(&wq[u][j][4 * c], c, cd, frag);
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) GemvMath<Element>::mma(acc[j][jj], xa[u], frag[jj][0], frag[jj][1]);
        }
      }
    }
  }

  // Accumulator (j, jj, e): token g + 8 (e >> 1), column 64 (strip0 + j) + 8 jj + 2 t + (e & 1).
  template <typename F>
  static __device__ __forceinline__ void for_each_output(GemvArgs const& p, int strip0, int lane,
                                                         float const (&acc)[kStrips][8][4], F&& f) {
#pragma unroll
    for (int j = 0; j < kStrips; ++j)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const n = 64 * (strip0 + j) + 8 * jj + 2 * (lane & 3) + (e & 1);
          int const token = (lane >> 2) + 8 * (e >> 1);
          if (n < p.n && token < p.m) f(n, token, acc[j][jj][e]);
        }
  }

  using Acc = float[kStrips][8][4];
  static __device__ __forceinline__ void finish(float (&)[kAcc]) {}  // mma accumulators are complete
  static __device__ void run(GemvArgs const& p, char* smem) { gemv_run<GemvSm80>(p, smem); }
};

}  // namespace mixed_gemm
