// The CUDA backend's windowed and normalisation ops (backend.h, the
// "cudnn_ops.cc" section): Conv2D forward and backward, 2-D max and average
// pooling, batch norm and softmax on cuDNN's legacy API. ops_window.cc
// (Conv2D, pooling, batch norm) and ops.cc (softmax, through
// ActivationForward/Backward) call them for tensors on a GPU, after checking
// shapes and sizing the outputs. The CPU backend (cpu/window_ops.cc,
// oneDNN; cpu/elementwise_cpu.cc for softmax) is the reference they match.
//
// How the seam's layouts and Keras' semantics map onto cuDNN:
//   * Images are NHWC, described as CUDNN_TENSOR_NHWC float tensors; cuDNN
//     reads and writes the callers' buffers in place.
//   * Kernels are Keras' HWIO ([kh, kw, in, out]); cuDNN's filters are KCRS
//     or KRSC, never HWIO. HWIO is a row-major [kh*kw*in, out] matrix and
//     KRSC (the NHWC filter format, [out, kh, kw, in]) its transpose, so the
//     kernel is transposed into scratch before a convolution and the filter
//     gradient transposed back (window_kernels.h).
//   * Padding: cuDNN pads symmetrically. Keras' 'same' pads one more row or
//     column at the bottom or right when the total is odd. Such windows are
//     padded explicitly into scratch (window_kernels::PadNhwc) and cuDNN runs
//     unpadded on the copy: zeros for convolution, -inf for max pooling (so
//     the maximum is always a real input, as ops.h requires), and gradients
//     are computed on the padded image and cropped back. Average pooling
//     with asymmetric padding does not go to cuDNN at all: once padding is
//     explicit no cuDNN mode can tell it from data, and ops.h divides by the
//     real inputs only, so an own kernel computes it directly
//     (window_kernels::AveragePool*). Symmetric windows — 'valid', and
//     'same' with an even total — use cuDNN's own padding with
//     CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, the same semantics.
//   * Max pooling uses CUDNN_POOLING_MAX_DETERMINISTIC: the plain mode's
//     backward adds overlapping windows' gradients with atomics. cuDNN's
//     backward recomputes each window's maximum from x and y and gives the
//     gradient to one input (not to every tie), like oneDNN's argmax; which
//     of several equal inputs it picks is not documented — the GPU tests
//     compare against the CPU on inputs with ties (ReLU zeros) to pin it.
//   * Batch norm views x[m, c] as an NHWC tensor [n, h, 1, c] with n * h = m
//     and n within cuDNN's bound on N (cudnn_batch_norm_shape.h), normalised
//     per channel (CUDNN_BATCHNORM_SPATIAL), in training and backward;
//     inference is an own element-wise kernel (BatchNormForwardInference).
//
// Precision: FP32 throughout. Convolutions run with CUDNN_FMA_MATH, not
// CUDNN_DEFAULT_MATH: on Ampere and later the default mode lets cuDNN pick
// TF32 tensor-core kernels for float data (10-bit mantissa products, ~1e-3
// relative), while FMA_MATH restricts it to FP32 FMA kernels. Mixed
// precision is the exception: its convolutions (ComputeType bfloat16 or
// float16) read tensors that hold only 16-bit values, which TF32's 8-bit
// exponent and 10-bit mantissa represent exactly, so they run with
// CUDNN_TENSOR_OP_MATH — tensor cores, FP32 accumulation, the same products. Among the
// algorithms the heuristics offer, the GEMM-based ones are preferred: FFT
// and Winograd convolutions are deterministic but round differently enough
// (transforms of the whole tile) to be a risk for the 1e-4 the GPU must
// hold against the CPU; they are used only when nothing else is available.
//
// Determinism: each convolution pass takes the first algorithm, in the
// order cuDNN's heuristics rank them (a pure function of geometry, GPU and
// cuDNN version; nothing is timed), that is deterministic, FP32 and fits
// kMaxWorkspaceBytes. The choice is cached per (device, pass, geometry) in
// a process-wide map, so a geometry gets the same algorithm on every call.
//
// Deprecation: cuDNN 9 marks the legacy filter, pooling, batch-norm and
// convolution descriptors and calls CUDNN_DEPRECATED in favour of its graph
// API (cudnn_graph.h), which is the migration path for this file; the
// warnings are silenced for this file alone (see the pragma below).
//
// Thread-safety: reentrant. Every function takes the device context's op
// lock before it touches the cuDNN handle or the scratch buffer, and
// releases it before calling into elementwise.cu (BiasAdd, BiasGrad), which
// takes it itself. The algorithm cache has its own mutex, always taken
// inside the op lock, never the other way round.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"
#include "spdlog/spdlog.h"
#include "worker/tensor/cuda/backend.h"
#include "worker/tensor/cuda/cudnn_batch_norm_shape.h"
#include "worker/tensor/cuda/device_context.h"
#include "worker/tensor/cuda/window_kernels.h"

