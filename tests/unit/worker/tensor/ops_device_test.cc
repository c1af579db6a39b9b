// GPU-vs-CPU equivalence of the op seam (worker/tensor/ops.h): every op on a
// GPU equals the CPU backend within 1e-4 — |cpu - gpu| <= 1e-4 * max(1, |cpu|)
// for every element — on the same random inputs (fixed seeds), for sizes
// that hit the edges of a CUDA launch: odd sizes that are not multiples of
// 32 or 256, rows of width 1, batch 1, rows wider than one block (1000+).
// Where the result is exact by construction — the dropout mask (an integer
// function of (stream, index)), copies, MoveTo, Fill — the GPU must be
// bit-identical.
//
// Each GPU output starts as a NaN-filled tensor on the GPU ("poisoned"), so
// an op that reads its output instead of overwriting it, or a kernel that
// leaves elements unwritten, shows up as a mismatch; each result must also
// still be on the GPU, so an op that silently fell back to the host cannot
// pass.
//
// The suite is instantiated once per visible CUDA device. In a build without
// CUDA, or on a machine without a GPU, it has one instance that skips,
// saying why. Only OpsDeviceComparisonTest, which checks this file's own
// comparison helpers (so the suite cannot pass vacuously), runs everywhere.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model/device_test_util.h"
#include "worker/tensor/ops.h"
#include "worker/tensor/tensor.h"

#ifdef DISTRAIN_HAVE_CUDA
#include "worker/tensor/cuda/device_memory.h"
#endif

namespace distrain::ops {
namespace {

constexpr double kTolerance = 1e-4;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- Inputs ------------------------------------------------------------------

Tensor Uniform(std::vector<int64_t> shape, uint32_t seed, float lo, float hi) {
  Tensor t(std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.size(); ++i) t[i] = dist(gen);
  return t;
}

// Every 32-bit pattern is equally likely: normals, denormals, both zeros,
// infinities and NaNs with payloads — what a byte-exact copy must keep.
Tensor RandomBits(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(std::move(shape));
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < t.size(); ++i) t[i] = std::bit_cast<float>(static_cast<uint32_t>(gen()));
  return t;
}

// ---- Comparison ----------------------------------------------------------------

// "[n, h, w, c]" of a flat row-major index.
std::string IndexString(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] == 0) return "[]";
    index[i] = flat % shape[i];
    flat /= shape[i];
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

::testing::AssertionResult SameShapeOnHost(const Tensor& cpu, const Tensor& gpu) {
  if (!cpu.on_host() || !gpu.on_host()) {
    return ::testing::AssertionFailure() << "comparing tensors not on the host (copy back first)";
  }
  if (cpu.shape() != gpu.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << gpu.ShapeString() << ", the CPU's is " << cpu.ShapeString();
  }
  return ::testing::AssertionSuccess();
}

// Every element within 1e-4 * max(1, |cpu|) of the CPU's (a NaN never is);
// on failure, how many are not and the worst one — not one line per element.
::testing::AssertionResult AllClose(const Tensor& cpu, const Tensor& gpu) {
  if (::testing::AssertionResult same = SameShapeOnHost(cpu, gpu); !same) return same;
  int64_t misses = 0, worst = -1;
  double worst_excess = 0;  // |difference| / bound
  for (int64_t i = 0; i < cpu.size(); ++i) {
    const double a = cpu[i], b = gpu[i];
    const double bound = kTolerance * std::max(1.0, std::abs(a));
    const double diff = std::abs(a - b);
    if (diff <= bound) continue;  // false for NaN
    ++misses;
    const double excess = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff / bound;
    if (worst < 0 || excess > worst_excess) {
      worst = i;
      worst_excess = excess;
    }
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << misses << " of " << cpu.size() << " elements of " << cpu.ShapeString()
         << " differ by more than 1e-4 * max(1, |cpu|); worst at index " << worst << " "
         << IndexString(cpu.shape(), worst) << ": cpu " << cpu[worst] << ", gpu " << gpu[worst]
         << " (" << worst_excess << " x the tolerance)";
}

std::string HexBits(float v) {
  return absl::StrCat("0x", absl::Hex(std::bit_cast<uint32_t>(v), absl::kZeroPad8));
}

// Every element's bits equal (so -0 != +0 and a NaN equals only its own bits).
::testing::AssertionResult BitEqual(const Tensor& cpu, const Tensor& gpu) {
  if (::testing::AssertionResult same = SameShapeOnHost(cpu, gpu); !same) return same;
  int64_t misses = 0, first = -1;
  for (int64_t i = 0; i < cpu.size(); ++i) {
    if (std::bit_cast<uint32_t>(cpu[i]) == std::bit_cast<uint32_t>(gpu[i])) continue;
    if (misses++ == 0) first = i;
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << misses << " of " << cpu.size() << " elements of " << cpu.ShapeString()
         << " differ bitwise; first at index " << first << " " << IndexString(cpu.shape(), first)
         << ": cpu " << cpu[first] << " (" << HexBits(cpu[first]) << "), gpu " << gpu[first]
         << " (" << HexBits(gpu[first]) << ")";
}

::testing::AssertionResult SumsClose(const LossSums& cpu, const LossSums& gpu) {
  if (cpu.correct != gpu.correct) {
    return ::testing::AssertionFailure()
           << "correct: cpu " << cpu.correct << ", gpu " << gpu.correct;
  }
  const double bound = kTolerance * std::max(1.0, std::abs(cpu.loss_sum));
  if (!(std::abs(cpu.loss_sum - gpu.loss_sum) <= bound)) {
    return ::testing::AssertionFailure()
           << "loss_sum: cpu " << absl::StrCat(cpu.loss_sum) << ", gpu "
           << absl::StrCat(gpu.loss_sum) << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

// ---- Devices -------------------------------------------------------------------


// The suite's parameters: each CUDA ordinal, or -1 ("no GPU") so that the
// suite always has an instance, which skips.
std::vector<int> GpuOrdinals() {
  std::vector<int> ordinals(VisibleGpus());
  std::iota(ordinals.begin(), ordinals.end(), 0);
  if (ordinals.empty()) ordinals.push_back(-1);
  return ordinals;
}

std::string NoGpuReason() {
#ifdef DISTRAIN_HAVE_CUDA
  return "no GPU visible to this process (cuda::VisibleDeviceCount() == 0); the GPU-vs-CPU "
         "equivalence suite needs one";
#else
  return "built without CUDA (DISTRAIN_CUDA=OFF or no toolkit found); no GPU backend to compare "
         "with the CPU";
#endif
}

Tensor ToHost(const Tensor& t) {
  Tensor host;  // a host dst: Copy keeps dst's device
  Copy(t, &host);
  return host;
}

class OpsDeviceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() < 0) GTEST_SKIP() << NoGpuReason();
  }

  DeviceId gpu() const { return DeviceId::Cuda(GetParam()); }

  Tensor ToGpu(const Tensor& host) const {
    Tensor d(host.shape(), gpu());
    Copy(host, &d);
    return d;
  }
  // An output on the GPU whose old contents are NaN.
  Tensor Poisoned(std::vector<int64_t> shape) const {
    Tensor d(std::move(shape), gpu());
    d.Fill(kNaN);
    return d;
  }
  // An empty tensor on the GPU (for outputs of a size only the op knows).
  Tensor EmptyOnGpu() const { return Tensor({0}, gpu()); }

  ::testing::AssertionResult OnThisGpu(const Tensor& t) const {
    if (t.device_id() == gpu()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "result is on " << t.device_id().ToString() << ", not " << gpu().ToString();
  }
  // The GPU's result, still on this GPU, equals the CPU's within tolerance.
  ::testing::AssertionResult MatchesCpu(const Tensor& cpu, const Tensor& gpu_result) const {
    if (::testing::AssertionResult on = OnThisGpu(gpu_result); !on) return on;
    return AllClose(cpu, ToHost(gpu_result));
  }
  ::testing::AssertionResult BitIdenticalToCpu(const Tensor& cpu, const Tensor& gpu_result) const {
    if (::testing::AssertionResult on = OnThisGpu(gpu_result); !on) return on;
    return BitEqual(cpu, ToHost(gpu_result));
  }
};

INSTANTIATE_TEST_SUITE_P(Gpus, OpsDeviceTest, ::testing::ValuesIn(GpuOrdinals()),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param < 0 ? std::string("NoGpu")
                                                 : absl::StrCat("Gpu", info.param);
                         });

// Shapes for row-wise and element-wise ops: a single element, width 1, odd
// sizes, one row wider than a block, a long thin matrix, and rank 4.
const std::vector<std::vector<int64_t>>& RowShapes() {
  static const auto* shapes = new std::vector<std::vector<int64_t>>{
      {1, 1}, {7, 1}, {1, 1000}, {33, 17}, {5, 1029}, {1, 4099}, {4097, 3}, {2, 3, 5, 7}};
  return *shapes;
}

// ---- Matrix products and broadcasts ----------------------------------------------

struct GemmShape {
  int64_t m, n, k;
  float alpha;
};

TEST_P(OpsDeviceTest, MatMulEveryTransposeWithBetaZeroAndOne) {
  const GemmShape shapes[] = {{1, 1, 1, 1.0f},   {1, 10, 64, 1.0f},  {7, 5, 3, -0.5f},
                              {33, 65, 17, 1.0f}, {64, 10, 576, 1.0f}, {1000, 1, 7, 2.0f},
                              {1, 1029, 33, 1.0f}, {257, 129, 1029, 0.25f}};
  uint32_t seed = 100;
  for (const GemmShape& s : shapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(absl::StrCat("m=", s.m, " n=", s.n, " k=", s.k, ta ? " a^T" : " a",
                                    tb ? " b^T" : " b", " alpha=", s.alpha, " beta=", beta));
          const Tensor a = Uniform(ta ? std::vector<int64_t>{s.k, s.m} : std::vector{s.m, s.k},
                                   ++seed, -1.0f, 1.0f);
          const Tensor b = Uniform(tb ? std::vector<int64_t>{s.n, s.k} : std::vector{s.k, s.n},
                                   ++seed, -1.0f, 1.0f);
          // beta == 0 must ignore c entirely, NaN included.
          Tensor c = beta == 0.0f ? Tensor({s.m, s.n}, kNaN) : Uniform({s.m, s.n}, ++seed, -1, 1);
          Tensor cd = ToGpu(c);
          MatMul(ta, tb, s.m, s.n, s.k, s.alpha, a, b, beta, &c);
          MatMul(ta, tb, s.m, s.n, s.k, s.alpha, ToGpu(a), ToGpu(b), beta, &cd);
          EXPECT_TRUE(MatchesCpu(c, cd));
        }
      }
    }
  }
}

