#include "worker/tensor/cpu_math.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/tensor/elementwise.h"

namespace distrain::cpu {
namespace {

std::vector<float> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(static_cast<int>(gen() % 2001) - 1000) / 500.0f;
  return v;
}

struct GemmCase {
  bool trans_a;
  bool trans_b;
  int64_t m, n, k;
  float alpha, beta;
};

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesNaiveTripleLoop) {
  const GemmCase& p = GetParam();
  const std::vector<float> a = RandomVector(p.m * p.k, 1);
  const std::vector<float> b = RandomVector(p.k * p.n, 2);
  std::vector<float> c = RandomVector(p.m * p.n, 3);
  if (p.beta == 0.0f) {
    // beta == 0 must ignore C's old contents entirely, NaN included.
    std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<double> want(p.m * p.n);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0;
      for (int64_t l = 0; l < p.k; ++l) {
        const double av = p.trans_a ? a[l * p.m + i] : a[i * p.k + l];
        const double bv = p.trans_b ? b[j * p.k + l] : b[l * p.n + j];
        acc += av * bv;
      }
      want[i * p.n + j] = p.alpha * acc + (p.beta == 0.0f ? 0.0 : p.beta * c[i * p.n + j]);
    }
  }
  Gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), b.data(), p.beta, c.data());
  for (int64_t i = 0; i < p.m * p.n; ++i) {
    EXPECT_NEAR(c[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, GemmTest,
    ::testing::Values(GemmCase{false, false, 7, 5, 3, 1.0f, 0.0f},
                      GemmCase{true, false, 7, 5, 3, 1.0f, 0.0f},
                      GemmCase{false, true, 7, 5, 3, 1.0f, 0.0f},
                      GemmCase{true, true, 7, 5, 3, 1.0f, 0.0f},
                      GemmCase{false, false, 7, 5, 3, 0.5f, 2.0f},
                      GemmCase{true, false, 3, 7, 5, -1.5f, 1.0f},
                      GemmCase{false, true, 5, 3, 7, 2.0f, -0.5f},
                      GemmCase{true, true, 1, 9, 4, 0.25f, 1.0f},
                      GemmCase{false, false, 33, 65, 17, 1.0f, 1.0f},
                      // Large enough for the library to block and split
                      // them: the MLP's forward, input-gradient and
                      // weight-gradient layouts.
                      GemmCase{false, false, 200, 300, 257, 1.0f, 0.0f},
                      GemmCase{false, true, 160, 300, 301, 1.0f, 0.0f},
                      GemmCase{true, false, 301, 130, 160, 1.0f, 1.0f}));

// Replicas that compare checksums, and a job that must repeat itself, rely on
// a product depending only on its inputs and the thread budget.
TEST(GemmDeterminismTest, EqualInputsGiveBitIdenticalProductsUnderTheSameBudget) {
  const int previous = BlasThreads();
  const std::vector<float> a = RandomVector(192 * 384, 4);
  const std::vector<float> b = RandomVector(384 * 320, 5);
  for (int threads : {1, 2}) {
    SetBlasThreads(threads);
    for (bool trans_a : {false, true}) {
      std::vector<float> first(192 * 320), again(192 * 320);
      Gemm(trans_a, false, 192, 320, 384, 1.0f, a.data(), b.data(), 0.0f, first.data());
      Gemm(trans_a, false, 192, 320, 384, 1.0f, a.data(), b.data(), 0.0f, again.data());
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0)
          << threads << " thread(s), trans_a " << trans_a;
    }
  }
  SetBlasThreads(previous);
}

TEST(GemmEdgeTest, ZeroInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  Gemm(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 3.0f, c.data());
  EXPECT_EQ(c, (std::vector<float>{3, 6, 9, 12}));
  std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  Gemm(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 0.0f, c.data());
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
}

TEST(TransposeTest, MovesEveryElementForTileMultiplesAndRemainders) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {1, 70}, {70, 1}, {32, 64},
                            {33, 65}, {256, 784}, {31, 257}}) {
    const std::vector<float> src = RandomVector(rows * cols, 6);
    std::vector<float> dst(rows * cols, -1.0f);
    Transpose(rows, cols, src.data(), dst.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(dst[c * rows + r], src[r * cols + c])
            << rows << "x" << cols << " at " << r << "," << c;
      }
    }
  }
}

