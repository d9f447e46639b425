// Probe (docs/notes/gemv.md, "A one-shot dense decode probe"): does a dense decode GEMM at 1-16
// tokens on the small shapes (8B: 8-30 MB, 64-230 KB an SM) gain from each CTA copying its whole
// share into shared memory at its start, as moe_gemv's one-shot mode does for a MoE layer? Not a
// kernel of the package: built by bench/oneshot_probe.py with nvcc, launched through ctypes on
// torch's stream, checked against mg.matmul and timed beside it and cuBLAS fp16.
//
// The kernel: y (M, N) = x (M, K) W^T for the sm90a layout's int4 atoms. Units are 16 weight rows
// over all of K; CTA c takes units [c per, (c + 1) per); warp w owns K atoms [w kper, (w + 1) kper)
// of every unit and copies exactly those (16-byte cp.async, a commit group per unit; x is read from
// global memory, the same rows for every CTA: L1 / L2 hits), then converts and multiplies with gemv's deferred form (an mma per
// atom and n8 tile of tokens on the raw codes, a sums mma per tile, the group's s and z' applied in
// fp32 at each group segment's end). Warps' partials add in warp order through shared memory.
#include <cuda_fp16.h>

#include <cstdint>

#include "moe_gemv/moe_oneshot.cuh"

