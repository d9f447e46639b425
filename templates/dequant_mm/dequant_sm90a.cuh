// Standalone dequantize of a weight in the sm90a layout (mixed_gemm/kernels/sm90a/layout.py) or the
// lowbit layout (1-3 bits, 1:2-sparse 7 bits: mixed_gemm/kernels/gemv/lowbit_layout.py): the dense
// (N, K) weight, w = q' s + z' through the same converters (atoms/lowbit.cuh) and the same fma as
// the gemv kernels (so "dequantize, then cuBLAS" computes the weight the other kernels compute with).
//
// One warp per layout block (one atom, 16 rows x 16 k; four along K for the lowbit layout): a block of
// 8 warps reads 8 adjacent strips of one block column, contiguous. Lane (g, t) holds rows g and g + 8 at k 2t, 2t+1, 2t+8, 2t+9; the
// shuffles below hand each lane 8 consecutive k of one row, so every store is 16 bytes and a
// row's 32 bytes (one sector) come from two adjacent lanes.
#pragma once

#include "atoms/lowbit.cuh"

namespace mixed_gemm {

struct DequantSm90aArgs {
  void const* b;       // atoms, int32 (blocks, strips, words, 32): see the layouts
  void const* scales;  // (num_groups, 16 * strips)
  void const* zeros;   // additive z', same shape
  void* out;           // (n, k) row-major, row stride ldo
  int n, k, strips, katoms, ldo, group_shift, num_groups;
};

template <typename Element, int kBits>
struct DequantSm90aKernel {
  using P = Pair<Element>;
  using raw = typename P::raw;
  static constexpr int kThreads = 256;
  using W = WeightAtoms<Element, kBits>;
  static constexpr int kStrips = kThreads / 32;  // layout blocks (16-row strips) per CTA

  static __device__ void run(DequantSm90aArgs const& p) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const nb = blockIdx.x * kStrips + warp, blk = blockIdx.y;
    if (nb >= p.strips) return;
    uint32_t w[W::kWords];
    W::load_at(block_words<W>(static_cast<uint32_t const*>(p.b), blk, nb, p.strips, lane), w);
    if constexpr (kBits == 7) {
      sparse_block(p, w, nb, blk, lane);
    } else {
#pragma unroll
      for (int u = 0; u < W::kAtoms; ++u) atom(p, w, nb, blk * W::kAtoms + u, u, lane);
    }
  }

  // 1:2-sparse (mma.sp's compressed fragments, atoms/lowbit.cuh): lane (g, t)'s register 2 i + n1 of
  // half h holds row g + 8 n1's kept pair of chunk t + 4 i (k 64 blk + 32 h + 4 (t + 4 i) .. + 3);
  // the chunk's metadata nibble (the two kept elements' indices) is in lane 4 g + 2 h + i's word.
  // Each lane writes its chunks whole, the dropped elements as zeros: 8 bytes per row and chunk.
  static __device__ __forceinline__ void sparse_block(DequantSm90aArgs const& p, uint32_t const (&w)[W::kWords], int nb,
                                                      int blk, int lane) {
    int const g = lane >> 2, t = lane & 3;
    uint32_t const meta = W::meta(w);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int const kb = blk * W::kAtoms + 2 * h;
      int const gi = min((kb * 16) >> p.group_shift, p.num_groups - 1);  // a group spans the half (>= 32)
      size_t const pi = (size_t)gi * (16 * p.strips) + 16 * nb + g;
      raw const* sp = static_cast<raw const*>(p.scales) + pi;
      raw const* zp = static_cast<raw const*>(p.zeros) + pi;
      uint32_t const s[2] = {P::splat(sp[0]), P::splat(sp[8])}, z[2] = {P::splat(zp[0]), P::splat(zp[8])};
      uint32_t a[4];
      W::convert_sp(w, h, a);
      atom_scale<Element>(a, s, z);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t const m = __shfl_sync(0xffffffffu, meta, 4 * g + 2 * h + i);
#pragma unroll
        for (int n1 = 0; n1 < 2; ++n1) {
          uint32_t const nibble = (m >> (16 * n1 + 4 * t)) & 0xfu, v = a[2 * i + n1];
          uint32_t const lo = v & 0xffffu, hi = v >> 16;  // the kept elements at indices 0-1 and 2-3
          uint2 const out = make_uint2(nibble & 1u ? lo << 16 : lo, nibble & 4u ? hi << 16 : hi);
          int const row = 16 * nb + g + 8 * n1, col = 64 * blk + 32 * h + 4 * (t + 4 * i);
          if (row < p.n && col < p.k)  // K % 8 == 0: a chunk is wholly in or out
            *reinterpret_cast<uint2*>(static_cast<raw*>(p.out) + (size_t)row * p.ldo + col) = out;
        }
      }
    }
  }

  static __device__ __forceinline__ void atom(DequantSm90aArgs const& p, uint32_t const (&w)[W::kWords], int nb,
                                              int kb, int u, int lane) {
    int const g = lane >> 2, t = lane & 3;
    uint32_t a[4];
    W::convert(w, u, a);
    int const gi = min((kb * 16) >> p.group_shift, p.num_groups - 1);
    size_t const pi = (size_t)gi * (16 * p.strips) + 16 * nb + g;
    raw const* sp = static_cast<raw const*>(p.scales) + pi;
    raw const* zp = static_cast<raw const*>(p.zeros) + pi;
    uint32_t const s[2] = {P::splat(sp[0]), P::splat(sp[8])}, z[2] = {P::splat(zp[0]), P::splat(zp[8])};
    atom_scale<Element>(a, s, z);
    // Lane (g, t) stores row g + 8 (t >> 1), k 8 (t & 1) .. + 7: register r = (t & 1) * 2 + (t >> 1)
    // of the four lanes 4g .. 4g + 3 (pair j of the vector comes from lane 4g + j).
    int const r = (t & 1) * 2 + (t >> 1);
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // Every lane reads lane 4g + j's registers; each keeps the one it needs.
      uint32_t const x0 = __shfl_sync(0xffffffffu, a[0], 4 * g + j), x1 = __shfl_sync(0xffffffffu, a[1], 4 * g + j);
      uint32_t const x2 = __shfl_sync(0xffffffffu, a[2], 4 * g + j), x3 = __shfl_sync(0xffffffffu, a[3], 4 * g + j);
      v[j] = r == 0 ? x0 : (r == 1 ? x1 : (r == 2 ? x2 : x3));
    }
    int const row = 16 * nb + g + 8 * (t >> 1), col = 16 * kb + 8 * (t & 1);
    if (row < p.n && col < p.k) {  // K % 8 == 0: a vector is wholly in or out
      *reinterpret_cast<uint4*>(static_cast<raw*>(p.out) + (size_t)row * p.ldo + col) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
};

}  // namespace mixed_gemm
