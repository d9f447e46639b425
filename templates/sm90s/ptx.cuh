// The PTX the sm90s mainloop issues, wrapped: register-A wgmma, shared-memory barriers (local and
// a cluster peer's), st.async into a peer's shared memory, TMA loads (plain and multicast), the
// phase offset's named barriers and wgmma's shared-memory descriptor. Device side only.
#pragma once

#include <cstdint>
#include <utility>

#include "cute/arch/mma_sm90_gmma.hpp"

#include "sm90s/params.cuh"

namespace mixed_gemm {
namespace sm90s {

// wgmma m64nNk16, A from registers, both operands K-major, fp32 accumulators.
template <class Element, int N>
struct RsOp;
#define MG_SM90S_RS_OP(N)                                                                                     \
  template <>                                                                                                \
  struct RsOp<cutlass::half_t, N> {                                                                          \
    using type = cute::SM90::GMMA::MMA_64x##N##x16_F32F16F16_RS<cute::SM90::GMMA::Major::K,                  \
                                                               cute::SM90::GMMA::Major::K>;                  \
  };                                                                                                         \
  template <>                                                                                                \
  struct RsOp<cutlass::bfloat16_t, N> {                                                                      \
    using type = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,                \
                                                                 cute::SM90::GMMA::Major::K>;                \
  };
MG_SM90S_RS_OP(16)
MG_SM90S_RS_OP(32)
MG_SM90S_RS_OP(64)
MG_SM90S_RS_OP(96)
#if defined(CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)  // the kernel's source defines it for these N
// Grouped token tiles between the powers of two, for ragged rows an expert: ~64 +- 8 (Mixtral at
// 256 tokens, Qwen3 at 1024) in one 80-row tile, ~32 +- 5 in 48, ~96 +- 10 in 112.
MG_SM90S_RS_OP(48)
MG_SM90S_RS_OP(80)
MG_SM90S_RS_OP(112)
#endif
MG_SM90S_RS_OP(128)
MG_SM90S_RS_OP(256)
#undef MG_SM90S_RS_OP

template <class Op, size_t... I>
__device__ __forceinline__ void wgmma_rs(uint32_t const (&a)[4], uint64_t desc, float (&d)[sizeof...(I)],
                                         std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], desc, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}

// ---- PTX: shared-memory barriers, TMA ----
__device__ __forceinline__ uint32_t smem_u32(void const* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Arrive on the barrier at the same offset in cluster CTA `cta`'s shared memory. CTA-scope release
// (PTX's default, as CUTLASS's ClusterBarrier::arrive): with `.release.cluster` ptxas puts
// MEMBAR.ALL.GPU + ERRBAR + CGAERRBAR before the arrive, a round trip through the loaded memory
// system on every consumer warp's path to its next wgmma, each k-tile. Nothing needs it: what
// the arrive orders before the peer's multicast are this CTA's reads of the stage, all complete
// by then (wgmma.wait_group 0, and the LDS results were consumed by the conversion).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cta.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_u32(bar)), "r"(cta) : "memory");
}
// Not volatile: a constant of the CTA, so the compiler may hoist it out of the k-tile loop.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of the cluster's CTAs: the barrier inits are visible cluster-wide past it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Four floats into cluster CTA `cta`'s shared memory at the offset of `dst` here, completing 16
// bytes on its barrier at the offset of `bar` (st.async: the writer does not wait).
__device__ __forceinline__ void st_async_f4(float* dst, float4 v, uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 rdst, rbar;\n"
      "mapa.shared::cluster.u32 rdst, %0, %6;\n"
      "mapa.shared::cluster.u32 rbar, %1, %6;\n"
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [rdst], {%2, %3, %4, %5}, [rbar];\n"
      "}\n" ::"r"(smem_u32(dst)), "r"(smem_u32(bar)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(cta)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

// L2 policies of the TMA loads: the weight streams once, x is re-read by every row tile.
constexpr uint64_t kEvictFirst = 0x12F0000000000000ull;
constexpr uint64_t kEvictLast = 0x14F0000000000000ull;

__device__ __forceinline__ void tma_2d(CUtensorMap const* map, uint64_t* bar, void* dst, int c0, int c1, uint64_t hint) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "l"(hint)
      : "memory");
}
// The box lands at the same offset in every CTA of `mask`, each CTA's barrier at `bar`'s offset
// receiving its bytes.
__device__ __forceinline__ void tma_2d_multicast(CUtensorMap const* map, uint64_t* bar, void* dst, int c0, int c1,
                                                 uint16_t mask, uint64_t hint) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint"
      " [%0], [%1, {%4, %5}], [%2], %3, %6;\n" ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "h"(mask), "r"(c0),
      "r"(c1), "l"(hint)
      : "memory");
}
__device__ __forceinline__ void tma_3d(CUtensorMap const* map, uint64_t* bar, void* dst, int c0, int c1, int c2,
                                       uint64_t hint) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1),
      "r"(c2), "l"(hint)
      : "memory");
}
__device__ __forceinline__ void tma_4d(CUtensorMap const* map, uint64_t* bar, void* dst, int c0, int c1, int c2, int c3,
                                       uint64_t hint) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0),
      "r"(c1), "r"(c2), "r"(c3), "l"(hint)
      : "memory");
}
// 16 bytes global -> shared, L2-cached only; `bytes` 0 writes zeros (a row or column past the data).
__device__ __forceinline__ void cp_async_16(void* dst, void const* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes)
               : "memory");
}
// Arrive on `bar` once this thread's earlier cp.asyncs have landed (noinc: counted in the init).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Generic-proxy writes (cp.async) made visible to the async proxy (wgmma's shared-memory reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void prefetch_map(CUtensorMap const* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
// Named barriers of `Threads` threads: the phase offset's turn barriers (ids 2 and 3: one warpgroup
// syncs, the other arrives), the gather producer's (id 1) and the staged epilogue's (4 .. 7, one a warpgroup).
// (Immediate ids: ptxas then reserves only the hardware barriers up to the largest, not all 16.)
template <int Id, int Threads>
__device__ __forceinline__ void turn_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "n"(Threads) : "memory");
}
template <int Id, int Threads>
__device__ __forceinline__ void turn_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(Id), "n"(Threads) : "memory");
}

// wgmma's shared-memory descriptor of a K-major, 128-byte-swizzled B tile (8-row groups 1024
// bytes apart); a k16 step inside a 64-element panel advances the start address by 32 bytes.
// Low word: start address >> 4 (14 bits), leading-byte offset 1; high word: stride 1024 >> 4 and
// the 128-byte swizzle mode. Kept as two words so a k16 step is one 32-bit add on the low word:
// shared addresses stay below 256 KB, so start + offset never carries out of its 14 bits.
constexpr uint32_t kDescSw128Hi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t desc_sw128_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t desc_sw128(uint32_t lo) { return (uint64_t(kDescSw128Hi) << 32) | lo; }

}  // namespace sm90s
}  // namespace mixed_gemm
