// How the decode and dequantize kernels read a weight, per stored width: one lane's words of a
// block of K atoms (16 x 16) -> the lane's mma.sync.m16n8k16 A fragment of each atom, as exact
// q' = q - 2**(bits-1) pairs (then w = q' s + z', atom_scale). Layout contracts:
// mixed_gemm/kernels/sm90a/layout.py (4 and 8 bits) and mixed_gemm/kernels/gemv/lowbit_layout.py
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
// load_at(src, w) from the lane's first word; the dense ones convert(w, u, a) (atom u's A fragment);
// the 1:2-sparse one (kSparse) convert_sp(w, h, a) (mma.sp h's compressed A fragment) and meta(w)
// (the metadata word the lane supplies).
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
  // The magic whose exponent makes bit e of the mantissa worth 1: a field q at bit e reads
  // 2**(kMantissa - e) + q exactly (the decode kernels' `_ds` raw codes).
  static constexpr uint32_t magic(int e) { return splat(uint32_t(kExpBias + kMantissa - e) << kMantissa); }
  static constexpr uint32_t one() { return splat(uint32_t(kExpBias) << kMantissa); }
  // -v for an integer 1 <= v < 2**(kMantissa + 1)
  static constexpr uint32_t neg_int(uint32_t v) {
    return splat(0x8000u | uint32_t(kExpBias + log2i(v)) << kMantissa | (v - (1u << log2i(v))) << (kMantissa - log2i(v)));
  }
};
static_assert(PairConst<cutlass::half_t>::neg_int(1026) == 0xe402e402u && PairConst<cutlass::half_t>::inv_pow2(4) == 0x2c002c00u,
              "fp16 constants");
static_assert(PairConst<cutlass::bfloat16_t>::neg_int(130) == 0xc302c302u, "bf16 constants");
static_assert(PairConst<cutlass::half_t>::magic(0) == 0x64006400u && PairConst<cutlass::half_t>::magic(8) == 0x44004400u &&
                  PairConst<cutlass::bfloat16_t>::magic(0) == 0x43004300u && PairConst<cutlass::half_t>::one() == 0x3c003c00u,
              "magic constants");

// f(integral_constant<i>) for 0 <= i < kN: i is known once the caller's loop is unrolled, so the
// chain of compares folds away and f may use i in constant expressions.
template <int kN, typename F>
__device__ __forceinline__ void with_index(int i, F&& f) {
  if constexpr (kN > 0) {
    if (i == kN - 1) {
      f(std::integral_constant<int, kN - 1>{});
    } else {
      with_index<kN - 1>(i, f);
    }
  }
}

// Atom kU's four registers of W's raw codes (`_ds`, RawSums): pairs 4 kU .. 4 kU + 3.
template <typename W, int kU>
__device__ __forceinline__ void raw_atom(uint32_t const (&w)[W::kWords], uint32_t (&a)[4]) {
  a[0] = W::template raw_pair<4 * kU>(w);
  a[1] = W::template raw_pair<4 * kU + 1>(w);
  a[2] = W::template raw_pair<4 * kU + 2>(w);
  a[3] = W::template raw_pair<4 * kU + 3>(w);
}

// Deferred group scaling's raw codes (`_ds`, atoms/deferred.cuh), every lowbit width: raw(w, u, a)
// puts pair p's field at bit e(p) under its own magic(e(p)), one lop3 per pair and no fma, so the
// mma multiplies 2**(M - e) + q. The offsets' sums then come from the one sums mma per atom that
// X needs anyway (shared by the warp's strips) when
//   - e depends on the register r = p % 4 alone: every atom's A fragment of magics is the same
//     four registers (else the compiler rebuilds it per atom: 2-4 MOVs);
//   - register r + 1 (rows g + 8) sits kCoupleStep bits above r (rows g, r even): its magic is
//     2**-step times r's, so rows g's offsets Y give rows g + 8's.
// kSums, that mma's A fragment: r's magic for r even (rows g: Y), ones for r odd (rows g + 8: X).
template <typename Element>
struct RawSums {
  using C = PairConst<Element>;
  template <typename W>
  static constexpr bool valid() {
    for (int p = 0; p < 16; ++p)
      if (W::raw_bit(p) != W::raw_bit(p % 4) || W::raw_bit(p) < 0 || W::raw_bit(p) + W::kRawBits > C::kMantissa)
        return false;
    return W::raw_bit(1) == W::raw_bit(0) + W::kCoupleStep && W::raw_bit(3) == W::raw_bit(2) + W::kCoupleStep;
  }
  template <typename W>
  static __device__ __forceinline__ void sums(uint32_t (&a)[4]) {
    a[0] = C::magic(W::raw_bit(0));
    a[1] = C::one();
    a[2] = C::magic(W::raw_bit(2));
    a[3] = C::one();
  }
};

