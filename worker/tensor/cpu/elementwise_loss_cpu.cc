// The CPU loops of ops::Loss other than sparse cross-entropy from logits
// (cpu::SoftmaxCrossEntropy). Per-row sums are in double; the per-element
// formulas are elementwise.h's, shared with the CUDA backend.

#include <cmath>

#include "worker/tensor/cpu/elementwise_cpu.h"

namespace distrain::cpu {
namespace {

using elementwise::kProbEpsilon;
using elementwise::kProbOneMinusEpsilon;

float Clip(float p) {
  return p < kProbEpsilon ? kProbEpsilon : (p > kProbOneMinusEpsilon ? kProbOneMinusEpsilon : p);
}
// tf.clip_by_value's gradient mask: the closed interval passes.
bool Inside(float p) { return p >= kProbEpsilon && p <= kProbOneMinusEpsilon; }

}  // namespace

double SparseCrossentropyFromProbs(int64_t batch, int64_t classes, const float* p,
                                   const int32_t* labels, float grad_scale, float* grad) {
  // Keras clips, takes the log and hands the result to
  // sparse_softmax_cross_entropy_with_logits: softmax(log c) = c / sum(c),
  // so the loss is log(sum c) - log(c_label) — the clipped row renormalised.
  double loss_sum = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* pr = p + r * classes;
    const int32_t label = labels[r];
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += Clip(pr[c]);
    const float c_label = Clip(pr[label]);
    loss_sum += std::log(sum) - std::log(static_cast<double>(c_label));
    if (grad != nullptr) {
      // d/dp_j = [inside_j] (1 / sum - [j == label] / c_j)
      float* g = grad + r * classes;
      const float inv_sum = static_cast<float>(1.0 / sum);
      for (int64_t c = 0; c < classes; ++c) {
        const float d = c == label ? inv_sum - 1.0f / c_label : inv_sum;
        g[c] = Inside(pr[c]) ? grad_scale * d : 0.0f;
      }
    }
  }
  return loss_sum;
}

double CategoricalCrossentropyFromProbs(int64_t batch, int64_t classes, const float* p,
                                        const int32_t* labels, float grad_scale, float* grad) {
  // Keras normalises the row to sum 1 first, then clips: -log(clip(p_y / s)).
  double loss_sum = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* pr = p + r * classes;
    const int32_t label = labels[r];
    float sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += pr[c];
    const float q = pr[label] / sum;
    const float c_label = Clip(q);
    loss_sum -= std::log(static_cast<double>(c_label));
    if (grad != nullptr) {
      // L = -log(p_y / s): dL/dp_j = -(1 / q) ([j == y] / s - p_y / s^2)
      //                            = (q - [j == y]) / (q s), zero when clipped.
      float* g = grad + r * classes;
      if (!Inside(q)) {
        for (int64_t c = 0; c < classes; ++c) g[c] = 0.0f;
        continue;
      }
      const float base = grad_scale / (q * sum);
      for (int64_t c = 0; c < classes; ++c) g[c] = base * (c == label ? q - 1.0f : q);
    }
  }
  return loss_sum;
}

double BinaryCrossentropy(bool from_logits, int64_t batch, const float* out,
                          const int32_t* labels, float grad_scale, float* grad) {
  double loss_sum = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float t = static_cast<float>(labels[r]);
    const elementwise::LossAndGrad lg = from_logits
                                            ? elementwise::BinaryCrossentropyFromLogits()(out[r], t)
                                            : elementwise::BinaryCrossentropyFromProbs()(out[r], t);
    loss_sum += lg.loss;
    if (grad != nullptr) grad[r] = grad_scale * lg.grad;
  }
  return loss_sum;
}

double MeanSquaredError(int64_t batch, int64_t width, const float* out, const int32_t* labels,
                        float grad_scale, float* grad) {
  double loss_sum = 0;
  const float inv_width = 1.0f / static_cast<float>(width);
  for (int64_t r = 0; r < batch; ++r) {
    const float* o = out + r * width;
    double row = 0;
    for (int64_t c = 0; c < width; ++c) {
      const float t = width == 1 ? static_cast<float>(labels[r]) : (c == labels[r] ? 1.0f : 0.0f);
      const elementwise::LossAndGrad lg = elementwise::SquaredError()(o[c], t);
      row += lg.loss;
      if (grad != nullptr) grad[r * width + c] = grad_scale * inv_width * lg.grad;
    }
    loss_sum += row / static_cast<double>(width);
  }
  return loss_sum;
}

int64_t ArgmaxHits(int64_t batch, int64_t classes, const float* out, const int32_t* labels) {
  int64_t hits = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* o = out + r * classes;
    int64_t argmax = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (o[c] > o[argmax]) argmax = c;
    }
    hits += argmax == labels[r];
  }
  return hits;
}

int64_t ThresholdHits(int64_t batch, const float* out, const int32_t* labels) {
  int64_t hits = 0;
  for (int64_t r = 0; r < batch; ++r) hits += (out[r] > 0.5f) == (labels[r] != 0);
  return hits;
}

}  // namespace distrain::cpu