TEST_P(OpsDeviceTest, MatMulReadsAndWritesOnlyTheLeadingElements) {
  // Tensors larger than the product (ops.h: the first m*k / k*n / m*n
  // elements): c's tail must come back untouched, as on the CPU.
  const int64_t m = 9, n = 13, k = 31;
  const Tensor a = Uniform({m * k + 5}, 1, -1, 1);
  const Tensor b = Uniform({k * n + 11}, 2, -1, 1);
  for (float beta : {0.0f, 1.0f}) {
    SCOPED_TRACE(absl::StrCat("beta=", beta));
    Tensor c = Uniform({m * n + 7}, 3, -1, 1);
    Tensor cd = ToGpu(c);
    MatMul(false, true, m, n, k, 1.0f, a, b, beta, &c);
    MatMul(false, true, m, n, k, 1.0f, ToGpu(a), ToGpu(b), beta, &cd);
    EXPECT_TRUE(MatchesCpu(c, cd));
  }
}

TEST_P(OpsDeviceTest, BiasAddBroadcastBiasAndBiasGrad) {
  uint32_t seed = 200;
  for (const std::vector<int64_t>& shape : RowShapes()) {
    SCOPED_TRACE(absl::StrCat("y ", Tensor(shape).ShapeString()));
    const int64_t cols = shape.back();
    const Tensor bias = Uniform({cols}, ++seed, -1, 1);
    const Tensor y = Uniform(shape, ++seed, -2, 2);

    Tensor added = y, added_d = ToGpu(y);
    BiasAdd(bias, &added);
    BiasAdd(ToGpu(bias), &added_d);
    EXPECT_TRUE(MatchesCpu(added, added_d)) << "BiasAdd";

    Tensor broadcast(shape), broadcast_d = Poisoned(shape);
    BroadcastBias(bias, &broadcast);
    BroadcastBias(ToGpu(bias), &broadcast_d);
    EXPECT_TRUE(MatchesCpu(broadcast, broadcast_d)) << "BroadcastBias";

    Tensor dbias({cols}), dbias_d = Poisoned({cols});
    BiasGrad(y, &dbias);
    BiasGrad(ToGpu(y), &dbias_d);
    EXPECT_TRUE(MatchesCpu(dbias, dbias_d)) << "BiasGrad";
  }
}

// ---- Activations ---------------------------------------------------------------

TEST_P(OpsDeviceTest, ActivationForwardAndBackwardEveryKindInAndOutOfPlace) {
  uint32_t seed = 300;
  for (ActivationFunction kind : testing::AllActivationFunctions()) {
    for (const std::vector<int64_t>& shape : RowShapes()) {
      SCOPED_TRACE(absl::StrCat(ActivationName(kind.kind), " alpha ", kind.alpha, " on ",
                                Tensor(shape).ShapeString()));
      // [-8, 8] reaches the saturated tails of sigmoid, tanh and softmax and
      // both ends of relu6 and hard_sigmoid.
      const Tensor x = Uniform(shape, ++seed, -8, 8);
      const Tensor dy = Uniform(shape, ++seed, -1, 1);
      Tensor y;
      ActivationForward(kind, x, &y);

      Tensor y_d = Poisoned(shape);
      ActivationForward(kind, ToGpu(x), &y_d);
      EXPECT_TRUE(MatchesCpu(y, y_d)) << "forward";
      Tensor in_place = ToGpu(x);
      ActivationForward(kind, in_place, &in_place);
      EXPECT_TRUE(MatchesCpu(y, in_place)) << "forward, y == x";

      // The same x and y (the CPU's) on both devices.
      Tensor dx;
      ActivationBackward(kind, x, y, dy, &dx);
      const Tensor xd = ToGpu(x), yd = ToGpu(y);
      Tensor dx_d = Poisoned(shape);
      ActivationBackward(kind, xd, yd, ToGpu(dy), &dx_d);
      EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "backward";
      Tensor dx_in_place = ToGpu(dy);
      ActivationBackward(kind, xd, yd, dx_in_place, &dx_in_place);
      EXPECT_TRUE(MatchesCpu(dx, dx_in_place)) << "backward, dx == dy";
    }
  }
}

// ---- Dropout ---------------------------------------------------------------------

TEST_P(OpsDeviceTest, ScaleShiftMatchesInAndOutOfPlace) {
  uint32_t seed = 380;
  for (const std::vector<int64_t>& shape : RowShapes()) {
    SCOPED_TRACE(Tensor(shape).ShapeString());
    const Tensor x = Uniform(shape, ++seed, 0, 255);
    Tensor y;
    ScaleShift(1.0f / 127.5f, -1.0f, x, &y);
    Tensor y_d = Poisoned(shape);
    ScaleShift(1.0f / 127.5f, -1.0f, ToGpu(x), &y_d);
    EXPECT_TRUE(MatchesCpu(y, y_d));
    Tensor in_place = ToGpu(x);
    ScaleShift(1.0f / 127.5f, -1.0f, in_place, &in_place);
    EXPECT_TRUE(MatchesCpu(y, in_place)) << "y == x";
  }
}