// The legacy API is deprecated, not removed, in cuDNN 9 (see the header
// comment); CUDNN_WARN_DEPRECATED builds would warn on every call here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace distrain::cuda {
namespace {

using ops::PoolKind;
using ops::Window2D;

// Convolution workspaces larger than this are not considered: the scratch
// buffer grows to the largest request and stays, and the zero-workspace
// implicit GEMM is always there to fall back on. 256 MiB holds the
// precomputed-index and explicit-GEMM workspaces of ordinary CNN layers.
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

// ---- Descriptors -----------------------------------------------------------------

// A cuDNN descriptor, owned by one call (pooling, batch norm) or by the
// convolution descriptor cache (CachedDescriptors).
// Create and Destroy are members of the loaded cuDNN table (cuda_library_api.h).
template <typename T, auto Create, auto Destroy>
class Descriptor {
 public:
  Descriptor() { DISTRAIN_CUDNN_CHECK((Cudnn().*Create)(&desc_)); }
  // Destroying fails only for an invalid descriptor, which this class never holds.
  ~Descriptor() { (void)(Cudnn().*Destroy)(desc_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};

using TensorDescriptor = Descriptor<cudnnTensorDescriptor_t, &CudnnApi::cudnnCreateTensorDescriptor,
               &CudnnApi::cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Descriptor<cudnnFilterDescriptor_t, &CudnnApi::cudnnCreateFilterDescriptor,
               &CudnnApi::cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, &CudnnApi::cudnnCreateConvolutionDescriptor,
               &CudnnApi::cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor = Descriptor<cudnnPoolingDescriptor_t, &CudnnApi::cudnnCreatePoolingDescriptor,
               &CudnnApi::cudnnDestroyPoolingDescriptor>;

// cuDNN's legacy API takes extents as int.
int Int(int64_t v, const char* what) {
  DISTRAIN_CHECK(v >= 0 && v <= std::numeric_limits<int>::max())
      << what << " = " << v << " does not fit cuDNN's 32-bit extents";
  return static_cast<int>(v);
}

// An NHWC float tensor [n, h, w, c]. The legacy API also indexes elements
// with 32-bit integers, so the whole tensor must stay below 2^31 elements.
void SetNhwc(const TensorDescriptor& d, int64_t n, int64_t h, int64_t w, int64_t c) {
  DISTRAIN_CHECK(n > 0 && h > 0 && w > 0 && c > 0 &&
                 n * h * w * c <= std::numeric_limits<int>::max())
      << "cuDNN tensor [" << n << ", " << h << ", " << w << ", " << c
      << "] is empty or has 2^31 elements or more";
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSetTensor4dDescriptor(d.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                                  Int(n, "n"), Int(c, "c"), Int(h, "h"),
                                                  Int(w, "w")));
}

std::string WindowString(const Window2D& w) {
  return absl::StrCat("[", w.batch, ", ", w.in_h, ", ", w.in_w, ", ", w.in_c, "] -> [", w.out_h,
                      ", ", w.out_w, ", ", w.out_c, "], window ", w.kernel_h, "x", w.kernel_w,
                      " stride ", w.stride_h, "x", w.stride_w, " pad t", w.pad_top, " b",
                      w.pad_bottom, " l", w.pad_left, " r", w.pad_right);
}

// ---- Scratch -----------------------------------------------------------------------

// DeviceContext::Scratch hands out one buffer per call, so a call that needs
// several pieces (a transposed filter, a padded image, a workspace) plans
// them as offsets into one request. Pieces are 256-byte aligned, cudaMalloc's
// own alignment, which cuDNN's workspaces and vectorised kernels expect.
class ScratchPlan {
 public:
  size_t Reserve(size_t bytes) {
    const size_t at = total_;
    total_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  size_t total() const { return total_; }

 private:
  static constexpr size_t kAlign = 256;
  size_t total_ = 0;
};

char* GetScratch(DeviceContext& ctx, const ScratchPlan& plan)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.op_mutex()) {
  return plan.total() > 0 ? static_cast<char*>(ctx.Scratch(plan.total())) : nullptr;
}

float* At(char* scratch, size_t offset) { return reinterpret_cast<float*>(scratch + offset); }

size_t FloatBytes(int64_t count) { return static_cast<size_t>(count) * sizeof(float); }

// ---- The window as cuDNN sees it ----------------------------------------------------

// Symmetric padding goes to cuDNN as is. Asymmetric padding is applied
// explicitly to a copy of the input (both axes, whichever is asymmetric:
// one copy either way) and cuDNN reads that copy without padding.
struct CudnnWindow {
  bool explicit_pad = false;
  int64_t in_h = 0, in_w = 0;    // the image cuDNN reads: padded when explicit_pad
  int64_t pad_h = 0, pad_w = 0;  // cuDNN's own (symmetric) padding
};

CudnnWindow ForCudnn(const Window2D& w) {
  if (w.pad_top == w.pad_bottom && w.pad_left == w.pad_right) {
    return {false, w.in_h, w.in_w, w.pad_top, w.pad_left};
  }
  return {true, w.in_h + w.pad_top + w.pad_bottom, w.in_w + w.pad_left + w.pad_right, 0, 0};
}

size_t PaddedInputBytes(const Window2D& w, const CudnnWindow& cw) {
  return cw.explicit_pad ? FloatBytes(w.batch * cw.in_h * cw.in_w * w.in_c) : 0;
}

// x[N, H, W, C] into padded[N, H + pt + pb, W + pl + pr, C] with `value` in the border.
void PadInput(cudaStream_t stream, const Window2D& w, float value, const float* x,
              float* padded) {
  window_kernels::PadNhwc(stream, w.batch, w.in_h, w.in_w, w.in_c, w.pad_top, w.pad_bottom,
                          w.pad_left, w.pad_right, value, x, padded);
}

// The gradient of the padded image back to dx[N, H, W, C].
void CropInput(cudaStream_t stream, const Window2D& w, const float* padded, float* dx) {
  window_kernels::CropNhwc(stream, w.batch, w.in_h, w.in_w, w.in_c, w.pad_top, w.pad_bottom,
                           w.pad_left, w.pad_right, padded, dx);
}

// ---- Convolution -------------------------------------------------------------------

// x (the image cuDNN reads), y, the KRSC filter and the convolution.
struct ConvDescriptors {
  TensorDescriptor x, y;
  FilterDescriptor filter;
  ConvolutionDescriptor conv;

