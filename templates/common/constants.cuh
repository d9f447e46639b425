// Constants shared by the kernels and the Python package. Each has exactly one Python mirror in
// mixed_gemm/kernels/common.py; every rendered source static_asserts the two agree, so changing
// one side alone fails at compile time instead of corrupting a launch.
#pragma once

namespace mixed_gemm {

// How the weight's zero point enters: w = (q - 2^(bits-1)) s | (q - z) s, z integer |
// (q - z) s, z any float (HQQ) | q s + m (GGUF Q4_1 offsets). See dequant.cuh.
enum class ZeroMode : int { kSymmetric = 0, kInteger = 1, kFloat = 2, kOffset = 3 };

// Split-K across blocks (blockIdx.z = slice). See sm80/gemm_sm80.cuh for what each mode does.
enum class SplitKMode : int { kNone = 0, kSerial = 1, kParallel = 2, kFused = 3 };

// group_shift meaning "one group per column": k >> 30 is 0 for every k a 32-bit index reaches.
constexpr int kPerChannelShift = 30;

// The 16 (k) x 64 (n) atom of the sm80 weight layout (mixed_gemm/kernels/sm80/layout.py): one
// ldmatrix.x4 per lane covers it, and scales/zeros are 8x8-transposed within its 64 columns.
constexpr int kAtomK = 16;
constexpr int kAtomN = 64;

// Threads per block of the parallel split-K reduce kernel (sm80/reduce.cuh).
constexpr int kReduceThreads = 256;

}  // namespace mixed_gemm
