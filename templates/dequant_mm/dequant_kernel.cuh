// Standalone dequantize: the (N, K) fp16/bf16 weight of a PackedWeight, through the same
// converters as the GEMM (AWQ's dequantize op, and the first half of "dequantize, then cuBLAS").
//
// A block of 8 warps covers 64 columns x 128 k (8 atoms, one per warp). Each lane reads its words
// straight from global memory with the same lane -> word mapping ldmatrix gives the GEMM
// (register i of lane t is the word at byte 128 i + 4 t of a 512-byte chunk: 32 lanes read 128
// contiguous bytes per load), converts them into B fragments, and parks the values in shared
// memory; the block then writes 128-byte rows of the output with 16-byte stores, so the writes,
// 4x the bytes of the reads for int4, are fully coalesced.
//
// Float zero points and offsets: the GEMM rounds (q - z) or q s in 16 bits before the final
// value; here the converters produce the exact q and the formula is evaluated in fp32 in the
// reference's order with explicit round-to-nearest (no fma contraction), so the result is the
// reference's float32 value rounded once to the output type.
#pragma once

#include "common/dequant.cuh"

namespace mixed_gemm {

struct DequantArgs {
  void const* b;       // atoms (see gemm_sm80.cuh)
  void const* scales;  // (num_groups, n_pad), permuted
  void const* zeros;   // same, or nullptr
  void* out;           // (N, K) row-major, row stride ldo
  int n, k, n_pad, k16, ldo, group_shift, num_groups;
};

template <typename Element, int kBits, int kZeroMode>
struct DequantKernel {
  using P = Pair<Element>;
  using raw = typename P::raw;
  static constexpr ZeroMode kMode = static_cast<ZeroMode>(kZeroMode);
  static constexpr bool kFp32Formula = kMode == ZeroMode::kFloat || kMode == ZeroMode::kOffset;
  // For the fp32 path: the float-zero converter with s = 1, z = 0 returns q itself, exactly.
  using Deq = Dequantizer<Element, kBits, kFp32Formula ? ZeroMode::kFloat : kMode>;
  static constexpr int kThreads = 256;
  static constexpr int kTileK = 128;                      // 8 atoms of 16
  static constexpr int kAtomBytes = kAtomK * kAtomN * kBits / 8;
  static constexpr int kRowPad = 8;                       // elements: rows 272 bytes apart, no 2-way conflicts
  static constexpr int kSmemBytes = 64 * (kTileK + kRowPad) * 2;

  static __device__ void run(DequantArgs const& p, char* smem_raw) {
    raw* smem = reinterpret_cast<raw*>(smem_raw);
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const na = blockIdx.x;                          // 64-column strip
    int const ka = blockIdx.y * (kTileK / 16) + warp;   // this warp's atom along K
    int const g = lane >> 2, k0 = 2 * (lane & 3);

    if (ka < p.k16) {
      char const* atom = static_cast<char const*>(p.b) + ((size_t)na * p.k16 + ka) * kAtomBytes;
      int const grp = min((ka * 16) >> p.group_shift, p.num_groups - 1);
      size_t const sidx = (size_t)grp * p.n_pad + na * 64 + g * 8;  // lane's 8 tiles, one 16-byte vector
      uint4 const s8 = *reinterpret_cast<uint4 const*>(static_cast<raw const*>(p.scales) + sidx);
      uint4 z8 = s8;
      if (p.zeros != nullptr) z8 = *reinterpret_cast<uint4 const*>(static_cast<raw const*>(p.zeros) + sidx);
      raw const* s_h = reinterpret_cast<raw const*>(&s8);
      raw const* z_h = reinterpret_cast<raw const*>(&z8);
      ColumnDequant cd[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        cd[j] = kFp32Formula ? Deq::column(raw(1.f), raw(0.f)) : Deq::column(s_h[j], z_h[j]);
      }

      uint32_t frag[8][2];
#pragma unroll
      for (int c = 0; c < kBits / 4; ++c) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<uint32_t const*>(atom + c * 512 + 128 * i + 4 * lane);
        Deq::chunk(w, c, cd, frag);
      }
      if (kFp32Formula) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float const sf = static_cast<float>(s_h[j]), zf = static_cast<float>(z_h[j]);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float2 q = P::to_floats(P::val(frag[j][r]));
            if (kMode == ZeroMode::kOffset) {
              q.x = __fadd_rn(__fmul_rn(q.x, sf), zf);  // q s + m
              q.y = __fadd_rn(__fmul_rn(q.y, sf), zf);
            } else {
              q.x = __fmul_rn(__fsub_rn(q.x, zf), sf);  // (q - z) s
              q.y = __fmul_rn(__fsub_rn(q.y, zf), sf);
            }
            frag[j][r] = P::bits(P::from_floats(q.x, q.y));
          }
        }
      }
      // Fragment register r of tile j holds (k0 + 8 r, k0 + 8 r + 1) of column 8 j + g.
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<uint32_t*>(smem + (8 * j + g) * (kTileK + kRowPad) + warp * 16 + k0 + 8 * r) = frag[j][r];
    }
    __syncthreads();

    // 64 rows x 128 k = 1024 vectors of 8 elements; 4 per thread.
    raw* out = static_cast<raw*>(p.out);
#pragma unroll
    for (int it = 0; it < 64 * kTileK / 8 / kThreads; ++it) {
      int const v = threadIdx.x + it * kThreads;
      int const row = v / (kTileK / 8), kc = (v % (kTileK / 8)) * 8;
      int const n = na * 64 + row, k = blockIdx.y * kTileK + kc;
      if (n < p.n && k < p.k) {  // K % 8 == 0: a vector is wholly in or out
        *reinterpret_cast<uint4*>(out + (size_t)n * p.ldo + k) =
            *reinterpret_cast<uint4 const*>(smem + row * (kTileK + kRowPad) + kc);
      }
    }
  }
};

}  // namespace mixed_gemm
