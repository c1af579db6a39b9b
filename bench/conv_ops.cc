// conv_ops: the measurement behind the CPU backend's Conv2D routing
// (worker/tensor/cpu/conv_kernels.h). For each op of the TensorFlow guide's
// CNN — Conv2D(32, 3x3) on 28x28x1, MaxPooling2D(2x2), Conv2D(64, 3x3) on
// 13x13x32 — at each batch size, times every implementation on the same
// buffers, interleaved:
//   onednn      oneDNN on the tensors' plain nhwc/hwio layouts (no reorders)
//   onednn-any  oneDNN with format_tag::any (its blocked layouts), plus the
//               reorders from and to the plain layouts the model keeps
//               (ConvLayout::kChosen; DNNL_VERBOSE=1 shows what it picks)
//   gemm        im2col + cpu::Gemm (OpenBLAS)
//   backend     what ops.h routes to today (one of the above)
// and prints ms per call, GFLOP/s and the fraction of the machine's FP32
// peak. Each variant's result is compared with `onednn`'s (max relative
// difference), so a fast wrong kernel shows.
//
//   conv_ops [--batch 64,256] [--threads 2] [--reps 7] [--min-ms 30]
//            [--flops-per-cycle 32]
//
// Peak = threads x clock (/proc/cpuinfo "cpu MHz") x --flops-per-cycle. 32
// is two 256-bit FMA pipes (AVX2 cores; Zen 4, which runs AVX-512 as two
// 256-bit halves); Intel cores with two 512-bit FMA units have 64. A figure
// is the best of --reps repetitions of at least --min-ms each.

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
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

double ClockGhz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) return std::stod(line.substr(line.find(':') + 1)) / 1000;
  }
  return 0;
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
  double min_ms = 30, flops_per_cycle = 32;
  app.add_option("--batch", batches, "comma-separated batch sizes");
  app.add_option("--threads", threads, "OpenMP and OpenBLAS threads");
  app.add_option("--reps", reps);
  app.add_option("--min-ms", min_ms);
  app.add_option("--flops-per-cycle", flops_per_cycle, "FP32 FLOPs per cycle per core");
  CLI11_PARSE(app, argc, argv);

  distrain::ops::SetCpuThreadsForThisThread(threads);
  const double ghz = ClockGhz();
  const double peak = threads * ghz * flops_per_cycle;
  std::printf("threads %d, clock %.2f GHz, peak %.0f GFLOP/s (%.0f FLOP/cycle/core)\n", threads,
              ghz, peak, flops_per_cycle);

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
            {"gemm", [&, p = &own(1, ys)] { internal::ConvForwardGemm(w, x.data(), k.data(), b.data(), p->data()); }, &outs[1]},
            {"backend", [&, p = &own(2, ys)] { distrain::cpu::Conv2DForward(w, x.data(), k.data(), b.data(), p->data()); }, &outs[2]}};
        Time(std::string(c.name) + " fwd", flops, std::move(v), reps, min_ms, peak);
      }
      // Backward data (the first layer never needs it; timed for completeness).
      {
        std::vector<Variant> v = {
            {"onednn", [&] { internal::ConvBackwardDataOnednn(w, dy.data(), k.data(), dx.data(), ConvLayout::kPlain); }, &dx},
            {"onednn-any", [&, p = &own(0, xs)] { internal::ConvBackwardDataOnednn(w, dy.data(), k.data(), p->data(), ConvLayout::kChosen); }, &outs[0]},
            {"gemm", [&, p = &own(1, xs)] { internal::ConvBackwardDataGemm(w, dy.data(), k.data(), p->data()); }, &outs[1]},
            {"backend", [&, p = &own(2, xs)] { distrain::cpu::Conv2DBackwardData(w, dy.data(), k.data(), p->data()); }, &outs[2]}};
        Time(std::string(c.name) + " bwd-data", flops, std::move(v), reps, min_ms, peak);
      }
      // Backward weights (+ bias).
      {
        std::vector<Variant> v = {
            {"onednn", [&] { internal::ConvBackwardWeightsOnednn(w, x.data(), dy.data(), dk.data(), db.data(), ConvLayout::kPlain); }, &dk},
            {"onednn-any", [&, p = &own(0, ks)] { internal::ConvBackwardWeightsOnednn(w, x.data(), dy.data(), p->data(), db.data(), ConvLayout::kChosen); }, &outs[0]},
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
