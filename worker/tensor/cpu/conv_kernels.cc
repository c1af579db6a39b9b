// Own Conv2D kernels (conv_kernels.h): im2col + GEMM.

#include "worker/tensor/cpu/conv_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "worker/tensor/cpu_math.h"

namespace distrain::cpu::internal {
namespace {

using ops::Window2D;

// The im2col block: rows of [kh*kw*c] patches, as many images per block as
// fit about this many floats (1 MiB), so a block stays in L2 between being
// written and being multiplied, and still gives the GEMM thousands of rows.
constexpr int64_t kBlockFloats = int64_t{1} << 18;

int64_t ImagesPerBlock(const Window2D& w) {
  const int64_t per_image = w.out_h * w.out_w * w.kernel_h * w.kernel_w * w.in_c;
  return std::clamp<int64_t>(kBlockFloats / std::max<int64_t>(per_image, 1), 1, w.batch);
}

std::vector<float>& Scratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(floats);
  return scratch;
}

// The first and one-past-last output column whose window tap kw lands inside
// the row (iw = ow * s - pad_left + kw in [0, in_w)).
void OwRange(const Window2D& w, int64_t kw, int64_t* lo, int64_t* hi) {
  const int64_t first = w.pad_left - kw;  // ow * s >= first
  *lo = first > 0 ? (first + w.stride_w - 1) / w.stride_w : 0;
  const int64_t last = w.in_w - 1 + w.pad_left - kw;  // ow * s <= last
  *hi = last < 0 ? 0 : std::min(w.out_w, last / w.stride_w + 1);
}

// cols[(i * OH + oh) * OW + ow, (kh * KW + kw) * C + c] for images [n0, n0 + count).
void Im2Col(const Window2D& w, const float* x, int64_t n0, int64_t count, float* cols) {
  const int64_t patch = w.kernel_h * w.kernel_w * w.in_c;
  const int64_t c = w.in_c;
  for (int64_t i = 0; i < count; ++i) {
    const float* img = x + (n0 + i) * w.in_h * w.in_w * c;
    for (int64_t oh = 0; oh < w.out_h; ++oh) {
      float* row = cols + (i * w.out_h + oh) * w.out_w * patch;
      for (int64_t kh = 0; kh < w.kernel_h; ++kh) {
        const int64_t ih = oh * w.stride_h - w.pad_top + kh;
        for (int64_t kw = 0; kw < w.kernel_w; ++kw) {
          const int64_t off = (kh * w.kernel_w + kw) * c;
          if (ih < 0 || ih >= w.in_h) {
            for (int64_t ow = 0; ow < w.out_w; ++ow) std::memset(row + ow * patch + off, 0, c * sizeof(float));
            continue;
          }
          int64_t lo, hi;
          OwRange(w, kw, &lo, &hi);
          for (int64_t ow = 0; ow < w.out_w; ++ow) {
            float* dst = row + ow * patch + off;
            if (ow < lo || ow >= hi) {
              std::memset(dst, 0, c * sizeof(float));
            } else {
              const int64_t iw = ow * w.stride_w - w.pad_left + kw;
              std::memcpy(dst, img + (ih * w.in_w + iw) * c, c * sizeof(float));
            }
          }
        }
      }
    }
  }
}

// dx[images n0..] += the patches of dcols scattered back (col2im).
void Col2ImAdd(const Window2D& w, const float* dcols, int64_t n0, int64_t count, float* dx) {
  const int64_t patch = w.kernel_h * w.kernel_w * w.in_c;
  const int64_t c = w.in_c;
  for (int64_t i = 0; i < count; ++i) {
    float* img = dx + (n0 + i) * w.in_h * w.in_w * c;
    for (int64_t oh = 0; oh < w.out_h; ++oh) {
      const float* row = dcols + (i * w.out_h + oh) * w.out_w * patch;
      for (int64_t kh = 0; kh < w.kernel_h; ++kh) {
        const int64_t ih = oh * w.stride_h - w.pad_top + kh;
        if (ih < 0 || ih >= w.in_h) continue;
        for (int64_t kw = 0; kw < w.kernel_w; ++kw) {
          int64_t lo, hi;
          OwRange(w, kw, &lo, &hi);
          const int64_t off = (kh * w.kernel_w + kw) * c;
          for (int64_t ow = lo; ow < hi; ++ow) {
            const float* src = row + ow * patch + off;
            float* dst = img + (ih * w.in_w + ow * w.stride_w - w.pad_left + kw) * c;
            for (int64_t j = 0; j < c; ++j) dst[j] += src[j];
          }
        }
      }
    }
  }
}

}  // namespace

void ConvForwardGemm(const Window2D& w, const float* x, const float* kernel, const float* bias,
                     float* y) {
  const int64_t patch = w.kernel_h * w.kernel_w * w.in_c;
  const int64_t pixels = w.out_h * w.out_w;
  const int64_t block = ImagesPerBlock(w);
  float* cols = Scratch(block * pixels * patch).data();
  for (int64_t n0 = 0; n0 < w.batch; n0 += block) {
    const int64_t count = std::min(block, w.batch - n0);
    const int64_t rows = count * pixels;
    float* out = y + n0 * pixels * w.out_c;
    Im2Col(w, x, n0, count, cols);
    if (bias != nullptr) BroadcastRow(rows, w.out_c, bias, out);
    Gemm(false, false, rows, w.out_c, patch, 1.0f, cols, kernel, bias != nullptr ? 1.0f : 0.0f,
         out);
  }
}

void ConvBackwardDataGemm(const Window2D& w, const float* dy, const float* kernel, float* dx) {
  const int64_t patch = w.kernel_h * w.kernel_w * w.in_c;
  const int64_t pixels = w.out_h * w.out_w;
  const int64_t block = ImagesPerBlock(w);
  float* dcols = Scratch(block * pixels * patch).data();
  std::fill(dx, dx + w.batch * w.in_h * w.in_w * w.in_c, 0.0f);
  for (int64_t n0 = 0; n0 < w.batch; n0 += block) {
    const int64_t count = std::min(block, w.batch - n0);
    Gemm(false, true, count * pixels, patch, w.out_c, 1.0f, dy + n0 * pixels * w.out_c, kernel,
         0.0f, dcols);
    Col2ImAdd(w, dcols, n0, count, dx);
  }
}

void ConvBackwardWeightsGemm(const Window2D& w, const float* x, const float* dy, float* dkernel,
                             float* dbias) {
  const int64_t patch = w.kernel_h * w.kernel_w * w.in_c;
  const int64_t pixels = w.out_h * w.out_w;
  const int64_t block = ImagesPerBlock(w);
  float* cols = Scratch(block * pixels * patch).data();
  for (int64_t n0 = 0; n0 < w.batch; n0 += block) {
    const int64_t count = std::min(block, w.batch - n0);
    Im2Col(w, x, n0, count, cols);
    Gemm(true, false, patch, w.out_c, count * pixels, 1.0f, cols, dy + n0 * pixels * w.out_c,
         n0 == 0 ? 0.0f : 1.0f, dkernel);
  }
  if (dbias != nullptr) ColumnSums(w.batch * pixels, w.out_c, dy, dbias);
}

}  // namespace distrain::cpu::internal
