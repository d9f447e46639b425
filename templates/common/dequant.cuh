// Fast int4/int8 -> fp16/bf16 converters for the mixed-input GEMM (seeds 000, 001, 003).
//
// No cvt instructions. fp16: an integer q placed in the mantissa of an fp16 whose exponent field
// is 25 (0x6400 = 1024.0) reads as 1024 + q exactly (10 mantissa bits, q < 1024), so subtracting
// (1024 + z) yields q - z exactly and the zero point costs nothing extra. bf16 has 7 mantissa
// bits: int4 uses 0x4300 (128.0) the same way; int8 does not fit, so its bytes go into an fp32
// mantissa (0x4B000000 = 2^23) and the exact integer is cut back to bf16 by keeping the top 16
// bits (an integer below 256 has no bits below them).
//
// Word contract (what prepack arranges, see mixed_gemm/kernels/sm80/layout.py):
//   int4: 8 nibbles, nibble p in bits [4p, 4p+4). The word yields half2 pairs
//         (nibble 0, 4) (1, 5) (2, 6) (3, 7): the two B-fragment registers of two n8 tiles.
//         fp16 picks (1, 5) with mask 0x00f000f0 (values x16, undone by an fma with 1/16);
//         bf16 cannot (bit 7 is exponent there), so it shifts the word by 4, 8 and 12 instead.
//   int8: 4 bytes; pairs (byte 0, 2) (1, 3): the two B-fragment registers of one n8 tile.
//
// Zero modes, each computed exactly as written:
//   kSymmetric: (q - 2^(bits-1)) * s     kInteger: (q - z) * s, z an integer
//   kFloat:     (q - z) * s, z any float (HQQ)   kOffset: q * s + m (GGUF Q4_1, fine-grained zeros)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "cutlass/numeric_types.h"

#include "common/constants.cuh"

namespace mixed_gemm {

template <uint32_t kMask, uint32_t kMagic>
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a) {
  // (a & mask) | magic in one instruction; immLut = (0xf0 & 0xcc) | 0xaa = 0xea.
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "n"(kMask), "n"(kMagic));
  return d;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Packed 2-wide arithmetic on raw 32-bit registers, per element type.
template <typename Element>
struct Pair;

template <>
struct Pair<cutlass::half_t> {
  using raw = __half;
  using raw2 = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;  // 1024.0
  static __device__ __forceinline__ uint32_t bits(raw2 v) { return *reinterpret_cast<uint32_t*>(&v); }
  static __device__ __forceinline__ raw2 val(uint32_t u) { return *reinterpret_cast<raw2*>(&u); }
  static __device__ __forceinline__ uint32_t sub(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  static __device__ __forceinline__ uint32_t mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  static __device__ __forceinline__ uint32_t fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  }
  static __device__ __forceinline__ uint32_t splat(raw v) { return bits(__half2half2(v)); }
  static __device__ __forceinline__ uint32_t splat_const(float v) { return bits(__float2half2_rn(v)); }
  static __device__ __forceinline__ raw2 from_floats(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float2 to_floats(raw2 v) { return __half22float2(v); }
};

template <>
struct Pair<cutlass::bfloat16_t> {
  using raw = __nv_bfloat16;
  using raw2 = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;  // 128.0
  static __device__ __forceinline__ uint32_t bits(raw2 v) { return *reinterpret_cast<uint32_t*>(&v); }
  static __device__ __forceinline__ raw2 val(uint32_t u) { return *reinterpret_cast<raw2*>(&u); }
  // cuda_bf16.h picks sub/mul.bf16x2 on sm_90 and an fma form on sm_80 (no cvt either way).
  static __device__ __forceinline__ uint32_t sub(uint32_t a, uint32_t b) { return bits(__hsub2(val(a), val(b))); }
  static __device__ __forceinline__ uint32_t mul(uint32_t a, uint32_t b) { return bits(__hmul2(val(a), val(b))); }
  static __device__ __forceinline__ uint32_t fma(uint32_t a, uint32_t b, uint32_t c) {
    return bits(__hfma2(val(a), val(b), val(c)));
  }
  static __device__ __forceinline__ uint32_t splat(raw v) { return bits(__bfloat162bfloat162(v)); }
  static __device__ __forceinline__ uint32_t splat_const(float v) { return bits(__float2bfloat162_rn(v)); }
  static __device__ __forceinline__ raw2 from_floats(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ float2 to_floats(raw2 v) { return __bfloat1622float2(v); }
};

// Per-column constants for one n8 tile; both halves of each pair hold that column's value.
struct ColumnDequant {
  uint32_t scale;  // (s, s)
  uint32_t zsub;   // subtracted from the magic-biased value: magic + z for integer zeros, magic otherwise
  uint32_t zfma;   // fp16 int4 high nibble: -(magic/16 + z) (or -(magic/16)), added after the x 1/16
  uint32_t extra;  // z (kFloat) or m (kOffset)
};

template <typename Element, int kBits, ZeroMode kMode>
struct Dequantizer {
  using P = Pair<Element>;
  using raw = typename P::raw;
  static constexpr bool kF16 = std::is_same<Element, cutlass::half_t>::value;
  // int8 on bf16 converts to an exact q first (see header), so its zero is subtracted after.
  static constexpr bool kFusedZero = (kMode == ZeroMode::kSymmetric || kMode == ZeroMode::kInteger) &&
                                     !(kBits == 8 && !kF16);

