// The sm90a weight layout's atom as registers: one lane's words -> its mma.sync.m16n8k16 A fragment
// of exact signed codes, for the kernels that read that layout outside the CUTLASS 3.x collective
// (gemv/, dequant_mm/dequant_sm90a.cuh). Layout contract: mixed_gemm/kernels/sm90a/layout.py.
// Its own folder because templates/common feeds every family's cache key: a header added there
// re-keys, and so rebuilds, every kernel of every family.
#pragma once

#include <cstdint>

#include "common/dequant.cuh"

namespace mixed_gemm {

template <uint32_t kLut>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return d;
}
// (a & b) ^ c: immLut = (0xf0 & 0xcc) ^ 0xaa.
constexpr uint32_t kAndXor = 0x6a;

// Streamed once: keep it out of L1 (it would only evict x).
__device__ __forceinline__ uint32_t ld_stream(uint32_t const* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream2(uint32_t const* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Signed codes of one lane's atom words -> the four A-fragment registers (q' as exact halves):
// a0 = rows g (k 2t, 2t+1), a1 = rows g+8 (same k), a2 = rows g (k 2t+8, 2t+9), a3 = rows g+8.
// Stored int4 nibble 4 k0 + 2 k2 + n1 holds q ^ 8 (= q' in two's complement), so pairs (0,4)
// (1,5) (2,6) (3,7) are a0..a3. The lop3 masks a nibble into an fp16 mantissa under the 1024.0
// exponent and flips its top bit in the same instruction (magic ^ 8), giving 1024 + q; one
// subtraction of 1032 leaves q - 8 = q' exactly. fp16 takes the odd nibbles in place (x16, undone
// by an fma with 1/16); bf16's 7-bit mantissa cannot hold them there, so it shifts instead.
template <typename Element, int kBits>
struct AtomConvert;

template <>
struct AtomConvert<cutlass::half_t, 4> {
  static __device__ __forceinline__ void run(uint32_t const* w, uint32_t (&a)[4]) {
    using P = Pair<cutlass::half_t>;
    uint32_t const lo = w[0], hi = w[0] >> 8;
    a[0] = P::sub(lop3<kAndXor>(lo, 0x000f000fu, 0x64086408u), 0x64086408u);         // - 1032
    a[2] = P::sub(lop3<kAndXor>(hi, 0x000f000fu, 0x64086408u), 0x64086408u);
    a[1] = P::fma(lop3<kAndXor>(lo, 0x00f000f0u, 0x64806480u), 0x2c002c00u, 0xd480d480u);  // x 1/16 - 72
    a[3] = P::fma(lop3<kAndXor>(hi, 0x00f000f0u, 0x64806480u), 0x2c002c00u, 0xd480d480u);
  }
};

template <>
struct AtomConvert<cutlass::bfloat16_t, 4> {
  static __device__ __forceinline__ void run(uint32_t const* w, uint32_t (&a)[4]) {
    using P = Pair<cutlass::bfloat16_t>;
    // 0x4308 = 136.0 = 128 + 8 (bf16): 128 + q after the flip, q - 8 after the subtraction.
#pragma unroll
    for (int i = 0; i < 4; ++i)  // nibble pair (i, i + 4) is register i
      a[i] = P::sub(lop3<kAndXor>(w[0] >> (4 * i), 0x000f000fu, 0x43084308u), 0x43084308u);
  }
};

template <>
struct AtomConvert<cutlass::half_t, 8> {
  static __device__ __forceinline__ void run(uint32_t const* w, uint32_t (&a)[4]) {
    using P = Pair<cutlass::half_t>;
    // Byte 4 k2 + 2 k0 + n1: word k2, bytes (0, 2) are rows g, bytes (1, 3) rows g + 8. Flipping
    // the top bits gives q; under 0x64 (1024.0) a byte reads 1024 + q; minus 1152 is q - 128.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t const u = w[h] ^ 0x80808080u;
      a[2 * h] = P::sub(prmt(u, 0x64646464u, 0x4240u), 0x64806480u);
      a[2 * h + 1] = P::sub(prmt(u, 0x64646464u, 0x4341u), 0x64806480u);
    }
  }
};

template <>
struct AtomConvert<cutlass::bfloat16_t, 8> {
  static __device__ __forceinline__ void run(uint32_t const* w, uint32_t (&a)[4]) {
    // q - 128 does not fit a bf16 mantissa under one exponent: go through fp32 (2^23 + byte, one
    // subtraction), then one cvt packs two exact integers into bf16x2.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t const u = w[h] ^ 0x80808080u;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float const lo = __uint_as_float(prmt(u, 0x4b000000u, 0x7440u + r)) - 8388736.f;      // byte r
        float const hi = __uint_as_float(prmt(u, 0x4b000000u, 0x7442u + r)) - 8388736.f;      // byte r + 2
        uint32_t d;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
        a[2 * h + r] = d;
      }
    }
  }
};

// The weight from the exact codes: w = q' s + z', one fma per pair in the activation type, with
// (s, s) / (z', z') of rows g (registers 0, 2) and g + 8 (registers 1, 3).
template <typename Element>
__device__ __forceinline__ void atom_scale(uint32_t (&a)[4], uint32_t const (&s)[2], uint32_t const (&z)[2]) {
  using P = Pair<Element>;
#pragma unroll
  for (int r = 0; r < 4; ++r) a[r] = P::fma(a[r], s[r & 1], z[r & 1]);
}

}  // namespace mixed_gemm