  ConvDescriptors(const Window2D& w, const CudnnWindow& cw, ComputeType compute) {
    SetNhwc(x, w.batch, cw.in_h, cw.in_w, w.in_c);
    SetNhwc(y, w.batch, w.out_h, w.out_w, w.out_c);
    // NHWC filter format = KRSC: [out, kh, kw, in].
    DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSetFilter4dDescriptor(
        filter.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, Int(w.out_c, "filters"),
        Int(w.in_c, "channels"), Int(w.kernel_h, "kernel height"), Int(w.kernel_w, "kernel width")));
    // Cross-correlation, as TensorFlow's conv2d; float accumulation.
    DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSetConvolution2dDescriptor(
        conv.get(), Int(cw.pad_h, "padding"), Int(cw.pad_w, "padding"),
        Int(w.stride_h, "stride"), Int(w.stride_w, "stride"), 1, 1, CUDNN_CROSS_CORRELATION,
        CUDNN_DATA_FLOAT));
    DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSetConvolutionMathType(
        conv.get(), compute == ComputeType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    // The output cuDNN derives must be the one Keras' arithmetic gave.
    int n = 0, c = 0, h = 0, wd = 0;
    DISTRAIN_CUDNN_CHECK(
        Cudnn().cudnnGetConvolution2dForwardOutputDim(conv.get(), x.get(), filter.get(), &n, &c, &h, &wd));
    DISTRAIN_CHECK(n == w.batch && c == w.out_c && h == w.out_h && wd == w.out_w)
        << "cuDNN derives a " << n << "x" << h << "x" << wd << "x" << c << " output for "
        << WindowString(w);
  }
};

size_t FilterBytes(const Window2D& w) {
  return FloatBytes(w.kernel_h * w.kernel_w * w.in_c * w.out_c);
}

// HWIO kernel [kh*kw*in, out] -> KRSC filter [out, kh*kw*in], and back.
void KernelToFilter(cudaStream_t stream, const Window2D& w, const float* kernel, float* filter) {
  window_kernels::Transpose(stream, w.kernel_h * w.kernel_w * w.in_c, w.out_c, kernel, filter);
}
void FilterToKernel(cudaStream_t stream, const Window2D& w, const float* filter, float* kernel) {
  window_kernels::Transpose(stream, w.out_c, w.kernel_h * w.kernel_w * w.in_c, filter, kernel);
}

enum class ConvPass : int64_t { kForward, kBackwardData, kBackwardFilter };

const char* PassName(ConvPass pass) {
  switch (pass) {
    case ConvPass::kForward:
      return "forward";
    case ConvPass::kBackwardData:
      return "backward-data";
    case ConvPass::kBackwardFilter:
      return "backward-filter";
  }
  return "?";
}

struct ConvAlgo {
  int algo = -1;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  size_t workspace_bytes = 0;
};

// Picks from cuDNN's heuristic ranking `perf` (best first):
//   1. the first deterministic FP32 algorithm of `exact` (GEMM-based, see
//      the header comment) whose workspace fits;
//   2. an `exact` algorithm the ranking left out entirely, if its workspace
//      query succeeds (an algorithm the ranking marked unsupported is not
//      retried);
//   3. the first deterministic FP32 algorithm of any kind, with a warning;
//   4. the first FP32 algorithm at all, non-deterministic (atomics: a rerun
//      may differ in the last bits), with a warning, rather than stop a job
//      that cuDNN can run. Only when none fits does the call fail.
// `workspace(algo, &bytes)` asks cuDNN for an algorithm's workspace; it
// fails for algorithms the geometry does not support.
// Under a 16-bit `compute`, "FP32" reads "FP32 or TF32 tensor cores"
// (never ALLOW_CONVERSION, whose float16 conversion would round bfloat16
// values).
template <typename Perf, typename Workspace>
ConvAlgo PickAlgo(ConvPass pass, const Window2D& w, ComputeType compute,
                  const std::vector<Perf>& perf, std::initializer_list<int> exact,
                  const Workspace& workspace) {
  const auto fits = [&](int algo, size_t* bytes) {
    return workspace(algo, bytes) == CUDNN_STATUS_SUCCESS && *bytes <= kMaxWorkspaceBytes;
  };
  const bool tensor_cores = compute != ComputeType::kFloat32;
  const auto fp32 = [tensor_cores](const Perf& p) {
    return p.status == CUDNN_STATUS_SUCCESS &&
           (tensor_cores || p.mathType != CUDNN_TENSOR_OP_MATH) &&
           p.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  };
  const auto deterministic_fp32 = [&fp32](const Perf& p) {
    return fp32(p) && p.determinism == CUDNN_DETERMINISTIC;
  };
  const auto is_exact = [&](int algo) {
    return std::find(exact.begin(), exact.end(), algo) != exact.end();
  };
  size_t bytes = 0;
  for (const Perf& p : perf) {
    const int algo = static_cast<int>(p.algo);
    if (deterministic_fp32(p) && is_exact(algo) && fits(algo, &bytes)) return {algo, bytes};
  }
  for (const int algo : exact) {
    const bool ranked = std::any_of(perf.begin(), perf.end(), [&](const Perf& p) {
      return static_cast<int>(p.algo) == algo;
    });
    if (!ranked && fits(algo, &bytes)) return {algo, bytes};
  }
  // Steps 3 and 4: the first ranked algorithm that `accept` takes and that
  // fits, with a warning saying what it lacks.
  const auto fallback = [&](const auto& accept, const char* lacking,
                            const char* caveat) -> std::optional<ConvAlgo> {
    for (const Perf& p : perf) {
      const int algo = static_cast<int>(p.algo);
      if (accept(p) && fits(algo, &bytes)) {
        spdlog::warn(
            "cuDNN offers no {} FP32 {} convolution for {}; using algorithm {} ({} bytes of "
            "workspace), {}",
            lacking, PassName(pass), WindowString(w), algo, bytes, caveat);
        return ConvAlgo{algo, bytes};
      }
    }
    return std::nullopt;
  };
  if (auto a = fallback(deterministic_fp32, "GEMM-based deterministic",
                        "whose rounding may differ more from the CPU's")) {
    return *a;
  }
  if (auto a = fallback(fp32, "deterministic",
                        "which adds with atomics: reruns may differ in the last bits")) {
    return *a;
  }
  DISTRAIN_CHECK(false) << "cuDNN has no FP32 " << PassName(pass)
                        << " convolution algorithm with a workspace under " << kMaxWorkspaceBytes
                        << " bytes for " << WindowString(w);
  return {};
}

ConvAlgo ChooseForward(cudnnHandle_t handle, const ConvDescriptors& d, const Window2D& w,
                      ComputeType compute) {
  int max_count = 0;
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(std::max(max_count, 1)));
  int returned = 0;
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnGetConvolutionForwardAlgorithm_v7(
      handle, d.x.get(), d.filter.get(), d.conv.get(), d.y.get(), static_cast<int>(perf.size()),
      &returned, perf.data()));
  perf.resize(static_cast<size_t>(returned));
  return PickAlgo(ConvPass::kForward, w, compute, perf,
                  {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
                   CUDNN_CONVOLUTION_FWD_ALGO_DIRECT},
                  [&](int algo, size_t* bytes) {
                    return Cudnn().cudnnGetConvolutionForwardWorkspaceSize(
                        handle, d.x.get(), d.filter.get(), d.conv.get(), d.y.get(),
                        static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
                  });
}