namespace probe {

using namespace mixed_gemm;
using Element = cutlass::half_t;
using raw = __half;
using R = RawAtom<Element, 4>;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTiles = 2;        // n8 tiles of tokens: M <= 16
constexpr int kAtomBytes = 128;  // int4 16 x 16
constexpr int kGroupBytes = 64;  // a strip's 16 scales, then 16 zeros

struct Args {
  uint32_t const* b;  // (K16 / 16, N / 16, 32) words
  raw const* scales;  // (G, N)
  raw const* zeros;
  raw const* x;       // (M, K)
  raw* y;             // (M, N)
  int m, n, k, katoms, groups, group_shift, per;
};

// cp.async helpers: moe_gemv's one-shot kernel's.
using OS = MoeGemvOneShot<Element, 4, kWarps>;

__host__ __device__ constexpr int slab_bytes(int katoms, int groups) { return katoms * kAtomBytes + groups * kGroupBytes; }
__host__ __device__ constexpr int kper_of(int katoms) { return (katoms + kWarps - 1) / kWarps; }
// The units' slabs, then the warps' partial sums (kTiles x 4 floats a lane).
__host__ __device__ constexpr int smem_bytes(int per, int katoms, int groups) {
  return per * slab_bytes(katoms, groups) + per * kWarps * kTiles * 4 * 32 * 4;
}

__global__ void __launch_bounds__(kThreads, 1) oneshot_dense(Args const a) {
  extern __shared__ __align__(16) char smem[];
  int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int const kper = kper_of(a.katoms), strips = a.n / 16;
  int const u0 = blockIdx.x * a.per, nu = max(0, min(a.per, strips - u0));
  int const k0 = min(a.katoms, warp * kper), k1 = min(a.katoms, k0 + kper);
  int const g0 = min(a.groups - 1, (k0 * 16) >> a.group_shift);
  int const g1 = k1 > k0 ? min(a.groups - 1, ((k1 - 1) * 16) >> a.group_shift) : g0 - 1;
  int const slab = slab_bytes(a.katoms, a.groups);
  char* const units = smem;
  float* const red = reinterpret_cast<float*>(units + a.per * slab);

  // 1. Each unit's atoms and groups: one group per unit.
  for (int i = 0; i < nu; ++i) {
    int const s = u0 + i;
    char* dst = units + i * slab;
    for (int p = lane; p < (k1 - k0) * 8; p += 32) {
      int const kk = k0 + p / 8, c = p % 8;
      OS::copy16(dst + kk * kAtomBytes + 16 * c,
             reinterpret_cast<char const*>(a.b) + ((size_t)kk * strips + s) * kAtomBytes + 16 * c);
    }
    for (int p = lane; p < (g1 - g0 + 1) * 4; p += 32) {
      int const grp = g0 + p / 4, c = p % 4;
      raw const* src = (c < 2 ? a.scales : a.zeros) + (size_t)grp * a.n + 16 * s + 8 * (c & 1);
      OS::copy16(dst + a.katoms * kAtomBytes + grp * kGroupBytes + 16 * c, src);
    }
    OS::commit();
  }

  // 2. Per unit as it lands: tiles of 8 tokens (row g + 8 tile of x), 4 atoms a step, loads first.
  uint32_t ones[4];
  R::sums(ones);
  int const gsize = a.group_shift >= kPerChannelShift ? a.katoms : max(1, (1 << a.group_shift) / 16);
  for (int i = 0; i < nu; ++i) {
    OS::wait_at_most(nu - 1 - i);
    __syncwarp();
    char const* sl = units + i * slab;
    float out[kTiles][4] = {};
    for (int grp = g0; grp <= g1; ++grp) {
      int const ks = max(k0, grp * gsize), ke = grp == a.groups - 1 ? k1 : min(k1, (grp + 1) * gsize);
      float part[kTiles][4] = {}, xsum[kTiles][4] = {};
      for (int kk = ks; kk < ke; kk += 4) {
        uint32_t w[4], b[4][kTiles][2];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          bool const in = kk + u < ke;
          w[u] = in ? reinterpret_cast<uint32_t const*>(sl + (kk + u) * kAtomBytes)[lane] : 0u;
#pragma unroll
          for (int tile = 0; tile < kTiles; ++tile) {
            int const row = g + 8 * tile, idx = (kk + u) * 16 + 2 * t;
            bool const ok = in && row < a.m;
            uint32_t const* src = reinterpret_cast<uint32_t const*>(a.x + (size_t)row * a.k + idx);
            b[u][tile][0] = ok && idx < a.k ? __ldg(src) : 0u;
            b[u][tile][1] = ok && idx + 8 < a.k ? __ldg(src + 4) : 0u;
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          uint32_t frag[4];
          R::run(&w[u], 0, frag);
#pragma unroll
          for (int tile = 0; tile < kTiles; ++tile) {
            GemvMath<Element>::mma(part[tile], frag, b[u][tile][0], b[u][tile][1]);
            GemvMath<Element>::mma(xsum[tile], ones, b[u][tile][0], b[u][tile][1]);
          }
        }
      }
      raw const* p = reinterpret_cast<raw const*>(sl + a.katoms * kAtomBytes + grp * kGroupBytes);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float const s = __half2float(p[g + 8 * h]), z = __half2float(p[16 + g + 8 * h]);
        float const c1 = s * R::mul(h), c2 = fmaf(-R::off(h), s, z);
#pragma unroll
        for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) out[tile][e] = fmaf(c1, part[tile][e], fmaf(c2, xsum[tile][e], out[tile][e]));
      }
    }
    float* r = red + ((i * kWarps + warp) * kTiles * 4) * 32 + lane;
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int e = 0; e < 4; ++e) r[(tile * 4 + e) * 32] = out[tile][e];
  }
  __syncthreads();
  // 3. y: thread per (unit, lane, tile, e), the warps added in order.
  for (int idx = threadIdx.x; idx < nu * 32 * kTiles * 4; idx += kThreads) {
    int const i = idx / (32 * kTiles * 4), rest = idx % (32 * kTiles * 4), lane_ = rest % 32, te = rest / 32;
    int const tile = te / 4, e = te % 4, row = (lane_ >> 2) + 8 * (e >> 1), tok = tile * 8 + 2 * (lane_ & 3) + (e & 1);
    if (tok >= a.m) continue;
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += red[((i * kWarps + w) * kTiles * 4 + te) * 32 + lane_];
    a.y[(size_t)tok * a.n + 16 * (u0 + i) + row] = __float2half_rn(s);
  }
}

}  // namespace probe

extern "C" int probe_smem_bytes(int per, int katoms, int groups) { return probe::smem_bytes(per, katoms, groups); }

// Launch on `stream`: grid CTAs, `per` units each; 0 or the CUDA error code.
extern "C" int probe_launch(void const* b, void const* scales, void const* zeros, void const* x, void* y, int m, int n,
                            int k, int katoms, int groups, int group_shift, int grid, int per, void* stream) {
  probe::Args a{static_cast<uint32_t const*>(b), static_cast<__half const*>(scales), static_cast<__half const*>(zeros),
                static_cast<__half const*>(x), static_cast<__half*>(y), m, n, k, katoms, groups, group_shift, per};
  int const smem = probe::smem_bytes(per, katoms, groups);
  static int configured = 0;
  if (smem > configured) {
    cudaError_t e = cudaFuncSetAttribute(probe::oneshot_dense, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return int(e);
    configured = smem;
  }
  probe::oneshot_dense<<<grid, probe::kThreads, smem, static_cast<cudaStream_t>(stream)>>>(a);
  return int(cudaGetLastError());
}
