// Tests of ops.h's windowed ops (Conv2D, pooling), batch and layer
// normalisation and global average pooling on the CPU backend: every op against a naive
// reference written here (plain loops, double accumulation), every backward
// op against central finite differences of the double reference forward on
// a weighted-sum loss, and the padding semantics TensorFlow has.

#include <algorithm>
#include <utility>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <omp.h>

#include "gtest/gtest.h"
#include "worker/tensor/cpu/conv_kernels.h"
#include "worker/tensor/cpu/window_ops.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"

namespace distrain::ops {
namespace {

// Distinct-ish values in [-2, 2] on a grid fine enough that max-pool
// windows have no ties (ties would make the argmax, and FD, ambiguous).
Tensor Random(std::vector<int64_t> shape, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  Tensor t(std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.size(); ++i) t[i] = dist(gen);
  return t;
}

// Random values rounded to bfloat16: what a mixed_bfloat16 layer feeds a
// convolution.
Tensor RandomBfloat16(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t = Random(std::move(shape), seed);
  ops::RoundTo(ComputeType::kBfloat16, t, &t);
  return t;
}

std::vector<double> ToDouble(const Tensor& t) { return {t.data(), t.data() + t.size()}; }

// |got - want| <= tol * (1 + |want|) elementwise, reporting the first miss.
void ExpectNear(const Tensor& got, const std::vector<double>& want, double tol,
                const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<int64_t>(want.size())) << what;
  for (int64_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), tol * (1.0 + std::abs(want[i])))
        << what << " at " << i << ": got " << got[i] << " want " << want[i];
  }
}

// ---- Naive references --------------------------------------------------------

// Index of x[n, h, w, c] in an NHWC buffer.
int64_t Nhwc(int64_t n, int64_t h, int64_t w, int64_t c, int64_t H, int64_t W, int64_t C) {
  return ((n * H + h) * W + w) * C + c;
}

std::vector<double> RefConvForward(const Window2D& g, const std::vector<double>& x,
                                   const std::vector<double>& k, const std::vector<double>* b) {
  std::vector<double> y(g.batch * g.out_h * g.out_w * g.out_c);
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow)
        for (int64_t f = 0; f < g.out_c; ++f) {
          double acc = b != nullptr ? (*b)[f] : 0.0;
          for (int64_t kh = 0; kh < g.kernel_h; ++kh)
            for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const int64_t ih = oh * g.stride_h - g.pad_top + kh;
              const int64_t iw = ow * g.stride_w - g.pad_left + kw;
              if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
              for (int64_t c = 0; c < g.in_c; ++c)
                acc += x[Nhwc(n, ih, iw, c, g.in_h, g.in_w, g.in_c)] *
                       k[((kh * g.kernel_w + kw) * g.in_c + c) * g.out_c + f];
            }
          y[Nhwc(n, oh, ow, f, g.out_h, g.out_w, g.out_c)] = acc;
        }
  return y;
}

// Calls visit(input index or -1 for padding, output index) for every window
// element of every pooling output.
void ForEachPoolTap(const Window2D& g, const std::function<void(int64_t, int64_t)>& visit) {
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow)
        for (int64_t c = 0; c < g.in_c; ++c)
          for (int64_t kh = 0; kh < g.kernel_h; ++kh)
            for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const int64_t ih = oh * g.stride_h - g.pad_top + kh;
              const int64_t iw = ow * g.stride_w - g.pad_left + kw;
              const bool inside = ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
              visit(inside ? Nhwc(n, ih, iw, c, g.in_h, g.in_w, g.in_c) : -1,
                    Nhwc(n, oh, ow, c, g.out_h, g.out_w, g.in_c));
            }
}

std::vector<double> RefPoolForward(PoolKind kind, const Window2D& g,
                                   const std::vector<double>& x) {
  const int64_t out = g.batch * g.out_h * g.out_w * g.in_c;
  std::vector<double> acc(out, kind == PoolKind::kMax ? -std::numeric_limits<double>::infinity()
                                                      : 0.0);
  std::vector<int64_t> count(out, 0);
  ForEachPoolTap(g, [&](int64_t in, int64_t o) {
    if (in < 0) return;  // padding is never selected nor counted
    acc[o] = kind == PoolKind::kMax ? std::max(acc[o], x[in]) : acc[o] + x[in];
    ++count[o];
  });
  if (kind == PoolKind::kAverage) {
    for (int64_t o = 0; o < out; ++o) acc[o] /= static_cast<double>(count[o]);
  }
  return acc;
}

struct BnRef {
  std::vector<double> y, mean, var;
};
BnRef RefBnForward(int64_t m, int64_t c, const std::vector<double>& x,
                   const std::vector<double>& gamma, const std::vector<double>& beta,
                   double eps, const std::vector<double>* given_mean = nullptr,
                   const std::vector<double>* given_var = nullptr) {
  BnRef r{std::vector<double>(m * c), std::vector<double>(c, 0.0), std::vector<double>(c, 0.0)};
  if (given_mean != nullptr) {
    r.mean = *given_mean;
    r.var = *given_var;
  } else {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < c; ++j) r.mean[j] += x[i * c + j] / m;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const double d = x[i * c + j] - r.mean[j];
        r.var[j] += d * d / m;  // biased, as Keras while training
      }
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < c; ++j)
      r.y[i * c + j] =
          gamma[j] * (x[i * c + j] - r.mean[j]) / std::sqrt(r.var[j] + eps) + beta[j];
  return r;
}