ConvAlgo ChooseBackwardData(cudnnHandle_t handle, const ConvDescriptors& d, const Window2D& w,
                           ComputeType compute) {
  int max_count = 0;
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(std::max(max_count, 1)));
  int returned = 0;
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnGetConvolutionBackwardDataAlgorithm_v7(
      handle, d.filter.get(), d.y.get(), d.conv.get(), d.x.get(), static_cast<int>(perf.size()),
      &returned, perf.data()));
  perf.resize(static_cast<size_t>(returned));
  // ALGO_0 adds with atomics (non-deterministic); ALGO_1 is the implicit GEMM.
  return PickAlgo(ConvPass::kBackwardData, w, compute, perf, {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1},
                  [&](int algo, size_t* bytes) {
                    return Cudnn().cudnnGetConvolutionBackwardDataWorkspaceSize(
                        handle, d.filter.get(), d.y.get(), d.conv.get(), d.x.get(),
                        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
                  });
}

ConvAlgo ChooseBackwardFilter(cudnnHandle_t handle, const ConvDescriptors& d,
                              const Window2D& w, ComputeType compute) {
  int max_count = 0;
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(
      static_cast<size_t>(std::max(max_count, 1)));
  int returned = 0;
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      handle, d.x.get(), d.y.get(), d.conv.get(), d.filter.get(), static_cast<int>(perf.size()),
      &returned, perf.data()));
  perf.resize(static_cast<size_t>(returned));
  // ALGO_0 and ALGO_3 add with atomics (non-deterministic); ALGO_1 is the
  // implicit GEMM.
  return PickAlgo(ConvPass::kBackwardFilter, w, compute, perf, {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1},
                  [&](int algo, size_t* bytes) {
                    return Cudnn().cudnnGetConvolutionBackwardFilterWorkspaceSize(
                        handle, d.x.get(), d.y.get(), d.conv.get(), d.filter.get(),
                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
                  });
}

// The algorithm cache: (pass, device, the Window2D's fields) -> choice. The
// device is part of the key because devices of one process may differ in
// kind, and cuDNN's ranking with them.
using AlgoKey = std::array<int64_t, 19>;

AlgoKey MakeAlgoKey(ConvPass pass, int device, ComputeType compute, const Window2D& w) {
  AlgoKey key{};
  key[0] = static_cast<int64_t>(pass);
  key[1] = device;
  key[2] = static_cast<int64_t>(compute);
  const std::array<int64_t, 15> fields = w.Fields();
  std::copy(fields.begin(), fields.end(), key.begin() + 3);
  return key;
}

struct AlgoCache {
  absl::Mutex mu;
  absl::flat_hash_map<AlgoKey, ConvAlgo> algos ABSL_GUARDED_BY(mu);
};

AlgoCache& Algos() {
  static AlgoCache* cache = new AlgoCache();  // never destroyed: used until exit
  return *cache;
}

