#include "worker/tensor/small_gemm.h"

#include <cblas.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/tensor/cpu_math.h"

namespace distrain::cpu::internal {
namespace {

// n floats that end exactly where an inaccessible page begins, so a kernel
// that reads or writes one element past any matrix crashes the test.
class GuardedFloats {
 public:
  explicit GuardedFloats(int64_t n) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    const size_t data_pages = (bytes + page - 1) / page;
    size_ = (data_pages + 1) * page;
    void* mem = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(mem, MAP_FAILED);
    base_ = static_cast<char*>(mem);
    EXPECT_EQ(mprotect(base_ + data_pages * page, page, PROT_NONE), 0);
    data_ = reinterpret_cast<float*>(base_ + data_pages * page - bytes);
  }
  ~GuardedFloats() { munmap(base_, size_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  float* data() { return data_; }

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
  float* data_ = nullptr;
};

std::vector<SmallGemmIsa> SupportedIsas() {
  std::vector<SmallGemmIsa> isas;
  const SmallGemmIsa best = DetectSmallGemmIsa();
  if (best == SmallGemmIsa::kAvx512) isas.push_back(SmallGemmIsa::kAvx512);
  if (best != SmallGemmIsa::kNone) isas.push_back(SmallGemmIsa::kAvx2);
  return isas;
}

void Fill(std::mt19937* gen, int64_t n, float* x) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = dist(*gen);
}

struct Scalars {
  float alpha, beta;
};
// beta == 0 runs with C full of NaN: the kernels must not read it.
constexpr Scalars kScalars[] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.75f, 0.5f}};

// Runs one shape on `isa` and checks every element against a double
// reference, within the forward error bound of a k-term float dot product,
// and against cblas_sgemm within twice that. Matrices end at a guard page;
// `offset` floats shift every pointer off 64-byte alignment.
void CheckShape(SmallGemmIsa isa, bool trans_b, int64_t m, int64_t n, int64_t k,
                Scalars s, int64_t offset) {
  SCOPED_TRACE(std::string(SmallGemmIsaName(isa)) + (trans_b ? " A*B^T" : " A*B") +
               " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
               std::to_string(k) + " alpha=" + std::to_string(s.alpha) +
               " beta=" + std::to_string(s.beta) + " offset=" + std::to_string(offset));
  std::mt19937 gen(static_cast<uint32_t>(m * 1000003 + n * 1009 + k));
  GuardedFloats a_buf(m * k + offset), b_buf(k * n + offset), c_buf(m * n + offset);
  float* a = a_buf.data() + offset;
  float* b = b_buf.data() + offset;
  float* c = c_buf.data() + offset;
  Fill(&gen, m * k, a);
  Fill(&gen, k * n, b);
  std::vector<float> c0(m * n);
  if (s.beta == 0.0f) {
    std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());
  } else {
    Fill(&gen, m * n, c0.data());
  }
  std::memcpy(c, c0.data(), c0.size() * sizeof(float));
  std::vector<float> blas = c0;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, s.alpha,
              a, k, b, trans_b ? k : n, s.beta, blas.data(), n);

  SmallGemm(isa, trans_b, m, n, k, s.alpha, a, b, s.beta, c);

  int failures = 0;
  for (int64_t i = 0; i < m && failures < 5; ++i) {
    for (int64_t j = 0; j < n && failures < 5; ++j) {
      double dot = 0, magnitude = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = a[i * k + p];
        const double bv = trans_b ? b[j * k + p] : b[p * n + j];
        dot += av * bv;
        magnitude += std::abs(av * bv);
      }
      double want = s.alpha * dot;
      magnitude *= std::abs(s.alpha);
      if (s.beta != 0.0f) {
        want += s.beta * static_cast<double>(c0[i * n + j]);
        magnitude += std::abs(s.beta * static_cast<double>(c0[i * n + j]));
      }
      // gamma_{k+2} with float's unit roundoff, doubled for margin.
      const double tolerance = 2.0 * (k + 2) * 0x1p-24 * magnitude + 1e-30;
      const float got = c[i * n + j];
      if (!(std::abs(got - want) <= tolerance) ||
          !(std::abs(got - blas[i * n + j]) <= 2 * tolerance)) {
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", want " << want
                      << " (cblas " << blas[i * n + j] << ", tolerance " << tolerance << ")";
        ++failures;
      }
    }
  }
}