// d/dv[i] of loss(v) by central differences, every element.
std::vector<double> FiniteDiff(std::vector<double> v,
                               const std::function<double(const std::vector<double>&)>& loss,
                               double h) {
  std::vector<double> grad(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double old = v[i];
    v[i] = old + h;
    const double plus = loss(v);
    v[i] = old - h;
    const double minus = loss(v);
    v[i] = old;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

// ---- KerasWindow2D -------------------------------------------------------------

TEST(KerasWindow2DTest, ValidAndSameArithmetic) {
  // The guide CNN's first conv: 28 -> 26, no padding.
  Window2D w = KerasWindow2D(64, 28, 28, 1, 32, {3, 3}, {1, 1}, PaddingKind::kValid);
  EXPECT_EQ(w.out_h, 26);
  EXPECT_EQ(w.out_w, 26);
  EXPECT_EQ(w.pad_top + w.pad_bottom + w.pad_left + w.pad_right, 0);
  EXPECT_EQ(w.out_c, 32);
  // valid, stride 2, odd remainder: floor((7 - 3) / 2) + 1 = 3; (8 - 3) / 2 + 1 = 3.
  w = KerasWindow2D(1, 7, 8, 3, 4, {3, 3}, {2, 2}, PaddingKind::kValid);
  EXPECT_EQ(w.out_h, 3);
  EXPECT_EQ(w.out_w, 3);
  // same, stride 1, kernel 3: out = in, one pixel each side.
  w = KerasWindow2D(1, 5, 6, 1, 1, {3, 3}, {1, 1}, PaddingKind::kSame);
  EXPECT_EQ(w.out_h, 5);
  EXPECT_EQ(w.out_w, 6);
  EXPECT_EQ(w.pad_top, 1);
  EXPECT_EQ(w.pad_bottom, 1);
  // same, stride 2, in 6, kernel 3: out 3, total padding 1, at the end (TF).
  w = KerasWindow2D(1, 6, 5, 1, 1, {3, 2}, {2, 2}, PaddingKind::kSame);
  EXPECT_EQ(w.out_h, 3);
  EXPECT_EQ(w.pad_top, 0);
  EXPECT_EQ(w.pad_bottom, 1);
  // in 5, kernel 2, stride 2: out 3, total max(4 + 2 - 5, 0) = 1 at the right.
  EXPECT_EQ(w.out_w, 3);
  EXPECT_EQ(w.pad_left, 0);
  EXPECT_EQ(w.pad_right, 1);
  // same, kernel 4, stride 1: total 3 -> 1 before, 2 after.
  w = KerasWindow2D(1, 5, 5, 1, 1, {4, 4}, {1, 1}, PaddingKind::kSame);
  EXPECT_EQ(w.pad_top, 1);
  EXPECT_EQ(w.pad_bottom, 2);
}

// ---- Parameterised geometry ----------------------------------------------------

// padding, stride, odd (7x7) or even (8x6) input, C_in, batch, kernel 3x3 or 2x3.
using Geometry = std::tuple<PaddingKind, int64_t, bool, int64_t, int64_t, bool>;

Window2D MakeWindow(const Geometry& p, int64_t out_c) {
  const auto [padding, stride, odd, in_c, batch, square] = p;
  const int64_t h = odd ? 7 : 8, w = odd ? 7 : 6;
  const std::array<int64_t, 2> kernel = square ? std::array<int64_t, 2>{3, 3}
                                               : std::array<int64_t, 2>{2, 3};
  return KerasWindow2D(batch, h, w, in_c, out_c == 0 ? in_c : out_c, kernel, {stride, stride},
                       padding);
}

std::string GeometryName(const ::testing::TestParamInfo<Geometry>& info) {
  const auto [padding, stride, odd, in_c, batch, square] = info.param;
  return std::string(padding == PaddingKind::kSame ? "same" : "valid") + "_s" +
         std::to_string(stride) + (odd ? "_7x7" : "_8x6") + "_c" + std::to_string(in_c) + "_n" +
         std::to_string(batch) + (square ? "_k3x3" : "_k2x3");
}

class ConvTest : public ::testing::TestWithParam<Geometry> {};

TEST_P(ConvTest, ForwardMatchesReference) {
  const Window2D g = MakeWindow(GetParam(), 5);
  const Tensor x = Random({g.batch, g.in_h, g.in_w, g.in_c}, 1);
  const Tensor k = Random({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 2);
  const Tensor b = Random({g.out_c}, 3);
  const std::vector<double> kd = ToDouble(k), bd = ToDouble(b);
  Tensor y;
  Conv2DForward(g, x, k, &b, &y);
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{g.batch, g.out_h, g.out_w, g.out_c}));
  ExpectNear(y, RefConvForward(g, ToDouble(x), kd, &bd), 1e-5, "with bias");
  Conv2DForward(g, x, k, nullptr, &y);
  ExpectNear(y, RefConvForward(g, ToDouble(x), kd, nullptr), 1e-5, "without bias");
  // A second call with new data (cached primitive) must read the new data.
  const Tensor x2 = Random({g.batch, g.in_h, g.in_w, g.in_c}, 4);
  Conv2DForward(g, x2, k, &b, &y);
  ExpectNear(y, RefConvForward(g, ToDouble(x2), kd, &bd), 1e-5, "second call");
}

TEST_P(ConvTest, BackwardMatchesFiniteDifferences) {
  const Window2D g = MakeWindow(GetParam(), 4);
  const Tensor x = Random({g.batch, g.in_h, g.in_w, g.in_c}, 5);
  const Tensor k = Random({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 6);
  const Tensor b = Random({g.out_c}, 7);
  const Tensor r = Random({g.batch, g.out_h, g.out_w, g.out_c}, 8);  // loss = sum(r * y)
  const std::vector<double> xd = ToDouble(x), kd = ToDouble(k), bd = ToDouble(b),
                            rd = ToDouble(r);

  Tensor dx;
  Conv2DBackwardData(g, r, k, &dx);
  ExpectNear(dx,
             FiniteDiff(
                 xd, [&](const std::vector<double>& v) { return Dot(rd, RefConvForward(g, v, kd, &bd)); },
                 1e-3),
             1e-4, "dx");

  Tensor dk, db;
  Conv2DBackwardWeights(g, x, r, &dk, &db);
  ExpectNear(dk,
             FiniteDiff(
                 kd, [&](const std::vector<double>& v) { return Dot(rd, RefConvForward(g, xd, v, &bd)); },
                 1e-3),
             1e-4, "dkernel");
  ExpectNear(db,
             FiniteDiff(
                 bd, [&](const std::vector<double>& v) { return Dot(rd, RefConvForward(g, xd, kd, &v)); },
                 1e-3),
             1e-4, "dbias");
  // Without a bias gradient the kernel gradient is the same.
  Tensor dk2;
  dk2.Resize(dk.shape());
  dk2.Fill(std::numeric_limits<float>::quiet_NaN());  // overwritten, not accumulated
  Conv2DBackwardWeights(g, x, r, &dk2, nullptr);
  ExpectNear(dk2, ToDouble(dk), 1e-5, "dkernel without dbias");
}

INSTANTIATE_TEST_SUITE_P(Geometries, ConvTest,
                         ::testing::Combine(::testing::Values(PaddingKind::kValid,
                                                              PaddingKind::kSame),
                                            ::testing::Values(1, 2), ::testing::Bool(),
                                            ::testing::Values(1, 3), ::testing::Values(1, 2),
                                            ::testing::Bool()),
                         GeometryName);

// Every Conv2D implementation the backend routes between (conv_kernels.h),
// not only today's routes, against the references.
TEST_P(ConvTest, EveryImplementationMatchesReference) {
  namespace in = cpu::internal;
  const Window2D g = MakeWindow(GetParam(), 6);
  const Tensor x = Random({g.batch, g.in_h, g.in_w, g.in_c}, 30);
  const Tensor k = Random({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 31);
  const Tensor b = Random({g.out_c}, 32);
  const Tensor r = Random({g.batch, g.out_h, g.out_w, g.out_c}, 33);
  const std::vector<double> xd = ToDouble(x), kd = ToDouble(k), bd = ToDouble(b),
                            rd = ToDouble(r);
  const std::vector<double> y_ref = RefConvForward(g, xd, kd, &bd);
  const std::vector<double> dx_ref = FiniteDiff(
      xd, [&](const std::vector<double>& v) { return Dot(rd, RefConvForward(g, v, kd, &bd)); },
      1e-3);
  const std::vector<double> dk_ref = FiniteDiff(
      kd, [&](const std::vector<double>& v) { return Dot(rd, RefConvForward(g, xd, v, &bd)); },
      1e-3);
  std::vector<double> db_ref(g.out_c, 0.0);
  for (int64_t i = 0; i < r.size(); ++i) db_ref[i % g.out_c] += r[i];

  Tensor y(r.shape()), dx(x.shape()), dk(k.shape()), db(b.shape());
  for (const in::ConvLayout layout :
       {in::ConvLayout::kPlain, in::ConvLayout::kChosen, in::ConvLayout::kChosenWeights}) {
    const std::string name = "onednn layout " + std::to_string(static_cast<int>(layout));
    in::ConvForwardOnednn(g, x.data(), k.data(), b.data(), y.data(), layout);
    ExpectNear(y, y_ref, 1e-5, name + " forward");
    in::ConvBackwardDataOnednn(g, r.data(), k.data(), dx.data(), layout);
    ExpectNear(dx, dx_ref, 1e-4, name + " dx");
    in::ConvBackwardWeightsOnednn(g, x.data(), r.data(), dk.data(), db.data(), layout);
    ExpectNear(dk, dk_ref, 1e-4, name + " dkernel");
    ExpectNear(db, db_ref, 1e-5, name + " dbias");
  }
  in::ConvForwardGemm(g, x.data(), k.data(), b.data(), y.data());
  ExpectNear(y, y_ref, 1e-5, "gemm forward");
  dx.Fill(std::numeric_limits<float>::quiet_NaN());  // overwritten, not accumulated
  in::ConvBackwardDataGemm(g, r.data(), k.data(), dx.data());
  ExpectNear(dx, dx_ref, 1e-4, "gemm dx");
  dk.Fill(std::numeric_limits<float>::quiet_NaN());
  in::ConvBackwardWeightsGemm(g, x.data(), r.data(), dk.data(), db.data());
  ExpectNear(dk, dk_ref, 1e-4, "gemm dkernel");
  ExpectNear(db, db_ref, 1e-5, "gemm dbias");
}

// mixed_bfloat16 on a CPU with bfloat16 dot products: convolutions of
// inputs that hold bfloat16 values run on oneDNN's bfloat16 kernels and give
// the float32 kernels' results (the products are exact either way; only the
// order of the float32 sums differs), in every pass, with and without bias,
// down to three input channels (an RGB image).
TEST(ConvBf16Test, Bfloat16KernelsMatchFloat32OnBfloat16Inputs) {
  namespace in = cpu::internal;
  if (!in::NativeBf16Convolutions()) {
    GTEST_SKIP() << "this CPU has no AVX512-BF16 or AMX; mixed_bfloat16 stays on float32 kernels";
  }
  for (const Window2D& g : {KerasWindow2D(8, 28, 28, 3, 32, {3, 3}, {1, 1}, PaddingKind::kValid),
                            KerasWindow2D(8, 13, 13, 32, 64, {3, 3}, {1, 1}, PaddingKind::kValid),
                            KerasWindow2D(3, 9, 7, 5, 6, {3, 2}, {2, 1}, PaddingKind::kSame)}) {
    SCOPED_TRACE(::testing::Message() << "in_c " << g.in_c << " out_c " << g.out_c);
    ASSERT_TRUE(cpu::Bfloat16ConvolutionKernels(g, ComputeType::kBfloat16));
    const Tensor x = RandomBfloat16({g.batch, g.in_h, g.in_w, g.in_c}, 50);
    const Tensor k = RandomBfloat16({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 51);
    const Tensor b = Random({g.out_c}, 52);
    const Tensor r = RandomBfloat16({g.batch, g.out_h, g.out_w, g.out_c}, 53);
    Tensor want(r.shape()), got(r.shape());
    cpu::Conv2DForward(g, x.data(), k.data(), b.data(), want.data());
    cpu::Conv2DForward(g, x.data(), k.data(), b.data(), got.data(), ComputeType::kBfloat16);
    ExpectNear(got, ToDouble(want), 1e-5, "forward");
    want.Resize(x.shape());
    got.Resize(x.shape());
    cpu::Conv2DBackwardData(g, r.data(), k.data(), want.data());
    cpu::Conv2DBackwardData(g, r.data(), k.data(), got.data(), ComputeType::kBfloat16);
    ExpectNear(got, ToDouble(want), 1e-5, "dx");
    want.Resize(k.shape());
    got.Resize(k.shape());
    Tensor db_want(b.shape()), db_got(b.shape());
    cpu::Conv2DBackwardWeights(g, x.data(), r.data(), want.data(), db_want.data());
    cpu::Conv2DBackwardWeights(g, x.data(), r.data(), got.data(), db_got.data(),
                               ComputeType::kBfloat16);
    // Sums over every image and position (5,408 terms for the first
    // geometry), so the two summation orders drift further apart.
    ExpectNear(got, ToDouble(want), 2e-4, "dkernel");
    ExpectNear(db_got, ToDouble(db_want), 2e-4, "dbias");
  }
}

// One input channel (a grayscale image: the guide CNN's first layer) stays
// on the float32 kernels under mixed_bfloat16 (window_ops.cc's routing
// comment): every pass gives exactly what the float32 pass gives on the same
// bfloat16 values, on every CPU.
TEST(ConvBf16Test, OneInputChannelRunsTheFloat32PassesBitForBit) {
  ops::SetCpuThreadsForThisThread(cpu::BlasThreads());  // both sides on one team
  const Window2D g = KerasWindow2D(8, 28, 28, 1, 32, {3, 3}, {1, 1}, PaddingKind::kValid);
  EXPECT_FALSE(cpu::Bfloat16ConvolutionKernels(g, ComputeType::kBfloat16));
  const Tensor x = RandomBfloat16({g.batch, g.in_h, g.in_w, g.in_c}, 70);
  const Tensor k = RandomBfloat16({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 71);
  const Tensor b = RandomBfloat16({g.out_c}, 72);
  const Tensor dy = RandomBfloat16({g.batch, g.out_h, g.out_w, g.out_c}, 73);
  Tensor y32({g.batch, g.out_h, g.out_w, g.out_c}), y16(y32.shape());
  cpu::Conv2DForward(g, x.data(), k.data(), b.data(), y32.data(), ComputeType::kFloat32);
  cpu::Conv2DForward(g, x.data(), k.data(), b.data(), y16.data(), ComputeType::kBfloat16);
  EXPECT_EQ(0, std::memcmp(y16.data(), y32.data(), y32.bytes())) << "forward";
  Tensor dk32(k.shape()), dk16(k.shape()), db32({g.out_c}), db16({g.out_c});
  Tensor dx32(x.shape()), dx16(x.shape()), scratch;
  ops::Conv2DBackward(g, x, dy, k, &dk32, &db32, &dx32, ComputeType::kFloat32, nullptr, &scratch);
  ops::Conv2DBackward(g, x, dy, k, &dk16, &db16, &dx16, ComputeType::kBfloat16, nullptr, &scratch);
  EXPECT_EQ(0, std::memcmp(dk16.data(), dk32.data(), dk32.bytes())) << "dkernel";
  EXPECT_EQ(0, std::memcmp(db16.data(), db32.data(), db32.bytes())) << "dbias";
  EXPECT_EQ(0, std::memcmp(dx16.data(), dx32.data(), dx32.bytes())) << "dx";
  // Several channels do take the bfloat16 kernels where the CPU has them.
  const Window2D two = KerasWindow2D(8, 28, 28, 2, 32, {3, 3}, {1, 1}, PaddingKind::kValid);
  EXPECT_EQ(cpu::Bfloat16ConvolutionKernels(two, ComputeType::kBfloat16),
            cpu::internal::NativeBf16Convolutions());
  EXPECT_FALSE(cpu::Bfloat16ConvolutionKernels(two, ComputeType::kFloat32));
}

// Both backward passes in one call (Conv2D's backward under any precision)
// give the separate passes' results bit for bit, also behind a ReLU whose
// gradient the call applies: under bfloat16 it converts dy once, masking it
// and summing the bias in that pass, where each pass staged its own.
// Batch 40 x 11 x 11 makes 4,840 rows: more than one bias-sum chunk.
TEST(ConvBackwardTest, BothPassesInOneCallAreTheSeparatePassesBitForBit) {
  // Every pass on the team a replica thread has: BLAS's budget. The im2col
  // backward-data route resizes the calling thread's team to it (cpu::Gemm),
  // and oneDNN bakes a team's size into its primitives' reductions, so a
  // team left at another size by an earlier test would make the first
  // separate pass run on a different team than the rest.
  ops::SetCpuThreadsForThisThread(cpu::BlasThreads());
  for (const ComputeType compute : {ComputeType::kFloat32, ComputeType::kBfloat16}) {
    for (const Window2D& g : {KerasWindow2D(40, 13, 13, 32, 64, {3, 3}, {1, 1}, PaddingKind::kValid),
                              KerasWindow2D(3, 9, 7, 1, 6, {3, 2}, {2, 1}, PaddingKind::kSame)}) {
      for (const bool with_bias : {false, true}) {
        for (const bool with_dx : {false, true}) {
          for (const bool with_relu : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << ComputeTypeName(compute) << " in_c " << g.in_c << " bias " << with_bias
                         << " dx " << with_dx << " relu " << with_relu);
            const Tensor x = RandomBfloat16({g.batch, g.in_h, g.in_w, g.in_c}, 60);
            const Tensor k = RandomBfloat16({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 61);
            const Tensor dy = RandomBfloat16({g.batch, g.out_h, g.out_w, g.out_c}, 62);
            // A ReLU's output: about half zeros.
            Tensor relu_out = RandomBfloat16(dy.shape(), 63);
            ops::ActivationForward(ActivationKind::kRelu, relu_out, &relu_out);
            Tensor dz = dy;  // what the passes read: dy behind the ReLU
            if (with_relu) {
              ops::ActivationBackward(ActivationKind::kRelu, relu_out, relu_out, dy, &dz);
            }
            Tensor dk_want(k.shape()), db_want({g.out_c}), dx_want(x.shape());
            cpu::Conv2DBackwardWeights(g, x.data(), dz.data(), dk_want.data(),
                                       with_bias ? db_want.data() : nullptr, compute);
            cpu::Conv2DBackwardData(g, dz.data(), k.data(), dx_want.data(), compute);
            Tensor dk(k.shape(), 7.0f), db({g.out_c}, 7.0f), dx(x.shape(), 7.0f);
            Tensor scratch;
            ops::Conv2DBackward(g, x, dy, k, &dk, with_bias ? &db : nullptr,
                                with_dx ? &dx : nullptr, compute,
                                with_relu ? &relu_out : nullptr, &scratch);
            EXPECT_EQ(0, std::memcmp(dk.data(), dk_want.data(), dk.bytes())) << "dkernel";
            if (with_bias) {
              EXPECT_EQ(0, std::memcmp(db.data(), db_want.data(), db.bytes())) << "dbias";
            } else {
              EXPECT_EQ(db[0], 7.0f) << "dbias written without a bias";
            }
            if (with_dx) {
              EXPECT_EQ(0, std::memcmp(dx.data(), dx_want.data(), dx.bytes())) << "dx";
            } else {
              EXPECT_EQ(dx[0], 7.0f) << "dx written without being asked";
            }
          }
        }
      }
    }
  }
}

// The bfloat16 matrix product (Dense layers under mixed_bfloat16) equals
// SGEMM on bfloat16 inputs, for every transpose, alpha and beta.
TEST(ConvBf16Test, Bfloat16GemmMatchesSgemmOnBfloat16Inputs) {
  if (!cpu::internal::NativeBf16Convolutions()) {
    GTEST_SKIP() << "this CPU has no AVX512-BF16 or AMX; mixed_bfloat16 stays on SGEMM";
  }
  uint32_t seed = 70;
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{128, 64, 7744},
                                std::array<int64_t, 3>{7744, 64, 128},
                                std::array<int64_t, 3>{33, 17, 65}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (const auto& [alpha, beta] :
             {std::pair{1.0f, 0.0f}, std::pair{1.0f, 1.0f}, std::pair{0.5f, -2.0f}}) {
          SCOPED_TRACE(::testing::Message() << m << "x" << n << "x" << k << " ta " << ta << " tb "
                                            << tb << " alpha " << alpha << " beta " << beta);
          const Tensor a =
              RandomBfloat16(ta ? std::vector<int64_t>{k, m} : std::vector{m, k}, ++seed);
          const Tensor b =
              RandomBfloat16(tb ? std::vector<int64_t>{n, k} : std::vector{k, n}, ++seed);
          const Tensor c0 = Random({m, n}, ++seed);
          Tensor want = c0, got = c0;
          cpu::Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, want.data());
          cpu::GemmBf16(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, got.data());
          // Sums of up to 7,744 products of magnitude up to 4.
          ExpectNear(got, ToDouble(want), 2e-4, "gemm");
        }
      }
    }
  }
}

TEST(ConvGemmTest, SeveralIm2colBlocksMatchOnednn) {
  // 18 x 18 x 288 patches per image: about 93 K floats, so the 256 K-float
  // im2col blocks hold two images and batch 5 takes three blocks, the last
  // one short. oneDNN (checked against the references above) is the oracle.
  namespace in = cpu::internal;
  const Window2D g = KerasWindow2D(5, 20, 20, 32, 8, {3, 3}, {1, 1}, PaddingKind::kValid);
  const Tensor x = Random({g.batch, g.in_h, g.in_w, g.in_c}, 40);
  const Tensor k = Random({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 41);
  const Tensor b = Random({g.out_c}, 42);
  const Tensor r = Random({g.batch, g.out_h, g.out_w, g.out_c}, 43);
  Tensor want(r.shape()), got(r.shape());
  in::ConvForwardOnednn(g, x.data(), k.data(), b.data(), want.data(), in::ConvLayout::kPlain);
  in::ConvForwardGemm(g, x.data(), k.data(), b.data(), got.data());
  ExpectNear(got, ToDouble(want), 1e-4, "forward");
  want.Resize(x.shape());
  got.Resize(x.shape());
  in::ConvBackwardDataOnednn(g, r.data(), k.data(), want.data(), in::ConvLayout::kPlain);
  in::ConvBackwardDataGemm(g, r.data(), k.data(), got.data());
  ExpectNear(got, ToDouble(want), 1e-4, "dx");
  want.Resize(k.shape());
  got.Resize(k.shape());
  Tensor db(b.shape());
  in::ConvBackwardWeightsOnednn(g, x.data(), r.data(), want.data(), db.data(),
                                in::ConvLayout::kPlain);
  in::ConvBackwardWeightsGemm(g, x.data(), r.data(), got.data(), db.data());
  ExpectNear(got, ToDouble(want), 1e-4, "dkernel");
}

class PoolTest : public ::testing::TestWithParam<std::tuple<Geometry, PoolKind>> {};

TEST_P(PoolTest, ForwardMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  const auto& [geometry, kind] = GetParam();
  const Window2D g = MakeWindow(geometry, 0);
  const Tensor x = Random({g.batch, g.in_h, g.in_w, g.in_c}, 9);
  const std::vector<double> xd = ToDouble(x);
  Tensor y, ws;
  Pool2DForward(kind, g, x, &y, &ws);
  ExpectNear(y, RefPoolForward(kind, g, xd), 1e-6, "forward");

  const Tensor r = Random({g.batch, g.out_h, g.out_w, g.in_c}, 10);
  const std::vector<double> rd = ToDouble(r);
  Tensor dx;
  dx.Resize(x.shape());
  dx.Fill(std::numeric_limits<float>::quiet_NaN());  // overwritten, not accumulated
  Pool2DBackward(kind, g, x, y, r, ws, &dx);
  // h far below the gap between distinct inputs, so no argmax changes.
  ExpectNear(dx,
             FiniteDiff(
                 xd, [&](const std::vector<double>& v) { return Dot(rd, RefPoolForward(kind, g, v)); },
                 1e-6),
             1e-4, "dx");
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, PoolTest,
    ::testing::Combine(::testing::Combine(::testing::Values(PaddingKind::kValid,
                                                            PaddingKind::kSame),
                                          ::testing::Values(1, 2), ::testing::Bool(),
                                          ::testing::Values(1, 3), ::testing::Values(1, 2),
                                          ::testing::Bool()),
                       ::testing::Values(PoolKind::kMax, PoolKind::kAverage)),
    [](const ::testing::TestParamInfo<std::tuple<Geometry, PoolKind>>& info) {
      return std::string(std::get<1>(info.param) == PoolKind::kMax ? "max_" : "avg_") +
             GeometryName({std::get<0>(info.param), info.index});
    });

TEST(PoolTest, GuideCnnMaxPool2x2) {
  const Window2D g = KerasWindow2D(3, 26, 26, 32, 32, {2, 2}, {2, 2}, PaddingKind::kValid);
  EXPECT_EQ(g.out_h, 13);
  const Tensor x = Random({3, 26, 26, 32}, 11);
  Tensor y, ws;
  Pool2DForward(PoolKind::kMax, g, x, &y, &ws);
  ExpectNear(y, RefPoolForward(PoolKind::kMax, g, ToDouble(x)), 0, "forward");
}

TEST(PoolTest, AverageSameExcludesPadding) {
  // 3x3 ones, 2x2 windows, stride 2, same: out 2x2; the last row and column
  // of windows hang over one padded row/column. Counting padding would give
  // 0.5 and 0.25 there; TensorFlow gives 1 everywhere.
  const Window2D g = KerasWindow2D(1, 3, 3, 2, 2, {2, 2}, {2, 2}, PaddingKind::kSame);
  ASSERT_EQ(g.out_h, 2);
  ASSERT_EQ(g.pad_bottom, 1);
  Tensor x({1, 3, 3, 2}, 1.0f);
  Tensor y, ws;
  Pool2DForward(PoolKind::kAverage, g, x, &y, &ws);
  for (int64_t i = 0; i < y.size(); ++i) EXPECT_FLOAT_EQ(y[i], 1.0f) << i;
  // Backward: each real input gets dy / (real inputs in its window).
  Tensor dy({1, 2, 2, 2}, 1.0f), dx;
  Pool2DBackward(PoolKind::kAverage, g, x, y, dy, ws, &dx);
  EXPECT_FLOAT_EQ(dx[0], 0.25f);                // corner of a full window
  EXPECT_FLOAT_EQ(dx[(2 * 3 + 2) * 2], 1.0f);   // alone in its window
  EXPECT_FLOAT_EQ(dx[(0 * 3 + 2) * 2], 0.5f);   // half window
}

TEST(PoolTest, MaxNeverSelectsPadding) {
  // All inputs negative: a padded zero would win every border window.
  const Window2D g = KerasWindow2D(2, 5, 5, 3, 3, {3, 3}, {2, 2}, PaddingKind::kSame);
  ASSERT_GT(g.pad_top + g.pad_bottom, 0);
  const Tensor x = Random({2, 5, 5, 3}, 12, -3.0f, -1.0f);
  Tensor y, ws;
  Pool2DForward(PoolKind::kMax, g, x, &y, &ws);
  for (int64_t i = 0; i < y.size(); ++i) EXPECT_LT(y[i], -0.5f) << i;
  ExpectNear(y, RefPoolForward(PoolKind::kMax, g, ToDouble(x)), 0, "forward");
  // The gradient lands on real inputs only: it sums to the sum of dy.
  Tensor dy({2, g.out_h, g.out_w, 3}, 1.0f), dx;
  Pool2DBackward(PoolKind::kMax, g, x, y, dy, ws, &dx);
  EXPECT_DOUBLE_EQ(std::accumulate(dx.data(), dx.data() + dx.size(), 0.0),
                   static_cast<double>(dy.size()));
}

// ---- Batch normalisation -------------------------------------------------------

class BatchNormTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(BatchNormTest, TrainingForwardMatchesReference) {
  const std::vector<int64_t> shape = GetParam();
  const int64_t c = shape.back();
  const Tensor x = Random(shape, 13, -1.0f, 3.0f);
  const int64_t m = x.size() / c;
  const Tensor gamma = Random({c}, 14, 0.5f, 2.0f), beta = Random({c}, 15);
  const float eps = 1e-3f;
  Tensor y, mean, var;
  BatchNormForwardTraining(x, gamma, beta, eps, &y, &mean, &var);
  const BnRef ref = RefBnForward(m, c, ToDouble(x), ToDouble(gamma), ToDouble(beta), eps);
  EXPECT_EQ(y.shape(), shape);
  ExpectNear(mean, ref.mean, 1e-5, "mean");
  ExpectNear(var, ref.var, 1e-5, "variance");
  ExpectNear(y, ref.y, 1e-4, "y");
}

TEST_P(BatchNormTest, BackwardMatchesFiniteDifferences) {
  const std::vector<int64_t> shape = GetParam();
  const int64_t c = shape.back();
  const Tensor x = Random(shape, 16, -1.0f, 3.0f);
  const int64_t m = x.size() / c;
  const Tensor gamma = Random({c}, 17, 0.5f, 2.0f), beta = Random({c}, 18);
  const Tensor r = Random(shape, 19);
  const float eps = 1e-3f;
  Tensor y, mean, var;
  BatchNormForwardTraining(x, gamma, beta, eps, &y, &mean, &var);
  Tensor dx, dgamma, dbeta;
  BatchNormBackward(x, r, gamma, mean, var, eps, &dx, &dgamma, &dbeta);

  const std::vector<double> xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta),
                            rd = ToDouble(r);
  // The loss goes through the batch statistics, which depend on x.
  ExpectNear(dx,
             FiniteDiff(
                 xd,
                 [&](const std::vector<double>& v) {
                   return Dot(rd, RefBnForward(m, c, v, gd, bd, eps).y);
                 },
                 1e-5),
             1e-3, "dx");
  ExpectNear(dgamma,
             FiniteDiff(
                 gd,
                 [&](const std::vector<double>& v) {
                   return Dot(rd, RefBnForward(m, c, xd, v, bd, eps).y);
                 },
                 1e-5),
             1e-4, "dgamma");
  ExpectNear(dbeta,
             FiniteDiff(
                 bd,
                 [&](const std::vector<double>& v) {
                   return Dot(rd, RefBnForward(m, c, xd, gd, v, eps).y);
                 },
                 1e-5),
             1e-4, "dbeta");
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchNormTest,
                         ::testing::Values(std::vector<int64_t>{2, 3},
                                           std::vector<int64_t>{16, 5},
                                           std::vector<int64_t>{2, 3, 5, 4},
                                           std::vector<int64_t>{1, 4, 4, 17}));

TEST(BatchNormTest, InferenceUsesGivenStatistics) {
  const Tensor x = Random({3, 4, 4, 6}, 20);
  const Tensor gamma = Random({6}, 21, 0.5f, 2.0f), beta = Random({6}, 22);
  const Tensor mean = Random({6}, 23), var = Random({6}, 24, 0.1f, 4.0f);
  Tensor y;
  BatchNormForwardInference(x, gamma, beta, mean, var, 1e-3f, &y);
  const std::vector<double> md = ToDouble(mean), vd = ToDouble(var);
  ExpectNear(y,
             RefBnForward(x.size() / 6, 6, ToDouble(x), ToDouble(gamma), ToDouble(beta), 1e-3,
                          &md, &vd)
                 .y,
             1e-5, "y");
}

// ---- Global average pooling ------------------------------------------------------

TEST(GlobalAveragePoolTest, ForwardAndBackward) {
  const Tensor x = Random({3, 5, 4, 7}, 25);
  Tensor y;
  GlobalAveragePool2DForward(x, &y);
  ASSERT_EQ(y.shape(), (std::vector<int64_t>{3, 7}));
  std::vector<double> want(3 * 7, 0.0);
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t p = 0; p < 20; ++p)
      for (int64_t c = 0; c < 7; ++c) want[n * 7 + c] += x[(n * 20 + p) * 7 + c] / 20.0;
  ExpectNear(y, want, 1e-6, "forward");

  const Tensor r = Random({3, 7}, 26);
  Tensor dx;
  GlobalAveragePool2DBackward(r, 5, 4, &dx);
  ASSERT_EQ(dx.shape(), x.shape());
  const std::vector<double> rd = ToDouble(r);
  ExpectNear(dx,
             FiniteDiff(
                 ToDouble(x),
                 [&](const std::vector<double>& v) {
                   double loss = 0;
                   for (int64_t n = 0; n < 3; ++n)
                     for (int64_t p = 0; p < 20; ++p)
                       for (int64_t c = 0; c < 7; ++c)
                         loss += rd[n * 7 + c] * v[(n * 20 + p) * 7 + c] / 20.0;
                   return loss;
                 },
                 1e-3),
             1e-6, "dx");
}

