// What one SM's tensor pipe gives a register-A wgmma mainloop, without HBM, TMA or barriers:
// docs/notes/serving-mainloop.md, "wgmma throughput, register A against shared A".
//
// Every CTA (one per SM) has WGS warpgroups, each issuing batches of 8 wgmma m64nNk16 (one
// 128-deep k-tile of 64 weight rows) on the same shared-memory x tile, as the sm90s consumers do,
// in one of these modes:
//   ss  A from shared memory (the fp16 GEMMs' form), wait for each batch;
//   rs  A from registers that never change, wait for each batch;
//   cv  A from registers, double-buffered: the next k-tile's fragments made while this batch
//       runs (8 LDS, then CONV ALU instructions a thread: the conversion's count), wait each batch;
//   ov  cv with one batch in flight: batch i issued before batch i - 1 is waited for (`_ov`);
//   cs  A from shared memory, made by the same conversion while the previous batch runs: each
//       thread stores its 32 converted registers into its warpgroup's next A buffer (two of them),
//       then a proxy fence and the warpgroup's named barrier before the batch;
//   ph  cv with the two warpgroups taking turns to issue (named barriers, as sm90s's `_ph`);
//   po  ov with the same turns;
//   cf, of, pf  cv, ov and po with a wait on a completed mbarrier after each batch's commit, as
//       the sm90s mainloop waits for the next stage there: its branch keeps ptxas from moving the
//       conversion in between the batch's wgmmas (which it does in cv), and in cf ptxas then puts
//       the wait for the batch before the conversion (no overlap with the own batch; the shipped
//       kernels' SASS has the conversion before that wait);
//   il  cv with the conversion interleaved: after each wgmma of the batch, the next k-tile's
//       fragments of that k16 block (one LDS, four registers' ALU).
// Prints FMA per cycle per SM (peak: 2048 for fp16 wgmma on sm_90) and the share of peak.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I<cutlass>/include -Itemplates \
//        bench/wgmma_probe.cu -o wgmma_probe && ./wgmma_probe
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "cutlass/numeric_types.h"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "sm90s/ptx.cuh"

using namespace mixed_gemm::sm90s;

enum Mode { kSS = 0, kRS = 1, kCV = 2, kOV = 3, kCS = 4, kIL = 5, kPH = 6, kPO = 7, kCF = 8, kOF = 9, kPF = 10 };
constexpr int base_mode(int m) { return m == kCF ? kCV : m == kOF ? kOV : m == kPF ? kPO : m; }
constexpr int KB = 8;  // k16 blocks a batch (TK = 128)

template <int N>
struct SsOp {
  using type = void;
};
#define PROBE_SS_OP(N)                                                                                     \
  template <>                                                                                              \
  struct SsOp<N> {                                                                                         \
    using type = cute::SM90::GMMA::MMA_64x##N##x16_F32F16F16_SS<cute::SM90::GMMA::Major::K,                \
                                                                cute::SM90::GMMA::Major::K>;               \
  };
PROBE_SS_OP(16)
PROBE_SS_OP(32)
PROBE_SS_OP(64)
PROBE_SS_OP(128)
PROBE_SS_OP(256)
#undef PROBE_SS_OP

template <class Op, size_t... I>
__device__ __forceinline__ void wgmma_ss(uint64_t da, uint64_t db, float (&d)[sizeof...(I)], std::index_sequence<I...>) {
  Op::fma(da, db, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}

template <int kAcc>
__device__ __forceinline__ void fence_acc(float (&acc)[kAcc]) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) cute::warpgroup_fence_operand(acc[i]);
}

