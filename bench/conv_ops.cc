// conv_ops: the measurement behind the CPU backend's Conv2D routing
// (worker/tensor/cpu/conv_kernels.h). For each op of the TensorFlow guide's
// CNN — Conv2D(32, 3x3) on 28x28x1, MaxPooling2D(2x2), Conv2D(64, 3x3) on
// 13x13x32 — at each batch size, times every implementation on the same
// buffers, interleaved:
//   onednn      oneDNN on the tensors' plain nhwc/hwio layouts (no reorders)
//   onednn-any  oneDNN with format_tag::any (its blocked layouts), plus the
//               reorders from and to the plain layouts the model keeps
//               (ConvLayout::kChosen; DNNL_VERBOSE=1 shows what it picks)
//   onednn-anyw oneDNN choosing the kernel's layout only, images nhwc
//               (ConvLayout::kChosenWeights)
//   gemm        im2col + cpu::Gemm (OpenBLAS)
//   backend     what ops.h routes to today (one of the above)
// and prints ms per call, GFLOP/s and the fraction of the machine's FP32
// peak. Each variant's result is compared with `onednn`'s (max relative
// difference), so a fast wrong kernel shows.
//
//   conv_ops [--batch 64,256] [--threads 2] [--reps 7] [--min-ms 30]
//
// Peak is measured, not computed: `threads` threads each running
// independent register FMAs (AVX-512 where the CPU has it, else AVX2) over
// their own CPU time — the clock a VM reports is the nominal one, not the
// boost the cores run at. The op timings are wall clock: on a shared
// machine other processes' load lowers them, so read them with the load
// figure. A figure is the best of --reps repetitions of at least --min-ms
// each.

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "worker/tensor/cpu/conv_kernels.h"
#include "worker/tensor/cpu/window_ops.h"
#include "worker/tensor/cpu_math.h"
#include "worker/tensor/ops.h"

namespace {

using distrain::PaddingKind;
using distrain::ops::KerasWindow2D;
using distrain::ops::Window2D;
namespace internal = distrain::cpu::internal;
using internal::ConvLayout;

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// FMA throughput of one thread: 12 independent chains of vector FMAs on
// registers, so the figure is the core's FP32 peak at whatever clock it
// boosts to (the VM's /proc/cpuinfo shows the nominal clock only). The
// result goes through memory: a function without side effects could be
// moved across the clock reads.
__attribute__((target("avx512f"))) void FmaLoop512(int64_t iters, float* out) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  // Lanes summed through memory as FmaLoop256 does: GCC 12's
  // _mm512_reduce_add_ps extracts through _mm256_undefined_pd(), which it then
  // warns about as uninitialised (a false positive in avx512fintrin.h).
  float lanes[16];
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float v : lanes) sum += v;
  }
  *out = sum;
}
__attribute__((target("avx2,fma"))) void FmaLoop256(int64_t iters, float* out) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float lanes[8];
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (float v : lanes) sum += v;
  }
  *out = sum;
}

// Global, so the FMA loops' stores are visible to the clock calls around them.
float g_sink[64];

// Measured FP32 peak of `threads` threads in GFLOP/s and the instruction
// set it used. Each thread's rate is over its own CPU time
// (CLOCK_THREAD_CPUTIME_ID), so time slices lost to other processes on a
// shared machine do not lower it; best of 5.
double MeasuredPeakGflops(int threads, const char** isa) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  *isa = avx512 ? "AVX-512" : "AVX2+FMA";
  const int64_t iters = 10'000'000;
  const double flops_per_call = iters * 12.0 * (avx512 ? 16 : 8) * 2;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> rate(threads, 0);
#pragma omp parallel num_threads(threads)
    {
      timespec a, b;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
      float* sink = &g_sink[omp_get_thread_num() % 64];
      if (avx512) {
        FmaLoop512(iters, sink);
      } else {
        FmaLoop256(iters, sink);
      }
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
      const double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
      rate[omp_get_thread_num()] = flops_per_call / s / 1e9;
    }
    double sum = 0;
    for (double r : rate) sum += r;
    best = std::max(best, sum);
  }
  return best;
}