// (a & b) | c: immLut = (0xf0 & 0xcc) | 0xaa.
constexpr uint32_t kAndOr = 0xea;

// 1 and 2 bits: a block is 4 atoms (k64); codes are unsigned, in bit planes so that a pair's two
// values sit in the two halves of a word at the same offset (one mask extracts both):
//   2-bit plane, words 0 (atoms 0, 1) and 1 (atoms 2, 3): pair p at bits 2 (p % 8) and 16 + 2 (p % 8);
//   1-bit plane (1 bit: the code): pair p at bits p and 16 + p.
// The field goes under the exponent of 1024.0 (fp16) / 128.0 (bf16) with one lop3, so the half reads
// magic + q exactly (no per-element cvt). A field stays where it lies when it fits the mantissa
// (bit e: the half reads magic + q 2**e, still exact), and one fma by 2**-e then gives q' exactly:
// a shift per word and window of the mantissa's width instead of one per pair. At 2 bits the decode
// kernel issues ~17 instructions per atom besides the loads, so the 4 shifts an atom saved are what
// it spends converting.
template <typename Element_, int kBits>
struct PlaneAtoms {
  static_assert(kBits == 1 || kBits == 2, "bit planes hold 1 or 2 bits (3 bits: Field3Atoms)");
  using Element = Element_;
  using P = Pair<Element>;
  using C = PairConst<Element>;
  static constexpr int kAtoms = 4, kWords = kBits, kLaneStride = 1;
  static constexpr uint32_t kMagic = P::kMagic;
  // Field offsets that fit under the exponent as they are: 0 .. kWindow - kBits (fp16: 10 bits).
  static constexpr int kWindow = C::kMantissa / kBits * kBits;

  static __device__ __forceinline__ void load_at(uint32_t const* src, uint32_t (&w)[kWords]) {
    load_planes<kWords>(src, w);
  }
  static __device__ __forceinline__ void convert(uint32_t const (&w)[kWords], int u, uint32_t (&a)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // the field at offset o of its word, shifted down by whole windows to bit e
      int const p = 4 * u + r, o = kBits * (p % (16 / kBits)), e = o % kWindow;
      uint32_t const f = lop3<kAndOr>(w[kBits == 1 ? 0 : p / 8] >> (o - e), ((1u << kBits) - 1) * 0x10001u << e, kMagic);
      a[r] = P::fma(f, C::inv_pow2(e), C::neg_int((1u << (C::kMantissa - e)) + (1u << (kBits - 1))));
    }
  }

  // `_ds` raw codes (RawSums): e(p) = kBits r, but bf16 2 bits puts registers 2 and 3 at bits 2 and 4
  // (bits 4 and 6 would leave the 7-bit mantissa). The shifts: fp16 2 bits >> 8 for a word's odd
  // atom (the converter's one shift); bf16 2 bits >> 2, 8, 10 (two); 1 bit >> 4, 8, 12 (one).
  static constexpr int kRawBits = kBits, kCoupleStep = kBits, kPerWord = 16 / kBits;
  static constexpr int raw_bit(int p) { return kBits * (p % 4) - (!C::kF16 && kBits == 2 && p % 4 >= 2 ? 2 : 0); }
  static constexpr int raw_shift(int p) { return kBits * (p % kPerWord) - raw_bit(p); }
  template <int kP>  // kP a template argument: the shift's loops run at compile time, never in SASS
  static __device__ __forceinline__ uint32_t raw_pair(uint32_t const (&w)[kWords]) {
    constexpr int sh = raw_shift(kP), e = raw_bit(kP);
    return lop3<kAndOr>(w[kP / kPerWord] >> sh, ((1u << kBits) - 1) * 0x10001u << e, C::magic(e));
  }
  static __device__ __forceinline__ void raw(uint32_t const (&w)[kWords], int u, uint32_t (&a)[4]) {
    with_index<kAtoms>(u, [&](auto ku) { raw_atom<PlaneAtoms, decltype(ku)::value>(w, a); });
  }
};
template <typename Element>
struct WeightAtoms<Element, 1> : PlaneAtoms<Element, 1> {};
template <typename Element>
struct WeightAtoms<Element, 2> : PlaneAtoms<Element, 2> {};

