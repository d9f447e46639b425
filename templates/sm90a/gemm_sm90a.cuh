// The sm90a family: CUTLASS 3.x warp-specialized wgmma mixed-input GEMM (sm_90a only).
//
// The narrow operand of CUTLASS's mixed-input collective is converted in registers and fed to
// wgmma as the register operand, which must be operand A. So this kernel computes the transposed
// problem: D[N, M] = W[N, K] . x[M, K]^T, i.e. kernel-M = the weight's output features, kernel-N =
// tokens, and D is y^T (column-major D == row-major y). The weight layout it reads is documented
// in mixed_gemm/kernels/sm90a/layout.py; scales and additive zeros are (groups, N_pad) row-major
// ("MN-major"), which is what the collective's scale TMA needs.
//
// Dequantization is w = q' * s + z' with q' the signed code (q - 2^(bits-1), stored as int4b_t /
// int8_t: those have the collective's fastest lop3/prmt converters) and z' = (2^(bits-1) - z) * s
// (or 2^(bits-1) s + m for offsets), computed at prepack: the collective's zero is additive.
//
// The host side (Arguments -> Params: five TMA descriptors and the tile scheduler's state) lives
// here too: the rendered .cu is built as one shared library with a small C ABI (kernel.cu.j2),
// loaded by mixed_gemm/kernels/sm90a/launch.py with ctypes.
#pragma once

#include <cstdint>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace mixed_gemm {
namespace sm90a {

using namespace cute;

// The weight reorder: the 16 x 16 (n, k) block one warp of a register-A wgmma reads, rearranged
// so that each lane's 8 values are contiguous (one 32-bit int4 / 64-bit int8 load per lane from
// shared memory instead of 8 sub-word loads) and in the value order the collective's
// layout-aware converters expect. The same construction as CUTLASS's
// compute_memory_reordering_atom (tools/util mixed_dtype_utils.hpp, which we cannot include: it
// pulls in curand); layout.py builds the identical permutation in torch and the test suite checks
// the two against each other through mg_layout_offset below.
template <class ElementMma, class ValLayout>
constexpr auto reorder_atom() {
  using MmaAtom = decltype(SM90::GMMA::rs_op_selector<ElementMma, ElementMma, float, Shape<_64, _16, _32>>());
  using Traits = MMA_Traits<MmaAtom>;
  auto mk_shape_mma = select<0, 2>(typename Traits::Shape_MNK{});
  auto tv_mma = typename Traits::ALayout{};
  // One warp's share of the warpgroup's A fragment (warps split M), inverted to (m, k) -> (thr, val).
  auto tv_tiler_warp = make_shape(Int<32>{}, size<1>(tv_mma));
  auto mk_shape_warp = shape_div(mk_shape_mma, size(typename Traits::ThrID{}) / Int<32>{});
  auto tv_warp = make_layout_like(composition(tv_mma, tv_tiler_warp));
  auto mk_warp = right_inverse(tv_warp).with_shape(mk_shape_warp);
  auto mk_target = blocked_product(mk_warp, Layout<Shape<_1, _1>>{});
  auto val_to_offset = logical_product(ValLayout{}, size<1>(tv_mma) / size(ValLayout{}));
  auto thr_to_offset = make_layout(size<0>(tv_warp));
  auto tv_to_offset = select<1, 0>(logical_product(val_to_offset, thr_to_offset));
  return composition(tv_to_offset, mk_target);
}

// A fixed pipeline depth for the mixed-input builder. CUTLASS 4.2's builder passes
// `StageCountType::bytes` as the last template argument of its stage-count helper, and only the
// StageCountAutoCarveout form has that member; its fixed-count overload takes StageCount<N> with that
// same argument as N. A StageCount<N> that also says bytes = N therefore selects the fixed overload.
template <int N>
struct FixedStageCount : cutlass::gemm::collective::StageCount<N> {
  static constexpr int bytes = N;
};

template <class MmaType_, class QuantType_, int TM, int TN, int TK, int CM, int CN, bool Pingpong, bool StreamK,
          int Stages>
struct Gemm {
  using MmaType = MmaType_;      // activations, scales, zeros, bias, output
  using QuantType = QuantType_;  // int4b_t or int8_t (signed codes q - 2^(bits-1))
  static constexpr int kBits = cutlass::sizeof_bits<QuantType>::value;