TEST_P(OpsDeviceTest, DropoutMaskIsBitIdenticalAndOutputsMatch) {
  struct Case {
    double rate;
    uint64_t stream;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{0.0, 1, {1}},
                        {0.1, 7, {33, 17}},
                        {0.5, 12345, {4099}},
                        {0.5, 0xffffffffffffffffULL, {3, 1029}},
                        {0.25, 0x123456789abcdefULL, {2, 13, 13, 32}},
                        {0.9, 42, {(1 << 20) + 3}}};
  uint32_t seed = 400;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("rate ", c.rate, " stream ", c.stream, " on ",
                              Tensor(c.shape).ShapeString()));
    const Tensor x = Uniform(c.shape, ++seed, -2, 2);
    const Tensor dy = Uniform(c.shape, ++seed, -1, 1);
    Tensor y, mask;
    DropoutForward(c.rate, c.stream, x, &y, &mask);
    Tensor y_d = Poisoned(c.shape), mask_d = Poisoned(c.shape);
    DropoutForward(c.rate, c.stream, ToGpu(x), &y_d, &mask_d);
    EXPECT_TRUE(BitIdenticalToCpu(mask, mask_d)) << "mask";
    EXPECT_TRUE(MatchesCpu(y, y_d)) << "y";

    Tensor dx, dx_d = Poisoned(c.shape);
    DropoutBackward(mask, dy, &dx);
    DropoutBackward(mask_d, ToGpu(dy), &dx_d);
    EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "dx";
  }
}

// ---- Windowed ops ----------------------------------------------------------------

struct WindowCase {
  const char* what;
  int64_t batch, h, w, c, f;  // pooling: f == c
  std::array<int64_t, 2> kernel, strides;
  PaddingKind padding;

  Window2D Window() const { return KerasWindow2D(batch, h, w, c, f, kernel, strides, padding); }
};

bool Asymmetric(const Window2D& w) {
  return w.pad_top != w.pad_bottom || w.pad_left != w.pad_right;
}

std::string Describe(const WindowCase& c) {
  const Window2D w = c.Window();
  return absl::StrCat(c.what, ": in ", w.batch, "x", w.in_h, "x", w.in_w, "x", w.in_c, " out ",
                      w.out_h, "x", w.out_w, "x", w.out_c, " pads t", w.pad_top, " b",
                      w.pad_bottom, " l", w.pad_left, " r", w.pad_right);
}

std::vector<int64_t> InShape(const Window2D& w) { return {w.batch, w.in_h, w.in_w, w.in_c}; }
std::vector<int64_t> OutShape(const Window2D& w) {
  return {w.batch, w.out_h, w.out_w, w.out_c};
}

constexpr PaddingKind kValid = PaddingKind::kValid;
constexpr PaddingKind kSame = PaddingKind::kSame;

const WindowCase kConvCases[] = {
    // TensorFlow's CNN guide: 28x28x1 -> conv 32 3x3 -> pool -> conv 64 3x3
    // -> pool -> conv 64 3x3.
    {"guide conv 1", 4, 28, 28, 1, 32, {3, 3}, {1, 1}, kValid},
    {"guide conv 2", 4, 13, 13, 32, 64, {3, 3}, {1, 1}, kValid},
    {"guide conv 3", 4, 5, 5, 64, 64, {3, 3}, {1, 1}, kValid},
    {"3x3 same stride 1 (symmetric)", 2, 7, 9, 3, 5, {3, 3}, {1, 1}, kSame},
    {"2x2 same stride 1 (asymmetric: bottom, right)", 2, 7, 7, 3, 4, {2, 2}, {1, 1}, kSame},
    {"2x2 same stride 2 on odd input (asymmetric)", 2, 7, 9, 2, 3, {2, 2}, {2, 2}, kSame},
    {"3x3 same stride 2 on even input (asymmetric)", 3, 8, 6, 4, 6, {3, 3}, {2, 2}, kSame},
    {"5x5 same stride 2 (rows symmetric, columns not)", 2, 9, 10, 2, 3, {5, 5}, {2, 2}, kSame},
    {"5x5 same stride 1", 1, 12, 11, 3, 8, {5, 5}, {1, 1}, kSame},
    {"5x5 valid stride 1", 2, 12, 12, 3, 7, {5, 5}, {1, 1}, kValid},
    {"2x2 valid stride 2 on odd input (last row unused)", 2, 7, 7, 5, 3, {2, 2}, {2, 2}, kValid},
    {"3x3 valid stride 2", 1, 9, 8, 3, 2, {3, 3}, {2, 2}, kValid},
    {"3x2 kernel, strides 2x1, same", 2, 9, 7, 3, 4, {3, 2}, {2, 1}, kSame},
    {"batch 1, one channel in and out", 1, 6, 5, 1, 1, {3, 3}, {1, 1}, kSame},
    {"33 channels -> 129 filters", 2, 6, 6, 33, 129, {3, 3}, {1, 1}, kSame},
};

const WindowCase kPoolCases[] = {
    {"guide pool 1", 2, 26, 26, 32, 32, {2, 2}, {2, 2}, kValid},
    {"guide pool 2 (odd: last row dropped)", 2, 11, 11, 64, 64, {2, 2}, {2, 2}, kValid},
    {"2x2 stride 2 same on odd input (asymmetric)", 2, 13, 13, 3, 3, {2, 2}, {2, 2}, kSame},
    {"3x3 stride 1 same (symmetric)", 1, 7, 9, 5, 5, {3, 3}, {1, 1}, kSame},
    {"3x3 stride 2 same on even input (asymmetric)", 2, 8, 8, 4, 4, {3, 3}, {2, 2}, kSame},
    {"2x2 stride 1 same (asymmetric)", 3, 5, 6, 1, 1, {2, 2}, {1, 1}, kSame},
    {"3x2 window, strides 2x1, same", 2, 9, 7, 2, 2, {3, 2}, {2, 1}, kSame},
    {"3x3 stride 2 valid (overlapping windows)", 2, 9, 9, 3, 3, {3, 3}, {2, 2}, kValid},
    {"batch 1, 1029 channels", 1, 4, 4, 1029, 1029, {2, 2}, {2, 2}, kValid},
};