  static __device__ __forceinline__ ColumnDequant column(raw s, raw z) {
    ColumnDequant c;
    c.scale = P::splat(s);
    float const magic = kF16 ? 1024.f : 128.f;
    uint32_t zz = kMode == ZeroMode::kSymmetric ? P::splat_const(float(1 << (kBits - 1))) : P::splat(z);
    if (kFusedZero) {
      c.zsub = P::fma(zz, P::splat_const(1.f), P::splat_const(magic));           // magic + z, exact
      c.zfma = P::fma(zz, P::splat_const(-1.f), P::splat_const(-magic / 16.f));  // -(magic/16 + z)
      c.extra = 0;
    } else {
      c.zsub = P::splat_const(magic);
      c.zfma = P::splat_const(-magic / 16.f);
      c.extra = zz;
    }
    return c;
  }

  // Exact (q - z) or q  ->  the weight value.
  static __device__ __forceinline__ uint32_t finish(uint32_t t, ColumnDequant const& c) {
    if (kMode == ZeroMode::kOffset) return P::fma(t, c.scale, c.extra);             // q s + m
    if (kMode == ZeroMode::kFloat || !kFusedZero) t = P::sub(t, c.extra);           // q - z
    return P::mul(t, c.scale);                                                       // (q - z) s
  }

  // int4: one word -> B fragments of two n8 tiles: out[0..1] for `lo`, out[2..3] for `hi`.
  static __device__ __forceinline__ void u4x8(uint32_t w, ColumnDequant const& lo, ColumnDequant const& hi,
                                              uint32_t (&out)[4]) {
    constexpr uint32_t kBottom = 0x000f000fu, kTop = 0x00f000f0u, kMagic = P::kMagic;
    if (kF16) {
      uint32_t const w8 = w >> 8;
      uint32_t const one16 = 0x2c002c00u;  // 1/16 in fp16
      out[0] = finish(P::sub(lop3_and_or<kBottom, kMagic>(w), lo.zsub), lo);
      out[1] = finish(P::fma(lop3_and_or<kTop, kMagic>(w), one16, lo.zfma), lo);
      out[2] = finish(P::sub(lop3_and_or<kBottom, kMagic>(w8), hi.zsub), hi);
      out[3] = finish(P::fma(lop3_and_or<kTop, kMagic>(w8), one16, hi.zfma), hi);
    } else {
      out[0] = finish(P::sub(lop3_and_or<kBottom, kMagic>(w), lo.zsub), lo);
      out[1] = finish(P::sub(lop3_and_or<kBottom, kMagic>(w >> 4), lo.zsub), lo);
      out[2] = finish(P::sub(lop3_and_or<kBottom, kMagic>(w >> 8), hi.zsub), hi);
      out[3] = finish(P::sub(lop3_and_or<kBottom, kMagic>(w >> 12), hi.zsub), hi);
    }
  }

  // The 4 words (registers) of chunk c of an atom -> B fragments of the atom's n8 tiles:
  // int4 chunk 0 fills all 8 tiles (word i: tiles 2i, 2i+1); int8 chunk c fills tiles 4c..4c+3.
  static __device__ __forceinline__ void chunk(uint32_t const* w, int c, ColumnDequant const (&cd)[8],
                                               uint32_t (&frag)[8][2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (kBits == 4) {
        uint32_t out[4];
        u4x8(w[i], cd[2 * i], cd[2 * i + 1], out);
        frag[2 * i][0] = out[0];
        frag[2 * i][1] = out[1];
        frag[2 * i + 1][0] = out[2];
        frag[2 * i + 1][1] = out[3];
      } else {
        uint32_t out[2];
        u8x4(w[i], cd[4 * c + i], out);
        frag[4 * c + i][0] = out[0];
        frag[4 * c + i][1] = out[1];
      }
    }
  }

  // int8: one word -> the B fragment (2 registers) of one n8 tile.
  static __device__ __forceinline__ void u8x4(uint32_t w, ColumnDequant const& c, uint32_t (&out)[2]) {
    if (kF16) {
      out[0] = finish(P::sub(prmt(w, 0x64646464u, 0x5250), c.zsub), c);  // 1024 + byte0 | 1024 + byte2
      out[1] = finish(P::sub(prmt(w, 0x64646464u, 0x5351), c.zsub), c);  // byte1 | byte3
    } else {
      // Each byte into an fp32 mantissa under 2^23, minus 2^23 (fp32, exact), top halves kept.
      float const magic = 8388608.f;
      uint32_t f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v = __uint_as_float(prmt(w, 0x4B000000u, 0x7540u | j)) - magic;
        f[j] = __float_as_uint(v);
      }
      out[0] = finish(prmt(f[0], f[2], 0x7632), c);  // q0 | q2
      out[1] = finish(prmt(f[1], f[3], 0x7632), c);  // q1 | q3
    }
  }
};

}  // namespace mixed_gemm
