// One-shot mode of the decode kernels (GemvConfig.oneshot, schedule "m8_s1_w<W>x1_u1_os";
// docs/notes/gemv.md, "One-shot mode"): y = x W^T (+ bias) (+ residual) for the sm90a layout's int4
// and int8 atoms at up to 8 tokens, on the small shapes. (16 and 32 tokens lost: every CTA reads all
// of x through L1, as many bytes as its weights or more.)
//
// Why. A small weight (8B's o and qkv: 8-13 MB) is 64-95 KB an SM: the stream is a few HBM round trips
// long, and the split-K kernels pay their start, the first round trip, one round trip per load step
// and a split-K fix-up on top of the bytes (4096x4096 at M = 1: 6.8 µs against a pure read's 4.8).
// Here every CTA requests its whole share at its start and then only computes.
//
// Work: units of 16 weight rows over all of K; CTA c takes units [c chunk, (c + 1) chunk) (the launch
// deals them over at most one CTA per SM: args.chunk). Warp w owns K atoms [w kper, (w + 1) kper) of
// every unit and copies exactly those bytes (16-byte cp.async, a commit group per unit), so
// cp.async.wait_group and __syncwarp alone order its reads. Math: gemv's deferred form
// (atoms/deferred.cuh): an mma.m16n8k16 per atom and n8 tile of tokens on the raw codes (x's
// fragments from global memory: the same rows for every CTA, L1 / L2 hits), a sums mma per tile for
// X, the group's s and z' applied in fp32 at the end of the warp's segment of each group. The warps'
// partial sums add in warp order through shared memory; bias and residual in fp32, one rounding.
// No split K: no workspace, counters or second pass.
// Layout contract: the sm90a atom (atoms/sm90a.cuh, mixed_gemm/kernels/sm90a/layout.py).
#pragma once

#include "gemv/gemv.cuh"

namespace mixed_gemm {

// The cp.async pieces of the one-shot kernel.
struct OneShotCopy {
  static __device__ __forceinline__ void copy16(char* smem, void const* gmem) {
    unsigned const s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  }
  static __device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  template <int N>
  static __device__ __forceinline__ void wait_group() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  }
  // Wait until at most `n` of this thread's groups are pending (an immediate in PTX: beyond 7,
  // waiting for 7 is stricter and still right).
  static __device__ __forceinline__ void wait_at_most(int n) {
    switch (n) {
      case 0: wait_group<0>(); break;
      case 1: wait_group<1>(); break;
      case 2: wait_group<2>(); break;
      case 3: wait_group<3>(); break;
      case 4: wait_group<4>(); break;
      case 5: wait_group<5>(); break;
      case 6: wait_group<6>(); break;
      default: wait_group<7>(); break;
    }
  }
};

// A warp's K range of a weight: atoms [k0, k1) and the groups [g0, g1] they touch (g1 < g0: none).
struct OneShotRange {
  int k0, k1, g0, g1;
  template <int kWarps>
  static __device__ __forceinline__ OneShotRange of(int katoms, int num_groups, int group_shift, int warp) {
    int const kper = (katoms + kWarps - 1) / kWarps;
    OneShotRange r;
    r.k0 = min(katoms, warp * kper);
    r.k1 = min(katoms, r.k0 + kper);
    r.g0 = min(num_groups - 1, (r.k0 * 16) >> group_shift);
    r.g1 = r.k1 > r.k0 ? min(num_groups - 1, ((r.k1 - 1) * 16) >> group_shift) : r.g0 - 1;
    return r;
  }
  // Atoms of a group (all of K per channel), for the segments [max(k0, grp gsize), ...).
  static __device__ __forceinline__ int group_atoms(int katoms, int group_shift) {
    return group_shift >= kPerChannelShift ? katoms : max(1, (1 << group_shift) / 16);
  }
};

