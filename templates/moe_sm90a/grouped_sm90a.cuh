// The moe_sm90a family: CUTLASS 3.x's ptr-array (grouped) warp-specialized wgmma mixed-input GEMM,
// one group per expert, for the many-token side of a mixture-of-experts layer (sm_90a only).
//
// As in the dense sm90a family (templates/sm90a/gemm_sm90a.cuh) the narrow operand must be wgmma's
// register operand A, so each group computes the transposed problem: D_e[N, T_e] = W_e[N, K] .
// X_e[T_e, K]^T, with W_e expert e's sm90a-layout weight (the same reordered layout, scales and
// additive zeros as a dense sm90a weight: PackedExperts stacks prepack's tensors), X_e the T_e rows
// routed to e (gathered, contiguous), D_e^T its rows of the output. The problem sizes, and every
// pointer, live in device arrays written by the caller on the stream (no host sync: T_e is never
// read on the host); the kernel's persistent group scheduler walks them, and rewrites each TMA
// descriptor in shared memory when its tile's group changes.
//
// CUTLASS 4.2's ptr-array mixed-input collective keeps the scale descriptor out of every tensormap
// step when it also carries zeros (ConvertAndScaleWithZero): only the zero's descriptor is copied
// to shared memory, re-pointed, re-shaped and released, so the scales would be read through a
// descriptor nobody initialised. ScaleZeroMainloop below adds the scale's steps beside the zero's;
// everything else is the library's collective.
#pragma once

#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "sm90a/gemm_sm90a.cuh"  // reorder_atom, FixedStageCount, the error codes
#include "common/gate_up.cuh"
#include "cutlass/epilogue/collective/default_epilogue_array.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"

namespace mixed_gemm {
namespace moe_sm90a {

using namespace cute;

// The library's ptr-array mixed-input collective with the scale descriptor's tensormap steps added
// (see the file comment). The kernel calls these four members on its CollectiveMainloop object,
// so overriding them in a derived type is enough: the base's own calls stay on the base's.
template <class Base>
struct ScaleZeroMainloop : Base {
  using typename Base::Params;
  using typename Base::TensorMapStorage;
  static_assert(Base::KernelConversionMode == Base::ConversionMode::ConvertAndScaleWithZero,
                "ScaleZeroMainloop fixes the scale-and-zero mode only");

  CUTLASS_DEVICE auto tensormaps_init(Params const& params, TensorMapStorage& smem, int32_t sm_count, int32_t sm_idx) {
    auto maps = Base::tensormaps_init(params, smem, sm_count, sm_idx);  // A, B, zero (and their gmem slots)
    Tensor from = make_tensor(params.tma_load_scale.get_tma_descriptor(), Int<1>{}, Int<1>{});
    Tensor to = make_tensor(make_smem_ptr(&smem.smem_tensormap_scale), Int<1>{}, Int<1>{});
    if (cute::elect_one_sync()) {
      copy(recast<uint128_t>(from), recast<uint128_t>(to));
    }
    __syncwarp();
    return maps;
  }

  template <class... TMs, class ProblemShapeMNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& smem, Params const& params,
                                                cute::tuple<TMs...> const& maps, ProblemShapeMNKL problem,
                                                int32_t next_group) {
    Base::tensormaps_perform_update(smem, params, maps, problem, next_group);
    if (cute::elect_one_sync()) {
      cute::tma_descriptor_replace_addr_in_shared_mem(smem.smem_tensormap_scale, params.ptr_S[next_group]);
      // The scale tensor of this group: (M rows of the kernel's view, K / group) with its stride,
      // exactly as the base builds the zero's (scales and zeros share one shape and stride).
      uint32_t const m = get<0>(problem);
      uint32_t const k = get<2>(problem);
      cute::array<uint32_t, 5> shape = {1, 1, 1, 1, 1};
      cute::array<uint64_t, 5> stride = {0, 0, 0, 0, 0};
      typename Base::NonVoidElementScale const* none = nullptr;
      Tensor scale = make_tensor(cutlass::gemm::collective::detail::get_logical_ptr(none),
                                 make_shape(m, ceil_div(k, params.chunk_size), Int<1>{}), params.dS[next_group]);
      cute::detail::fill_tma_gmem_shape_stride(params.tma_load_scale, scale, shape, stride);
      for (uint64_t& s : stride) {
        s = (s * sizeof_bits_v<typename Base::NonVoidElementScale>) / 8;  // bytes
      }
      cute::tma_descriptor_replace_dims_strides_in_shared_mem(smem.smem_tensormap_scale, shape, stride);
    }
  }