// ---- Threads -----------------------------------------------------------------------

// Layer norm splits rows (forward, dx) and columns (dgamma, dbeta) across
// the thread's team: any team size gives the same bits, and the values are
// the formula's, computed here in double.
TEST(LayerNormOpTest, EveryTeamSizeGivesTheSameBitsAndTheFormulasValues) {
  const int64_t rows = 3000, cols = 48;  // past the split threshold (2^16 elements)
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.0f, 3.0f);
  Tensor x({rows, cols}), dy({rows, cols}), gamma({cols}), beta({cols});
  for (Tensor* t : {&x, &dy, &gamma, &beta}) {
    for (float& v : t->span()) v = u(gen);
  }
  for (const bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rms" : "layer");
    std::vector<std::vector<float>> results;
    const int before = omp_get_max_threads();
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      Tensor y, mean, rstd, dx, dgamma, dbeta;
      ops::LayerNormForward(x, &gamma, rms ? nullptr : &beta, 1e-3f, rms, &y, &mean, &rstd);
      ops::LayerNormBackward(x, dy, &gamma, mean, rstd, rms, &dx, &dgamma,
                             rms ? nullptr : &dbeta);
      std::vector<float>& flat = results.emplace_back();
      for (const Tensor* t : {&y, &dx, &dgamma}) {
        flat.insert(flat.end(), t->span().begin(), t->span().end());
      }
      if (!rms) flat.insert(flat.end(), dbeta.span().begin(), dbeta.span().end());
      if (threads > 1) continue;
      // The formula in double, for a few rows and columns.
      for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
        double mu = 0, var = 0;
        for (int64_t c = 0; c < cols; ++c) mu += x[r * cols + c];
        mu = rms ? 0.0 : mu / cols;
        for (int64_t c = 0; c < cols; ++c) var += std::pow(x[r * cols + c] - mu, 2);
        const double inv = 1 / std::sqrt(var / cols + 1e-3);
        for (int64_t c = 0; c < cols; ++c) {
          const double want = gamma[c] * (x[r * cols + c] - mu) * inv + (rms ? 0.0 : beta[c]);
          ASSERT_NEAR(y[r * cols + c], want, 1e-5 * (1 + std::abs(want))) << r << "," << c;
        }
      }
      for (int64_t c : {int64_t{0}, cols - 1}) {
        double sum_dy = 0, sum_dy_xhat = 0;
        for (int64_t r = 0; r < rows; ++r) {
          sum_dy += dy[r * cols + c];
          sum_dy_xhat += double{dy[r * cols + c]} * (x[r * cols + c] - mean[r]) * rstd[r];
        }
        EXPECT_NEAR(dgamma[c], sum_dy_xhat, 1e-5 * (1 + std::abs(sum_dy_xhat)));
        if (!rms) {
          EXPECT_NEAR(dbeta[c], sum_dy, 1e-5 * (1 + std::abs(sum_dy)));
        }
      }
    }
    omp_set_num_threads(before);
    EXPECT_EQ(results[0], results[1]);
    EXPECT_EQ(results[0], results[2]);
  }
}