// The cached choice for (pass, device, w), made by choose() on first use.
// choose() runs outside the cache's mutex (it calls cuDNN, which may take
// milliseconds); two devices racing on one key both choose, and the first
// stored wins, so every later call sees one answer.
template <typename Choose>
ConvAlgo CachedAlgo(ConvPass pass, int device, ComputeType compute, const Window2D& w,
                    const Choose& choose) {
  const AlgoKey key = MakeAlgoKey(pass, device, compute, w);
  AlgoCache& cache = Algos();
  {
    absl::MutexLock lock(&cache.mu);
    const auto it = cache.algos.find(key);
    if (it != cache.algos.end()) return it->second;
  }
  const ConvAlgo chosen = choose();
  spdlog::debug("cuDNN {} convolution on GPU:{} for {}: algorithm {}, {} bytes of workspace",
                PassName(pass), device, WindowString(w), chosen.algo, chosen.workspace_bytes);
  absl::MutexLock lock(&cache.mu);
  return cache.algos.try_emplace(key, chosen).first->second;
}

// The descriptors of one (device, compute type, geometry), made on first use
// and kept until exit: making and checking them is four cuDNN calls and a
// host allocation per descriptor on every pass otherwise. They serve all
// three passes. A device's descriptors are only used under its op lock (the
// device is in the key), and the map's own mutex is taken inside it, as the
// algorithm cache's is.
const ConvDescriptors& CachedDescriptors(int device, ComputeType compute, const Window2D& w,
                                         const CudnnWindow& cw) {
  struct Cache {
    absl::Mutex mu;
    absl::flat_hash_map<AlgoKey, std::unique_ptr<ConvDescriptors>> map ABSL_GUARDED_BY(mu);
  };
  static Cache* cache = new Cache();  // never destroyed: used until exit
  const AlgoKey key = MakeAlgoKey(ConvPass::kForward, device, compute, w);
  absl::MutexLock lock(&cache->mu);
  std::unique_ptr<ConvDescriptors>& slot = cache->map[key];
  if (slot == nullptr) slot = std::make_unique<ConvDescriptors>(w, cw, compute);
  return *slot;  // stable: the map moves the pointer, not the descriptors
}

// ---- Pooling ----------------------------------------------------------------------

struct PoolDescriptors {
  TensorDescriptor x, y;  // x: the image cuDNN reads
  PoolingDescriptor pool;

  PoolDescriptors(PoolKind kind, const Window2D& w, const CudnnWindow& cw) {
    SetNhwc(x, w.batch, cw.in_h, cw.in_w, w.in_c);
    SetNhwc(y, w.batch, w.out_h, w.out_w, w.out_c);
    // Average pooling reaches cuDNN only with symmetric padding, all of it
    // cuDNN's own, which EXCLUDE_PADDING leaves out of the count. NaN is not
    // propagated by max pooling, TensorFlow's GPU default.
    const cudnnPoolingMode_t mode = kind == PoolKind::kMax
                                        ? CUDNN_POOLING_MAX_DETERMINISTIC
                                        : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSetPooling2dDescriptor(
        pool.get(), mode, CUDNN_NOT_PROPAGATE_NAN, Int(w.kernel_h, "window"),
        Int(w.kernel_w, "window"), Int(cw.pad_h, "padding"), Int(cw.pad_w, "padding"),
        Int(w.stride_h, "stride"), Int(w.stride_w, "stride")));
    int n = 0, c = 0, h = 0, wd = 0;
    DISTRAIN_CUDNN_CHECK(Cudnn().cudnnGetPooling2dForwardOutputDim(pool.get(), x.get(), &n, &c, &h, &wd));
    DISTRAIN_CHECK(n == w.batch && c == w.out_c && h == w.out_h && wd == w.out_w)
        << "cuDNN derives a " << n << "x" << h << "x" << wd << "x" << c << " pooling output for "
        << WindowString(w);
  }
};

// The border value of an explicitly padded max-pooling input: -inf never
// wins a maximum against a real input (a window holding only -inf and
// padding is the one tie, and a degenerate input).
constexpr float kMaxPoolPad = -std::numeric_limits<float>::infinity();

// ---- Batch norm -------------------------------------------------------------------

struct BatchNormDescriptors {
  // x, y, dy and dx: [m, c] as NHWC [n, h, 1, c] with n * h = m and n within
  // cuDNN's bound on N (cudnn_batch_norm_shape.h).
  TensorDescriptor x;
  TensorDescriptor param;  // gamma, beta, mean, variance: 1 x C x 1 x 1

  BatchNormDescriptors(int64_t m, int64_t c) {
    const BatchNormNH shape = BatchNormShape(m);
    SetNhwc(x, shape.n, shape.h, 1, c);
    DISTRAIN_CUDNN_CHECK(
        Cudnn().cudnnDeriveBNTensorDescriptor(param.get(), x.get(), CUDNN_BATCHNORM_SPATIAL));
  }
};

// cuDNN rejects epsilon < CUDNN_BN_MIN_EPSILON. That bound is 0.0 in cuDNN 9
// (older releases had 1e-5), so any epsilon the CPU backend accepts passes;
// the check keeps the failure ours, with the value, should it rise again.
void CheckEpsilon(float epsilon) {
  DISTRAIN_CHECK(static_cast<double>(epsilon) >= CUDNN_BN_MIN_EPSILON)
      << "batch norm epsilon " << epsilon << " is below cuDNN's minimum " << CUDNN_BN_MIN_EPSILON;
}

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

}  // namespace

// ---- Convolution -------------------------------------------------------------------