  template <class... TMs>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& smem, cute::tuple<TMs...> const& maps) {
    Base::tensormaps_cp_fence_release(smem, maps);  // waits for the shared-memory edits, releases A, B, zero
    cute::tma_descriptor_cp_fence_release(get<2>(maps), smem.smem_tensormap_scale);
  }

  template <class... TMs>
  CUTLASS_DEVICE void tensormaps_fence_acquire(cute::tuple<TMs...> const& maps) {
    Base::tensormaps_fence_acquire(maps);
    cute::tma_descriptor_fence_acquire(get<2>(maps));
  }
};

// The library's ptr-array register-store epilogue (no shared memory) with a gate|up mode
// (Arguments::gate_up, chosen per launch: one binary serves both projections). The weight rows are
// a gate|up stack's (common/gate_up.cuh): a wgmma m64 accumulator gives each thread rows r and
// r + 8 of a 16-row block, value (c, 0, j) and (c, 1, j) of its fragment, i.e. gate row i and up
// row i. It writes h[t, gate_up_output(r)] = silu(g) * u for each token column t of the group:
// (N / 2) columns, half the bytes of the product it replaces and no second pass over them. g and u
// are rounded to the output dtype first (the rounding of a stored product), silu(g) * u once.
template <class Base>
struct GateUpEpilogue : Base {
  struct Arguments : Base::Arguments {
    int gate_up = 0;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }

  CUTLASS_HOST_DEVICE GateUpEpilogue(Params const& params) : Base(params), params_(params) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                      BlockCoordMNKL blk_coord_mnkl, Tensor<FrgEngine, FrgLayout> const& accumulators,
                                      TiledMma tiled_mma, ResidueMNK residue, int thread_idx, char* smem) {
    if (!params_.gate_up) {
      Base::operator()(problem_shape_mnkl, blk_shape_MNK, blk_coord_mnkl, accumulators, tiled_mma, residue,
                       thread_idx, smem);
      return;
    }
    using ElementD = typename Base::ElementD;
    // wgmma's accumulator fragment: ((2 columns, 2 row halves, N / 8), MMA_M, MMA_N).
    static_assert(rank<0>(FrgLayout{}) == 3 && size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2,
                  "a wgmma accumulator: rows r and r + 8 in the fragment's second mode");
    static_assert(kGateUpBlock == 8, "the gate|up rows pair accumulator rows r and r + 8");
    int const m_total = int(get<0>(problem_shape_mnkl));  // 2I weight rows
    int const n_total = int(get<1>(problem_shape_mnkl));  // the group's routed rows
    int const inter = m_total / 2;
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    ElementD* h = params_.ptr_D[l_coord];
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor tile = local_tile(make_identity_tensor(make_shape(m_total, n_total)), take<0, 2>(blk_shape_MNK),
                             make_coord(m_coord, n_coord));
    Tensor coords = thr_mma.partition_C(tile);  // (m, n) of each accumulator
    auto rounded = [](float v) { return float(ElementD(v)); };
    // A thread holds h columns i (its row r) for tokens n and n + 1; lane ^ 4 holds column i ^ 1 (row
    // r ^ 1) for the same tokens. One exchange and each thread stores two adjacent columns of one
    // token in one 4-byte store: rows r even take token n, odd ones token n + 1.
    bool const odd = (thread_idx >> 2) & 1;
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < size<1>(accumulators); ++mi) {
      CUTLASS_PRAGMA_UNROLL
      for (int ni = 0; ni < size<2>(accumulators); ++ni) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<0, 2>(accumulators); ++j) {
          float v[2];
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < 2; ++c) {
            v[c] = silu_mul(rounded(accumulators(make_coord(c, 0, j), mi, ni)),
                            rounded(accumulators(make_coord(c, 1, j), mi, ni)));
          }
          float const other = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 4);
          auto const at = coords(make_coord(0, 0, j), mi, ni);
          int const m = get<0>(at) & ~1, n = get<1>(at) + (odd ? 1 : 0);  // the pair's first row, this store's token
          if (m < m_total && n < n_total) {
            cutlass::Array<ElementD, 2> pair;
            pair[0] = ElementD(odd ? other : v[0]);
            pair[1] = ElementD(odd ? v[1] : other);
            *reinterpret_cast<cutlass::Array<ElementD, 2>*>(h + (size_t)n * inter + gate_up_output(m)) = pair;
          }
        }
      }
    }
  }

 private:
  Params params_;
};