// 3 bits: a block is 4 atoms (k64), 3 words per lane, the whole 3-bit code of a pair's value in one
// field so that one lop3 puts it under the magic's exponent (bit planes cost a shift and a lop3 per
// plane and pair: 16 of an atom's 33 instructions). Pair p < 15 is field p % 5 of word p / 5: bits
// 3 (p % 5) and 16 + 3 (p % 5). Pair 15 spreads over the bits left, 15 and 31: its code bit c is
// bit 15 (k0 = 0) / 31 (k0 = 1) of word c.
// The converter shifts each word once per mantissa window (fp16: fields 0-2 as they lie, 3-4 after
// >> (9 - c); bf16: 0-1, 2-3 after >> 6, 4 after >> (12 - c)). The last window's shift decreases
// with the word, so it leaves word c's bit 15 at bit kSpare + c: pair 15's code is three masks away
// from those shifted words (no shift of its own). Then one fma by 2**-e per pair gives q' exactly.
// Python mirrors: FIELD3_PER_WORD, FIELD3_SPARE_BIT (lowbit_layout.py; checked by the lowbit sources).
constexpr int kField3PerWord = 5, kField3SpareBit = 15;

template <typename Element_>
struct Field3Atoms {
  using Element = Element_;
  using P = Pair<Element>;
  using C = PairConst<Element>;
  static constexpr int kAtoms = 4, kWords = 3, kLaneStride = 1;
  static constexpr uint32_t kMagic = P::kMagic;
  static constexpr int kSpare = C::kF16 ? 6 : 3;  // where the last window leaves word 0's bit 15
  static constexpr int last_shift(int c) { return kField3SpareBit - kSpare - c; }
  static constexpr int shift(int c, int j) {  // field j of word c: the shift that puts it in the mantissa
    return C::kF16 ? (j <= 2 ? 0 : last_shift(c)) : (j <= 1 ? 0 : j <= 3 ? 6 : last_shift(c));
  }
  static constexpr bool fits() {  // every field, and pair 15's three bits, inside the mantissa
    for (int c = 0; c < 3; ++c)
      for (int j = 0; j < kField3PerWord; ++j)
        if (3 * j - shift(c, j) < 0 || 3 * j - shift(c, j) + 3 > C::kMantissa) return false;
    return kSpare + 3 <= C::kMantissa;
  }
  static_assert(fits(), "a 3-bit field does not fit the mantissa after its window's shift");

  static __device__ __forceinline__ uint32_t q_prime(uint32_t f, int e) {  // magic + q 2**e -> q - 4
    return P::fma(f, C::inv_pow2(e), C::neg_int((1u << (C::kMantissa - e)) + 4u));
  }
  static __device__ __forceinline__ void load_at(uint32_t const* src, uint32_t (&w)[kWords]) {
    load_planes<kWords>(src, w);
  }
  static __device__ __forceinline__ void convert(uint32_t const (&w)[kWords], int u, uint32_t (&a)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      int const p = 4 * u + r;
      if (p < 3 * kField3PerWord) {
        int const c = p / kField3PerWord, j = p % kField3PerWord, e = 3 * j - shift(c, j);
        a[r] = q_prime(lop3<kAndOr>(w[c] >> shift(c, j), 0x00070007u << e, kMagic), e);
      } else {
        uint32_t f = kMagic;
#pragma unroll
        for (int c = 0; c < 3; ++c) f = lop3<kAndOr>(w[c] >> last_shift(c), 0x00010001u << (kSpare + c), f);
        a[r] = q_prime(f, kSpare);
      }
    }
  }

  // `_ds` raw codes (RawSums): e(p) = 3 (p & 1), each field moved to bit 0 or 3 by a signed shift
  // (< 0: left; couples (4, 5) and (14, 15) cross words). Pair 15's code lies at bit 3, so its three
  // shifts (word c's bit 15 to bit 3 + c) are 12 - c, and word 0's serves pair 4 too: 9 shifts per
  // block (the converter's 3 for fp16, 6 for bf16).
  static constexpr int kRawBits = 3, kCoupleStep = 3;
  static constexpr int raw_bit(int p) { return 3 * (p & 1); }
  static constexpr int raw_shift(int p) { return 3 * (p % kField3PerWord) - raw_bit(p); }
  static constexpr int spare_shift(int c) { return kField3SpareBit - raw_bit(15) - c; }
  template <int kP>
  static __device__ __forceinline__ uint32_t raw_pair(uint32_t const (&w)[kWords]) {
    constexpr int e = raw_bit(kP);
    if constexpr (kP < 3 * kField3PerWord) {
      constexpr int sh = raw_shift(kP);
      uint32_t v = w[kP / kField3PerWord];
      if constexpr (sh >= 0) {
        v >>= sh;
      } else {
        v <<= -sh;  // word 1's field 0, 3 bits above word 0's field 4 (couple (4, 5))
      }
      return lop3<kAndOr>(v, 0x00070007u << e, C::magic(e));
    } else {
      uint32_t f = C::magic(e);
#pragma unroll
      for (int c = 0; c < 3; ++c) f = lop3<kAndOr>(w[c] >> spare_shift(c), 0x00010001u << (e + c), f);
      return f;
    }
  }
  static __device__ __forceinline__ void raw(uint32_t const (&w)[kWords], int u, uint32_t (&a)[4]) {
    with_index<kAtoms>(u, [&](auto ku) { raw_atom<Field3Atoms, decltype(ku)::value>(w, a); });
  }
};
template <typename Element>
struct WeightAtoms<Element, 3> : Field3Atoms<Element> {};