void Conv2DForward(int device, const Window2D& w, const float* x, const float* kernel,
                   const float* bias, float* y, ComputeType compute) {
  DeviceContext& ctx = DeviceContext::Get(device);
  {
    absl::MutexLock lock(&ctx.op_mutex());
    const cudaStream_t stream = ctx.compute_stream();
    const cudnnHandle_t handle = ctx.cudnn();
    const CudnnWindow cw = ForCudnn(w);
    const ConvDescriptors& d = CachedDescriptors(device, compute, w, cw);
    const ConvAlgo algo = CachedAlgo(ConvPass::kForward, device, compute, w,
                                     [&] { return ChooseForward(handle, d, w, compute); });
    ScratchPlan plan;
    const size_t filter_at = plan.Reserve(FilterBytes(w));
    const size_t padded_at = plan.Reserve(PaddedInputBytes(w, cw));
    const size_t workspace_at = plan.Reserve(algo.workspace_bytes);
    char* scratch = GetScratch(ctx, plan);

    float* filter = At(scratch, filter_at);
    KernelToFilter(stream, w, kernel, filter);
    const float* input = x;
    if (cw.explicit_pad) {
      float* padded = At(scratch, padded_at);
      PadInput(stream, w, 0.0f, x, padded);
      input = padded;
    }
    DISTRAIN_CUDNN_CHECK(Cudnn().cudnnConvolutionForward(
        handle, &kOne, d.x.get(), input, d.filter.get(), filter, d.conv.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(algo.algo),
        algo.workspace_bytes > 0 ? scratch + workspace_at : nullptr, algo.workspace_bytes,
        &kZero, d.y.get(), y));
  }
  // elementwise.cu's row broadcast, the one Dense uses: y[r, f] += bias[f]
  // over y viewed as [N*OH*OW, F], queued after the convolution.
  if (bias != nullptr) BiasAdd(device, w.batch * w.out_h * w.out_w, w.out_c, bias, y);
}

void Conv2DBackwardData(int device, const Window2D& w, const float* dy, const float* kernel,
                        float* dx, ComputeType compute) {
  DeviceContext& ctx = DeviceContext::Get(device);
  absl::MutexLock lock(&ctx.op_mutex());
  const cudaStream_t stream = ctx.compute_stream();
  const cudnnHandle_t handle = ctx.cudnn();
  const CudnnWindow cw = ForCudnn(w);
  const ConvDescriptors& d = CachedDescriptors(device, compute, w, cw);
  const ConvAlgo algo = CachedAlgo(ConvPass::kBackwardData, device, compute, w,
                                   [&] { return ChooseBackwardData(handle, d, w, compute); });
  ScratchPlan plan;
  const size_t filter_at = plan.Reserve(FilterBytes(w));
  const size_t padded_at = plan.Reserve(PaddedInputBytes(w, cw));
  const size_t workspace_at = plan.Reserve(algo.workspace_bytes);
  char* scratch = GetScratch(ctx, plan);

  float* filter = At(scratch, filter_at);
  KernelToFilter(stream, w, kernel, filter);
  // With explicit padding cuDNN computes the gradient of the padded image,
  // whose border (the padding's own gradient) is then dropped.
  float* target = cw.explicit_pad ? At(scratch, padded_at) : dx;
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnConvolutionBackwardData(
      handle, &kOne, d.filter.get(), filter, d.y.get(), dy, d.conv.get(),
      static_cast<cudnnConvolutionBwdDataAlgo_t>(algo.algo),
      algo.workspace_bytes > 0 ? scratch + workspace_at : nullptr, algo.workspace_bytes, &kZero,
      d.x.get(), target));
  if (cw.explicit_pad) CropInput(stream, w, target, dx);
}

void Conv2DBackwardWeights(int device, const Window2D& w, const float* x, const float* dy,
                           float* dkernel, float* dbias, ComputeType compute) {
  DeviceContext& ctx = DeviceContext::Get(device);
  {
    absl::MutexLock lock(&ctx.op_mutex());
    const cudaStream_t stream = ctx.compute_stream();
    const cudnnHandle_t handle = ctx.cudnn();
    const CudnnWindow cw = ForCudnn(w);
    const ConvDescriptors& d = CachedDescriptors(device, compute, w, cw);
    const ConvAlgo algo = CachedAlgo(ConvPass::kBackwardFilter, device, compute, w,
                                     [&] { return ChooseBackwardFilter(handle, d, w, compute); });
    ScratchPlan plan;
    const size_t filter_at = plan.Reserve(FilterBytes(w));
    const size_t padded_at = plan.Reserve(PaddedInputBytes(w, cw));
    const size_t workspace_at = plan.Reserve(algo.workspace_bytes);
    char* scratch = GetScratch(ctx, plan);

    const float* input = x;
    if (cw.explicit_pad) {
      float* padded = At(scratch, padded_at);
      PadInput(stream, w, 0.0f, x, padded);
      input = padded;
    }
    // beta = 0: the KRSC gradient is overwritten, never read, so the
    // scratch's old contents do not matter.
    float* dfilter = At(scratch, filter_at);
    DISTRAIN_CUDNN_CHECK(Cudnn().cudnnConvolutionBackwardFilter(
        handle, &kOne, d.x.get(), input, d.y.get(), dy, d.conv.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo.algo),
        algo.workspace_bytes > 0 ? scratch + workspace_at : nullptr, algo.workspace_bytes,
        &kZero, d.filter.get(), dfilter));
    FilterToKernel(stream, w, dfilter, dkernel);
  }
  // elementwise.cu's deterministic column sums over dy as [N*OH*OW, F] (it
  // takes the op lock itself, so it runs after this function's is released).
  if (dbias != nullptr) BiasGrad(device, w.batch * w.out_h * w.out_w, w.out_c, dy, dbias);
}

