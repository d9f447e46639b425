// Deferred group scaling for the decode kernels (gemv `_ds`): the mma multiplies the codes as the
// converter's first instruction leaves them (an offset encoding, exact in the activation type), and
// the group's scale and zero are applied once per group to the fp32 sums:
//   sum_k w x = sum_k (q' s + z') x = (s mul) sum_k raw x + (z' - off s) X,   X = sum_k x,
// for raw = (q' + off) / mul (mul(h), off(h): rows g (h = 0) and g + 8 (h = 1) of the fragment).
// Per atom that drops the subtraction of the offset and the scale fma
// (6 of the 14 instructions of an fp16 int4 atom; 8 of bf16's), for a fold per group of 2 FFMAs per
// accumulator and one mma per atom (of ones, shared by the warp's strips) that gives X.
// Layout contracts: the sm90a atom (atoms/sm90a.cuh, mixed_gemm/kernels/sm90a/layout.py) and the
// lowbit layout (atoms/lowbit.cuh, mixed_gemm/kernels/gemv/lowbit_layout.py); not 1:2-sparse.
#pragma once

#include <cstdint>

#include "atoms/lowbit.cuh"
#include "atoms/sm90a.cuh"

namespace mixed_gemm {

template <typename Element, int kBits>
struct RawAtom;

// fp16 int4: a0/a2 (rows g) hold 1024 + q = q' + 1032; a1/a3 (rows g + 8, the odd nibbles kept in
// place) hold 1024 + 16 q = 16 (q' + 72). All below 2048: exact halves.
template <>
struct RawAtom<cutlass::half_t, 4> {
  static __device__ __forceinline__ constexpr float mul(int h) { return h ? 1.f / 16.f : 1.f; }
  static __device__ __forceinline__ constexpr float off(int h) { return h ? 72.f : 1032.f; }
  static __device__ __forceinline__ void run(uint32_t const* w, int, uint32_t (&a)[4]) {
    uint32_t const lo = w[0], hi = w[0] >> 8;
    a[0] = lop3<kAndXor>(lo, 0x000f000fu, 0x64086408u);
    a[2] = lop3<kAndXor>(hi, 0x000f000fu, 0x64086408u);
    a[1] = lop3<kAndXor>(lo, 0x00f000f0u, 0x64806480u);
    a[3] = lop3<kAndXor>(hi, 0x00f000f0u, 0x64806480u);
  }
};

// bf16 int4: 128 + q = q' + 136 (below 256: exact in bf16's 8-bit significand).
template <>
struct RawAtom<cutlass::bfloat16_t, 4> {
  static __device__ __forceinline__ constexpr float mul(int) { return 1.f; }
  static __device__ __forceinline__ constexpr float off(int) { return 136.f; }
  static __device__ __forceinline__ void run(uint32_t const* w, int, uint32_t (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = lop3<kAndXor>(w[0] >> (4 * i), 0x000f000fu, 0x43084308u);
  }
};

// fp16 int8: 1024 + (q' + 128) = q' + 1152.
template <>
struct RawAtom<cutlass::half_t, 8> {
  static __device__ __forceinline__ constexpr float mul(int) { return 1.f; }
  static __device__ __forceinline__ constexpr float off(int) { return 1152.f; }
  static __device__ __forceinline__ void run(uint32_t const* w, int, uint32_t (&a)[4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t const u = w[h] ^ 0x80808080u;
      a[2 * h] = prmt(u, 0x64646464u, 0x4240u);
      a[2 * h + 1] = prmt(u, 0x64646464u, 0x4341u);
    }
  }
};

// bf16 int8: q' itself (no offset fits bf16's significand); only the scale fma is saved.
template <>
struct RawAtom<cutlass::bfloat16_t, 8> {
  static __device__ __forceinline__ constexpr float mul(int) { return 1.f; }
  static __device__ __forceinline__ constexpr float off(int) { return 0.f; }
  static __device__ __forceinline__ void run(uint32_t const* w, int, uint32_t (&a)[4]) {
    AtomConvert<cutlass::bfloat16_t, 8>::run(w, a);
  }
};

// 1-3 bits (lowbit): the converter's fma already leaves q' (one fma per pair places the field and
// removes the magic together: there is no offset encoding left to keep); only the scale fma is
// saved. run(w, u, a): atom u of the lane's block words w.
template <typename Element, typename W>
struct RawLowbit {
  static __device__ __forceinline__ constexpr float mul(int) { return 1.f; }
  static __device__ __forceinline__ constexpr float off(int) { return 0.f; }
  static __device__ __forceinline__ void run(uint32_t const* w, int u, uint32_t (&a)[4]) {
    W::convert(reinterpret_cast<uint32_t const(&)[W::kWords]>(*w), u, a);
  }
};
template <typename Element>
struct RawAtom<Element, 1> : RawLowbit<Element, PlaneAtoms<Element, 1>> {};
template <typename Element>
struct RawAtom<Element, 2> : RawLowbit<Element, PlaneAtoms<Element, 2>> {};
template <typename Element>
struct RawAtom<Element, 3> : RawLowbit<Element, Field3Atoms<Element>> {};

// The A fragment of an all-ones 16x16 matrix: mma(ones, x) gives X = sum_k x per token.
template <typename Element>
struct Ones;
template <>
struct Ones<cutlass::half_t> {
  static constexpr uint32_t kPair = 0x3c003c00u;
};
template <>
struct Ones<cutlass::bfloat16_t> {
  static constexpr uint32_t kPair = 0x3f803f80u;
};

}  // namespace mixed_gemm