// 1:2-sparse 7 bits, read by mma.sp.m16n8k32 (sparse tensor cores): the mma skips the dropped
// half of every pair, so a pair costs half a prmt, half a subtraction and half an fma, where
// expanding it to a dense fragment and zeroing the dropped element cost five instructions per
// register (31 per atom). A block is 4 atoms (k64), two mma's: word 2 h + i of a lane is mma h's
// compressed A registers 2 i (rows g, bytes 0-1) and 2 i + 1 (rows g + 8, bytes 2-3), one byte per
// pair: the kept element's code in bits 0-6; bit 7 of the 16 bytes is the lane's metadata word
// (the lane supplies mma t >> 1's: the sparsity selector; layout contract: lowbit_layout.py).
template <typename Element>
struct WeightAtoms<Element, 7> {
  using P = Pair<Element>;
  static constexpr bool kSparse = true;
  static constexpr int kAtoms = 4, kWords = 4, kLaneStride = 1;
  static constexpr uint32_t kMagicBytes = ((P::kMagic >> 8) & 0xffu) * 0x01010101u;  // 0x64 / 0x43 in every byte
  static constexpr uint32_t kBias = P::kMagic + 64u * 0x10001u;              // magic + 2**6

  static __device__ __forceinline__ void load_at(uint32_t const* src, uint32_t (&w)[4]) { load_planes<4>(src, w); }
  // Metadata bit i (pair i % 8 of rows g + 8 (i / 8); 1: the second element is kept) is bit 7 of
  // byte i / 4 of word i % 4 and goes to bit 2 i: one shift per word. A chunk's nibble is then
  // (first's index 0 or 1) | (second's 2 or 3) << 2, bit 3 always set: 0x8, 0x9, 0xC, 0xD, all
  // valid (increasing) for mma.sp::ordered_metadata.
  static __device__ __forceinline__ uint32_t meta(uint32_t const (&w)[4]) {
    return 0x88888888u | ((w[0] >> 7) & 0x01010101u) | ((w[1] >> 5) & 0x04040404u) | ((w[2] >> 3) & 0x10101010u) |
           ((w[3] >> 1) & 0x40404040u);
  }
  // mma h's compressed A fragment as exact q' = q - 64: the metadata bits masked off, prmt puts two
  // codes under the magic's exponent (magic + code, exact), one subtraction.
  static __device__ __forceinline__ void convert_sp(uint32_t const (&w)[4], int h, uint32_t (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t const codes = w[2 * h + i] & 0x7f7f7f7fu;
      a[2 * i] = P::sub(prmt(codes, kMagicBytes, 0x4140u), kBias);
      a[2 * i + 1] = P::sub(prmt(codes, kMagicBytes, 0x4342u), kBias);
    }
  }
};

}  // namespace mixed_gemm