TEST_P(OpsDeviceTest, Conv2DForwardAndBackwardWithAndWithoutBias) {
  ASSERT_TRUE(std::any_of(std::begin(kConvCases), std::end(kConvCases),
                          [](const WindowCase& c) { return Asymmetric(c.Window()); }))
      << "the cases must keep an asymmetric 'same' window";
  uint32_t seed = 500;
  for (const WindowCase& c : kConvCases) {
    SCOPED_TRACE(Describe(c));
    const Window2D w = c.Window();
    const std::vector<int64_t> kshape = {w.kernel_h, w.kernel_w, w.in_c, w.out_c};
    const Tensor x = Uniform(InShape(w), ++seed, -1, 1);
    const Tensor kernel = Uniform(kshape, ++seed, -0.25f, 0.25f);
    const Tensor bias = Uniform({w.out_c}, ++seed, -0.1f, 0.1f);
    const Tensor dy = Uniform(OutShape(w), ++seed, -1, 1);
    const Tensor xd = ToGpu(x), kernel_d = ToGpu(kernel), bias_d = ToGpu(bias), dy_d = ToGpu(dy);

    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(with_bias ? "with bias" : "without bias");
      Tensor y, y_d = Poisoned(OutShape(w));
      Conv2DForward(w, x, kernel, with_bias ? &bias : nullptr, &y);
      Conv2DForward(w, xd, kernel_d, with_bias ? &bias_d : nullptr, &y_d);
      EXPECT_TRUE(MatchesCpu(y, y_d)) << "forward";

      Tensor dkernel, dbias, dkernel_d = Poisoned(kshape), dbias_d = Poisoned({w.out_c});
      Conv2DBackwardWeights(w, x, dy, &dkernel, with_bias ? &dbias : nullptr);
      Conv2DBackwardWeights(w, xd, dy_d, &dkernel_d, with_bias ? &dbias_d : nullptr);
      EXPECT_TRUE(MatchesCpu(dkernel, dkernel_d)) << "backward weights: dkernel";
      if (with_bias) {
        EXPECT_TRUE(MatchesCpu(dbias, dbias_d)) << "backward weights: dbias";
      }
    }

    Tensor dx, dx_d = Poisoned(InShape(w));
    Conv2DBackwardData(w, dy, kernel, &dx);
    Conv2DBackwardData(w, dy_d, kernel_d, &dx_d);
    EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "backward data";
  }
}

// ---- Mixed precision ------------------------------------------------------------

// The rounding kernels run the CPU's functors: bit-identical on every bit
// pattern (NaNs as NaNs); AllFinite finds one bad element among many.
TEST_P(OpsDeviceTest, RoundToIsBitIdenticalAndAllFiniteFindsOneBadElement) {
  const Tensor x = RandomBits({5, 4099}, 900);
  for (ComputeType type : {ComputeType::kBfloat16, ComputeType::kFloat16}) {
    SCOPED_TRACE(ComputeTypeName(type));
    Tensor y, y_d = Poisoned(x.shape());
    RoundTo(type, x, &y);
    RoundTo(type, ToGpu(x), &y_d);
    EXPECT_TRUE(BitIdenticalToCpu(y, y_d));
    Tensor in_place = ToGpu(x);
    RoundTo(type, in_place, &in_place);
    EXPECT_TRUE(BitIdenticalToCpu(y, in_place));
  }
  Tensor a = Uniform({3, 1000}, 901, -1, 1), b = Uniform({4097}, 902, -1, 1);
  Tensor a_d = ToGpu(a), b_d = ToGpu(b);
  EXPECT_TRUE(AllFinite({&a_d, &b_d}));
  b[4096] = std::numeric_limits<float>::infinity();
  b_d = ToGpu(b);
  EXPECT_FALSE(AllFinite({&a_d, &b_d}));
  EXPECT_FALSE(AllFinite({&a, &b_d}));  // host and device tensors together
  Tensor s_d = ToGpu(a);
  Scale(0.5f, &s_d);
  Scale(0.5f, &a);
  EXPECT_TRUE(BitIdenticalToCpu(a, s_d));
}

// A mixed-precision layer's ReLU rounds its output in the same pass
// (ActivationForward with a compute type): the same bits as ReLU and then
// RoundTo, on every bit pattern (NaN, -0, subnormals, infinities, values
// that round up into the next binade or to infinity), in place or not.
TEST_P(OpsDeviceTest, ReluRoundedInOnePassIsReluThenRoundTo) {
  const Tensor x = RandomBits({3, 70001}, 903);  // above the CPU's parallel threshold
  for (ComputeType type : {ComputeType::kBfloat16, ComputeType::kFloat16}) {
    SCOPED_TRACE(ComputeTypeName(type));
    Tensor two_passes;
    ActivationForward(ActivationKind::kRelu, x, &two_passes);
    RoundTo(type, two_passes, &two_passes);
    Tensor y_d = Poisoned(x.shape());
    ActivationForward(ActivationKind::kRelu, ToGpu(x), &y_d, type);
    EXPECT_TRUE(BitIdenticalToCpu(two_passes, y_d));
    Tensor in_place = ToGpu(x);
    ActivationForward(ActivationKind::kRelu, in_place, &in_place, type);
    EXPECT_TRUE(BitIdenticalToCpu(two_passes, in_place));
  }
  // float32 rounds nothing: plain ReLU.
  Tensor relu, relu_d = Poisoned(x.shape());
  ActivationForward(ActivationKind::kRelu, x, &relu);
  ActivationForward(ActivationKind::kRelu, ToGpu(x), &relu_d, ComputeType::kFloat32);
  EXPECT_TRUE(BitIdenticalToCpu(relu, relu_d));
}

// Under a 16-bit compute type, products of inputs holding 16-bit values run
// on tensor cores (cuBLAS FAST_16BF / FAST_16F, cuDNN TENSOR_OP_MATH): the
// conversion is exact and the accumulation float32, so they still match the
// CPU's float32 products within 1e-4.
TEST_P(OpsDeviceTest, TensorCoreProductsOfRoundedInputsMatchTheCpu) {
  uint32_t seed = 950;
  for (ComputeType type : {ComputeType::kBfloat16, ComputeType::kFloat16}) {
    SCOPED_TRACE(ComputeTypeName(type));
    const auto rounded = [&](std::vector<int64_t> shape, float lo, float hi) {
      Tensor t = Uniform(std::move(shape), ++seed, lo, hi);
      RoundTo(type, t, &t);
      return t;
    };
    for (const GemmShape& g : {GemmShape{64, 10, 576, 1.0f}, GemmShape{257, 129, 1029, 1.0f}}) {
      for (bool ta : {false, true}) {
        const Tensor a = rounded(ta ? std::vector<int64_t>{g.k, g.m} : std::vector{g.m, g.k}, -1, 1);
        const Tensor b = rounded({g.k, g.n}, -1, 1);
        Tensor c({g.m, g.n}), cd = Poisoned({g.m, g.n});
        MatMul(ta, false, g.m, g.n, g.k, g.alpha, a, b, 0.0f, &c);
        MatMul(ta, false, g.m, g.n, g.k, g.alpha, ToGpu(a), ToGpu(b), 0.0f, &cd, type);
        EXPECT_TRUE(MatchesCpu(c, cd)) << "m=" << g.m << " n=" << g.n << " k=" << g.k;
      }
    }
    const Window2D w = KerasWindow2D(16, 28, 28, 8, 32, {3, 3}, {1, 1}, PaddingKind::kValid);
    const std::vector<int64_t> kshape = {w.kernel_h, w.kernel_w, w.in_c, w.out_c};
    const Tensor x = rounded(InShape(w), -1, 1);
    const Tensor kernel = rounded(kshape, -0.25f, 0.25f);
    const Tensor dy = rounded(OutShape(w), -1, 1);
    Tensor y, y_d = Poisoned(OutShape(w));
    Conv2DForward(w, x, kernel, nullptr, &y);
    Conv2DForward(w, ToGpu(x), ToGpu(kernel), nullptr, &y_d, type);
    EXPECT_TRUE(MatchesCpu(y, y_d)) << "forward";
    Tensor dk, dk_d = Poisoned(kshape);
    Conv2DBackwardWeights(w, x, dy, &dk, nullptr);
    Conv2DBackwardWeights(w, ToGpu(x), ToGpu(dy), &dk_d, nullptr, type);
    EXPECT_TRUE(MatchesCpu(dk, dk_d)) << "backward weights";
    Tensor dx, dx_d = Poisoned(InShape(w));
    Conv2DBackwardData(w, dy, kernel, &dx);
    Conv2DBackwardData(w, ToGpu(dy), ToGpu(kernel), &dx_d, type);
    EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "backward data";
  }
}