TEST(WindowOpsThreadsTest, ConcurrentReplicaThreadsGetCorrectResults) {
  // Replica threads, each with its own primitive cache and one OpenMP thread,
  // running the same and different shapes at once.
  const Window2D g1 = KerasWindow2D(4, 12, 12, 3, 8, {3, 3}, {1, 1}, PaddingKind::kSame);
  const Window2D g2 = KerasWindow2D(2, 9, 9, 8, 6, {3, 3}, {2, 2}, PaddingKind::kValid);
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      SetCpuThreadsForThisThread(1);
      const Window2D& g = t % 2 == 0 ? g1 : g2;
      for (int iter = 0; iter < 5; ++iter) {
        const Tensor x = Random({g.batch, g.in_h, g.in_w, g.in_c}, 100 + t * 10 + iter);
        const Tensor k = Random({g.kernel_h, g.kernel_w, g.in_c, g.out_c}, 200 + t);
        Tensor y;
        Conv2DForward(g, x, k, nullptr, &y);
        const std::vector<double> want = RefConvForward(g, ToDouble(x), ToDouble(k), nullptr);
        for (int64_t i = 0; i < y.size(); ++i) {
          if (std::abs(y[i] - want[i]) > 1e-5 * (1 + std::abs(want[i]))) {
            failures[t] = "thread " + std::to_string(t) + " iteration " + std::to_string(iter);
            return;
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
}

}  // namespace
}  // namespace distrain::ops