  // [0,2,4,6,1,3,5,7] (int4) / [0,2,1,3] (int8): the orders the LayoutAwareConvert
  // specializations of mixed_input_utils.hpp take, so conversion needs no per-element shifts.
  using ValueShuffle = cute::conditional_t<kBits == 4, Layout<Shape<_2, _4>, Stride<_4, _1>>,
                                           Layout<Shape<_2, _2>, Stride<_2, _1>>>;
  using LayoutAtomW = decltype(reorder_atom<MmaType, ValueShuffle>());
  using StrideW = cutlass::detail::TagToStrideA_t<cutlass::layout::RowMajor>;  // K-major (required)
  using LayoutW = decltype(tile_to_shape(LayoutAtomW{}, Layout<Shape<int, int, int>, StrideW>{}));

  using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using ClusterShape = Shape<Int<CM>, Int<CN>, _1>;
  // Pingpong: one consumer warpgroup per tile, two tiles in flight (math of one overlaps the
  // other's epilogue). Cooperative: two warpgroups split one tile's M (needs TM >= 128).
  using KernelSchedule = cute::conditional_t<Pingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                             cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = cute::conditional_t<Pingpong, cutlass::epilogue::TmaWarpSpecialized,
                                               cutlass::epilogue::TmaWarpSpecializedCooperative>;

  // y row-major is D^T column-major; no C operand (beta = 0). The per-row bias of the kernel's
  // view is the per-output-feature bias; a null pointer reads as zero, so one kernel serves both.
  using LayoutY = cutlass::layout::ColumnMajor;
  static constexpr int kAlignY = 128 / cutlass::sizeof_bits<MmaType>::value;
  using FusionOp = cutlass::epilogue::fusion::LinCombPerRowBias<MmaType, float, MmaType, MmaType, float>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutY, kAlignY,
      MmaType, LayoutY, kAlignY,
      EpilogueSchedule, FusionOp>::CollectiveOp;

  // Stages == 0: as many as fit beside the epilogue's shared memory.
  using StageCount = cute::conditional_t<
      Stages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      FixedStageCount<(Stages > 0 ? Stages : 2)>>;

  // x[M, K] row-major is a K-major operand B ("ColumnMajor" B in CUTLASS's naming).
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cute::tuple<QuantType, MmaType, MmaType>, LayoutW, 128 / kBits,
      MmaType, cutlass::layout::ColumnMajor, 128 / cutlass::sizeof_bits<MmaType>::value,
      float, TileShape, ClusterShape, StageCount, KernelSchedule>::CollectiveOp;

  // Stream-K's scheduler also does plain split-K (DecompositionMode::SplitK) and data-parallel.
  using Scheduler = cute::conditional_t<StreamK, cutlass::gemm::StreamKScheduler, cutlass::gemm::PersistentScheduler>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, Scheduler>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using Arguments = typename GemmKernel::Arguments;
  using Params = typename GemmKernel::Params;
  using StrideS = typename CollectiveMainloop::StrideScale;  // Stride<_1, int64_t, int64_t>
  using StrideX = typename GemmKernel::StrideB;
  using StrideY = typename GemmKernel::StrideD;

  // The arguments of one call. n: output features (kernel M); n_pad: rows of the stored weight,
  // scales and zeros (a multiple of 16); k: the true K (x's row length; the weight is stored with
  // K rounded up to 16, and TMA zero-fills x beyond k, so the padding never reaches a sum).
  static Arguments make_args(const void* w, const void* s, const void* z, const void* x, void* y, const void* bias,
                             int m, int n, int n_pad, int k, int group, int sm_count, int splits, int swizzle,
                             int raster) {
    int k16 = (k + 15) / 16 * 16;
    int64_t groups = (k + group - 1) / group;
    auto layout_w = tile_to_shape(LayoutAtomW{}, make_shape(n_pad, k16, 1));
    StrideX dx = make_stride(int64_t(k), Int<1>{}, int64_t(m) * k);
    StrideS ds = make_stride(Int<1>{}, int64_t(n_pad), int64_t(n_pad) * groups);
    StrideY dy = make_stride(Int<1>{}, int64_t(n), int64_t(n) * m);
    Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                   {n, m, k, 1},
                   {static_cast<QuantType const*>(w), layout_w, static_cast<MmaType const*>(x), dx,
                    static_cast<MmaType const*>(s), ds, group, static_cast<MmaType const*>(z)},
                   {{}, nullptr, dy, static_cast<MmaType*>(y), dy}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.thread.bias_ptr = static_cast<MmaType const*>(bias);
    // Given explicitly: otherwise to_underlying_arguments queries the device on every call.
    args.hw_info.sm_count = sm_count;
    // Tile order: groups of `swizzle` tiles along the other dimension share operand tiles in L2;
    // raster 0 lets CUTLASS pick the direction, 1 walks weight tiles first, 2 token tiles first.
    using Raster = decltype(args.scheduler.raster_order);
    args.scheduler.max_swizzle_size = swizzle;
    args.scheduler.raster_order = raster == 1 ? Raster::AlongM : raster == 2 ? Raster::AlongN : Raster::Heuristic;
    if constexpr (StreamK) {
      using Mode = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams::DecompositionMode;
      // splits 0: CUTLASS's stream-K heuristic; 1: data-parallel; > 1: split-K into that many slices.
      args.scheduler.splits = splits > 1 ? splits : 1;
      args.scheduler.decomposition_mode = splits == 0 ? Mode::Heuristic : splits == 1 ? Mode::DataParallel : Mode::SplitK;
    }
    return args;
  }
};

// One cached launch (per weight, bias and M bucket on the Python side): the arguments, the Params
// built from them and the addresses they hold, so a call re-encodes only what changed.
template <class G>
struct Slot {
  typename G::Arguments args;
  alignas(128) typename G::Params params;
  const void* x = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int m = -1;
};

using ReplaceAddressFn = CUresult (*)(CUtensorMap*, void*);

// cuTensorMapReplaceAddress through the runtime's driver entry point (no -lcuda link needed).
inline ReplaceAddressFn replace_address_fn() {
  static ReplaceAddressFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapReplaceAddress", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<ReplaceAddressFn>(p);
  }();
  return fn;
}

