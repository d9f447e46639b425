// One-shot mode (MoeGemvConfig.oneshot, schedules "..._m1_os"; docs/notes/moe.md, "One launch,
// every byte requested at once"): a layer of many small experts at a token or two, both
// projections in ONE launch of at most one CTA per SM, each CTA's share of both projections'
// weights requested before it computes anything.
//
// Why. At one token Qwen3-30B-A3B reads ~20 MB: ~150 KB an SM, a handful of HBM round trips. The
// two-launch modes pay two starts, and each of their CTAs walks its slice as a chain of load
// rounds (gemv's registers hold one step of it), so the layer took ~3x the bytes' time. Here a CTA
// issues cp.async for all of its gate|up AND down bytes at its start (the down weights do not
// depend on h): the bytes cost their bandwidth time once, plus one round trip.
//
// Work is static (nothing claimed, nothing requested late):
//   gate|up unit (pair p, outputs 16 j .. 16 j + 15 of h[p]): two 16-row strips of w13[e_p] over
//     all of K (gate_up: strips 2 j, 2 j + 1, each gate rows then the matching up rows, gate_up.cuh;
//     else gate strip j and up strip j + I/16);
//   down unit (token t, outputs 16 n .. 16 n + 15 of y[t]): strip n of w2[e] for each of the
//     token's top_k slots over all of I: y = sum_j w_j (h[p_j] . W2_e_j), no cross-CTA sum.
//   CTA c takes gate|up units [c up_per, (c + 1) up_per) and down units [c down_per, ...).
// Inside a CTA, warp w owns K atoms [w kper, (w + 1) kper) of every unit and copies exactly the
// bytes it reads (16-byte cp.async: one commit group per gate|up unit, one for every down unit),
// so cp.async.wait_group and __syncwarp alone order a warp's reads after its copies. Two warps
// whose K ranges share a group both copy its parameters to the same place: equal bytes.
//
// Math: deferred group parameters (atoms/deferred.cuh, gemv's `_ds`): one mma.m16n8k16 per atom and
// strip on the raw codes with the token in column 0 (lanes g == 0 load x, the other columns are
// zero), one sums mma for X shared by a unit's strips, and each group's s and z' applied to the fp32
// sums at the end of the warp's segment of that group. Gate|up reads x from global memory (one row
// for all CTAs: L1 hits); after the barrier each warp stages its h slices in shared memory with one
// more cp.async group (the gate|up slabs' bytes, free by then), so the down math after the
// barrier waits for one round trip, not one per atom. Rounding points: h and y are rounded once from fp32; the warps' partial
// sums add in warp order, a token's slots in slot order inside each warp.
//
// Between the projections, a grid barrier: every CTA is resident (a cooperative launch of at
// most one CTA per SM), arrives on sync[0] and waits for all, then counts its departure on
// sync[1]; the last departure zeroes both (zero between launches, as every counter of the
// family). h is then read through L2 (ld.global.cg), never the read-only path.
// Layout contract: the sm90a atom (atoms/sm90a.cuh, mixed_gemm/kernels/sm90a/layout.py).
#pragma once

#include "gemv/gemv_oneshot.cuh"
#include "moe_gemv/moe_gemv.cuh"

namespace mixed_gemm {

struct MoeOneShotArgs {
  MoeGemvArgs up;    // gate|up: x, w13, h as its output (no planes, no counters)
  MoeGemvArgs down;  // down: h as its input, w2, the top-k weights, y
  int* sync;         // [0]: the grid barrier's arrivals, [1]: its departures; zero between launches
  int up_per;        // gate|up units per CTA
  int down_per;      // down units per CTA
};

template <typename Element, int kBits, int kWarps>
struct MoeGemvOneShot {
  static_assert(kBits == 4 || kBits == 8, "one-shot mode reads the sm90a layout's int4 and int8 atoms");
  using Slab = OneShotSlab<Element, kBits>;  // a strip's atoms and groups in shared memory (gemv_oneshot.cuh)
  using raw = typename Slab::raw;
  using R = RawAtom<Element, kBits>;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16;      // outputs of a unit
  static constexpr int kSmemBytes = 0;  // all dynamic (smem_bytes, sized per launch)