// The epilogue operator inside CUTLASS's adapter for the warp-specialized kernels.
template <class Adapted>
struct AdaptedOp;
template <class Op>
struct AdaptedOp<cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Op>> {
  using type = Op;
};

// ClusterM: CTAs per cluster along the weight rows (1 or 2). A pair takes adjacent weight tiles of
// one expert (CUTLASS's group scheduler rounds each group's weight tiles up to the cluster) and the
// routed rows' tile, the same for both, is read from L2 once and TMA-multicast into both CTAs.
template <class MmaType_, class QuantType_, int TM, int TN, int TK, int Stages, int ClusterM = 1>
struct GroupedGemm {
  using MmaType = MmaType_;
  using QuantType = QuantType_;
  static constexpr int kBits = cutlass::sizeof_bits<QuantType>::value;

  // The dense family's weight reorder (same layout, same converters).
  using ValueShuffle = cute::conditional_t<kBits == 4, Layout<Shape<_2, _4>, Stride<_4, _1>>,
                                           Layout<Shape<_2, _2>, Stride<_2, _1>>>;
  using LayoutAtomW = decltype(sm90a::reorder_atom<MmaType, ValueShuffle>());
  // Ptr-array strides have a static zero batch stride: each group is one matrix at its own pointer.
  using StrideW = cute::remove_pointer_t<cutlass::detail::TagToStrideA_t<cutlass::layout::RowMajor*>>;
  using LayoutW = decltype(tile_to_shape(LayoutAtomW{}, Layout<Shape<int, int, _1>, StrideW>{}));

  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (N, T_e, K) per expert
  using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
  static_assert(ClusterM == 1 || ClusterM == 2, "clusters of 1 or 2 CTAs along the weight rows");
  static constexpr int kClusterM = ClusterM;
  using ClusterShape = Shape<Int<ClusterM>, _1, _1>;
  // Cooperative: two consumer warpgroups split the tile's weight rows (TM >= 128).
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  // Register stores, so that one thread can pair gate and up (GateUpEpilogue); no shared memory,
  // which the main loop's stages take instead.
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;

  // y rows (tokens, N) row-major are D^T column-major; no C operand.
  static constexpr int kAlignY = 128 / cutlass::sizeof_bits<MmaType>::value;
  using LibraryEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::ColumnMajor*, kAlignY,
      MmaType, cutlass::layout::ColumnMajor*, kAlignY,
      EpilogueSchedule>::CollectiveOp;
  using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
      GateUpEpilogue<typename AdaptedOp<LibraryEpilogue>::type>>;

  using StageCount = cute::conditional_t<
      Stages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      sm90a::FixedStageCount<(Stages > 0 ? Stages : 2)>>;

  using LibraryMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cute::tuple<QuantType, MmaType, MmaType>, LayoutW*, 128 / kBits,
      MmaType, cutlass::layout::ColumnMajor*, 128 / cutlass::sizeof_bits<MmaType>::value,
      float, TileShape, ClusterShape, StageCount, KernelSchedule>::CollectiveOp;
  using CollectiveMainloop = ScaleZeroMainloop<LibraryMainloop>;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Arguments = typename GemmKernel::Arguments;
  using Params = typename GemmKernel::Params;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using StrideX = typename GemmKernel::InternalStrideB;
  using StrideS = typename LibraryMainloop::NonVoidStrideScale;
  using StrideY = typename GemmKernel::InternalStrideD;

