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
#include <type_traits>

#include "atoms/sm90a.cuh"

namespace mixed_gemm {

// Every policy: kAtoms (atoms per block along K), kWords (32-bit words per lane per block),
// kLaneStride (words between lanes' first words: a block of one strip is 32 kWords words),
// load_at(src, w) from the lane's first word, convert(w, u, a) and finish(w, u, a) (after atom_scale).
template <typename W>
__device__ __forceinline__ uint32_t const* block_words(uint32_t const* b, int blk, int nb, int strips, int lane) {
  return b + ((size_t)blk * strips + nb) * (32 * W::kWords) + lane * W::kLaneStride;
}
template <typename Element, int kBits>
struct WeightAtoms;

// The sm90a layout: a block is one atom; int4 one word per lane, int8 two adjacent words.
template <typename Element, int kBits>
struct Sm90aAtoms {
  static constexpr int kAtoms = 1, kWords = kBits / 4, kLaneStride = kWords;
  static __device__ __forceinline__ void load_at(uint32_t const* src, uint32_t (&w)[kWords]) {
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
__device__ __forceinline__ void load_planes(uint32_t const* src, uint32_t (&w)[kWords]) {
#pragma unroll
  for (int c = 0; c < kWords; ++c) w[c] = ld_stream(src + 32 * c);
}

// Exact constants as (x, x) pairs of the activation type, at compile time (no cvt at run time).
template <typename Element>
struct PairConst {
  static constexpr bool kF16 = std::is_same<Element, cutlass::half_t>::value;
  static constexpr int kMantissa = kF16 ? 10 : 7, kExpBias = kF16 ? 15 : 127;
  static constexpr uint32_t splat(uint32_t h) { return h | h << 16; }
  static constexpr int log2i(uint32_t v) { return v <= 1 ? 0 : 1 + log2i(v >> 1); }
  static constexpr uint32_t inv_pow2(int e) { return splat(uint32_t(kExpBias - e) << kMantissa); }  // 2**-e
  // -v for an integer 1 <= v < 2**(kMantissa + 1)
  static constexpr uint32_t neg_int(uint32_t v) {
    return splat(0x8000u | uint32_t(kExpBias + log2i(v)) << kMantissa | (v - (1u << log2i(v))) << (kMantissa - log2i(v)));
  }
};
static_assert(PairConst<cutlass::half_t>::neg_int(1026) == 0xe402e402u && PairConst<cutlass::half_t>::inv_pow2(4) == 0x2c002c00u,
              "fp16 constants");
static_assert(PairConst<cutlass::bfloat16_t>::neg_int(130) == 0xc302c302u, "bf16 constants");

// 1, 2 and 3 bits: a block is 4 atoms (k64); codes are unsigned, in bit planes so that a pair's two
// values sit in the two halves of a word at the same offset (one mask extracts both):
//   2-bit plane, words 0 (atoms 0, 1) and 1 (atoms 2, 3): pair p at bits 2 (p % 8) and 16 + 2 (p % 8);
//   1-bit plane, word kBits - 1 (3 bits: the top bit; 1 bit: the code): pair p at bits p and 16 + p.
// The field goes under the exponent of 1024.0 (fp16) / 128.0 (bf16) with one lop3, so the half reads
// magic + q exactly; one subtraction of magic + 2**(bits-1) leaves q' (no per-element cvt).
// 1 and 2 bits leave a field where it lies when it fits the mantissa (bit e: the half reads magic +
// q 2**e, still exact), and one fma by 2**-e then gives q' exactly: a shift per word and window of
// the mantissa's width instead of one per pair. At 2 bits the decode kernel issues ~17 instructions
// per atom besides the loads, so the 4 shifts an atom saved are what it spends converting.
template <typename Element, int kBits>
struct PlaneAtoms {
  static_assert(kBits >= 1 && kBits <= 3, "bit planes hold 1, 2 or 3 bits");
  using P = Pair<Element>;
  using C = PairConst<Element>;
  static constexpr int kAtoms = 4, kWords = kBits, kLaneStride = 1;
  static constexpr uint32_t kMagic = P::kMagic;
  static constexpr uint32_t kBias = kMagic + (1u << (kBits - 1)) * 0x10001u;  // magic + 2**(bits-1), both halves
  // Field offsets that fit under the exponent as they are: 0 .. kWindow - kBits (fp16: 10 bits).
  static constexpr int kWindow = C::kMantissa / kBits * kBits;
  // (a & b) | c: immLut = (0xf0 & 0xcc) | 0xaa.
  static constexpr uint32_t kAndOr = 0xea;

  static __device__ __forceinline__ void load_at(uint32_t const* src, uint32_t (&w)[kWords]) {
    load_planes<kWords>(src, w);
  }
  static __device__ __forceinline__ void convert(uint32_t const (&w)[kWords], int u, uint32_t (&a)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      int const p = 4 * u + r;
      if (kBits <= 2) {  // the field at offset o of its word, shifted down by whole windows to bit e
        int const o = kBits * (p % (16 / kBits)), e = o % kWindow;
        uint32_t const f = lop3<kAndOr>(w[kBits == 1 ? 0 : p / 8] >> (o - e), ((1u << kBits) - 1) * 0x10001u << e, kMagic);
        a[r] = P::fma(f, C::inv_pow2(e), C::neg_int((1u << (C::kMantissa - e)) + (1u << (kBits - 1))));
      } else {
        a[r] = P::sub(magic_field3(w, p), kBias);
      }
    }
  }
  // 3 bits: magic + q of pair p, exact: the top bit from plane 2 moved to bit 2 of each half, then
  // (lo & 3) | top | magic.
  static __device__ __forceinline__ uint32_t magic_field3(uint32_t const (&w)[kWords], int p) {
    uint32_t const lo = w[p / 8] >> (2 * (p % 8));
    uint32_t const top = p >= 2 ? w[kWords - 1] >> (p - 2) : w[kWords - 1] << (2 - p);
    return lop3<kAndOr>(lo, 0x00030003u, (top & 0x00040004u) | kMagic);
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
  static constexpr int kAtoms = 1, kWords = 1, kLaneStride = 1;
  static constexpr uint32_t kMagicBytes = ((P::kMagic >> 8) & 0xffu) * 0x01010101u;  // 0x64 / 0x43 in every byte
  static constexpr uint32_t kBias = P::kMagic + 64u * 0x10001u;              // magic + 2**6
  // a & (b ^ c): immLut = 0xf0 & (0xcc ^ 0xaa).
  static constexpr uint32_t kAndXorMask = 0x60;

  static __device__ __forceinline__ void load_at(uint32_t const* src, uint32_t (&w)[1]) { load_planes<1>(src, w); }
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