TEST_P(OpsDeviceTest, Pool2DMaxAndAverageForwardAndBackward) {
  ASSERT_TRUE(std::any_of(std::begin(kPoolCases), std::end(kPoolCases),
                          [](const WindowCase& c) { return Asymmetric(c.Window()); }))
      << "the cases must keep an asymmetric 'same' window";
  uint32_t seed = 600;
  for (const WindowCase& c : kPoolCases) {
    const Window2D w = c.Window();
    // Random floats: no ties in a max window, so the argmax is unambiguous.
    const Tensor x = Uniform(InShape(w), ++seed, -2, 2);
    const Tensor dy = Uniform(OutShape(w), ++seed, -1, 1);
    const Tensor xd = ToGpu(x);
    for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
      SCOPED_TRACE(absl::StrCat(kind == PoolKind::kMax ? "max " : "average ", Describe(c)));
      Tensor y, workspace;
      Pool2DForward(kind, w, x, &y, &workspace);
      Tensor y_d = Poisoned(OutShape(w)), workspace_d = EmptyOnGpu();
      Pool2DForward(kind, w, xd, &y_d, &workspace_d);
      EXPECT_TRUE(MatchesCpu(y, y_d)) << "forward";

      Tensor dx, dx_d = Poisoned(InShape(w));
      Pool2DBackward(kind, w, x, y, dy, workspace, &dx);
      Pool2DBackward(kind, w, xd, y_d, ToGpu(dy), workspace_d, &dx_d);
      EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "backward";
    }
  }
}

// ---- Batch normalisation -----------------------------------------------------------

TEST_P(OpsDeviceTest, BatchNormTrainingInferenceAndBackward) {
  struct Case {
    std::vector<int64_t> shape;  // the last axis is normalised
    float epsilon;
  };
  const Case cases[] = {{{1, 7}, 1e-3f},          {{2, 5}, 1e-3f},        {{64, 37}, 1e-3f},
                        {{1024, 3}, 1e-3f},       {{1, 4, 4, 1}, 1e-3f},  {{8, 13, 13, 32}, 1e-3f},
                        {{3, 7, 9, 1029}, 1e-5f}, {{2, 5, 5, 64}, 1e-2f},
                        // Rows past cuDNN's bounds on N (cudnn_batch_norm_shape.h):
                        // 262144 (split 32768 x 8), 900000 (over the training
                        // bound; 60000 x 15), a prime (one image of 65537 rows).
                        {{16, 128, 128, 4}, 1e-3f}, {{1, 30, 30000, 2}, 1e-3f},
                        {{65537, 2}, 1e-3f}};
  uint32_t seed = 700;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(Tensor(c.shape).ShapeString(), " epsilon ", c.epsilon));
    const int64_t ch = c.shape.back();
    // Activations off centre, as a layer's input is.
    const Tensor x = Uniform(c.shape, ++seed, -1, 3);
    const Tensor gamma = Uniform({ch}, ++seed, 0.5f, 1.5f);
    const Tensor beta = Uniform({ch}, ++seed, -0.5f, 0.5f);
    const Tensor moving_mean = Uniform({ch}, ++seed, 0, 2);
    const Tensor moving_var = Uniform({ch}, ++seed, 0.5f, 2);
    const Tensor dy = Uniform(c.shape, ++seed, -1, 1);
    const Tensor xd = ToGpu(x), gamma_d = ToGpu(gamma), beta_d = ToGpu(beta);

    Tensor y, mean, var;
    BatchNormForwardTraining(x, gamma, beta, c.epsilon, &y, &mean, &var);
    Tensor y_d = Poisoned(c.shape), mean_d = Poisoned({ch}), var_d = Poisoned({ch});
    BatchNormForwardTraining(xd, gamma_d, beta_d, c.epsilon, &y_d, &mean_d, &var_d);
    EXPECT_TRUE(MatchesCpu(y, y_d)) << "training: y";
    EXPECT_TRUE(MatchesCpu(mean, mean_d)) << "training: batch mean";
    EXPECT_TRUE(MatchesCpu(var, var_d)) << "training: batch variance";

    Tensor yi, yi_d = Poisoned(c.shape);
    BatchNormForwardInference(x, gamma, beta, moving_mean, moving_var, c.epsilon, &yi);
    BatchNormForwardInference(xd, gamma_d, beta_d, ToGpu(moving_mean), ToGpu(moving_var),
                              c.epsilon, &yi_d);
    EXPECT_TRUE(MatchesCpu(yi, yi_d)) << "inference";

    // The CPU's batch statistics on both devices.
    Tensor dx, dgamma, dbeta;
    BatchNormBackward(x, dy, gamma, mean, var, c.epsilon, &dx, &dgamma, &dbeta);
    Tensor dx_d = Poisoned(c.shape), dgamma_d = Poisoned({ch}), dbeta_d = Poisoned({ch});
    BatchNormBackward(xd, ToGpu(dy), gamma_d, ToGpu(mean), ToGpu(var), c.epsilon, &dx_d,
                      &dgamma_d, &dbeta_d);
    EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "backward: dx";
    EXPECT_TRUE(MatchesCpu(dgamma, dgamma_d)) << "backward: dgamma";
    EXPECT_TRUE(MatchesCpu(dbeta, dbeta_d)) << "backward: dbeta";
  }
}

// ---- Layer and RMS normalisation -----------------------------------------------------

TEST_P(OpsDeviceTest, LayerNormForwardAndBackwardEveryVariant) {
  struct Case {
    std::vector<int64_t> shape;  // each row of the last axis is normalised
    float epsilon;
  };
  // Widths below, at and past a warp and the 256-thread block; row counts
  // past one ColumnSums chunk (1024) and past the 65535-block grid.
  const Case cases[] = {{{1, 1}, 1e-3f},        {{3, 7}, 1e-3f},         {{64, 32}, 1e-5f},
                        {{5, 33}, 1e-3f},       {{2, 300}, 1e-3f},       {{4, 4096}, 1e-6f},
                        {{8, 13, 13, 32}, 1e-3f}, {{3, 1029}, 1e-3f},    {{70000, 3}, 1e-3f},
                        {{2, 600, 64}, 1e-5f}};
  struct Variant {
    bool gamma, beta, rms;
  };
  const Variant variants[] = {
      {true, true, false}, {false, false, false}, {true, false, false}, {true, false, true},
      {false, false, true}};
  uint32_t seed = 750;
  for (const Case& c : cases) {
    for (const Variant& v : variants) {
      SCOPED_TRACE(absl::StrCat(Tensor(c.shape).ShapeString(), " epsilon ", c.epsilon,
                                v.rms ? " rms" : "", v.gamma ? " gamma" : "",
                                v.beta ? " beta" : ""));
      const int64_t ch = c.shape.back();
      const int64_t rows = Tensor(c.shape).size() / ch;
      const Tensor x = Uniform(c.shape, ++seed, -1, 3);  // off centre, as activations are
      const Tensor gamma = Uniform({ch}, ++seed, 0.5f, 1.5f);
      const Tensor beta = Uniform({ch}, ++seed, -0.5f, 0.5f);
      const Tensor dy = Uniform(c.shape, ++seed, -1, 1);
      const Tensor xd = ToGpu(x), gamma_d = ToGpu(gamma), beta_d = ToGpu(beta);
      const Tensor* g = v.gamma ? &gamma : nullptr;
      const Tensor* b = v.beta ? &beta : nullptr;
      const Tensor* g_d = v.gamma ? &gamma_d : nullptr;
      const Tensor* b_d = v.beta ? &beta_d : nullptr;

      Tensor y, mean, rstd;
      LayerNormForward(x, g, b, c.epsilon, v.rms, &y, &mean, &rstd);
      Tensor y_d = Poisoned(c.shape), mean_d = Poisoned({rows}), rstd_d = Poisoned({rows});
      LayerNormForward(xd, g_d, b_d, c.epsilon, v.rms, &y_d, &mean_d, &rstd_d);
      EXPECT_TRUE(MatchesCpu(y, y_d)) << "y";
      EXPECT_TRUE(MatchesCpu(mean, mean_d)) << "row means";
      EXPECT_TRUE(MatchesCpu(rstd, rstd_d)) << "row scales";

      // The CPU's statistics on both devices.
      Tensor dx, dgamma, dbeta;
      LayerNormBackward(x, dy, g, mean, rstd, v.rms, &dx, v.gamma ? &dgamma : nullptr,
                        v.beta ? &dbeta : nullptr);
      Tensor dx_d = Poisoned(c.shape), dgamma_d = Poisoned({ch}), dbeta_d = Poisoned({ch});
      LayerNormBackward(xd, ToGpu(dy), g_d, ToGpu(mean), ToGpu(rstd), v.rms, &dx_d,
                        v.gamma ? &dgamma_d : nullptr, v.beta ? &dbeta_d : nullptr);
      EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "dx";
      if (v.gamma) {
        EXPECT_TRUE(MatchesCpu(dgamma, dgamma_d)) << "dgamma";
      }
      if (v.beta) {
        EXPECT_TRUE(MatchesCpu(dbeta, dbeta_d)) << "dbeta";
      }
    }
  }
}