TEST(SmallGemmTest, MatchesDoubleReferenceOnEveryRemainderShape) {
  // Every row-block and column-panel remainder of both tile sets: m covers
  // 1..70 at the block edges (8, 12, 24 and 4, 6 rows), n and k the vector
  // edges (8, 16 lanes), the 48-column panel and the short-k path (k <= 32).
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 23, 24, 25, 31, 32, 33, 47,
                        49, 64, 70};
  const int64_t sizes[] = {1, 7, 8, 10, 16, 17, 31, 32, 33, 48, 49, 65};
  for (SmallGemmIsa isa : SupportedIsas()) {
    for (bool trans_b : {false, true}) {
      for (int64_t m : ms) {
        for (int64_t n : sizes) {
          for (int64_t k : sizes) {
            // Cycle the scalars and alignments instead of crossing them all.
            const Scalars s = kScalars[(m + n + k) % 3];
            CheckShape(isa, trans_b, m, n, k, s, (m + n) % 2);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
  if (SupportedIsas().empty()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
}

TEST(SmallGemmTest, MatchesDoubleReferenceOnTheMlpShapes) {
  // The products of Dense layers 784-1024-1024-10 at batch 32 and at odd
  // sizes around them.
  struct Shape {
    bool trans_b;
    int64_t n, k;
  };
  const Shape shapes[] = {{false, 1024, 784}, {false, 1024, 1024}, {false, 10, 1024},
                          {true, 1024, 1024}, {true, 1024, 10},    {true, 784, 1024},
                          {false, 1000, 37},  {true, 777, 785},    {false, 17, 785}};
  for (SmallGemmIsa isa : SupportedIsas()) {
    for (const Shape& shape : shapes) {
      // m % 3 cycles through the scalars: 33 runs beta = 0 on a NaN C.
      for (int64_t m : {1, 32, 33, 70}) {
        CheckShape(isa, shape.trans_b, m, shape.n, shape.k, kScalars[m % 3], m % 2);
        if (HasFailure()) return;
      }
    }
  }
  if (SupportedIsas().empty()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
}

TEST(SmallGemmTest, RepeatedCallsAreBitIdentical) {
  const int64_t m = 33, n = 1000, k = 1023;
  std::mt19937 gen(7);
  std::vector<float> a(m * k), b(k * n);
  Fill(&gen, a.size(), a.data());
  Fill(&gen, b.size(), b.data());
  for (SmallGemmIsa isa : SupportedIsas()) {
    for (bool trans_b : {false, true}) {
      std::vector<float> first(m * n), again(m * n);
      SmallGemm(isa, trans_b, m, n, k, 1.0f, a.data(), b.data(), 0.0f, first.data());
      for (int rep = 0; rep < 3; ++rep) {
        SmallGemm(isa, trans_b, m, n, k, 1.0f, a.data(), b.data(), 0.0f, again.data());
        ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0)
            << SmallGemmIsaName(isa) << " trans_b=" << trans_b << " rep " << rep;
      }
    }
  }
}

// A * B is one fused multiply-add chain per element on both instruction sets,
// so a machine's choice of kernels does not change the bits.
TEST(SmallGemmTest, NoTransposeIsBitIdenticalAcrossInstructionSets) {
  if (DetectSmallGemmIsa() != SmallGemmIsa::kAvx512) GTEST_SKIP() << "needs AVX-512F";
  for (int64_t n : {10, 1024, 1000}) {
    const int64_t m = 32, k = 784;
    std::mt19937 gen(static_cast<uint32_t>(n));
    std::vector<float> a(m * k), b(k * n), c512(m * n), c2(m * n);
    Fill(&gen, a.size(), a.data());
    Fill(&gen, b.size(), b.data());
    Fill(&gen, c512.size(), c512.data());
    c2 = c512;
    SmallGemm(SmallGemmIsa::kAvx512, false, m, n, k, 1.0f, a.data(), b.data(), 1.0f, c512.data());
    SmallGemm(SmallGemmIsa::kAvx2, false, m, n, k, 1.0f, a.data(), b.data(), 1.0f, c2.data());
    EXPECT_EQ(std::memcmp(c512.data(), c2.data(), c2.size() * sizeof(float)), 0) << "n=" << n;
  }
}

// With one BLAS thread (parameter-server workers) cpu::Gemm runs the kernels
// for every routed shape: its output is theirs, bit for bit, so the
// properties above hold for training.
TEST(SmallGemmTest, GemmOnOneBlasThreadRunsTheKernels) {
  if (DetectSmallGemmIsa() == SmallGemmIsa::kNone) GTEST_SKIP() << "no kernels on this CPU";
  struct Shape {
    bool trans_b;
    int64_t m, n, k;
  };
  const Shape shapes[] = {{false, 32, 1024, 784}, {false, 32, 1024, 1024}, {true, 32, 1024, 1024},
                          {true, 32, 1024, 10},   {true, 256, 1024, 10},   {false, 7, 10, 1024}};
  const int saved = BlasThreads();
  SetBlasThreads(1);
  int routed = 0;
  for (const Shape& s : shapes) {
    if (!SmallGemmRoutes(false, s.trans_b, s.m, s.n, s.k)) continue;
    ++routed;
    std::mt19937 gen(static_cast<uint32_t>(s.m + s.n + s.k));
    std::vector<float> a(s.m * s.k), b(s.k * s.n), via_gemm(s.m * s.n), direct(s.m * s.n);
    Fill(&gen, a.size(), a.data());
    Fill(&gen, b.size(), b.data());
    Fill(&gen, via_gemm.size(), via_gemm.data());
    direct = via_gemm;
    Gemm(false, s.trans_b, s.m, s.n, s.k, 0.5f, a.data(), b.data(), 1.0f, via_gemm.data());
    SmallGemm(DetectSmallGemmIsa(), s.trans_b, s.m, s.n, s.k, 0.5f, a.data(), b.data(), 1.0f,
              direct.data());
    EXPECT_EQ(std::memcmp(via_gemm.data(), direct.data(), direct.size() * sizeof(float)), 0)
        << "m=" << s.m << " n=" << s.n << " k=" << s.k << " trans_b=" << s.trans_b;
  }
  SetBlasThreads(saved);
  // At least three of these shapes are routed on every kernel set (which ones
  // depends on the set and on what Gemm falls back to).
  EXPECT_GE(routed, 3);
}

TEST(SmallGemmTest, RoutesOnlyImplementedCombinations) {
  EXPECT_FALSE(SmallGemmRoutes(true, false, 32, 1024, 784));
  EXPECT_FALSE(SmallGemmRoutes(true, true, 32, 1024, 784));
  EXPECT_FALSE(SmallGemmRoutes(false, false, 0, 1024, 784));
  EXPECT_FALSE(SmallGemmRoutes(false, false, 32, 1024, 0));
  if (DetectSmallGemmIsa() == SmallGemmIsa::kNone) {
    EXPECT_FALSE(SmallGemmRoutes(false, true, 32, 1024, 1024));
  } else {
    // The batch-32 input gradient won on every measured CPU and kernel set.
    EXPECT_TRUE(SmallGemmRoutes(false, true, 32, 1024, 1024));
  }
}

}  // namespace
}  // namespace distrain::cpu::internal