TEST(RowOpsTest, BroadcastAddAndColumnSums) {
  const std::vector<float> v = {1, -2, 3};
  std::vector<float> x(2 * 3, 7.0f);
  BroadcastRow(2, 3, v.data(), x.data());
  EXPECT_EQ(x, (std::vector<float>{1, -2, 3, 1, -2, 3}));
  AddRowVector(2, 3, v.data(), x.data());
  EXPECT_EQ(x, (std::vector<float>{2, -4, 6, 2, -4, 6}));
  const std::vector<float> m = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [4, 3]
  std::vector<float> sums(3, 99.0f);
  ColumnSums(4, 3, m.data(), sums.data());
  EXPECT_EQ(sums, (std::vector<float>{22, 26, 30}));
}

// A bias gradient is the same bits however many threads sum it: rows in
// fixed chunks, each chunk in row order, the chunks in order (here against
// that order written out), for widths of any size and a last chunk short.
TEST(RowOpsTest, ColumnSumsAreTheSameBitsOnAnyThreadCount) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const int64_t cols : {1, 16, 32, 40, 64, 100}) {
    const int64_t rows = 3 * kColumnSumChunkRows + 17;
    std::vector<float> x(rows * cols);
    for (float& v : x) v = u(gen);
    std::vector<float> want(cols, 0.0f);
    for (int64_t r0 = 0; r0 < rows; r0 += kColumnSumChunkRows) {
      std::vector<float> chunk(cols, 0.0f);
      for (int64_t r = r0; r < std::min(rows, r0 + kColumnSumChunkRows); ++r) {
        for (int64_t c = 0; c < cols; ++c) chunk[c] += x[r * cols + c];
      }
      for (int64_t c = 0; c < cols; ++c) want[c] = r0 == 0 ? chunk[c] : want[c] + chunk[c];
    }
    const int before = omp_get_max_threads();
    for (const int threads : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << cols << " columns, " << threads << " threads");
      omp_set_num_threads(threads);
      std::vector<float> got(cols, 99.0f);
      ColumnSums(rows, cols, x.data(), got.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), cols * sizeof(float)));
    }
    omp_set_num_threads(before);
  }
}

// The bias sums of a bfloat16 convolution's backward pass come with the
// conversion of its output gradient: the sums are ColumnSums's bits on any
// thread count, the conversion is RoundToBfloat16's upper half (round to
// nearest even, NaN stays NaN), with and without sums, and with ReLU's
// gradient applied first: ReluGrad's values, summed and converted.
TEST(RowOpsTest, ColumnSumsAndBfloat16AreColumnSumsAndTheRoundedUpperHalves) {
  std::mt19937 gen(6);
  for (const int64_t cols : {1, 32, 64, 100}) {
    const int64_t rows = 2 * kColumnSumChunkRows + 5;
    std::vector<float> x(rows * cols);
    // Finite values of every magnitude, so the sums stay finite and compare
    // bit for bit; the special values below test the rounding.
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : x) v = std::ldexp(u(gen), static_cast<int>(gen() % 40) - 20);
    x[6] = std::numeric_limits<float>::infinity();
    x[7] = std::bit_cast<float>(0x7f7fffffu);  // the largest float: rounds to infinity
    x[8] = std::bit_cast<float>(0x00000001u);  // a subnormal
    x[3] = 1.0f + 0x1p-8f;          // a tie: to even (1.0)
    x[4] = 1.0f + 0x1.8p-8f;        // above the tie: up
    x[5] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> want(cols);
    ColumnSums(rows, cols, x.data(), want.data());
    std::vector<uint16_t> want16(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float r = elementwise::RoundToBfloat16()(x[i]);
      want16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(r) >> 16);
    }
    const int before = omp_get_max_threads();
    for (const int threads : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << cols << " columns, " << threads << " threads");
      omp_set_num_threads(threads);
      std::vector<float> got(cols, 99.0f);
      std::vector<uint16_t> got16(x.size(), 7), only16(x.size(), 7);
      ColumnSumsAndBfloat16(rows, cols, x.data(), got.data(), got16.data());
      for (int64_t c = 0; c < cols; ++c) {
        // Bit for bit; a NaN's payload depends on the order of an add's operands.
        EXPECT_TRUE(std::isnan(want[c]) ? std::isnan(got[c])
                                        : std::bit_cast<uint32_t>(got[c]) ==
                                              std::bit_cast<uint32_t>(want[c]))
            << "column " << c << ": " << got[c] << " vs " << want[c];
      }
      EXPECT_EQ(got16, want16);
      ColumnSumsAndBfloat16(rows, cols, x.data(), nullptr, only16.data());
      EXPECT_EQ(only16, want16);
      // Behind a ReLU: x masked by ReluGrad, in the same pass.
      std::vector<float> relu_out(x.size()), masked(x.size()), masked_sums(cols);
      for (size_t i = 0; i < x.size(); ++i) relu_out[i] = (i * 7919 % 3 == 0) ? 0.0f : 0.5f;
      relu_out[9] = -0.0f;
      relu_out[10] = std::numeric_limits<float>::quiet_NaN();  // masked, as ReluGrad does
      ReluGrad(static_cast<int64_t>(x.size()), relu_out.data(), x.data(), masked.data());
      ColumnSums(rows, cols, masked.data(), masked_sums.data());
      std::vector<float> got_masked(cols, 99.0f);
      std::vector<uint16_t> got_masked16(x.size(), 7);
      ColumnSumsAndBfloat16(rows, cols, x.data(), got_masked.data(), got_masked16.data(),
                            relu_out.data());
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_TRUE(std::isnan(masked_sums[c]) ? std::isnan(got_masked[c])
                                               : std::bit_cast<uint32_t>(got_masked[c]) ==
                                                     std::bit_cast<uint32_t>(masked_sums[c]))
            << "masked column " << c;
      }
      for (size_t i = 0; i < x.size(); ++i) {
        const float r = elementwise::RoundToBfloat16()(masked[i]);
        ASSERT_EQ(got_masked16[i], static_cast<uint16_t>(std::bit_cast<uint32_t>(r) >> 16))
            << "masked element " << i;
      }
    }
    omp_set_num_threads(before);
  }
}