// ---- Embedding ------------------------------------------------------------------------

// The gather is a copy and the gradient adds each id's rows in the ids'
// order on both backends: bit for bit the CPU's, repeated ids included.
TEST_P(OpsDeviceTest, EmbeddingForwardAndBackwardAreBitIdenticalToTheCpu) {
  struct Case {
    std::vector<int64_t> ids_shape;
    int64_t vocab, dim;
  };
  const Case cases[] = {{{1, 1}, 1, 1},        {{4, 7}, 3, 5},      {{32, 200}, 1000, 64},
                        {{2, 28, 28, 1}, 256, 4}, {{8, 50}, 20000, 130}};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(Tensor(c.ids_shape).ShapeString(), " vocab ", c.vocab, " dim ",
                              c.dim));
    Tensor ids(c.ids_shape);
    std::mt19937 gen(++seed);
    // Few distinct ids, so most rows of the gradient add several positions.
    const int64_t distinct = std::max<int64_t>(1, c.vocab / 4);
    for (float& id : ids.span()) id = static_cast<float>(gen() % distinct);
    const Tensor table = Uniform({c.vocab, c.dim}, ++seed, -1, 1);
    std::vector<int64_t> out_shape = c.ids_shape;
    out_shape.push_back(c.dim);
    const Tensor dy = Uniform(out_shape, ++seed, -1, 1);

    Tensor y, y_d = Poisoned(out_shape);
    EmbeddingForward(table, ids, &y);
    EmbeddingForward(ToGpu(table), ToGpu(ids), &y_d);
    EXPECT_TRUE(BitIdenticalToCpu(y, y_d)) << "forward";

    Tensor dtable({c.vocab, c.dim}), dtable_d = Poisoned({c.vocab, c.dim});
    EmbeddingBackward(ids, dy, &dtable);
    EmbeddingBackward(ToGpu(ids), ToGpu(dy), &dtable_d);
    EXPECT_TRUE(BitIdenticalToCpu(dtable, dtable_d)) << "backward";
  }
}

// ---- Global average pooling ----------------------------------------------------------

TEST_P(OpsDeviceTest, GlobalAveragePool2DForwardAndBackward) {
  const std::vector<int64_t> shapes[] = {
      {1, 1, 1, 1}, {3, 5, 7, 33}, {2, 11, 11, 1029}, {4, 32, 32, 3}, {1, 3, 3, 64}};
  uint32_t seed = 800;
  for (const std::vector<int64_t>& shape : shapes) {
    SCOPED_TRACE(Tensor(shape).ShapeString());
    const int64_t n = shape[0], h = shape[1], w = shape[2], c = shape[3];
    const Tensor x = Uniform(shape, ++seed, -2, 2);
    const Tensor dy = Uniform({n, c}, ++seed, -1, 1);
    Tensor y, y_d = Poisoned({n, c});
    GlobalAveragePool2DForward(x, &y);
    GlobalAveragePool2DForward(ToGpu(x), &y_d);
    EXPECT_TRUE(MatchesCpu(y, y_d)) << "forward";
    Tensor dx, dx_d = Poisoned(shape);
    GlobalAveragePool2DBackward(dy, h, w, &dx);
    GlobalAveragePool2DBackward(ToGpu(dy), h, w, &dx_d);
    EXPECT_TRUE(MatchesCpu(dx, dx_d)) << "backward";
  }
}

// ---- Losses ------------------------------------------------------------------------

struct LossCase {
  LossKind kind;
  int64_t batch, width;
  float logit_range;  // logits uniform in [-range, range]; 30 saturates (clipping)
};

// A batch of outputs as the model would produce them for (kind, from_logits):
// logits, softmax rows, sigmoids, or regression values.
Tensor LossOutputs(const LossCase& c, bool from_logits, uint32_t seed) {
  if (c.kind == LossKind::kMeanSquaredError) {
    return Uniform({c.batch, c.width}, seed, -1, c.width == 1 ? 6.0f : 2.0f);
  }
  Tensor out = Uniform({c.batch, c.width}, seed, -c.logit_range, c.logit_range);
  if (from_logits) return out;
  if (c.kind == LossKind::kBinaryCrossentropy) {
    for (int64_t i = 0; i < out.size(); ++i) out[i] = 1.0f / (1.0f + std::exp(-out[i]));
    return out;
  }
  for (int64_t r = 0; r < c.batch; ++r) {
    double max = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < c.width; ++j) max = std::max<double>(max, out.at(r, j));
    for (int64_t j = 0; j < c.width; ++j) sum += std::exp(out.at(r, j) - max);
    for (int64_t j = 0; j < c.width; ++j) {
      out.at(r, j) = static_cast<float>(std::exp(out.at(r, j) - max) / sum);
    }
  }
  return out;
}

// Class indices; 0/1 for binary; the target value for width-1 MSE.
std::vector<int32_t> LossLabels(const LossCase& c, uint32_t seed) {
  std::mt19937 gen(seed);
  const int64_t limit = c.kind == LossKind::kBinaryCrossentropy ? 2
                        : (c.kind == LossKind::kMeanSquaredError && c.width == 1) ? 5
                                                                                   : c.width;
  std::vector<int32_t> labels(c.batch);
  for (int32_t& l : labels) l = static_cast<int32_t>(gen() % limit);
  return labels;
}

