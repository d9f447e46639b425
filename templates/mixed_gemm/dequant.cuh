// Fast int4/int8 -> fp16 converters for the mixed-input GEMM (seeds 000, 001, 003).
//
// No cvt instructions: an integer q placed in the mantissa of an fp16 whose exponent field is 25
// (0x6400 = 1024.0) reads as 1024 + q, exactly, because fp16 has 10 mantissa bits and q < 1024.
// Subtracting (1024 + z) then gives q - z exactly, so the zero point costs nothing extra.
//
// Register contract (what prepack arranges, see mixed_gemm/formats/kernel_layout.py):
//   int4: one 32-bit word holds 8 nibbles; nibble p sits in bits [4p, 4p+4).
//         lop3 with mask 0x000f000f picks nibbles (0, 4) into the (low, high) fp16 of a half2,
//         0x00f000f0 picks (1, 5) scaled by 16, and the same on word >> 8 picks (2, 6) and (3, 7).
//         So the word yields half2 pairs (0,4) (1,5) (2,6) (3,7): prepack stores the two mma.sync
//         B-fragment registers of two n8 tiles in that order.
//   int8: one word holds 4 bytes; prmt with selectors 0x5250 / 0x5351 builds (byte0, byte2) and
//         (byte1, byte3) under the 0x64 exponent byte.
#pragma once

#include <cuda_fp16.h>
#include <cstdint>

namespace mixed_gemm {

// fp16 bit patterns, both halves of a half2.
constexpr uint32_t kF16Magic1024 = 0x64006400u;   // 1024.0
constexpr uint32_t kF16OneSixteenth = 0x2c002c00u;  // 1/16

template <uint32_t kMask>
__device__ __forceinline__ uint32_t lop3_and_or_magic(uint32_t a) {
  // (a & mask) | 0x64006400 in one instruction; immLut = (0xf0 & 0xcc) | 0xaa = 0xea.
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "n"(kMask), "n"(kF16Magic1024));
  return d;
}

__device__ __forceinline__ uint32_t hsub2_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t hfma2_u32(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// Per-column constants for one n8 tile: both halves of each half2 hold the same column's value.
struct ColumnDequant {
  uint32_t scale;   // (s, s)
  uint32_t zero1024;  // (1024 + z, 1024 + z): subtrahend for low-nibble / byte lanes
  uint32_t zero64;    // (-(64 + z), -(64 + z)): addend for the high-nibble fma (int4 only)
};

// Build the constants from one fp16 scale and one fp16 zero point (an integer value for AWQ/GPTQ).
template <int kBits>
__device__ __forceinline__ ColumnDequant make_column_dequant(__half s, __half z) {
  ColumnDequant c;
  c.scale = half2_bits(__half2half2(s));
  __half2 z2 = __half2half2(z);
  c.zero1024 = half2_bits(__hadd2(z2, __half2half2(__ushort_as_half(0x6400))));
  if (kBits == 4) {
    c.zero64 = half2_bits(__hneg2(__hadd2(z2, __half2half2(__ushort_as_half(0x5400)))));  // 64
  } else {
    c.zero64 = 0;
  }
  return c;
}

// int4: one word -> B fragments of two n8 tiles: out[0..1] for tile `lo`, out[2..3] for tile `hi`.
// Every value is exact up to the final multiply by s: (q - z) is a small integer in fp16.
__device__ __forceinline__ void dequant_u4x8(uint32_t w, ColumnDequant const& lo, ColumnDequant const& hi,
                                             uint32_t (&out)[4]) {
  constexpr uint32_t kBottom = 0x000f000fu, kTop = 0x00f000f0u;
  uint32_t const w8 = w >> 8;
  uint32_t h0 = lop3_and_or_magic<kBottom>(w);   // 1024 + q0 | 1024 + q4
  uint32_t h1 = lop3_and_or_magic<kTop>(w);      // 1024 + 16 q1 | 1024 + 16 q5
  uint32_t h2 = lop3_and_or_magic<kBottom>(w8);  // nibbles 2, 6
  uint32_t h3 = lop3_and_or_magic<kTop>(w8);     // nibbles 3, 7
  out[0] = hmul2_u32(hsub2_u32(h0, lo.zero1024), lo.scale);
  out[1] = hmul2_u32(hfma2_u32(h1, kF16OneSixteenth, lo.zero64), lo.scale);  // (64 + q) - (64 + z)
  out[2] = hmul2_u32(hsub2_u32(h2, hi.zero1024), hi.scale);
  out[3] = hmul2_u32(hfma2_u32(h3, kF16OneSixteenth, hi.zero64), hi.scale);
}

// int8: one word -> the B fragment (2 registers) of one n8 tile.
__device__ __forceinline__ void dequant_u8x4(uint32_t w, ColumnDequant const& c, uint32_t (&out)[2]) {
  uint32_t h0, h1;
  asm("prmt.b32 %0, %1, %2, 0x5250;\n" : "=r"(h0) : "r"(w), "r"(0x64646464u));  // byte0 | byte2
  asm("prmt.b32 %0, %1, %2, 0x5351;\n" : "=r"(h1) : "r"(w), "r"(0x64646464u));  // byte1 | byte3
  out[0] = hmul2_u32(hsub2_u32(h0, c.zero1024), c.scale);
  out[1] = hmul2_u32(hsub2_u32(h1, c.zero1024), c.scale);
}

}  // namespace mixed_gemm