// The next k-tile's fragments: 8 LDS (the codes), then CONV ALU instructions spread over the 32
// registers, every register rewritten: one LOP3 each, then chains of OP: fp16x2 FMA (HFMA2, as the
// conversion's scale and zero), LOP3 (ALU pipe) or integer multiply-add (IMAD), CONV / 1000 picks
// (0, 1, 2), CONV % 1000 counts.
template <int OP>
__device__ __forceinline__ void alu(uint32_t& v, uint32_t m) {
  if constexpr (OP == 0) asm volatile("fma.rn.f16x2 %0, %0, %1, %1;\n" : "+r"(v) : "r"(m));
  if constexpr (OP == 1) asm volatile("lop3.b32 %0, %0, %1, %1, 0x6a;\n" : "+r"(v) : "r"(m));
  if constexpr (OP == 2) asm volatile("mad.lo.u32 %0, %0, %1, %1;\n" : "+r"(v) : "r"(m));
}
template <int CONV>
__device__ __forceinline__ void convert(uint32_t const* codes, uint32_t (&a)[KB][4], uint32_t magic) {
  uint32_t w[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = codes[j * 32];
  constexpr int kRounds = (CONV % 1000) / 32 > 0 ? (CONV % 1000) / 32 : 1;
#pragma unroll
  for (int r = 0; r < KB * 4; ++r) {
    uint32_t v;
    asm volatile("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(v) : "r"(w[r % 8] >> (r / 8)), "r"(0x000f000fu), "r"(magic));
#pragma unroll
    for (int i = 1; i < kRounds; ++i) alu<CONV / 1000>(v, magic);
    a[r / 4][r % 4] = v;
  }
}

// il: k16 block kb's share of convert().
template <int CONV>
__device__ __forceinline__ void convert_block(uint32_t const* codes, uint32_t (&a)[4], int kb, uint32_t magic) {
  uint32_t const w = codes[kb * 32];
  constexpr int kRounds = (CONV % 1000) / 32 > 0 ? (CONV % 1000) / 32 : 1;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t v;
    asm volatile("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(v) : "r"(w >> j), "r"(0x000f000fu), "r"(magic));
#pragma unroll
    for (int i = 1; i < kRounds; ++i) alu<CONV / 1000>(v, magic);
    a[j] = v;
  }
}

// cs: the converted fragments into A buffer `dst` (64 rows x 256 bytes), 16 bytes a store, the
// warpgroup's threads side by side (no bank conflicts; the layout is not wgmma's, the bytes are).
template <int CONV>
__device__ __forceinline__ void convert_to_smem(uint32_t const* codes, char* dst, uint32_t magic, int wg) {
  uint32_t a[KB][4];
  convert<CONV>(codes, a, magic);
  uint4* d = reinterpret_cast<uint4*>(dst) + (threadIdx.x % 128);
#pragma unroll
  for (int kb = 0; kb < KB; ++kb) d[kb * 128] = make_uint4(a[kb][0], a[kb][1], a[kb][2], a[kb][3]);
  fence_proxy_async();
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");  // the warpgroup's own barrier
}

template <int N, int WGS, int MODE, int CONV>
__global__ void __launch_bounds__(128 * WGS, 1) probe(int iters, long long* cycles, float* sink) {
  constexpr int kAcc = N / 2;
  constexpr int MB = base_mode(MODE);
  constexpr bool kFence = MB != MODE;
  using Rs = typename RsOp<cutlass::half_t, N>::type;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = smem_raw + 1024 + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  // x: two 64-element panels of N rows x 128 bytes (swizzled; the values are what was there:
  // throughput does not depend on them); then each warpgroup's A (ss) as 64 rows x 2 panels.
  char* x = smem;
  char* a_smem = smem + 2 * N * 128;  // ss: one A buffer a warpgroup; cs: two
  int const wg = threadIdx.x / 128;
  // Fill shared memory with small fp16 values (0x3c00 = 1.0 at 1/1024 scale: no infinities).
  for (int i = threadIdx.x; i < (2 * N * 128 + 2 * WGS * 64 * 256) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x14001400u ^ (i & 0x00ff00ffu);
  uint64_t* const done = reinterpret_cast<uint64_t*>(smem_raw);  // below the 1024-aligned tiles
  if (threadIdx.x == 0) {
    mbar_init(done, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) mbar_arrive(done);  // phase 0 completes
  fence_proxy_async();
  __syncthreads();

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  uint32_t a0[KB][4], a1[KB][4];
  uint32_t const magic = 0x64006400u ^ uint32_t(iters & 1);
#pragma unroll
  for (int kb = 0; kb < KB; ++kb)
#pragma unroll
    for (int j = 0; j < 4; ++j) a0[kb][j] = a1[kb][j] = 0x14001400u + kb + j;
  // The codes: the A buffers (unread by register-A wgmmas), as the ring's weight region is.
  uint32_t const* codes = reinterpret_cast<uint32_t const*>(a_smem) + (threadIdx.x % 128);
  uint32_t const xlo = desc_sw128_lo(smem_u32(x));
  char* const a_mine = a_smem + wg * 2 * 64 * 256;
  uint32_t alo = desc_sw128_lo(smem_u32(a_mine));

  auto batch = [&](uint32_t (&a)[KB][4]) {
    fence_acc(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      uint64_t const db = desc_sw128(xlo + uint32_t(((kb / 4) * N * 128 + (kb % 4) * 32) >> 4));
      if constexpr (MODE == kSS || MODE == kCS) {
        uint64_t const da = desc_sw128(alo + uint32_t(((kb / 4) * 64 * 128 + (kb % 4) * 32) >> 4));
        wgmma_ss<typename SsOp<N>::type>(da, db, acc, std::make_index_sequence<kAcc>{});
      } else {
        wgmma_rs<Rs>(a[kb], db, acc, std::make_index_sequence<kAcc>{});
      }
    }
    cute::warpgroup_commit_batch();
    fence_acc(acc);
    if constexpr (kFence) mbar_wait(done, 0);  // complete since the start: the ring wait's branch, nothing else
  };

  auto batch_il = [&](uint32_t (&a)[KB][4], uint32_t (&next)[KB][4], uint32_t const* c) {
    fence_acc(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      uint64_t const db = desc_sw128(xlo + uint32_t(((kb / 4) * N * 128 + (kb % 4) * 32) >> 4));
      wgmma_rs<Rs>(a[kb], db, acc, std::make_index_sequence<kAcc>{});
      convert_block<CONV>(c, next[kb], kb, magic);
    }
    cute::warpgroup_commit_batch();
    fence_acc(acc);
  };

  __syncthreads();
  long long const t0 = clock64();
  if constexpr (MB == kSS || MB == kRS) {
    for (int i = 0; i < iters; ++i) {
      batch(a0);
      cute::warpgroup_wait<0>();
    }
  } else if constexpr (MB == kCV) {
    convert<CONV>(codes, a0, magic);
    for (int i = 0; i < iters; i += 2) {
      batch(a0);
      convert<CONV>(codes + 256, a1, magic);
      cute::warpgroup_wait<0>();
      batch(a1);
      convert<CONV>(codes, a0, magic);
      cute::warpgroup_wait<0>();
    }
  } else if constexpr (MB == kPH || MB == kPO) {
    static_assert(WGS == 2, "turns between two warpgroups");
    // sm90s's turn barriers (ids 2 and 3): a warpgroup syncs on its own, arrives on the other's.
    auto take = [&] { wg == 0 ? turn_sync<2, 256>() : turn_sync<3, 256>(); };
    auto pass = [&] { wg == 0 ? turn_arrive<3, 256>() : turn_arrive<2, 256>(); };
    convert<CONV>(codes, a0, magic);
    if (wg == 1) pass();  // warpgroup 0 issues first
    if constexpr (MB == kPH) {
      for (int i = 0; i < iters; i += 2) {
        take();
        batch(a0);
        pass();
        convert<CONV>(codes + 256, a1, magic);
        cute::warpgroup_wait<0>();
        take();
        batch(a1);
        pass();
        convert<CONV>(codes, a0, magic);
        cute::warpgroup_wait<0>();
      }
    } else {
      take();
      batch(a0);
      pass();
      for (int i = 1; i < iters; i += 2) {
        convert<CONV>(codes + 256, a1, magic);
        take();
        batch(a1);
        pass();
        cute::warpgroup_wait<1>();
        convert<CONV>(codes, a0, magic);
        take();
        batch(a0);
        pass();
        cute::warpgroup_wait<1>();
      }
    }
    cute::warpgroup_wait<0>();
    if (wg == 0) take();  // warpgroup 1's last pass
  } else if constexpr (MB == kIL) {
    convert<CONV>(codes, a0, magic);
    for (int i = 0; i < iters; i += 2) {
      batch_il(a0, a1, codes + 256);
      cute::warpgroup_wait<0>();
      batch_il(a1, a0, codes);
      cute::warpgroup_wait<0>();
    }
  } else if constexpr (MB == kCS) {
    uint32_t const lo0 = alo, lo1 = alo + ((64 * 256) >> 4);
    convert_to_smem<CONV>(codes, a_mine, magic, wg);
    for (int i = 0; i < iters; i += 2) {
      alo = lo0;
      batch(a0);
      convert_to_smem<CONV>(codes + 256, a_mine + 64 * 256, magic, wg);
      cute::warpgroup_wait<0>();
      alo = lo1;
      batch(a0);
      convert_to_smem<CONV>(codes, a_mine, magic, wg);
      cute::warpgroup_wait<0>();
    }
  } else {
    convert<CONV>(codes, a0, magic);
    batch(a0);
    for (int i = 1; i < iters; i += 2) {
      convert<CONV>(codes + 256, a1, magic);  // a1's last reader (batch i - 2) was waited for below
      batch(a1);
      cute::warpgroup_wait<1>();              // batch i - 1 (a0) done
      convert<CONV>(codes, a0, magic);
      batch(a0);
      cute::warpgroup_wait<1>();              // batch i (a1) done
    }
    cute::warpgroup_wait<0>();
  }
  long long const t1 = clock64();
  __syncthreads();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * WGS + wg] = t1 - t0;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) s += acc[i];
  if (s == 1234.5f) sink[threadIdx.x] = s;  // keeps the accumulators live
}

template <int N, int WGS, int MODE, int CONV>
void run(int sms, int iters, long long* d_cycles, float* d_sink, long long* h_cycles) {
  auto kernel = probe<N, WGS, MODE, CONV>;
  int const smem = 2 * N * 128 + 2 * WGS * 64 * 256 + 2048;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<sms, 128 * WGS, smem>>>(iters / 8, d_cycles, d_sink);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  kernel<<<sms, 128 * WGS, smem>>>(iters, d_cycles, d_sink);
  cudaEventRecord(e1);
  cudaError_t const err = cudaEventSynchronize(e1);
  if (err != cudaSuccess) {
    std::printf("error %s\n", cudaGetErrorString(err));
    std::exit(1);
  }
  float ms = 0.f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaMemcpy(h_cycles, d_cycles, sizeof(long long) * sms * WGS, cudaMemcpyDeviceToHost);
  double mean = 0.0;
  for (int i = 0; i < sms * WGS; ++i) mean += double(h_cycles[i]);
  mean /= sms * WGS;
  double const fma_per_cta = double(WGS) * iters * KB * 64.0 * N * 16.0;
  double const per_cycle = fma_per_cta / mean;
  double const tflops = 2.0 * fma_per_cta * sms / (ms * 1e-3) / 1e12;
  static char const* names[] = {"ss", "rs", "cv", "ov", "cs", "il", "ph", "po", "cf", "of", "pf"};
  std::printf("| %s | %d | %d | %d | %.0f | %.0f | %.0f%% | %.0f |\n", names[MODE], N, WGS, MODE >= kCV ? CONV : 0,
              mean / iters, per_cycle, 100.0 * per_cycle / 2048.0, tflops);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long* d_cycles;
  float* d_sink;
  cudaMalloc(&d_cycles, sizeof(long long) * sms * 4);
  cudaMalloc(&d_sink, sizeof(float) * 512);
  long long* h_cycles = static_cast<long long*>(std::malloc(sizeof(long long) * sms * 4));
  int const iters = 4096;
  std::printf("%d SMs, %d batches of %d wgmma a warpgroup\n\n", sms, iters, KB);
  std::printf("| mode | N | warpgroups | conversion ALU a thread | cycles a batch | FMA/cycle/SM | of peak | TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
#define ROW(N, W, M, C) run<N, W, M, C>(sms, iters, d_cycles, d_sink, h_cycles)
  // The tensor pipe alone: A from shared memory against A from registers, 1-4 warpgroups.
  ROW(16, 1, kSS, 0); ROW(16, 2, kSS, 0); ROW(16, 4, kSS, 0);
  ROW(16, 1, kRS, 0); ROW(16, 2, kRS, 0); ROW(16, 4, kRS, 0);
  ROW(64, 1, kSS, 0); ROW(64, 2, kSS, 0); ROW(64, 4, kSS, 0);
  ROW(64, 1, kRS, 0); ROW(64, 2, kRS, 0); ROW(64, 4, kRS, 0);
  ROW(128, 1, kSS, 0); ROW(128, 2, kSS, 0); ROW(128, 4, kSS, 0);
  ROW(128, 1, kRS, 0); ROW(128, 2, kRS, 0); ROW(128, 4, kRS, 0);
  ROW(256, 1, kSS, 0); ROW(256, 2, kSS, 0);
  ROW(256, 1, kRS, 0); ROW(256, 2, kRS, 0);
  // The mainloop's shape: the next k-tile's A made while a batch runs, with 0-256 ALU a thread
  // (the shipped conversion is ~113 ALU + 12 LDS a k-tile, SASS of t128x64x128), into registers
  // (cv, ov) or into shared memory (cs); 1, 2 and 4 warpgroups.
  ROW(64, 1, kCV, 128); ROW(64, 1, kOV, 128); ROW(64, 1, kCS, 128);
  ROW(64, 2, kCV, 0); ROW(64, 2, kCV, 64); ROW(64, 2, kCV, 128); ROW(64, 2, kOV, 128); ROW(64, 2, kCS, 0);
  ROW(64, 2, kCS, 64); ROW(64, 2, kCS, 128);
  ROW(64, 4, kCV, 128); ROW(64, 4, kOV, 128); ROW(64, 4, kCS, 128);
  ROW(128, 1, kCV, 128); ROW(128, 1, kOV, 128); ROW(128, 1, kCS, 128);
  ROW(128, 2, kCV, 0); ROW(128, 2, kCV, 64); ROW(128, 2, kCV, 128); ROW(128, 2, kOV, 128); ROW(128, 2, kCS, 128);
  ROW(128, 2, kCV, 256); ROW(128, 2, kOV, 256); ROW(128, 2, kCS, 256);
  ROW(128, 4, kCV, 128); ROW(128, 4, kCS, 128);
  ROW(256, 2, kCV, 128); ROW(256, 2, kOV, 128); ROW(256, 2, kCS, 128);
  ROW(16, 2, kCV, 128); ROW(16, 4, kCV, 128); ROW(16, 4, kCS, 128);
  // The conversion between the wgmmas of a batch.
  ROW(64, 1, kIL, 128); ROW(64, 2, kIL, 128); ROW(64, 4, kIL, 128);
  ROW(128, 1, kIL, 128); ROW(128, 2, kIL, 128); ROW(128, 2, kIL, 256); ROW(128, 4, kIL, 128);
  ROW(256, 2, kIL, 128); ROW(16, 2, kIL, 128); ROW(32, 2, kCV, 128); ROW(32, 2, kIL, 128);
  // Turns.
  ROW(64, 2, kPH, 128); ROW(64, 2, kPO, 128); ROW(128, 2, kPH, 128); ROW(128, 2, kPO, 128);
  ROW(64, 2, kPH, 0); ROW(128, 2, kPO, 256); ROW(256, 2, kPO, 128); ROW(32, 2, kPO, 128);
  // The conversion kept after the batch's issue.
  ROW(64, 2, kCF, 128); ROW(64, 2, kOF, 128); ROW(64, 2, kPF, 128); ROW(64, 4, kCF, 128); ROW(64, 4, kOF, 128);
  ROW(128, 2, kCF, 128); ROW(128, 2, kOF, 128); ROW(128, 2, kPF, 128); ROW(128, 2, kOF, 256);
  ROW(32, 2, kOF, 128); ROW(64, 1, kOF, 128); ROW(128, 1, kOF, 128); ROW(64, 2, kCF, 0);
  // Which pipe the conversion contends on: 128 a thread of HFMA2 (0), LOP3 (1000) or IMAD (2000).
  ROW(64, 2, kOV, 128); ROW(64, 2, kOV, 1128); ROW(64, 2, kOV, 2128);
  ROW(128, 2, kOV, 256); ROW(128, 2, kOV, 1256); ROW(128, 2, kOV, 2256);
  ROW(64, 4, kCV, 128); ROW(64, 4, kCV, 1128); ROW(64, 4, kCV, 2128);
#undef ROW
  return 0;
}