// A 16-row strip's slab in shared memory: its atoms over all of K, then its groups' parameters (16
// scales, then 16 zeros), and the copy of one warp's part of it (atoms [k0, k1), groups [g0, g1]).
template <typename Element, int kBits>
struct OneShotSlab {
  using raw = typename Pair<Element>::raw;
  static constexpr int kLaneWords = kBits / 4;         // a lane's words of one 16 x 16 atom
  static constexpr int kAtomBytes = 128 * kLaneWords;  // the atom: 32 lanes' words, contiguous
  static constexpr int kPieces = kAtomBytes / 16;      // 16-byte copies an atom
  static constexpr int kGroupBytes = 64;
  static __host__ __device__ constexpr int bytes(int katoms, int groups) {
    return katoms * kAtomBytes + groups * kGroupBytes;
  }
  // Strip s of a weight at b (atoms (K16 / 16, strips)), scales and zeros ((G, 16 strips)).
  static __device__ __forceinline__ void copy(char* slab, void const* b, raw const* sc, raw const* zc, int strips,
                                              int s, int katoms, OneShotRange const& r, int lane) {
    for (int p = lane; p < (r.k1 - r.k0) * kPieces; p += 32) {
      int const k = r.k0 + p / kPieces, c = p % kPieces;
      OneShotCopy::copy16(slab + k * kAtomBytes + 16 * c,
                          static_cast<char const*>(b) + ((size_t)k * strips + s) * kAtomBytes + 16 * c);
    }
    for (int p = lane; p < (r.g1 - r.g0 + 1) * 4; p += 32) {  // per group: scales 0-7, 8-15, zeros 0-7, 8-15
      int const grp = r.g0 + p / 4, c = p % 4;
      OneShotCopy::copy16(slab + katoms * kAtomBytes + grp * kGroupBytes + 16 * c,
                          (c < 2 ? sc : zc) + (size_t)grp * 16 * strips + 16 * s + 8 * (c & 1));
    }
  }
  // A lane's words of atom k.
  static __device__ __forceinline__ uint32_t word(char const* slab, int k, int lane, int c) {
    return reinterpret_cast<uint32_t const*>(slab + k * kAtomBytes)[lane * kLaneWords + c];
  }
  // The parameters of group grp (raw: scale of row r at [r], zero at [16 + r]).
  static __device__ __forceinline__ raw const* params(char const* slab, int katoms, int grp) {
    return reinterpret_cast<raw const*>(slab + katoms * kAtomBytes + grp * kGroupBytes);
  }
};

template <typename Element, int kBits, int kWarps, int kTiles>
struct GemvOneShot {
  static_assert(kBits == 4 || kBits == 8, "one-shot mode reads the sm90a layout's int4 and int8 atoms");
  static_assert(kTiles == 1, "8 tokens: one n8 tile (GemvConfig refuses more)");
  using Slab = OneShotSlab<Element, kBits>;
  using raw = typename Slab::raw;
  using R = RawAtom<Element, kBits>;
  using C = OneShotCopy;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16;      // outputs of a unit
  static constexpr int kSmemBytes = 0;  // all dynamic (smem_bytes, sized per launch)

  // The units' slabs, then the warps' partial sums (4 floats a lane and tile).
  static __host__ __device__ constexpr int smem_bytes(int per, int katoms, int groups) {
    return per * Slab::bytes(katoms, groups) + per * kWarps * kTiles * 4 * 32 * 4;
  }