  // One group's strides, identical for every expert (same N, K): the caller replicates them into
  // the device arrays once per stacked weight. n_pad: stored weight / scale rows; k16: K padded to 16.
  static LayoutW layout_w(int n_pad, int k16) { return tile_to_shape(LayoutAtomW{}, make_shape(n_pad, k16, _1{})); }
  static StrideX stride_x(int k) {
    StrideX s{};
    get<0>(s) = k;  // x rows (K-major operand B): one row of K per routed pair
    return s;
  }
  static StrideS stride_s(int n_pad) {
    StrideS s{};
    get<1>(s) = n_pad;  // (groups, N_pad) row-major: MN-major scales
    return s;
  }
  static StrideY stride_y(int n) {
    StrideY s{};
    get<1>(s) = n;  // D (N x T_e) column-major: one output row of N per routed pair
    return s;
  }

  // CUTLASS's argument structs take mutable pointers to the device arrays; the kernel only reads them.
  template <class T>
  static T* as(void const* p) {
    return static_cast<T*>(const_cast<void*>(p));
  }

  // The arguments of one launch over `groups` experts: every pointer is a device array of one
  // entry per expert, `shapes` the (N, T_e, K) triples. gate_up: y is h (T_e rows of N / 2 per
  // group), SiLU(gate) * up of the gate|up stack's product (GateUpEpilogue). raster_n: the group
  // scheduler walks a group's routed-row tiles first (else its weight tiles, CUTLASS's default); its
  // swizzle stays 1, which would round every group's tile counts up to the swizzle (empty tiles
  // that still run the main loop) for groups of a few tiles.
  static Arguments make_args(int groups, void* shapes, void const* w, void const* layouts_w, void const* x,
                             void const* strides_x, void const* s, void const* strides_s, void const* z, void* y,
                             void const* strides_y, int group_size, int sm_count, int gate_up, int raster_n) {
    typename CollectiveEpilogue::Arguments epilogue{};
    epilogue.ptr_D = as<MmaType*>(y);
    epilogue.dD = as<StrideY>(strides_y);
    epilogue.gate_up = gate_up;
    epilogue.thread.alpha = 1.0f;
    epilogue.thread.beta = 0.0f;
    Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                   {groups, static_cast<Shape3*>(shapes), nullptr},
                   {as<QuantType const*>(w), as<LayoutW>(layouts_w), as<MmaType const*>(x), as<StrideX>(strides_x),
                    as<MmaType const*>(s), as<StrideS>(strides_s), group_size, as<MmaType const*>(z)},
                   epilogue};
    args.hw_info.sm_count = sm_count;  // given: otherwise every call queries the device
    // Clusters of two: max_active_clusters stays 0 and the scheduler's grid is its GPC estimate, all
    // SMs for pairs (SMs come in pairs, TPCs, on Hopper).
    using Raster = typename GemmKernel::TileScheduler::RasterOrderOptions;
    args.scheduler.raster_order = raster_n ? Raster::AlongN : Raster::AlongM;
    args.scheduler.max_swizzle_size = 1;
    return args;
  }
};

template <class G>
int launch(typename G::Arguments const& args, void* workspace, size_t workspace_bytes, void const* kernel,
           cudaStream_t stream) {
  if (!G::GemmKernel::can_implement(args)) return int(cutlass::Status::kInvalid);
  if (G::GemmKernel::get_workspace_size(args) > workspace_bytes) return sm90a::kErrWorkspace;
  cutlass::Status st = G::GemmKernel::initialize_workspace(args, workspace, stream, nullptr);
  if (st != cutlass::Status::kSuccess) return int(st);
  // Host work only (descriptors with placeholder shapes, the scheduler's grid): the kernel replaces
  // every descriptor's address and shape per group on the device.
  typename G::Params params = G::GemmKernel::to_underlying_arguments(args, workspace);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = G::GemmKernel::get_grid_shape(params);
  cfg.blockDim = G::GemmKernel::get_block_shape();
  cfg.dynamicSmemBytes = G::GemmKernel::SharedStorageSize;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = G::kClusterM;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  void* kernel_args[] = {&params};
  return cudaLaunchKernelExC(&cfg, kernel, kernel_args) == cudaSuccess ? 0 : sm90a::kErrLaunch;
}

}  // namespace moe_sm90a
}  // namespace mixed_gemm
