// Deferred group scaling for the decode kernels (gemv `_ds`): the mma multiplies the codes as the
// converter's first instruction leaves them (an offset encoding, exact in the activation type), and
// the group's scale and zero are applied once per group to the fp32 sums:
//   sum_k w x = sum_k (q' s + z') x = (s mul) sum_k raw x + (z' - off s) X,   X = sum_k x,
// for raw = (q' + off) / mul (mul(h), off(h): rows g (h = 0) and g + 8 (h = 1) of the fragment).
// Per atom that drops the subtraction of the offset and the scale fma
// (6 of the 14 instructions of an fp16 int4 atom; 8 of bf16's), for a fold per group of 2 FFMAs per
// accumulator and one mma per atom (of ones, shared by the warp's strips) that gives X. The lowbit
// widths keep per-pair magics instead (RawLowbit below): a third FFMA per accumulator at the fold.
// Layout contracts: the sm90a atom (atoms/sm90a.cuh, mixed_gemm/kernels/sm90a/layout.py) and the
// lowbit layout (atoms/lowbit.cuh, mixed_gemm/kernels/gemv/lowbit_layout.py); not 1:2-sparse.
#pragma once

#include <cstdint>

#include "atoms/lowbit.cuh"
#include "atoms/sm90a.cuh"

namespace mixed_gemm {

template <typename Element, int kBits>
struct RawAtom;

// int4 and int8: every row's offset is a multiple of X, so the sums mma is of ones: X in every row.
template <typename Element>
struct RawOnes {
  static constexpr bool kRowSums = false;
  static __device__ __forceinline__ constexpr float lam(int) { return 0.f; }
  static __device__ __forceinline__ void sums(uint32_t (&a)[4]) {
    a[0] = a[1] = a[2] = a[3] = PairConst<Element>::one();
  }
};

// fp16 int4: a0/a2 (rows g) hold 1024 + q = q' + 1032; a1/a3 (rows g + 8, the odd nibbles kept in
// place) hold 1024 + 16 q = 16 (q' + 72). All below 2048: exact halves.
template <>
struct RawAtom<cutlass::half_t, 4> : RawOnes<cutlass::half_t> {
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
struct RawAtom<cutlass::bfloat16_t, 4> : RawOnes<cutlass::bfloat16_t> {
  static __device__ __forceinline__ constexpr float mul(int) { return 1.f; }
  static __device__ __forceinline__ constexpr float off(int) { return 136.f; }
  static __device__ __forceinline__ void run(uint32_t const* w, int, uint32_t (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = lop3<kAndXor>(w[0] >> (4 * i), 0x000f000fu, 0x43084308u);
  }
};

// fp16 int8: 1024 + (q' + 128) = q' + 1152.
template <>
struct RawAtom<cutlass::half_t, 8> : RawOnes<cutlass::half_t> {
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
struct RawAtom<cutlass::bfloat16_t, 8> : RawOnes<cutlass::bfloat16_t> {
  static __device__ __forceinline__ constexpr float mul(int) { return 1.f; }
  static __device__ __forceinline__ constexpr float off(int) { return 0.f; }
  static __device__ __forceinline__ void run(uint32_t const* w, int, uint32_t (&a)[4]) {
    AtomConvert<cutlass::bfloat16_t, 8>::run(w, a);
  }
};

// 1-3 bits (lowbit): the raw codes leave pair p at 2**(M - e(p)) + q (lowbit.cuh, RawSums), so per
// row half h the offsets sum to lam(h) Y, Y = sum_k 2**(M - e(k)) x over rows g's fields:
//   sum_k w x = s (part - lam(h) Y) + (z' - off s) X,   off = 2**(bits - 1) (q' = q - off).
// One lop3 per pair; the fma that placed the field and removed the magic is gone, for a third fma
// per accumulator at the fold and an A fragment of magics in the sums mma (kRowSums: rows g give Y,
// rows g + 8 give X). run(w, u, a): atom u of the lane's block words w.
template <typename W>
struct RawLowbit {
  using S = RawSums<typename W::Element>;
  static_assert(S::template valid<W>(), "raw codes: e by register alone, rows g + 8 kCoupleStep bits above rows g");
  static constexpr bool kRowSums = true;
  static __device__ __forceinline__ constexpr float mul(int) { return 1.f; }
  static __device__ __forceinline__ constexpr float off(int) { return float(1 << (W::kRawBits - 1)); }
  static __device__ __forceinline__ constexpr float lam(int h) { return h ? 1.f / float(1 << W::kCoupleStep) : 1.f; }
  static __device__ __forceinline__ void sums(uint32_t (&a)[4]) { S::template sums<W>(a); }
  static __device__ __forceinline__ void run(uint32_t const* w, int u, uint32_t (&a)[4]) {
    W::raw(reinterpret_cast<uint32_t const(&)[W::kWords]>(*w), u, a);
  }
};
template <typename Element>
struct RawAtom<Element, 1> : RawLowbit<PlaneAtoms<Element, 1>> {};
template <typename Element>
struct RawAtom<Element, 2> : RawLowbit<PlaneAtoms<Element, 2>> {};
template <typename Element>
struct RawAtom<Element, 3> : RawLowbit<Field3Atoms<Element>> {};

}  // namespace mixed_gemm
