// How fast one CTA per SM can pull its share of a weight into shared memory when every byte is
// requested at the start, by the copy instruction used (docs/notes/gemv.md and moe.md, "One-shot mode"; results: bench/results/h200-copy-probe-2026-11-28.md).
//
// The one-shot kernels (gemv `_os`, moe_gemv `_m1_os`; both since removed) issued 16-byte cp.async for a CTA's whole
// share (64-160 KB) and then computed; on the H200 they ran at 12-30% of the memory floor. This
// probe times the copy alone, without the math, every CTA copying BYTES into its shared memory:
//   cp    cp.async.cg 16 B, a warp instruction 512 contiguous bytes (the best case for cp.async);
//   cps   cp.async.cg 16 B in the one-shot kernels' pattern: CHUNK-byte pieces (a CTA's strips at one
//         K atom) STRIDE bytes apart (the next K atom of the same strips), a warp's pieces contiguous
//         in K, eight warps (or WARPS) splitting K;
//   bulk  cp.async.bulk (the TMA engine, no tensor map) of the same CHUNK-byte pieces, one lane a
//         warp issuing, completion counted on one mbarrier (expect_tx of the whole share);
//   ldg   ld.global 16 B into registers, 8 in flight a thread (what the split-K gemv kernels do),
//         the same bytes a CTA, nothing stored (an XOR kept live).
// Each launch reads a fresh region of a 2 GB buffer (cold L2). Prints µs a launch (back-to-back
// launches, CUDA events: a launch's own cost is inside, ~4.7 µs at 4 KB a CTA on an H200) and the
// share of the floor at the device's measured copy rate (a 1 GB device-to-device copy).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a bench/copy_probe.cu -o copy_probe && ./copy_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

enum Mode { kCp = 0, kCps = 1, kBulk = 2, kLdg = 3 };
static char const* const kNames[] = {"cp", "cps", "bulk", "ldg"};

__device__ __forceinline__ void cp16(void* smem, void const* gmem) {
  unsigned const s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

// Where CTA c's share starts: contiguous shares for cp and ldg; in the strided modes stride / chunk
// CTAs share a matrix (their chunks side by side in each row of `pieces` rows), as a weight's strips.
__host__ __device__ __forceinline__ size_t share_at(int mode, int c, int bytes, int chunk, int stride) {
  if (mode == kCp || mode == kLdg) return (size_t)c * bytes;
  int const per_row = stride / chunk, pieces = bytes / chunk;
  return (size_t)(c / per_row) * pieces * stride + (size_t)(c % per_row) * chunk;
}

template <int kMode>
__global__ void probe(char const* __restrict__ src, int bytes, int chunk, int stride, unsigned* sink) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bar;
  int const warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The CTA's region: contiguous for cp and ldg, pieces * stride for the strided modes.
  int const pieces = bytes / chunk;
  char const* base = src + share_at(kMode, blockIdx.x, bytes, chunk, stride);
  if (kMode == kCp) {
    for (int i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16) cp16(smem + i, base + i);
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
  } else if (kMode == kCps) {
    // Warp w: pieces [w per, (w + 1) per); a warp instruction covers 512 bytes of consecutive pieces.
    int const per = (pieces + warps - 1) / warps, p0 = warp * per, p1 = min(pieces, p0 + per);
    int const sixteens = chunk / 16;
    for (int q = lane; q < (p1 - p0) * sixteens; q += 32) {
      int const p = p0 + q / sixteens, c = q % sixteens;
      cp16(smem + p * chunk + 16 * c, base + (size_t)p * stride + 16 * c);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
  } else if (kMode == kBulk) {
    unsigned const b = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(b));
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(b), "r"(pieces * chunk) : "memory");
    }
    __syncthreads();
    if (lane == 0) {
      int const per = (pieces + warps - 1) / warps, p0 = warp * per, p1 = min(pieces, p0 + per);
      for (int p = p0; p < p1; ++p) {
        unsigned const d = static_cast<unsigned>(__cvta_generic_to_shared(smem + p * chunk));
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(d),
            "l"(base + (size_t)p * stride), "r"(chunk), "r"(b)
            : "memory");
      }
    }
    asm volatile(
        "{\n .reg .pred P;\n WAIT:\n mbarrier.try_wait.parity.shared.b64 P, [%0], 0;\n @!P bra WAIT;\n}\n" ::"r"(b)
        : "memory");
    __syncthreads();
  } else {
    uint4 acc = make_uint4(0, 0, 0, 0);
    uint4 const* p = reinterpret_cast<uint4 const*>(base);
    int const n = bytes / 16;
    for (int i = threadIdx.x; i < n; i += 8 * blockDim.x) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        int const j = i + u * blockDim.x;
        v[u] = j < n ? __ldcg(p + j) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) acc.x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc.x == 0x12345678u) sink[0] = acc.x;  // keeps the loads
  }
  if (kMode != kLdg && threadIdx.x == 0 && smem[lane] == 0x7f && smem[bytes - 1] == 0x7e) sink[1] = 1;
}