// ---- Pooling ----------------------------------------------------------------------

int64_t Pool2DWorkspaceFloats(PoolKind kind, const Window2D& w) {
  // cuDNN's backward recomputes what it needs from x and y; the
  // own average-pooling kernels need nothing either.
  return 0;
}

void Pool2DForward(int device, PoolKind kind, const Window2D& w, const float* x, float* y,
                   float* workspace) {
  DeviceContext& ctx = DeviceContext::Get(device);
  absl::MutexLock lock(&ctx.op_mutex());
  const cudaStream_t stream = ctx.compute_stream();
  const CudnnWindow cw = ForCudnn(w);
  if (kind == PoolKind::kAverage && cw.explicit_pad) {
    window_kernels::AveragePoolForward(stream, w, x, y);
    return;
  }
  const PoolDescriptors d(kind, w, cw);
  const float* input = x;
  if (cw.explicit_pad) {  // max pooling
    ScratchPlan plan;
    const size_t padded_at = plan.Reserve(PaddedInputBytes(w, cw));
    float* padded = At(GetScratch(ctx, plan), padded_at);
    PadInput(stream, w, kMaxPoolPad, x, padded);
    input = padded;
  }
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnPoolingForward(ctx.cudnn(), d.pool.get(), &kOne, d.x.get(), input,
                                           &kZero, d.y.get(), y));
}

void Pool2DBackward(int device, PoolKind kind, const Window2D& w, const float* x, const float* y,
                    const float* dy, const float* workspace, float* dx) {
  DeviceContext& ctx = DeviceContext::Get(device);
  absl::MutexLock lock(&ctx.op_mutex());
  const cudaStream_t stream = ctx.compute_stream();
  const CudnnWindow cw = ForCudnn(w);
  if (kind == PoolKind::kAverage && cw.explicit_pad) {
    window_kernels::AveragePoolBackward(stream, w, dy, dx);
    return;
  }
  const PoolDescriptors d(kind, w, cw);
  const float* input = x;
  float* target = dx;
  if (cw.explicit_pad) {
    // Max pooling: the forward call's padded input again (cuDNN finds each
    // window's maximum by comparing x with y), and the padded image's
    // gradient, cropped back below.
    ScratchPlan plan;
    const size_t padded_at = plan.Reserve(PaddedInputBytes(w, cw));
    const size_t grad_at = plan.Reserve(PaddedInputBytes(w, cw));
    char* scratch = GetScratch(ctx, plan);
    float* padded = At(scratch, padded_at);
    PadInput(stream, w, kMaxPoolPad, x, padded);
    input = padded;
    target = At(scratch, grad_at);
  }
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnPoolingBackward(ctx.cudnn(), d.pool.get(), &kOne, d.y.get(), y,
                                            d.y.get(), dy, d.x.get(), input, &kZero, d.x.get(),
                                            target));
  if (cw.explicit_pad) CropInput(stream, w, target, dx);
}

// ---- Batch norm -------------------------------------------------------------------
// The statistics ops.h asks for are the batch mean and the BIASED batch
// variance (divided by m), the ones oneDNN returns and the normalisation
// uses. cuDNN normalises with the biased variance too, but reports the batch
// statistics only through its running averages, and its running variance is
// the UNBIASED estimate (divided by m - 1). With exponentialAverageFactor
// 1.0 the running outputs are exactly this batch's statistics, and
// rescaling the variance by (m - 1) / m turns it back into the biased one
// (two float roundings: a few ulp). A batch of one row has no unbiased
// variance (0 / 0), so m == 1 is computed by own kernels: mean = x, var = 0,
// y = beta (x - mean = 0), as oneDNN gives.

void BatchNormForwardTraining(int device, int64_t m, int64_t c, const float* x,
                              const float* gamma, const float* beta, float epsilon, float* y,
                              float* batch_mean, float* batch_var) {
  DeviceContext& ctx = DeviceContext::Get(device);
  absl::MutexLock lock(&ctx.op_mutex());
  const cudaStream_t stream = ctx.compute_stream();
  CheckEpsilon(epsilon);
  DISTRAIN_CHECK(m > 0 && c > 0) << "batch norm over [" << m << ", " << c << "]";
  if (m == 1) {
    DISTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(batch_mean, x, FloatBytes(c), cudaMemcpyDeviceToDevice, stream));
    DISTRAIN_CUDA_CHECK(cudaMemsetAsync(batch_var, 0, FloatBytes(c), stream));
    window_kernels::BatchNormApply(stream, 1, c, x, gamma, beta, batch_mean, batch_var, epsilon,
                                   y);
    return;
  }
  const BatchNormDescriptors d(m, c);
  // The running outputs are read as (1 - factor) * old: zero them first so
  // whatever the freshly sized tensors hold (NaN included) cannot leak in.
  DISTRAIN_CUDA_CHECK(cudaMemsetAsync(batch_mean, 0, FloatBytes(c), stream));
  DISTRAIN_CUDA_CHECK(cudaMemsetAsync(batch_var, 0, FloatBytes(c), stream));
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnBatchNormalizationForwardTraining(
      ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d.x.get(), x, d.x.get(), y,
      d.param.get(), gamma, beta, /*exponentialAverageFactor=*/1.0, batch_mean, batch_var,
      static_cast<double>(epsilon), /*resultSaveMean=*/nullptr,
      /*resultSaveInvVariance=*/nullptr));
  const double unbiased_to_biased = static_cast<double>(m - 1) / static_cast<double>(m);
  window_kernels::Scale(stream, c, static_cast<float>(unbiased_to_biased), batch_var);
}