TEST_P(OpsDeviceTest, LossEveryKindWithAndWithoutLogits) {
  using K = LossKind;
  const LossCase cases[] = {
      {K::kSparseCategoricalCrossentropy, 64, 10, 4},
      {K::kSparseCategoricalCrossentropy, 1, 10, 4},
      {K::kSparseCategoricalCrossentropy, 1029, 10, 4},
      {K::kSparseCategoricalCrossentropy, 3, 1029, 4},
      {K::kSparseCategoricalCrossentropy, 5, 1, 4},
      {K::kSparseCategoricalCrossentropy, 16, 10, 30},
      {K::kCategoricalCrossentropy, 64, 10, 4},
      {K::kCategoricalCrossentropy, 1, 10, 4},
      {K::kCategoricalCrossentropy, 3, 1029, 4},
      {K::kCategoricalCrossentropy, 5, 1, 4},
      {K::kCategoricalCrossentropy, 16, 10, 30},
      {K::kBinaryCrossentropy, 1, 1, 6},
      {K::kBinaryCrossentropy, 64, 1, 6},
      {K::kBinaryCrossentropy, 4099, 1, 6},
      {K::kBinaryCrossentropy, 16, 1, 30},
      {K::kMeanSquaredError, 64, 10, 0},
      {K::kMeanSquaredError, 1, 10, 0},
      {K::kMeanSquaredError, 1029, 10, 0},
      {K::kMeanSquaredError, 33, 1, 0},
  };
  uint32_t seed = 900;
  for (const LossCase& c : cases) {
    for (bool from_logits : {false, true}) {
      SCOPED_TRACE(absl::StrCat(LossKindName(c.kind), from_logits ? " from logits" : "",
                                " batch ", c.batch, " width ", c.width, " logit range ",
                                c.logit_range));
      const Tensor out = LossOutputs(c, from_logits, ++seed);
      const std::vector<int32_t> labels = LossLabels(c, ++seed);
      const float scale = 1.0f / static_cast<float>(c.batch);
      const Tensor out_d = ToGpu(out);

      Tensor grad;
      const LossSums sums = Loss(c.kind, from_logits, out, labels, scale, &grad);
      Tensor grad_d = Poisoned({c.batch, c.width});
      const LossSums sums_d = Loss(c.kind, from_logits, out_d, labels, scale, &grad_d);
      EXPECT_TRUE(SumsClose(sums, sums_d));
      EXPECT_TRUE(MatchesCpu(grad, grad_d)) << "gradient";

      EXPECT_TRUE(SumsClose(sums, Loss(c.kind, from_logits, out_d, labels, scale, nullptr)))
          << "without a gradient";
    }
  }
}

// ---- Copies and tensors on the GPU ------------------------------------------------------

TEST_P(OpsDeviceTest, CopyRoundTripsAreBitExact) {
  const std::vector<int64_t> shapes[] = {{0}, {1}, {1000}, {3, 1029}, {(1 << 20) + 3}};
  uint32_t seed = 1000;
  for (const std::vector<int64_t>& shape : shapes) {
    SCOPED_TRACE(Tensor(shape).ShapeString());
    const Tensor host = RandomBits(shape, ++seed);
    const Tensor d = ToGpu(host);
    EXPECT_TRUE(BitIdenticalToCpu(host, d)) << "host -> GPU -> host";

    // Device to device on this GPU, into a tensor of another shape: dst is
    // resized to src's shape and keeps its device.
    Tensor same_gpu = Tensor({2, 2}, gpu());
    Copy(d, &same_gpu);
    EXPECT_EQ(same_gpu.shape(), shape);
    EXPECT_TRUE(BitIdenticalToCpu(host, same_gpu)) << "GPU -> same GPU";

    // Host into a device tensor that was larger: shrinks, stays on the GPU.
    Tensor shrunk = Tensor({(1 << 20) + 100}, gpu());
    Copy(host, &shrunk);
    EXPECT_TRUE(BitIdenticalToCpu(host, shrunk)) << "host into a larger GPU tensor";

    const int gpus = VisibleGpus();
    if (gpus > 1) {
      const DeviceId other = DeviceId::Cuda((GetParam() + 1) % gpus);
      Tensor there({1}, other);
      Copy(d, &there);
      EXPECT_EQ(there.device_id(), other) << "dst keeps its device";
      EXPECT_TRUE(BitEqual(host, ToHost(there))) << "GPU -> " << other.ToString();
      Tensor back({1}, gpu());
      Copy(there, &back);
      EXPECT_TRUE(BitIdenticalToCpu(host, back)) << other.ToString() << " -> GPU";
    }
  }
}

TEST_P(OpsDeviceTest, MoveToCarriesTheContentsBitExactly) {
  const Tensor host = RandomBits({3, 1029}, 1050);
  Tensor t = host;
  MoveTo(gpu(), &t);
  EXPECT_TRUE(BitIdenticalToCpu(host, t)) << "host -> GPU";
  const float* storage = t.data();
  MoveTo(gpu(), &t);
  EXPECT_EQ(t.data(), storage) << "already on the device: nothing moves";

  const int gpus = VisibleGpus();
  if (gpus > 1) {
    const DeviceId other = DeviceId::Cuda((GetParam() + 1) % gpus);
    MoveTo(other, &t);
    EXPECT_EQ(t.device_id(), other);
    EXPECT_TRUE(BitEqual(host, ToHost(t))) << "GPU -> " << other.ToString();
    MoveTo(gpu(), &t);
    EXPECT_TRUE(BitIdenticalToCpu(host, t)) << other.ToString() << " -> GPU";
  }

  MoveTo(DeviceId::Cpu(), &t);
  EXPECT_TRUE(t.on_host());
  EXPECT_TRUE(BitEqual(host, t)) << "GPU -> host";
}

TEST_P(OpsDeviceTest, TensorOnTheGpuIsZeroFilledAndFillSetsEveryElement) {
  const std::vector<int64_t> shapes[] = {{1}, {3, 1029}, {4097, 3}};
  for (const std::vector<int64_t>& shape : shapes) {
    SCOPED_TRACE(Tensor(shape).ShapeString());
    Tensor d(shape, gpu());
    EXPECT_TRUE(OnThisGpu(d));
    EXPECT_FALSE(d.on_host());
    EXPECT_EQ(d.shape(), shape);
    EXPECT_TRUE(d.span().empty()) << "no host storage for a GPU tensor";
    EXPECT_NE(d.data(), nullptr);
    EXPECT_TRUE(BitIdenticalToCpu(Tensor(shape, 0.0f), d)) << "zero-filled (+0)";
    d.Fill(-2.5f);
    EXPECT_TRUE(BitIdenticalToCpu(Tensor(shape, -2.5f), d)) << "Fill";
  }
}

TEST_P(OpsDeviceTest, TensorCopiesAreDeepOnTheSameGpuAndMovesKeepTheStorage) {
  const Tensor host = Uniform({5, 1029}, 1100, -1, 1);
  Tensor d = ToGpu(host);

  Tensor copied(d);
  EXPECT_TRUE(OnThisGpu(copied)) << "copy constructor";
  EXPECT_NE(copied.data(), d.data());
  EXPECT_TRUE(BitIdenticalToCpu(host, copied)) << "copy constructor";

  Tensor assigned({2}, 1.0f);  // a host tensor takes the source's device
  assigned = d;
  EXPECT_TRUE(OnThisGpu(assigned)) << "copy assignment";
  EXPECT_TRUE(BitIdenticalToCpu(host, assigned)) << "copy assignment";

  d.Fill(7.0f);  // the copies are unaffected
  EXPECT_TRUE(BitIdenticalToCpu(host, copied)) << "copy constructor after the source changed";
  EXPECT_TRUE(BitIdenticalToCpu(host, assigned)) << "copy assignment after the source changed";

  const float* storage = copied.data();
  Tensor moved(std::move(copied));
  EXPECT_TRUE(OnThisGpu(moved));
  EXPECT_EQ(moved.data(), storage) << "a move keeps the device storage";
  EXPECT_TRUE(BitIdenticalToCpu(host, moved)) << "move";
}

TEST_P(OpsDeviceTest, ResizeKeepsTheDeviceUnlessToldOtherwise) {
  Tensor t({5}, gpu());
  t.Resize({7, 300});  // grows
  EXPECT_TRUE(OnThisGpu(t));
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{7, 300}));
  t.Fill(1.5f);
  EXPECT_TRUE(BitIdenticalToCpu(Tensor({7, 300}, 1.5f), t)) << "after growing";
  t.Resize({3});  // shrinks
  EXPECT_TRUE(OnThisGpu(t));
  t.Fill(4.0f);
  EXPECT_TRUE(BitIdenticalToCpu(Tensor({3}, 4.0f), t)) << "after shrinking";

  t.Resize({2, 2}, DeviceId::Cpu());
  EXPECT_TRUE(t.on_host());
  EXPECT_EQ(t.span().size(), 4u);
  t.Resize({1029}, gpu());
  EXPECT_TRUE(OnThisGpu(t));
  t.Fill(-3.0f);
  EXPECT_TRUE(BitIdenticalToCpu(Tensor({1029}, -3.0f), t)) << "back on the GPU";
}