TEST(ElementwiseTest, AxpyScaleRelu) {
  std::vector<float> y = {1, 2, 3, 4, 5};
  const std::vector<float> x = {1, 1, 1, 1, -1};
  Axpy(5, 2.0f, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{3, 4, 5, 6, 3}));
  Scale(5, -0.5f, y.data());
  EXPECT_EQ(y, (std::vector<float>{-1.5f, -2, -2.5f, -3, -1.5f}));

  const std::vector<float> in = {-1, 0, 2, -0.5f, 3};
  std::vector<float> out(5);
  Relu(5, in.data(), out.data());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 2, 0, 3}));
  const std::vector<float> g = {10, 20, 30, 40, 50};
  std::vector<float> gi(5);
  ReluGrad(5, out.data(), g.data(), gi.data());
  EXPECT_EQ(gi, (std::vector<float>{0, 0, 30, 0, 50}));
}

// The SIMD body and the scalar tail (n = 23) both give the plain select's
// bits: signed zeros, NaN and infinities included, also in place.
TEST(ElementwiseTest, ReluAndReluGradAreTheSelectBitForBit) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = RandomVector(23, 11);
  in[0] = -0.0f;
  in[1] = 0.0f;
  in[2] = nan;
  in[3] = inf;
  in[5] = -inf;
  in[21] = nan;
  std::vector<float> g = RandomVector(23, 12);
  g[3] = nan;
  g[6] = -0.0f;
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  std::vector<float> out(23), gi(23);
  Relu(23, in.data(), out.data());
  ReluGrad(23, out.data(), g.data(), gi.data());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(bits(out[i]), bits(in[i] > 0.0f ? in[i] : 0.0f)) << "relu " << i;
    EXPECT_EQ(bits(gi[i]), bits(out[i] > 0.0f ? g[i] : 0.0f)) << "grad " << i;
  }
  std::vector<float> in_place = in, g_in_place = g;
  Relu(23, in_place.data(), in_place.data());
  ReluGrad(23, in_place.data(), g_in_place.data(), g_in_place.data());
  EXPECT_EQ(std::memcmp(in_place.data(), out.data(), 23 * 4), 0);
  EXPECT_EQ(std::memcmp(g_in_place.data(), gi.data(), 23 * 4), 0);
}

// n = 11 covers both the 4-wide SIMD body and the scalar tail.
TEST(AdamUpdateTest, EveryElementFollowsTheScalarRule) {
  const int64_t n = 11;
  const std::vector<float> g = RandomVector(n, 4);
  std::vector<float> m = RandomVector(n, 5), v = RandomVector(n, 6), w = RandomVector(n, 7);
  for (float& x : v) x = std::abs(x);
  const std::vector<float> m0 = m, v0 = v, w0 = w;
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-7f;
  AdamUpdate(n, lr, b1, b2, eps, g.data(), m.data(), v.data(), w.data());
  for (int64_t i = 0; i < n; ++i) {
    const double mi = 0.9 * m0[i] + 0.1 * g[i];
    const double vi = 0.999 * v0[i] + 0.001 * g[i] * g[i];
    EXPECT_NEAR(m[i], mi, 1e-6) << i;
    EXPECT_NEAR(v[i], vi, 1e-6) << i;
    EXPECT_NEAR(w[i], w0[i] - 0.01 * mi / (std::sqrt(vi) + 1e-7), 1e-5) << i;
  }
}