  // The h slices the warps stage after the grid barrier: 32 bytes an atom of each (unit, slot, warp).
  static __host__ __device__ constexpr int staged_h_bytes(int down_per, int top_k, int down_katoms) {
    return down_per * top_k * kWarps * ((down_katoms + kWarps - 1) / kWarps) * 32;
  }
  // The launch's dynamic shared memory: the gate|up units (2 slabs each; the staged h slices reuse
  // these bytes once gate|up is done), the down units (top_k slabs each), then the warps' partial
  // sums (gate|up: 16 gate and 16 up sums a unit; down: 16).
  static __host__ __device__ constexpr int smem_bytes(int up_per, int up_katoms, int up_groups, int down_per,
                                                      int top_k, int down_katoms, int down_groups) {
    int const up = up_per * 2 * Slab::bytes(up_katoms, up_groups), staged = staged_h_bytes(down_per, top_k, down_katoms);
    return (up > staged ? up : staged) + down_per * top_k * Slab::bytes(down_katoms, down_groups) +
           (up_per * 32 + down_per * 16) * kWarps * 4;
  }

  using C = OneShotCopy;  // cp.async pieces (gemv/gemv_oneshot.cuh)
  using Range = OneShotRange;
  static __device__ __forceinline__ Range range(MoeGemvArgs const& a, int warp) {
    return Range::of<kWarps>(a.katoms, a.num_groups, a.group_shift, warp);
  }

  // Copy strip `s` of expert e's weight, the warp's atoms and groups, into `slab`.
  static __device__ __forceinline__ void copy_slab(char* slab, MoeGemvArgs const& a, int e, int s, Range const& r,
                                                   int lane) {
    Slab::copy(slab, static_cast<uint32_t const*>(a.b) + (size_t)e * a.expert_b,
               static_cast<raw const*>(a.scales) + (size_t)e * a.expert_s,
               static_cast<raw const*>(a.zeros) + (size_t)e * a.expert_s, a.strips, s, a.katoms, r, lane);
  }

  // The B fragment of atom k (b0: k 2t, 2t + 1; b1: k 2t + 8, 2t + 9) for lanes g == 0, column 0 of
  // the n8 tile being the token (the other lanes' columns are zero). Gate|up reads x from global
  // memory (read-only, the same row for every CTA: L1 hits after the first); down reads the h slice
  // this warp staged in shared memory after the grid barrier (hs: its atoms from r.k0, 32 bytes each).
  struct XGlobal {
    raw const* row;
    int len;
    __device__ __forceinline__ void operator()(int k, int t, uint32_t& b0, uint32_t& b1) const {
      int const i = k * 16 + 2 * t;  // len % 8 == 0: a pair is wholly inside or outside
      b0 = i < len ? __ldg(reinterpret_cast<uint32_t const*>(row + i)) : 0u;
      b1 = i + 8 < len ? __ldg(reinterpret_cast<uint32_t const*>(row + i + 8)) : 0u;
    }
  };
  struct XStaged {
    char const* hs;
    int k0, len;
    __device__ __forceinline__ void operator()(int k, int t, uint32_t& b0, uint32_t& b1) const {
      int const i = k * 16 + 2 * t;  // past len (K % 16 == 8's last half atom) nothing was staged
      uint32_t const* w = reinterpret_cast<uint32_t const*>(hs + (k - k0) * 32) + t;
      b0 = i < len ? w[0] : 0u;
      b1 = i + 8 < len ? w[4] : 0u;
    }
  };

  // Lane (g, t == 0)'s fp32 dot products of rows g and g + 8 of kN slabs' strips with one row of x
  // over the warp's atoms (other lanes: zeros): the strips share the x fragments and the sums mma;
  // per group segment, the raw codes' and x's sums, then sum += s mul(h) part + (z' - off(h) s) X.
  template <int kN, typename X>
  static __device__ __forceinline__ void dot(char const* const (&slabs)[kN], MoeGemvArgs const& a, Range const& r,
                                             X const& xf, int lane, float (&out)[kN][2]) {
    int const g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < kN; ++q) out[q][0] = out[q][1] = 0.f;
    if (r.k1 <= r.k0) return;
    uint32_t ones[4];
    R::sums(ones);
    float part[kN][4], xs[4];
    auto clear = [&]() {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        xs[e] = 0.f;
#pragma unroll
        for (int q = 0; q < kN; ++q) part[q][e] = 0.f;
      }
    };
    auto fold = [&](int grp) {
#pragma unroll
      for (int q = 0; q < kN; ++q) {
        raw const* p = Slab::params(slabs[q], a.katoms, grp);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float const s = static_cast<float>(p[g + 8 * h]), z = static_cast<float>(p[16 + g + 8 * h]);
          out[q][h] = fmaf(s * R::mul(h), part[q][2 * h], fmaf(fmaf(-R::off(h), s, z), xs[2 * h], out[q][h]));
        }
      }
    };
    // Group segment by group segment, four atoms a step: every load of a step (the strips' words
    // from shared memory, x's fragment) is issued before its first mma, so a step waits for one
    // round trip, not one per atom. Atoms past the segment load zeros (x = 0: they add nothing).
    int const gsize = Range::group_atoms(a.katoms, a.group_shift);
