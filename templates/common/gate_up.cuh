// The row order of a stacked gate|up weight (mixed_gemm/ops/experts.py, prepack_experts(gate_up=True)):
// stored rows 16 j .. 16 j + 7 are gate rows 8 j .. 8 j + 7, stored rows 16 j + 8 .. 16 j + 15 the
// matching up rows. An mma.sync (m16n8k16) or wgmma (m64) accumulator gives each thread rows r and
// r + 8 of a 16-row block, so with this order one thread holds gate row i and up row i and the
// GEMM's own epilogue forms SiLU(gate) * up: h (pairs, I) is the only output written.
// Python mirror: mixed_gemm.kernels.common.GATE_UP_BLOCK (the grouped families' sources assert it).
#pragma once

namespace mixed_gemm {

constexpr int kGateUpBlock = 8;

// The h column of stored row `row` (< 8 within its 16-row block: a gate row) of a gate|up stack.
__host__ __device__ constexpr int gate_up_output(int row) { return (row >> 4) * kGateUpBlock + (row & 7); }

// silu(g) * u in fp32, the one SiLU of every gated epilogue. The fast exp and divide: a tile
// epilogue forms one per pair of accumulators, and with expf and an IEEE divide (~30 instructions)
// that cost Mixtral's 4096-token gate|up GEMM ~0.2 ms, beyond the one-pass kernel it replaced.
// (A very negative g: exp overflows to inf and the quotient is -0, as silu's limit.)
__device__ __forceinline__ float silu_mul(float g, float u) { return __fdividef(g, 1.f + __expf(-g)) * u; }

}  // namespace mixed_gemm