// Inference is an element-wise map with the given statistics, so it runs on
// the own kernel (window_kernels::BatchNormApply), not on cuDNN, whose
// spatial inference has the tightest bound on N of all (65535;
// cudnn_batch_norm_shape.h): one kernel, no descriptor, no bound.
void BatchNormForwardInference(int device, int64_t m, int64_t c, const float* x,
                               const float* gamma, const float* beta, const float* mean,
                               const float* var, float epsilon, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  DISTRAIN_CHECK(m > 0 && c > 0) << "batch norm over [" << m << ", " << c << "]";
  window_kernels::BatchNormApply(ctx.compute_stream(), m, c, x, gamma, beta, mean, var, epsilon,
                                 y);
}

void BatchNormBackward(int device, int64_t m, int64_t c, const float* x, const float* dy,
                       const float* gamma, const float* batch_mean, const float* batch_var,
                       float epsilon, float* dx, float* dgamma, float* dbeta) {
  DeviceContext& ctx = DeviceContext::Get(device);
  absl::MutexLock lock(&ctx.op_mutex());
  const cudaStream_t stream = ctx.compute_stream();
  CheckEpsilon(epsilon);
  DISTRAIN_CHECK(m > 0 && c > 0) << "batch norm over [" << m << ", " << c << "]";
  if (m == 1) {
    window_kernels::BatchNormBackwardOneRow(stream, c, x, dy, gamma, batch_mean, batch_var,
                                            epsilon, dx, dgamma, dbeta);
    return;
  }
  const BatchNormDescriptors d(m, c);
  // The gradients are taken at the statistics the caller passes, as the CPU
  // backend does: cuDNN's "saved" mean and inverse standard deviation
  // 1 / sqrt(var + eps) (what its forward pass would have saved, from the
  // biased variance) are made from them rather than recomputed from x.
  ScratchPlan plan;
  const size_t inv_at = plan.Reserve(FloatBytes(c));
  float* inv_std = At(GetScratch(ctx, plan), inv_at);
  window_kernels::InverseStd(stream, c, batch_var, epsilon, inv_std);
  // alpha 1, beta 0 for both dx and (dgamma, dbeta): all three overwritten.
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnBatchNormalizationBackward(
      ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, d.x.get(), x, d.x.get(),
      dy, d.x.get(), dx, d.param.get(), gamma, dgamma, dbeta, static_cast<double>(epsilon),
      batch_mean, inv_std));
}

// ---- Softmax ----------------------------------------------------------------------
// Rows of x[rows, cols] as N = rows, C = cols, H = W = 1, softmax over C
// (CUDNN_SOFTMAX_MODE_CHANNEL), shifted by the row maximum
// (CUDNN_SOFTMAX_ACCURATE) as the CPU's SoftmaxRows is. cuDNN does not
// document in-place operation, so an aliased output goes through scratch.

void SoftmaxForward(int device, int64_t rows, int64_t cols, const float* x, float* y) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (rows <= 0 || cols <= 0) return;
  absl::MutexLock lock(&ctx.op_mutex());
  TensorDescriptor d;
  SetNhwc(d, rows, 1, 1, cols);
  float* out = y;
  if (y == x) {
    ScratchPlan plan;
    const size_t out_at = plan.Reserve(FloatBytes(rows * cols));
    out = At(GetScratch(ctx, plan), out_at);
  }
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSoftmaxForward(ctx.cudnn(), CUDNN_SOFTMAX_ACCURATE,
                                           CUDNN_SOFTMAX_MODE_CHANNEL, &kOne, d.get(), x, &kZero,
                                           d.get(), out));
  if (out != y) {
    DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(y, out, FloatBytes(rows * cols), cudaMemcpyDeviceToDevice,
                                        ctx.compute_stream()));
  }
}

void SoftmaxBackward(int device, int64_t rows, int64_t cols, const float* y, const float* dy,
                     float* dx) {
  DeviceContext& ctx = DeviceContext::Get(device);
  if (rows <= 0 || cols <= 0) return;
  absl::MutexLock lock(&ctx.op_mutex());
  TensorDescriptor d;
  SetNhwc(d, rows, 1, 1, cols);
  // dx may alias dy (ops.h's ActivationBackward); aliasing y is guarded too.
  float* out = dx;
  if (dx == dy || dx == y) {
    ScratchPlan plan;
    const size_t out_at = plan.Reserve(FloatBytes(rows * cols));
    out = At(GetScratch(ctx, plan), out_at);
  }
  DISTRAIN_CUDNN_CHECK(Cudnn().cudnnSoftmaxBackward(ctx.cudnn(), CUDNN_SOFTMAX_ACCURATE,
                                            CUDNN_SOFTMAX_MODE_CHANNEL, &kOne, d.get(), y, d.get(),
                                            dy, &kZero, d.get(), out));
  if (out != dx) {
    DISTRAIN_CUDA_CHECK(cudaMemcpyAsync(dx, out, FloatBytes(rows * cols),
                                        cudaMemcpyDeviceToDevice, ctx.compute_stream()));
  }
}

}  // namespace distrain::cuda

#pragma GCC diagnostic pop