  static __device__ void run(GemvArgs const& a, char* smem) {
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int const per = a.chunk, u0 = blockIdx.x * per, nu = max(0, min(per, a.strips - u0));
    OneShotRange const r = OneShotRange::of<kWarps>(a.katoms, a.num_groups, a.group_shift, warp);
    int const slab = Slab::bytes(a.katoms, a.num_groups);
    float* const red = reinterpret_cast<float*>(smem + per * slab);
    raw const* const x = static_cast<raw const*>(a.x);
    raw const* const sc = static_cast<raw const*>(a.scales);
    raw const* const zc = static_cast<raw const*>(a.zeros);

    // 1. Every byte this warp reads: its atoms and groups of each unit, a commit group per unit.
    for (int i = 0; i < nu; ++i) {
      Slab::copy(smem + i * slab, a.b, sc, zc, a.strips, u0 + i, a.katoms, r, lane);
      C::commit();
    }

    // 2. A unit at a time as it lands: per group segment, four atoms a step, every load first.
    uint32_t ones[4];
    R::sums(ones);
    int const gsize = OneShotRange::group_atoms(a.katoms, a.group_shift);
    for (int i = 0; i < nu; ++i) {
      C::wait_at_most(nu - 1 - i);
      __syncwarp();
      char const* const sl = smem + i * slab;
      float out[kTiles][4] = {};
#pragma unroll 1
      for (int grp = r.g0; grp <= r.g1; ++grp) {
        int const ks = max(r.k0, grp * gsize), ke = grp == a.num_groups - 1 ? r.k1 : min(r.k1, (grp + 1) * gsize);
        float part[kTiles][4] = {}, xs[kTiles][4] = {};
#pragma unroll 1
        for (int k = ks; k < ke; k += 4) {
          uint32_t w[4][Slab::kLaneWords], b[4][kTiles][2];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            bool const in = k + u < ke;
#pragma unroll
            for (int c = 0; c < Slab::kLaneWords; ++c)
              w[u][c] = in ? Slab::word(sl, k + u, lane, c) : 0u;
#pragma unroll
            for (int tile = 0; tile < kTiles; ++tile) {  // B: token g + 8 tile, k 2t, 2t + 1 (b0) and + 8 (b1)
              int const row = g + 8 * tile, idx = (k + u) * 16 + 2 * t;
              uint32_t const* src = reinterpret_cast<uint32_t const*>(x + (size_t)min(row, a.m - 1) * a.k + idx);
              bool const ok = in && row < a.m;  // rows past M: zero columns (their outputs are not written)
              b[u][tile][0] = ok && idx < a.k ? __ldg(src) : 0u;
              b[u][tile][1] = ok && idx + 8 < a.k ? __ldg(src + 4) : 0u;
            }
          }
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            uint32_t frag[4];
            R::run(w[u], 0, frag);
#pragma unroll
            for (int tile = 0; tile < kTiles; ++tile) {
              GemvMath<Element>::mma(part[tile], frag, b[u][tile][0], b[u][tile][1]);
              GemvMath<Element>::mma(xs[tile], ones, b[u][tile][0], b[u][tile][1]);
            }
          }
        }
        raw const* p = Slab::params(sl, a.katoms, grp);
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // c0, c1: row g; c2, c3: row g + 8
          float const s = static_cast<float>(p[g + 8 * h]), z = static_cast<float>(p[16 + g + 8 * h]);
          float const c1 = s * R::mul(h), c2 = fmaf(-R::off(h), s, z);
#pragma unroll
          for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) out[tile][e] = fmaf(c1, part[tile][e], fmaf(c2, xs[tile][e], out[tile][e]));
        }
      }
      float* const mine = red + ((i * kWarps + warp) * kTiles * 4) * 32 + lane;
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(tile * 4 + e) * 32] = out[tile][e];
    }
    __syncthreads();

    // 3. y: a thread per (unit, lane, tile, accumulator), the warps added in warp order.
    raw const* const bias = static_cast<raw const*>(a.bias);
    raw const* const residual = static_cast<raw const*>(a.residual);
    for (int idx = threadIdx.x; idx < nu * 32 * kTiles * 4; idx += kThreads) {
      int const i = idx / (32 * kTiles * 4), rest = idx % (32 * kTiles * 4), l = rest % 32, te = rest / 32;
      int const e = te % 4, row = (l >> 2) + 8 * (e >> 1), tok = (te / 4) * 8 + 2 * (l & 3) + (e & 1);
      int const n = 16 * (u0 + i) + row;
      if (tok >= a.m || n >= a.n) continue;
      float v = 0.f;
      for (int w = 0; w < kWarps; ++w) v += red[((i * kWarps + w) * kTiles * 4 + te) * 32 + l];
      size_t const at = (size_t)tok * a.n + n;
      if (bias != nullptr) v += static_cast<float>(bias[n]);
      if (residual != nullptr) v += static_cast<float>(residual[at]);
      static_cast<raw*>(a.y)[at] = static_cast<raw>(v);
    }
  }
};

}  // namespace mixed_gemm