struct Variant {
  std::string name;
  std::function<void()> run;
  const std::vector<float>* out;  // compared with the first variant's
};

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::abs(b[i])));
  }
  return worst;
}

void Time(const std::string& what, double flops, std::vector<Variant> variants, int reps,
          double min_ms, double peak_gflops) {
  // Warm-up (primitive creation, first touch), then compare with the first.
  for (Variant& v : variants) v.run();
  variants[0].run();
  const std::vector<float> reference = *variants[0].out;
  std::vector<double> best(variants.size(), 1e30);
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < variants.size(); ++i) {
      int calls = 0;
      const auto start = std::chrono::steady_clock::now();
      double ms = 0;
      do {
        variants[i].run();
        ++calls;
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                 .count();
      } while (ms < min_ms);
      best[i] = std::min(best[i], ms / calls);
    }
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    variants[i].run();
    const double gflops = flops > 0 ? flops / (best[i] * 1e6) : 0;
    std::printf("  %-34s %-11s %8.3f ms", what.c_str(), variants[i].name.c_str(), best[i]);
    if (flops > 0) std::printf("  %7.1f GFLOP/s  %5.1f%% peak", gflops, 100 * gflops / peak_gflops);
    std::printf("  x%.2f vs %s  diff %.1e\n", best[0] / best[i], variants[0].name.c_str(),
                MaxRelDiff(*variants[i].out, reference));
  }
}

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Conv2D/pooling op timings: oneDNN vs own kernels (bench/README.md)");
  std::string batches = "64,256";
  int threads = 2, reps = 7;
  double min_ms = 30;
  app.add_option("--batch", batches, "comma-separated batch sizes");
  app.add_option("--threads", threads, "OpenMP and OpenBLAS threads");
  app.add_option("--reps", reps);
  app.add_option("--min-ms", min_ms);
  CLI11_PARSE(app, argc, argv);

  distrain::ops::SetCpuThreadsForThisThread(threads);
  distrain::cpu::SetBlasThreads(threads);
  const char* isa = "";
  const double peak = MeasuredPeakGflops(threads, &isa);
  std::printf("threads %d, measured FP32 peak %.0f GFLOP/s (%s FMAs)\n", threads, peak, isa);

  for (const int64_t batch : ParseList(batches)) {
    std::printf("batch %lld\n", static_cast<long long>(batch));
    struct Conv {
      const char* name;
      Window2D w;
    };
    const Conv convs[] = {
        {"conv1 28x28x1->26x26x32", KerasWindow2D(batch, 28, 28, 1, 32, {3, 3}, {1, 1},
                                                  PaddingKind::kValid)},
        {"conv2 13x13x32->11x11x64", KerasWindow2D(batch, 13, 13, 32, 64, {3, 3}, {1, 1},
                                                   PaddingKind::kValid)},
    };
    for (const Conv& c : convs) {
      const Window2D& w = c.w;
      const int64_t xs = w.batch * w.in_h * w.in_w * w.in_c, ys = w.batch * w.out_h * w.out_w * w.out_c,
                    ks = w.kernel_h * w.kernel_w * w.in_c * w.out_c;
      const std::vector<float> x = Random(xs, 1), k = Random(ks, 2), b = Random(w.out_c, 3),
                               dy = Random(ys, 4);
      std::vector<float> y(ys), dx(xs), dk(ks), db(w.out_c);
      std::vector<std::vector<float>> outs(5, std::vector<float>());
      const double flops = 2.0 * w.batch * w.out_h * w.out_w * w.out_c * w.kernel_h * w.kernel_w *
                           w.in_c;
      const auto own = [&](int slot, int64_t size) -> std::vector<float>& {
        outs[slot].resize(size);
        return outs[slot];
      };
      // Forward.
      {
        std::vector<Variant> v = {
            {"onednn", [&] { internal::ConvForwardOnednn(w, x.data(), k.data(), b.data(), y.data(), ConvLayout::kPlain); }, &y},
            {"onednn-any", [&, p = &own(0, ys)] { internal::ConvForwardOnednn(w, x.data(), k.data(), b.data(), p->data(), ConvLayout::kChosen); }, &outs[0]},
            {"onednn-anyw", [&, p = &own(3, ys)] { internal::ConvForwardOnednn(w, x.data(), k.data(), b.data(), p->data(), ConvLayout::kChosenWeights); }, &outs[3]},
            {"gemm", [&, p = &own(1, ys)] { internal::ConvForwardGemm(w, x.data(), k.data(), b.data(), p->data()); }, &outs[1]},
            {"backend", [&, p = &own(2, ys)] { distrain::cpu::Conv2DForward(w, x.data(), k.data(), b.data(), p->data()); }, &outs[2]}};
        Time(std::string(c.name) + " fwd", flops, std::move(v), reps, min_ms, peak);
      }
      // Backward data (the first layer never needs it; timed for completeness).
      {
        std::vector<Variant> v = {
            {"onednn", [&] { internal::ConvBackwardDataOnednn(w, dy.data(), k.data(), dx.data(), ConvLayout::kPlain); }, &dx},
            {"onednn-any", [&, p = &own(0, xs)] { internal::ConvBackwardDataOnednn(w, dy.data(), k.data(), p->data(), ConvLayout::kChosen); }, &outs[0]},
            {"onednn-anyw", [&, p = &own(3, xs)] { internal::ConvBackwardDataOnednn(w, dy.data(), k.data(), p->data(), ConvLayout::kChosenWeights); }, &outs[3]},
            {"gemm", [&, p = &own(1, xs)] { internal::ConvBackwardDataGemm(w, dy.data(), k.data(), p->data()); }, &outs[1]},
            {"backend", [&, p = &own(2, xs)] { distrain::cpu::Conv2DBackwardData(w, dy.data(), k.data(), p->data()); }, &outs[2]}};
        Time(std::string(c.name) + " bwd-data", flops, std::move(v), reps, min_ms, peak);
      }
      // Backward weights (+ bias).
      {
        std::vector<Variant> v = {
            {"onednn", [&] { internal::ConvBackwardWeightsOnednn(w, x.data(), dy.data(), dk.data(), db.data(), ConvLayout::kPlain); }, &dk},
            {"onednn-any", [&, p = &own(0, ks)] { internal::ConvBackwardWeightsOnednn(w, x.data(), dy.data(), p->data(), db.data(), ConvLayout::kChosen); }, &outs[0]},
            {"onednn-anyw", [&, p = &own(3, ks)] { internal::ConvBackwardWeightsOnednn(w, x.data(), dy.data(), p->data(), db.data(), ConvLayout::kChosenWeights); }, &outs[3]},
            {"gemm", [&, p = &own(1, ks)] { internal::ConvBackwardWeightsGemm(w, x.data(), dy.data(), p->data(), db.data()); }, &outs[1]},
            {"backend", [&, p = &own(2, ks)] { distrain::cpu::Conv2DBackwardWeights(w, x.data(), dy.data(), p->data(), db.data()); }, &outs[2]}};
        Time(std::string(c.name) + " bwd-weights", flops, std::move(v), reps, min_ms, peak);
      }
    }
    // Pooling: memory-bound, reported in ms (and GB/s moved) only.
    {
      const Window2D w = KerasWindow2D(batch, 26, 26, 32, 32, {2, 2}, {2, 2}, PaddingKind::kValid);
      const int64_t xs = w.batch * w.in_h * w.in_w * w.in_c, ys = w.batch * w.out_h * w.out_w * w.in_c;
      const std::vector<float> x = Random(xs, 5), dy = Random(ys, 6);
      std::vector<float> y(ys), dx(xs),
          ws(distrain::cpu::Pool2DWorkspaceFloats(distrain::ops::PoolKind::kMax, w));
      Time("maxpool 26x26x32->13x13x32 fwd", 0,
           {{"onednn", [&] { distrain::cpu::Pool2DForward(distrain::ops::PoolKind::kMax, w, x.data(), y.data(), ws.data()); }, &y}},
           reps, min_ms, peak);
      Time("maxpool 26x26x32->13x13x32 bwd", 0,
           {{"onednn", [&] { distrain::cpu::Pool2DBackward(distrain::ops::PoolKind::kMax, w, dy.data(), ws.data(), dx.data()); }, &dx}},
           reps, min_ms, peak);
    }
  }
  return 0;
}
