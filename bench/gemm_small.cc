// gemm_small: the measurement behind cpu::Gemm's small-M routing
// (worker/tensor/small_gemm.h). For each matrix product of the MLP
// 784-1024-1024-10 (Dense::Forward and the input gradient of
// Dense::Backward) at each batch size, times cblas_sgemm on one OpenBLAS
// thread, dnnl_sgemm on one OpenMP thread (what cpu::Gemm runs when it does
// not route) and the small-M kernels (every instruction set this CPU has) on
// the same buffers, interleaved, and prints GFLOP/s and the kernel/oneDNN
// ratio.
// With --blas-threads T > 1 it adds a column for OpenBLAS on T threads (the
// kernels are single-threaded).
//
//   gemm_small [--m 32,256] [--reps 7] [--min-ms 20] [--blas-threads 1]
//
// Each repetition runs a shape for at least --min-ms; a figure is the best
// repetition. Both sides see the same operands in the same cache state (B, the
// weights, is 3-4 MiB: it sits in L3 between calls, as in training).

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.h"
#include "worker/tensor/small_gemm.h"

namespace {

using distrain::cpu::internal::SmallGemmIsa;

struct Shape {
  const char* what;
  bool trans_b;
  int64_t n, k;
  float beta;
};

// Row-major, as Dense calls cpu::Gemm; M is the batch.
constexpr Shape kShapes[] = {
    {"fwd  dense1 x[M,784]  W[784,1024]", false, 1024, 784, 1.0f},
    {"fwd  dense2 x[M,1024] W[1024,1024]", false, 1024, 1024, 1.0f},
    {"fwd  dense3 x[M,1024] W[1024,10]", false, 10, 1024, 1.0f},
    {"bwd  dense2 dy[M,1024] W^T", true, 1024, 1024, 0.0f},
    {"bwd  dense3 dy[M,10]  W^T", true, 1024, 10, 0.0f},
    // A parameter server forming a factored kernel gradient (L^T R, see
    // UploadShard.factor_rank) as (L^T)[rows, B] R[B, 1024]: M is the
    // shard's rows, K the batch.
    {"ps   G = L^T R, batch 32", false, 1024, 32, 0.0f},
    {"ps   G = L^T R, batch 256", false, 1024, 256, 0.0f},
};

// Seconds per call: best over `reps` repetitions of at least min_s each.
double BestSecondsPerCall(const std::function<void()>& call, double min_s) {
  using Clock = std::chrono::steady_clock;
  call();  // warm caches and page tables
  int64_t iters = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    call();
    ++iters;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_s);
  return elapsed / static_cast<double>(iters);
}

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty()) out.push_back(std::stoll(cur));
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms = {32, 256};
  int reps = 7;
  double min_ms = 20;
  int blas_threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--m") {
      ms = ParseList(argv[i + 1]);
    } else if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (flag == "--min-ms") {
      min_ms = std::atof(argv[i + 1]);
    } else if (flag == "--blas-threads") {
      blas_threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const SmallGemmIsa best = distrain::cpu::internal::DetectSmallGemmIsa();
  std::vector<SmallGemmIsa> isas;
  if (best == SmallGemmIsa::kAvx512) isas.push_back(SmallGemmIsa::kAvx512);
  if (best != SmallGemmIsa::kNone) isas.push_back(SmallGemmIsa::kAvx2);
  // OPENBLAS_CORETYPE, where the host sets it, pins OpenBLAS's kernels: the
  // core name says which ran.
  std::printf("OpenBLAS %s (kernels for %s); oneDNN %d.%d; kernels: %s; best of %d x %.0f ms\n",
              openblas_get_config(), openblas_get_corename(), dnnl_version()->major,
              dnnl_version()->minor, distrain::cpu::internal::SmallGemmIsaName(best), reps, min_ms);
  std::printf("%-36s %5s %10s %10s", "shape", "M", "blas1", "dnnl1");
  for (SmallGemmIsa isa : isas) {
    std::printf(" %10s %7s", distrain::cpu::internal::SmallGemmIsaName(isa), "ratio");
  }
  if (blas_threads > 1) std::printf(" %9s%-2d", "blas", blas_threads);
  std::printf("   (GFLOP/s; ratio = kernel / dnnl1, what cpu::Gemm falls back to)\n");

  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t m : ms) {
    for (const Shape& s : kShapes) {
      std::vector<float> a(m * s.k), b(s.k * s.n), c(m * s.n);
      for (float& x : a) x = dist(gen);
      for (float& x : b) x = dist(gen);
      for (float& x : c) x = dist(gen);
      const double flops = 2.0 * static_cast<double>(m) * s.n * s.k;
      auto blas = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans, m, s.n,
                    s.k, 1.0f, a.data(), s.k, b.data(), s.trans_b ? s.k : s.n, s.beta, c.data(),
                    s.n);
      };
      auto dnnl = [&] {
        dnnl_sgemm('N', s.trans_b ? 'T' : 'N', m, s.n, s.k, 1.0f, a.data(), s.k, b.data(),
                   s.trans_b ? s.k : s.n, s.beta, c.data(), s.n);
      };
      // [0] OpenBLAS, [1] oneDNN, then each kernel set, then OpenBLAS on T threads.
      std::vector<double> best_s(isas.size() + 3, 1e30);
      for (int r = 0; r < reps; ++r) {
        // Interleaved, so drifting load from other processes hits every side.
        openblas_set_num_threads(1);
        omp_set_num_threads(1);
        best_s[0] = std::min(best_s[0], BestSecondsPerCall(blas, min_ms / 1e3));
        best_s[1] = std::min(best_s[1], BestSecondsPerCall(dnnl, min_ms / 1e3));
        for (size_t i = 0; i < isas.size(); ++i) {
          auto kernel = [&, isa = isas[i]] {
            distrain::cpu::internal::SmallGemm(isa, s.trans_b, m, s.n, s.k, 1.0f, a.data(),
                                               b.data(), s.beta, c.data());
          };
          best_s[i + 2] = std::min(best_s[i + 2], BestSecondsPerCall(kernel, min_ms / 1e3));
        }
        if (blas_threads > 1) {
          openblas_set_num_threads(blas_threads);
          best_s.back() = std::min(best_s.back(), BestSecondsPerCall(blas, min_ms / 1e3));
        }
      }
      std::printf("%-36s %5lld %10.1f %10.1f", s.what, static_cast<long long>(m),
                  flops / best_s[0] / 1e9, flops / best_s[1] / 1e9);
      for (size_t i = 0; i < isas.size(); ++i) {
        std::printf(" %10.1f %6.2fx", flops / best_s[i + 2] / 1e9, best_s[1] / best_s[i + 2]);
      }
      if (blas_threads > 1) std::printf(" %10.1f", flops / best_s.back() / 1e9);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