#pragma unroll 1
    for (int grp = r.g0; grp <= r.g1; ++grp) {
      int const ks = max(r.k0, grp * gsize), ke = grp == a.num_groups - 1 ? r.k1 : min(r.k1, (grp + 1) * gsize);
      clear();
#pragma unroll 1
      for (int k = ks; k < ke; k += 4) {
        uint32_t w[4][kN][Slab::kLaneWords], b[4][2];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          bool const in = k + u < ke;
#pragma unroll
          for (int q = 0; q < kN; ++q)
#pragma unroll
            for (int c = 0; c < Slab::kLaneWords; ++c) w[u][q][c] = in ? Slab::word(slabs[q], k + u, lane, c) : 0u;
          b[u][0] = b[u][1] = 0u;
          if (in && g == 0) xf(k + u, t, b[u][0], b[u][1]);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int q = 0; q < kN; ++q) {
            uint32_t frag[4];
            R::run(w[u][q], 0, frag);
            GemvMath<Element>::mma(part[q], frag, b[u][0], b[u][1]);
          }
          GemvMath<Element>::mma(xs, ones, b[u][0], b[u][1]);
        }
      }
      fold(grp);
    }
  }

  // Expert of pair p, or -1 outside [0, experts) (in 64 bits, as pair mode: no id wraps into range).
  static __device__ __forceinline__ int expert_of(MoeGemvArgs const& a, int pair) {
    long long const e = a.ids_64 ? __ldg(static_cast<long long const*>(a.ids) + pair)
                                 : (long long)__ldg(static_cast<int const*>(a.ids) + pair);
    return e >= 0 && e < a.experts ? int(e) : -1;
  }

  static __device__ __forceinline__ int acquire(int const* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
  }

  // The grid barrier (module comment). Every thread's writes are fenced GPU-wide before thread 0
  // arrives; thread 0's acquire and the CTA barrier order the CTA's later reads after everyone's.
  static __device__ __forceinline__ void grid_sync(int* sync) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      int const n = static_cast<int>(gridDim.x);
      atomicAdd(sync, 1);
      unsigned ns = 32;
