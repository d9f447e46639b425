// How the decode and dequantize kernels read a weight, per stored width: one lane's words of a
// block of K atoms (16 x 16) -> the lane's mma.sync.m16n8k16 A fragment of each atom, as exact
// q' = q - 2**(bits-1) pairs (then w = q' s + z', atom_scale). Layout contracts:
// mixed_gemm/kernels/sm90a/layout.py (4 and 8 bits) and mixed_gemm/kernels/gemv/layout.py
// ("lowbit": 1, 2, 3 bits and 1:2-sparse 7 bits).
//
// Fragment register r of an atom holds rows g + 8 (r & 1), columns 2t, 2t+1 (+ 8 when r >= 2) for
// lane 4g + t: the pair index p = 4u + r numbers the registers of the block's atoms u.
#pragma once

#include <cstdint>

#include "atoms/sm90a.cuh"

namespace mixed_gemm {

// Every policy: kAtoms (atoms per block along K), kWords (32-bit words per lane per block),
// load(b, block, strip, strips, lane, w), convert(w, u, a) and finish(w, u, a) (after atom_scale).
template <typename Element, int kBits>
struct WeightAtoms;

// The sm90a layout: a block is one atom; int4 one word per lane, int8 two adjacent words.
template <typename Element, int kBits>
struct Sm90aAtoms {
  static constexpr int kAtoms = 1, kWords = kBits / 4;
  static __device__ __forceinline__ void load(uint32_t const* b, int blk, int nb, int strips, int lane,
                                              uint32_t (&w)[kWords]) {
    uint32_t const* src = b + (((size_t)blk * strips + nb) * 32 + lane) * kWords;
    if (kWords == 1) {
      w[0] = ld_stream(src);
    } else {
      uint2 const v = ld_stream2(src);
      w[0] = v.x;
      w[kWords - 1] = v.y;
    }
  }
  static __device__ __forceinline__ void convert(uint32_t const (&w)[kWords], int, uint32_t (&a)[4]) {
    AtomConvert<Element, kBits>::run(w, a);
  }
  static __device__ __forceinline__ void finish(uint32_t const (&)[kWords], int, uint32_t (&)[4]) {}
};
template <typename Element>
struct WeightAtoms<Element, 4> : Sm90aAtoms<Element, 4> {};
template <typename Element>
struct WeightAtoms<Element, 8> : Sm90aAtoms<Element, 8> {};

// Word c of a block for every lane: (blk, strip, c, lane), so each word of a warp is one coalesced
// 128-byte request (the lowbit layout's order).
template <int kWords>
__device__ __forceinline__ void load_planes(uint32_t const* b, int blk, int nb, int strips, int lane,
                                            uint32_t (&w)[kWords]) {
  uint32_t const* src = b + ((size_t)blk * strips + nb) * (32 * kWords) + lane;
#pragma unroll
  for (int c = 0; c < kWords; ++c) w[c] = ld_stream(src + 32 * c);
}

// 1, 2 and 3 bits: a block is 4 atoms (k64); codes are unsigned, in bit planes so that a pair's two
// values sit in the two halves of a word at the same offset (one mask extracts both):
//   2-bit plane, words 0 (atoms 0, 1) and 1 (atoms 2, 3): pair p at bits 2 (p % 8) and 16 + 2 (p % 8);
//   1-bit plane, word kBits - 1 (3 bits: the top bit; 1 bit: the code): pair p at bits p and 16 + p.
// The field goes under the exponent of 1024.0 (fp16) / 128.0 (bf16) with one lop3, so the half reads
// magic + q exactly; one subtraction of magic + 2**(bits-1) leaves q' (no per-element cvt).
template <typename Element, int kBits>
struct PlaneAtoms {
  static_assert(kBits >= 1 && kBits <= 3, "bit planes hold 1, 2 or 3 bits");
  using P = Pair<Element>;
  static constexpr int kAtoms = 4, kWords = kBits;
  static constexpr uint32_t kMagic = P::kMagic;
  static constexpr uint32_t kBias = kMagic + (1u << (kBits - 1)) * 0x10001u;  // magic + 2**(bits-1), both halves
  // (a & b) | c: immLut = (0xf0 & 0xcc) | 0xaa.
  static constexpr uint32_t kAndOr = 0xea;

  static __device__ __forceinline__ void load(uint32_t const* b, int blk, int nb, int strips, int lane,
                                              uint32_t (&w)[kWords]) {
    load_planes<kWords>(b, blk, nb, strips, lane, w);
  }
  static __device__ __forceinline__ void convert(uint32_t const (&w)[kWords], int u, uint32_t (&a)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      int const p = 4 * u + r;
      uint32_t f;
      if (kBits == 1) {
        f = lop3<kAndOr>(w[0] >> p, 0x00010001u, kMagic);
      } else {
        uint32_t const lo = w[p / 8] >> (2 * (p % 8));
        if (kBits == 2) {
          f = lop3<kAndOr>(lo, 0x00030003u, kMagic);
        } else {  // the top bit from plane 2, moved to bit 2 of each half, then (lo & 3) | top | magic
          uint32_t const top = p >= 2 ? w[kWords - 1] >> (p - 2) : w[kWords - 1] << (2 - p);
          f = lop3<kAndOr>(lo, 0x00030003u, (top & 0x00040004u) | kMagic);
        }
      }
      a[r] = P::sub(f, kBias);
    }
  }
  static __device__ __forceinline__ void finish(uint32_t const (&)[kWords], int, uint32_t (&)[4]) {}
};
template <typename Element>
struct WeightAtoms<Element, 1> : PlaneAtoms<Element, 1> {};
template <typename Element>
struct WeightAtoms<Element, 2> : PlaneAtoms<Element, 2> {};
template <typename Element>
struct WeightAtoms<Element, 3> : PlaneAtoms<Element, 3> {};

// 1:2-sparse 7 bits: a block is one atom, one word per lane (int4's bytes): byte r is register r's
// pair, the kept element's 7-bit code with its position in bit 7 (1: the first, k even). prmt puts
// the code under the magic's exponent in both halves (magic + code, exact); after the scale, the
// position bit (replicated by prmt's sign mode) keeps the kept half and zeroes the other.
template <typename Element>
struct WeightAtoms<Element, 7> {
  using P = Pair<Element>;
  static constexpr int kAtoms = 1, kWords = 1;
  static constexpr uint32_t kMagicBytes = ((P::kMagic >> 8) & 0xffu) * 0x01010101u;  // 0x64 / 0x43 in every byte
  static constexpr uint32_t kBias = P::kMagic + 64u * 0x10001u;              // magic + 2**6
  // a & (b ^ c): immLut = 0xf0 & (0xcc ^ 0xaa).
  static constexpr uint32_t kAndXorMask = 0x60;

  static __device__ __forceinline__ void load(uint32_t const* b, int blk, int nb, int strips, int lane,
                                              uint32_t (&w)[1]) {
    load_planes<1>(b, blk, nb, strips, lane, w);
  }
  static __device__ __forceinline__ void convert(uint32_t const (&w)[1], int, uint32_t (&a)[4]) {
    uint32_t const codes = w[0] & 0x7f7f7f7fu;
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = P::sub(prmt(codes, kMagicBytes, 0x4040u + 0x0101u * r), kBias);
  }
  static __device__ __forceinline__ void finish(uint32_t const (&w)[1], int, uint32_t (&a)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      uint32_t const first = prmt(w[0], 0u, 0x8888u + 0x1111u * r);  // all ones when the first is kept
      a[r] = lop3<kAndXorMask>(a[r], first, 0xffff0000u);
    }
  }
};

}  // namespace mixed_gemm
