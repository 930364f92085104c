// Hand-instantiated CUTLASS 3.x Hopper (sm_90a) GEMMs for DARE's projection shapes: y = x @ w.T in bf16 with fp32
// accumulation, x row-major [M, K], w row-major [N, K] (F.linear's operands), y row-major [M, N].
//
// Benchmark helper, not a DARE dependency: `benchmarks/cutlass/build.sh` compiles it into a shared library with a
// plain C interface (no PyTorch headers, so one build serves any PyTorch), and `benchmarks/cutlass_gemm.py` calls
// it through ctypes on PyTorch's current stream, so calls can be recorded into CUDA graphs.
//
// Each variant is one kernel configuration: warp-specialised cooperative (two consumer warp groups on one tile) or
// ping-pong (two tiles in flight), a CTA tile, a cluster shape (multicast of the weight tile across the CTAs of a
// cluster), and a persistent or stream-K tile scheduler. Stream-K variants take a decomposition at run time
// (heuristic, data-parallel, split-K with `splits`, stream-K).

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace {

template <class Tile, class Cluster, class MainloopSchedule, class EpilogueSchedule, class Scheduler>
struct Projection {
  using Element = cutlass::bfloat16_t;
  static constexpr int kAlign = 16 / sizeof(Element);

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlign,  // no source operand: y = acc
      Element, cutlass::layout::RowMajor, kAlign, EpilogueSchedule>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, kAlign,     // x: M x K, K contiguous
      Element, cutlass::layout::ColumnMajor, kAlign,  // w read as K x N with K contiguous
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const void* x, const void* w, void* y, int m, int n, int k,
                                            int decomposition, int splits, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const Element*>(x), cutlass::make_cute_packed_stride(StrideA{}, make_shape(m, k, 1)),
         static_cast<const Element*>(w), cutlass::make_cute_packed_stride(StrideB{}, make_shape(n, k, 1))},
        {{}, nullptr, cutlass::make_cute_packed_stride(StrideC{}, make_shape(m, n, 1)),
         static_cast<Element*>(y), cutlass::make_cute_packed_stride(StrideD{}, make_shape(m, n, 1))},
        hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    if constexpr (cute::is_same_v<Scheduler, cutlass::gemm::StreamKScheduler>) {
      args.scheduler.decomposition_mode = static_cast<decltype(args.scheduler.decomposition_mode)>(decomposition);
      args.scheduler.splits = splits;
    }
    return args;
  }

  // Bytes of workspace the call needs (stream-K partials and flags), or -1 if the kernel cannot run the shape.
  static long long workspace(int m, int n, int k, int decomposition, int splits, int sm_count) {
    auto args = arguments(nullptr, nullptr, nullptr, m, n, k, decomposition, splits, sm_count);
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return -1;
    return static_cast<long long>(Gemm::get_workspace_size(args));
  }

  // 0 on success; the workspace must hold `workspace(...)` bytes.
  static int run(const void* x, const void* w, void* y, int m, int n, int k, void* ws, int decomposition,
                 int splits, int sm_count, void* stream) {
    auto args = arguments(x, w, y, m, n, k, decomposition, splits, sm_count);
    Gemm gemm;
    auto cs = static_cast<cudaStream_t>(stream);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
    // The first call sets the kernel's shared-memory attribute (initialize); later calls only reset the workspace
    // on the stream and rebuild the parameters, so that they can be recorded into a CUDA graph.
    static bool attributes_set = false;
    if (!attributes_set) {
      if (gemm.initialize(args, ws, cs) != cutlass::Status::kSuccess) return 2;
      attributes_set = true;
    } else {
      if (Kernel::initialize_workspace(args, ws, cs, nullptr) != cutlass::Status::kSuccess) return 2;
      if (gemm.update(args, ws) != cutlass::Status::kSuccess) return 2;
    }
    if (gemm.run(cs) != cutlass::Status::kSuccess) return 3;
    return cudaGetLastError() == cudaSuccess ? 0 : 4;
  }
};

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingPongEpi = cutlass::epilogue::TmaWarpSpecialized;
using Persistent = cutlass::gemm::PersistentScheduler;
using StreamK = cutlass::gemm::StreamKScheduler;

}  // namespace

#define DARE_VARIANT(NAME, ...)                                                                                 \
  extern "C" long long dare_gemm_##NAME##_workspace(int m, int n, int k, int decomposition, int splits,        \
                                                    int sm_count) {                                            \
    return Projection<__VA_ARGS__>::workspace(m, n, k, decomposition, splits, sm_count);                       \
  }                                                                                                            \
  extern "C" int dare_gemm_##NAME(const void* x, const void* w, void* y, int m, int n, int k, void* ws,        \
                                  int decomposition, int splits, int sm_count, void* stream) {                  \
    return Projection<__VA_ARGS__>::run(x, w, y, m, n, k, ws, decomposition, splits, sm_count, stream);         \
  }

// The variant list: build.sh compiles one translation unit per entry (-DDARE_ONLY=<index>) so that two cores
// build in parallel. Names: schedule, CTA tile (M x N), cluster (M x N), scheduler.
#if !defined(DARE_ONLY) || DARE_ONLY == 0
DARE_VARIANT(coop_128x128_c1_sk, Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 1
DARE_VARIANT(coop_128x256_c1_sk, Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 2
DARE_VARIANT(coop_128x192_c1_sk, Shape<_128, _192, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 3
DARE_VARIANT(coop_256x128_c1_sk, Shape<_256, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi, StreamK)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 4
DARE_VARIANT(coop_128x128_c2_p, Shape<_128, _128, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 5
DARE_VARIANT(coop_128x256_c2_p, Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 6
DARE_VARIANT(pp_64x256_c1_p, Shape<_64, _256, _64>, Shape<_1, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 7
DARE_VARIANT(pp_64x128_c1_p, Shape<_64, _128, _64>, Shape<_1, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 8
DARE_VARIANT(coop_128x128_c2_sk, Shape<_128, _128, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, StreamK)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 9
DARE_VARIANT(pp_64x192_c2_p, Shape<_64, _192, _64>, Shape<_2, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
// Clusters along M multicast each weight tile to the CTAs of the other row tiles (weights read once from L2 per
// cluster instead of once per row tile).
#if !defined(DARE_ONLY) || DARE_ONLY == 10
DARE_VARIANT(coop_128x192_c2_p, Shape<_128, _192, _64>, Shape<_2, _1, _1>, Coop, CoopEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 11
DARE_VARIANT(pp_64x128_c2_p, Shape<_64, _128, _64>, Shape<_2, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 12
DARE_VARIANT(pp_64x128_c4_p, Shape<_64, _128, _64>, Shape<_4, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 13
DARE_VARIANT(pp_64x192_c4_p, Shape<_64, _192, _64>, Shape<_4, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 14
DARE_VARIANT(pp_64x256_c4_p, Shape<_64, _256, _64>, Shape<_4, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
#if !defined(DARE_ONLY) || DARE_ONLY == 15
DARE_VARIANT(pp_64x256_c2_p, Shape<_64, _256, _64>, Shape<_2, _1, _1>, PingPong, PingPongEpi, Persistent)
#endif