// Whatever width the CPU gives the update (16, 8 or 4 floats, chosen at run
// time), every element is rounded exactly as the scalar rule rounds it, so
// replicas on different CPUs stay bit-identical. n covers every body and tail.
// At every length, and on any thread count: lengths from 64K elements up
// are split across the team, which must not change a bit.
TEST(AdamUpdateTest, BitIdenticalToTheScalarRuleAtEveryLength) {
  const int before = omp_get_max_threads();
  for (int64_t n : {1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 1000, 4099, 70001, 200003}) {
    const std::vector<float> g = RandomVector(n, 14);
    std::vector<float> m = RandomVector(n, 15), v = RandomVector(n, 16), w = RandomVector(n, 17);
    for (float& x : v) x = std::abs(x);
    std::vector<float> em = m, ev = v, ew = w;
    const float lr = 0.003f, b1 = 0.9f, b2 = 0.999f, eps = 1e-7f;
    for (int64_t i = 0; i < n; ++i) {
      // volatile: no contraction or reordering in the reference either.
      volatile float a = b1 * em[i];
      volatile float b = (1.0f - b1) * g[i];
      const float mi = a + b;
      volatile float gg = g[i] * g[i];
      volatile float c = b2 * ev[i];
      volatile float d = (1.0f - b2) * gg;
      const float vi = c + d;
      volatile float num = lr * mi;
      volatile float den = std::sqrt(vi) + eps;
      em[i] = mi;
      ev[i] = vi;
      ew[i] = ew[i] - num / den;
    }
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> tm = m, tv = v, tw = w;
      AdamUpdate(n, lr, b1, b2, eps, g.data(), tm.data(), tv.data(), tw.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(tm[i], em[i]) << "n=" << n << " i=" << i << " threads=" << threads;
        ASSERT_EQ(tv[i], ev[i]) << "n=" << n << " i=" << i << " threads=" << threads;
        ASSERT_EQ(tw[i], ew[i]) << "n=" << n << " i=" << i << " threads=" << threads;
      }
    }
  }
  omp_set_num_threads(before);
}

TEST(MomentumUpdateTest, PlainAndNesterov) {
  const std::vector<float> g = {1, -2, 0.5f, 4, 0, 3};
  for (bool nesterov : {false, true}) {
    std::vector<float> v = {0.5f, 0.5f, -1, 0, 2, 1};
    std::vector<float> w = {1, 1, 1, 1, 1, 1};
    const std::vector<float> v0 = v;
    MomentumUpdate(6, 0.1f, 0.9f, nesterov, g.data(), v.data(), w.data());
    for (int i = 0; i < 6; ++i) {
      const double vi = 0.9 * v0[i] - 0.1 * g[i];
      EXPECT_NEAR(v[i], vi, 1e-6);
      EXPECT_NEAR(w[i], nesterov ? 1 + 0.9 * vi - 0.1 * g[i] : 1 + vi, 1e-6);
    }
  }
}

// Long variables are split across the thread's team: the same bits as one
// thread, for both rules.
TEST(MomentumUpdateTest, TheSameBitsOnAnyThreadCount) {
  const int64_t n = 200003;
  const std::vector<float> g = RandomVector(n, 20), v0 = RandomVector(n, 21),
                           w0 = RandomVector(n, 22);
  const int before = omp_get_max_threads();
  for (bool nesterov : {false, true}) {
    omp_set_num_threads(1);
    std::vector<float> want_v = v0, want_w = w0;
    MomentumUpdate(n, 0.1f, 0.9f, nesterov, g.data(), want_v.data(), want_w.data());
    for (const int threads : {2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> v = v0, w = w0;
      MomentumUpdate(n, 0.1f, 0.9f, nesterov, g.data(), v.data(), w.data());
      EXPECT_EQ(v, want_v) << threads << " threads, nesterov " << nesterov;
      EXPECT_EQ(w, want_w) << threads << " threads, nesterov " << nesterov;
    }
  }
  omp_set_num_threads(before);
}

TEST(BlasThreadsTest, SetAndRestore) {
  const int before = BlasThreads();
  ASSERT_GE(before, 1);
  SetBlasThreads(1);
  EXPECT_EQ(BlasThreads(), 1);
  SetBlasThreads(before);
  EXPECT_EQ(BlasThreads(), before);
}

}  // namespace
}  // namespace distrain::cpu