// tensor.h: "an op sizes its output on its inputs' device, so a
// default-constructed output follows them there".
TEST_P(OpsDeviceTest, DefaultConstructedOutputsFollowTheirInputsToTheGpu) {
  const Window2D w = KerasWindow2D(2, 7, 7, 3, 4, {2, 2}, {2, 2}, PaddingKind::kSame);
  const Tensor x = Uniform(InShape(w), 1200, -1, 1);
  const Tensor kernel = Uniform({2, 2, 3, 4}, 1201, -0.25f, 0.25f);
  const Tensor xd = ToGpu(x), kernel_d = ToGpu(kernel);

  Tensor act, act_d;
  ActivationForward(ActivationKind::kTanh, x, &act);
  ActivationForward(ActivationKind::kTanh, xd, &act_d);
  EXPECT_TRUE(MatchesCpu(act, act_d)) << "ActivationForward";

  Tensor conv, conv_d;
  Conv2DForward(w, x, kernel, nullptr, &conv);
  Conv2DForward(w, xd, kernel_d, nullptr, &conv_d);
  EXPECT_TRUE(MatchesCpu(conv, conv_d)) << "Conv2DForward";

  const Window2D pw = KerasWindow2D(2, 7, 7, 3, 3, {2, 2}, {2, 2}, PaddingKind::kSame);
  Tensor pool, workspace, pool_d, workspace_d;
  Pool2DForward(PoolKind::kMax, pw, x, &pool, &workspace);
  Pool2DForward(PoolKind::kMax, pw, xd, &pool_d, &workspace_d);
  EXPECT_TRUE(MatchesCpu(pool, pool_d)) << "Pool2DForward";

  Tensor gap, gap_d;
  GlobalAveragePool2DForward(x, &gap);
  GlobalAveragePool2DForward(xd, &gap_d);
  EXPECT_TRUE(MatchesCpu(gap, gap_d)) << "GlobalAveragePool2DForward";

  Tensor y, mask, y_d, mask_d;
  DropoutForward(0.5, 3, x, &y, &mask);
  DropoutForward(0.5, 3, xd, &y_d, &mask_d);
  EXPECT_TRUE(BitIdenticalToCpu(mask, mask_d)) << "DropoutForward mask";

  const std::vector<int32_t> labels = {1, 0};
  Tensor grad, grad_d;
  Loss(LossKind::kSparseCategoricalCrossentropy, true, gap, labels, 0.5f, &grad);
  Loss(LossKind::kSparseCategoricalCrossentropy, true, gap_d, labels, 0.5f, &grad_d);
  EXPECT_TRUE(MatchesCpu(grad, grad_d)) << "Loss gradient";
}

// ---- The comparison helpers themselves (run in every build) -----------------------------

// The host's fused pass (one loop doing both) against its own two passes;
// the GPU case above compares a device with these same host results.
TEST(OpsHostTest, ReluRoundedInOnePassIsReluThenRoundTo) {
  const Tensor x = RandomBits({3, 70001}, 904);  // above the parallel threshold: both cores
  for (ComputeType type : {ComputeType::kBfloat16, ComputeType::kFloat16}) {
    SCOPED_TRACE(ComputeTypeName(type));
    Tensor two_passes;
    ActivationForward(ActivationKind::kRelu, x, &two_passes);
    RoundTo(type, two_passes, &two_passes);
    Tensor fused;
    ActivationForward(ActivationKind::kRelu, x, &fused, type);
    EXPECT_TRUE(BitEqual(two_passes, fused));
    Tensor in_place = x;
    ActivationForward(ActivationKind::kRelu, in_place, &in_place, type);
    EXPECT_TRUE(BitEqual(two_passes, in_place));
  }
}

TEST(OpsDeviceComparisonTest, AllCloseRejectsAPerturbedTensorAndNamesTheWorstElement) {
  Tensor cpu = Uniform({17, 33}, 1300, -3, 3);
  cpu[0] = 1000.0f;  // relative regime
  cpu[1] = 0.001f;   // absolute regime
  EXPECT_TRUE(AllClose(cpu, cpu));

  Tensor within = cpu;
  within[5] += static_cast<float>(0.5 * kTolerance * std::max(1.0f, std::abs(cpu[5])));
  within[0] += 0.05f;  // 5e-5 relative
  within[1] += 5e-5f;  // under the absolute floor of 1e-4
  EXPECT_TRUE(AllClose(cpu, within));

  Tensor beyond = cpu;
  beyond[200] += static_cast<float>(3 * kTolerance * std::max(1.0f, std::abs(cpu[200])));
  ::testing::AssertionResult one = AllClose(cpu, beyond);
  EXPECT_FALSE(one);
  EXPECT_THAT(one.message(), ::testing::HasSubstr("1 of 561 elements"));
  EXPECT_THAT(one.message(), ::testing::HasSubstr("index 200 [6, 2]"));

  beyond[0] += 0.2f;   // 2e-4 relative: a miss, but not the worst
  beyond[300] += 1.0f;  // the worst
  ::testing::AssertionResult three = AllClose(cpu, beyond);
  EXPECT_FALSE(three);
  EXPECT_THAT(three.message(), ::testing::HasSubstr("3 of 561 elements"));
  EXPECT_THAT(three.message(), ::testing::HasSubstr("index 300 [9, 3]"));

  Tensor nan = cpu;
  nan[42] = kNaN;
  EXPECT_THAT(AllClose(cpu, nan).message(), ::testing::HasSubstr("index 42"));
  EXPECT_FALSE(AllClose(nan, nan)) << "a NaN never matches, not even a NaN";
  EXPECT_FALSE(AllClose(cpu, Tensor({33, 17}, 0.0f))) << "shape";
}

TEST(OpsDeviceComparisonTest, BitEqualRejectsOneUlpAndTheOtherZero) {
  const Tensor cpu = RandomBits({1000}, 1400);
  EXPECT_TRUE(BitEqual(cpu, cpu)) << "NaNs equal their own bits";
  Tensor ulp({3}, std::vector<float>{1.0f, 2.0f, 3.0f});
  Tensor next = ulp;
  next[2] = std::nextafter(3.0f, 4.0f);
  ::testing::AssertionResult r = BitEqual(ulp, next);
  EXPECT_FALSE(r);
  EXPECT_THAT(r.message(), ::testing::HasSubstr("first at index 2"));
  EXPECT_FALSE(BitEqual(Tensor({1}, 0.0f), Tensor({1}, -0.0f)));
  EXPECT_FALSE(BitEqual(ulp, Tensor({1, 3}, std::vector<float>{1.0f, 2.0f, 3.0f}))) << "shape";
}

TEST(OpsDeviceComparisonTest, LossSumsCompareCorrectExactlyAndTheSumWithinTolerance) {
  EXPECT_TRUE(SumsClose({2500.0, 40}, {2500.2, 40}));   // 8e-5 relative
  EXPECT_FALSE(SumsClose({2500.0, 40}, {2500.3, 40}));  // 1.2e-4 relative
  EXPECT_TRUE(SumsClose({0.5, 1}, {0.50009, 1}));       // absolute floor
  EXPECT_FALSE(SumsClose({0.5, 1}, {0.5, 2}));
  EXPECT_FALSE(SumsClose({0.5, 1}, {std::numeric_limits<double>::quiet_NaN(), 1}));
}

}  // namespace
}  // namespace distrain::ops