template <int kMode>
float time_mode(char const* buf, size_t cap, int sms, int warps, int bytes, int chunk, int stride, unsigned* sink) {
  cudaFuncSetAttribute(probe<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);  // (+ the static mbarrier)
  size_t const region = share_at(kMode, sms, bytes, chunk, stride) + (size_t)bytes * 2;
  size_t const step = (region + 4095) / 4096 * 4096;
  int const iters = 40;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  size_t off = 0;
  for (int i = 0; i < 3; ++i) probe<kMode><<<sms, 32 * warps, bytes>>>(buf, bytes, chunk, stride, sink);
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) {
    off = off + step + region > cap ? 0 : off + step;
    probe<kMode><<<sms, 32 * warps, bytes>>>(buf + off, bytes, chunk, stride, sink);
  }
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, a, b);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) std::printf("error %s\n", cudaGetErrorString(e));
  return ms * 1000.f / iters;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  size_t const cap = size_t(2) << 30;
  char* buf = nullptr;
  unsigned* sink = nullptr;
  cudaMalloc(&buf, cap + (64 << 20));
  cudaMalloc(&sink, 16);
  cudaMemset(buf, 1, cap);
  // The copy rate of the device itself (a 1 GB device-to-device copy: reads and writes).
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  cudaMemcpy(buf + (cap / 2), buf, cap / 2, cudaMemcpyDeviceToDevice);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, a, b);
  double const bw = 2.0 * (cap / 2) / (ms * 1e-3);
  std::printf("%d SMs; device copy %.2f TB/s (read + write)\n", sms, bw / 1e12);
  std::printf("| mode | warps | KB a CTA | chunk | stride | µs | floor µs | share of floor |\n|---|---|---|---|---|---|---|---|\n");
  // (chunk, stride): 4096x4096 int4 (2 strips a CTA: 256 B, 32 KB apart), Qwen3 gate|up (6 strips: 768 B,
  // 12 KB apart), DeepSeek down-like (128 B pieces, 2 KB apart).
  int const shapes[][2] = {{256, 32768}, {768, 12288}, {128, 2048}};
  for (int kb : {4, 32, 64, 96, 160, 208}) {
    int const bytes = kb * 1024;
    for (int warps : {8, 16}) {
      auto row = [&](int mode, int chunk, int stride, float us) {
        double const floor_us = (double)sms * (chunk ? bytes / chunk * chunk : bytes) / bw * 1e6;
        std::printf("| %s | %d | %d | %d | %d | %.2f | %.2f | %.0f%% |\n", kNames[mode], warps, kb, chunk, stride, us,
                    floor_us, 100.0 * floor_us / us);
      };
      row(kCp, 0, 0, time_mode<kCp>(buf, cap, sms, warps, bytes, 16, 0, sink));
      row(kLdg, 0, 0, time_mode<kLdg>(buf, cap, sms, warps, bytes, 16, 0, sink));
      for (auto const& s : shapes) {
        row(kCps, s[0], s[1], time_mode<kCps>(buf, cap, sms, warps, bytes, s[0], s[1], sink));
        row(kBulk, s[0], s[1], time_mode<kBulk>(buf, cap, sms, warps, bytes, s[0], s[1], sink));
      }
    }
  }
  return 0;
}