#pragma unroll 1
      while (acquire(sync) < n) {
        __nanosleep(ns);
        ns = ns < 256 ? 2 * ns : ns;
      }
      if (atomicAdd(sync + 1, 1) == n - 1) {  // the last to leave: every CTA has seen all arrivals
        atomicExch(sync, 0);
        atomicExch(sync + 1, 0);
      }
    }
    __syncthreads();
  }

  static __device__ void run(MoeOneShotArgs const& f, char* smem) {
    MoeGemvArgs const& up = f.up;
    MoeGemvArgs const& dn = f.down;
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int const inter = up.n / 2, per_pair = inter / kRows, per_token = (dn.n + kRows - 1) / kRows;
    int const u0 = blockIdx.x * f.up_per, d0 = blockIdx.x * f.down_per;
    int const n13 = max(0, min(f.up_per, up.tokens * up.top_k * per_pair - u0));
    int const n2 = max(0, min(f.down_per, dn.tokens * per_token - d0));
    int const slab13 = Slab::bytes(up.katoms, up.num_groups), slab2 = Slab::bytes(dn.katoms, dn.num_groups);
    int const region = max(f.up_per * 2 * slab13, staged_h_bytes(f.down_per, dn.top_k, dn.katoms));
    char* const down_smem = smem + region;
    float* const red13 = reinterpret_cast<float*>(down_smem + f.down_per * dn.top_k * slab2);
    float* const red2 = red13 + f.up_per * 32 * kWarps;
    Range const r13 = range(up, warp), r2 = range(dn, warp);
    auto strip_of = [&](int j, int q) {  // strip q of gate|up unit j
      return up.gate_up ? 2 * j + q : j + q * per_pair;
    };

    // 1. Every byte this warp will read: a group per gate|up unit, then one for all down units.
    for (int i = 0; i < n13; ++i) {
      int const unit = u0 + i, e = expert_of(up, unit / per_pair);
      if (e >= 0) {
#pragma unroll
        for (int q = 0; q < 2; ++q) copy_slab(smem + (2 * i + q) * slab13, up, e, strip_of(unit % per_pair, q), r13, lane);
      }
      C::commit();
    }
    for (int i = 0; i < n2; ++i) {
      int const unit = d0 + i, tok = unit / per_token, n = unit % per_token;
      for (int j = 0; j < dn.top_k; ++j) {
        int const e = expert_of(dn, tok * dn.top_k + j);
        if (e >= 0) copy_slab(down_smem + (i * dn.top_k + j) * slab2, dn, e, n, r2, lane);
      }
    }
    C::commit();

    // 2. gate|up, a unit at a time as its bytes land.
    for (int i = 0; i < n13; ++i) {
      C::wait_at_most(n13 - i);  // this unit's group and the ones after it, the down group last
      __syncwarp();
      int const unit = u0 + i, pair = unit / per_pair, e = expert_of(up, pair);
      float out[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
      if (e >= 0) {
        char const* const slabs[2] = {smem + 2 * i * slab13, smem + (2 * i + 1) * slab13};
        dot(slabs, up, r13, XGlobal{static_cast<raw const*>(up.x) + (size_t)(pair / up.top_k) * up.k, up.k}, lane,
            out);
      }
      if (t == 0) {  // [0, 16): gate of outputs 0..15, [16, 32): up
        float* red = red13 + (i * kWarps + warp) * 32;
        if (up.gate_up) {  // strip q: gate row g, up row g + 8, both of output 8 q + g
          red[g] = out[0][0], red[16 + g] = out[0][1], red[8 + g] = out[1][0], red[24 + g] = out[1][1];
        } else {  // strip 0: gate of outputs g, g + 8; strip 1: up of the same
          red[g] = out[0][0], red[8 + g] = out[0][1], red[16 + g] = out[1][0], red[24 + g] = out[1][1];
        }
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n13 * kRows; idx += kThreads) {
      int const i = idx / kRows, o = idx % kRows, unit = u0 + i, pair = unit / per_pair;
      float gs = 0.f, us = 0.f;
      for (int w = 0; w < kWarps; ++w) {
        gs += red13[(i * kWarps + w) * 32 + o];
        us += red13[(i * kWarps + w) * 32 + 16 + o];
      }
      float const v = expert_of(up, pair) >= 0 ? silu_mul(gs, us) : 0.f;
      static_cast<raw*>(up.y)[(size_t)pair * inter + (unit % per_pair) * kRows + o] = static_cast<raw>(v);
    }

    // 3. Every h row written (and every warp done with the gate|up slabs, which now take the h slices).
    grid_sync(f.sync);

    // 4. down: its weights were requested at the start; this warp's h slices now, through L2.
    int const kper2 = (dn.katoms + kWarps - 1) / kWarps;
    auto staged = [&](int i, int j) { return smem + ((i * dn.top_k + j) * kWarps + warp) * kper2 * 32; };
    for (int i = 0; i < n2; ++i) {
      int const tok = (d0 + i) / per_token;
      for (int j = 0; j < dn.top_k; ++j) {
        int const pair = tok * dn.top_k + j;
        if (expert_of(dn, pair) < 0) continue;
        raw const* hr = static_cast<raw const*>(dn.x) + (size_t)pair * dn.k;
        for (int pc = lane; pc < (r2.k1 - r2.k0) * 2; pc += 32) {  // 8 elements a copy, 2 an atom
          int const idx = (r2.k0 + pc / 2) * 16 + 8 * (pc % 2);
          if (idx < dn.k) C::copy16(staged(i, j) + 16 * pc, hr + idx);
        }
      }
    }
    C::commit();
    C::wait_group<0>();
    __syncwarp();
    for (int i = 0; i < n2; ++i) {
      int const tok = (d0 + i) / per_token;
      float acc[2] = {0.f, 0.f};
      for (int j = 0; j < dn.top_k; ++j) {
        int const pair = tok * dn.top_k + j;
        if (expert_of(dn, pair) < 0) continue;
        char const* const slab[1] = {down_smem + (i * dn.top_k + j) * slab2};
        float out[1][2];
        dot(slab, dn, r2, XStaged{staged(i, j), r2.k0, dn.k}, lane, out);
        float const wt = topk_weight(dn, pair);
        acc[0] = fmaf(wt, out[0][0], acc[0]);
        acc[1] = fmaf(wt, out[0][1], acc[1]);
      }
      if (t == 0) {
        float* red = red2 + (i * kWarps + warp) * 16;
        red[g] = acc[0], red[8 + g] = acc[1];
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n2 * kRows; idx += kThreads) {
      int const i = idx / kRows, o = idx % kRows, unit = d0 + i, tok = unit / per_token;
      int const n = (unit % per_token) * kRows + o;
      float s = 0.f;
      for (int w = 0; w < kWarps; ++w) s += red2[(i * kWarps + w) * 16 + o];
      if (n < dn.n) static_cast<raw*>(dn.y)[(size_t)tok * dn.n + n] = static_cast<raw>(s);
    }
  }
};

}  // namespace mixed_gemm