// Error codes of the C ABI (0 = success; positive values are cutlass::Status).
enum : int { kErrNoReplace = -1, kErrReplaceX = -2, kErrReplaceY = -3, kErrWorkspace = -4, kErrSetup = -5,
             kErrLaunch = -6, kErrLoad = -7 };

template <class G>
int init(Slot<G>* slot, const void* w, const void* s, const void* z, const void* x, void* y, const void* bias, int m,
         int n, int n_pad, int k, int group, int sm_count, int splits, int swizzle, int raster, void* workspace,
         size_t workspace_bytes) {
  slot->args = G::make_args(w, s, z, x, y, bias, m, n, n_pad, k, group, sm_count, splits, swizzle, raster);
  if (!G::GemmKernel::can_implement(slot->args)) return int(cutlass::Status::kInvalid);
  if (G::GemmKernel::get_workspace_size(slot->args) > workspace_bytes) return kErrWorkspace;
  slot->params = G::GemmKernel::to_underlying_arguments(slot->args, workspace);
  slot->x = x;
  slot->y = y;
  slot->workspace = workspace;
  slot->workspace_bytes = workspace_bytes;
  slot->m = m;
  return 0;
}

// Point the cached Params at new activations and output: the x (operand B) and y (D) TMA
// descriptors are patched in place; every other field stays. Host-only, no stream work.
template <class G>
int retarget(Slot<G>* slot, const void* x, void* y) {
  ReplaceAddressFn replace = replace_address_fn();
  if (!replace) return kErrNoReplace;
  if (x != slot->x) {
    auto* d = const_cast<CUtensorMap*>(reinterpret_cast<CUtensorMap const*>(slot->params.mainloop.tma_load_b.get_tma_descriptor()));
    if (replace(d, const_cast<void*>(x)) != CUDA_SUCCESS) return kErrReplaceX;
    slot->x = x;
    slot->args.mainloop.ptr_B = static_cast<typename G::MmaType const*>(x);
  }
  if (y != slot->y) {
    auto* d = const_cast<CUtensorMap*>(reinterpret_cast<CUtensorMap const*>(slot->params.epilogue.tma_store_d.get_tma_descriptor()));
    if (replace(d, y) != CUDA_SUCCESS) return kErrReplaceY;
    slot->y = y;
    slot->args.epilogue.ptr_D = static_cast<typename G::MmaType*>(y);
  }
  return 0;
}

template <class G>
int launch(Slot<G>* slot, void const* kernel, cudaStream_t stream) {
  // Stream-K / split-K barriers count up and are not reset by the kernel: clear them before every
  // launch (a memset on the stream, so it is captured into CUDA graphs with the kernel).
  if (slot->workspace != nullptr) {
    cutlass::Status st = G::GemmKernel::initialize_workspace(slot->args, slot->workspace, stream, nullptr);
    if (st != cutlass::Status::kSuccess) return int(st);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = G::GemmKernel::get_grid_shape(slot->params);
  cfg.blockDim = G::GemmKernel::get_block_shape();
  cfg.dynamicSmemBytes = G::GemmKernel::SharedStorageSize;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = size<0>(typename G::ClusterShape{});
  attr[0].val.clusterDim.y = size<1>(typename G::ClusterShape{});
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  void* kernel_args[] = {&slot->params};
  // The Params blob is copied into the launch, so a captured graph node owns its copy and the
  // slot can be re-targeted right after.
  return cudaLaunchKernelExC(&cfg, kernel, kernel_args) == cudaSuccess ? 0 : kErrLaunch;
}

}  // namespace sm90a
}  // namespace mixed_gemm
